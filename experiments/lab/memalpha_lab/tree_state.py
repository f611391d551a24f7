"""Which commit a GPU result ran, and whether the tree held changes that commit lacks.

A GPU result is only worth keeping if it can be tied to a commit: every figure in
``experiments/results/gpu/`` should be reproducible by checking that commit out. Two ways to know:

- **git**: where the checkout has its ``.git`` (this machine, and a device machine if its copy
  carries one), ``HEAD`` and ``git status`` of the tracked files say it directly.
- **stamp**: where it has none (a copy of the working tree without its history), the file
  :data:`STAMP` written here before the tree is carried (``python -m memalpha_lab.tree_state
  stamp``; ``experiments/gpu/gpu_pack.sh`` runs it) lists ``HEAD`` and the git blob hash of every
  tracked file at ``HEAD``. There, each file is hashed again: a file that differs from its
  committed blob, or is missing, makes the tree dirty.

A run refuses a dirty tree, or one whose commit cannot be known, with one line
(:class:`DirtyTree`), unless it is started with ``--allow-dirty``; that choice is recorded with
the state. ``python -m memalpha_lab.tree_state check [--allow-dirty] [--out FILE]`` does the
check once for a sequence of runs (``experiments/gpu/gpu_check.sh``) and writes the state to the
file that :data:`STATE_ENV` names, so that the runs' own result files, written as they go, do
not count as changes for the runs after them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
STAMP = REPO_ROOT / ".device" / "tree.json"
"""Where ``stamp`` writes the commit and its file hashes (``.device/`` is what a device run carries)."""

STATE_ENV = "MEMALPHA_TREE_STATE"
"""Names a file holding the state a sequence of runs checked once at its start (see ``check``)."""

SHOWN_CHANGES = 5
"""Changed paths named in the refusal line (all are recorded)."""


class DirtyTree(SystemExit):
    """The run refuses to start: the tree has uncommitted changes or no known commit (one line)."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
    ).stdout


def blob_hash(path: Path) -> str:
    """The git blob hash (SHA-1 of ``blob <size>\\0`` and the bytes) of the file at ``path``."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def from_git(repo: Path = REPO_ROOT) -> dict[str, Any] | None:
    """``commit``, ``dirty`` and ``changed`` (tracked paths that differ from ``HEAD``) from git;
    ``untracked`` counts files git neither tracks nor ignores (they do not make the tree dirty).
    None where ``repo`` is no git checkout (or git is missing)."""
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        status = _git(repo, "status", "--porcelain", "--untracked-files=all")
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in status.splitlines() if line.strip()]
    changed = [line[3:] for line in lines if not line.startswith("??")]
    return {
        "commit": commit,
        "dirty": bool(changed),
        "changed": changed,
        "untracked": sum(line.startswith("??") for line in lines),
        "source": "git",
    }


def make_stamp(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The stamp of ``repo`` now: ``HEAD``, whether the tree is dirty, and ``files``, the blob
    hash at ``HEAD`` of every regular tracked file (links and submodules are left out)."""
    state = from_git(repo)
    if state is None:
        raise RuntimeError(f"{repo} is no git checkout: nothing to stamp")
    files = {}
    for line in _git(repo, "ls-tree", "-r", "--full-tree", "HEAD").splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and mode in ("100644", "100755"):
            files[path] = sha
    return {**state, "files": files}


def from_stamp(stamp: dict[str, Any], repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The state of ``repo`` against ``stamp``: its commit, and dirty if any stamped file is missing
    or differs from its committed blob (or the tree was already dirty when stamped)."""
    changed = []
    for path, sha in sorted(stamp["files"].items()):
        target = repo / path
        if not target.is_file() or blob_hash(target) != sha:
            changed.append(path)
    if stamp.get("dirty"):
        changed = sorted(set(changed) | set(stamp.get("changed", [])))
    return {
        "commit": stamp["commit"],
        "dirty": bool(changed),
        "changed": changed,
        "untracked": None,
        "source": "stamp",
    }


def tree_state(repo: Path = REPO_ROOT, stamp_path: Path | None = None) -> dict[str, Any]:
    """The state of ``repo``: from git where it can, else from the stamp, else unknown
    (``commit`` and ``dirty`` None, ``source`` None)."""
    state = from_git(repo)
    if state is not None:
        return state
    stamp_path = stamp_path if stamp_path is not None else repo / STAMP.relative_to(REPO_ROOT)
    if stamp_path.is_file():
        return from_stamp(json.loads(stamp_path.read_text(encoding="utf-8")), repo)
    return {"commit": None, "dirty": None, "changed": [], "untracked": None, "source": None}


def refusal(state: dict[str, Any]) -> str | None:
    """The one line a run that must start from a clean commit prints (None when it may start)."""
    if state["commit"] is None:
        return (
            "refusing to run: the commit of this tree is unknown (no git and no .device/tree.json: run "
            "`python -m memalpha_lab.tree_state stamp` before carrying it), or pass --allow-dirty"
        )
    if state["dirty"]:
        shown = ", ".join(state["changed"][:SHOWN_CHANGES])
        more = len(state["changed"]) - SHOWN_CHANGES
        return (
            f"refusing to run: the tree has uncommitted changes to {len(state['changed'])} file(s) "
            f"({shown}{f', +{more} more' if more > 0 else ''}) on {state['commit'][:10]}; "
            "commit them or pass --allow-dirty"
        )
    return None


def checked_state(allow_dirty: bool = False, repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The tree's state with ``allow_dirty`` recorded; raises :class:`DirtyTree` (one line) when
    it is dirty or unknown and ``allow_dirty`` is false. Where :data:`STATE_ENV` names a file,
    the state in it (checked at the start of a sequence of runs) is used instead of a new look."""
    shared = os.environ.get(STATE_ENV)
    if shared and Path(shared).is_file():
        state = json.loads(Path(shared).read_text(encoding="utf-8"))
        state["allow_dirty"] = bool(state.get("allow_dirty")) or allow_dirty
    else:
        state = {**tree_state(repo), "allow_dirty": allow_dirty}
    line = refusal(state)
    if line is not None and not state["allow_dirty"]:
        raise DirtyTree(line)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    stamp = sub.add_parser("stamp", help="write HEAD and its file hashes, for a copy without .git")
    stamp.add_argument("--out", type=Path, default=STAMP)
    check = sub.add_parser("check", help="refuse (exit 3, one line) a dirty tree; write the state")
    check.add_argument("--allow-dirty", action="store_true", help="run anyway; recorded in every result")
    check.add_argument(
        "--out", type=Path, default=None, help="write the state here (for MEMALPHA_TREE_STATE)"
    )
    check.add_argument(
        "--stamp", type=Path, default=None,
        help="check the files against this stamp, not git (a carried copy's .git can be another commit's)",
    )
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.command == "stamp":
        data = make_stamp(args.repo)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        flag = " (dirty: commit first, or the device run will refuse)" if data["dirty"] else ""
        print(f"stamped {data['commit'][:10]}, {len(data['files'])} files -> {args.out}{flag}")
        return 0
    if args.stamp is not None:
        state = from_stamp(json.loads(args.stamp.read_text(encoding="utf-8")), args.repo)
    else:
        state = tree_state(args.repo)
    state["allow_dirty"] = args.allow_dirty
    line = refusal(state)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    if line is not None and not args.allow_dirty:
        print(line, file=sys.stderr)
        return 3
    commit = state["commit"][:10] if state["commit"] else "unknown commit"
    dirty = f", DIRTY, run anyway (--allow-dirty, recorded): {len(state['changed'])} changed file(s)"
    print(f"tree: {commit} from {state['source']}" + (dirty if line else ", clean"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
