"""A study's run folder kept whole across its processes, sessions and machines.

A pre-registered study runs for more CPU hours than a machine is kept here (a session's machine may
be a new one, and only the repository comes along), so its state is committed as it grows.
:func:`save` copies the run folder into a folder of the repository, all but what a model is made of:
of an exported adapter only its config (the SHA-256 of each of its files go into ``adapters.json``;
its weights and tokenizer come back when it is trained again), no Lightning checkpoint, no lock file,
and nothing of a training that was running (its ``.running`` marker, events and adapter: without its
checkpoint it restarts from its beginning anyway). What stays is text: configs, demonstrations, the
compute ledger, logs, TensorBoard events of finished trainings, validation reports and the journals
of validations under way. :func:`restore` lays it back into a run folder of the same path.

An adapter whose weights are not there but whose digests are recorded counts as trained
(:func:`trained`): the stages after it keep their outputs. Where one is needed again (a validation
still to run, or a training that starts from it), the study trains it again from its own config, and
:func:`install` takes the files it lacks only if every file equals the recorded digest (the config up
to the order of ``target_modules``, which PEFT writes in a set's order, different in every process;
the original config is kept). The adapter is then the same bytes in the same place, and a validation
journal of the lost one resumes with it (``memalpha.train.validation_journal`` refuses another
adapter by itself).

Across processes: two processes over one run folder never run the same validation (:func:`claimed`).
Across sessions: the product a study measures stays the one its first stage ran (:func:`check_product`).

Run:  python -m memalpha_lab.run_state save RUN_DIR STATE_DIR
      python -m memalpha_lab.run_state restore STATE_DIR RUN_DIR
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from memalpha_lab.arm_configs import logger
from memalpha_lab.common import REPO_ROOT, write_text_atomically
from memalpha_lab.compute import measured
from memalpha_lab.recipe_configs import load_yaml, write_yaml

DIGESTS = "adapters.json"
"""The run-folder file of every exported adapter's files and their SHA-256, by relative path."""
WEIGHTS = "adapter_model.safetensors"
"""An exported adapter's weights."""
MAX_FILE_BYTES = 8 << 20
"""A file larger than this is no run-state text: :func:`save` stops naming it."""
PRODUCT = ("memalpha", "configs")
"""What a study measures: the package and the configs its stages derive theirs from."""


class RunStateError(SystemExit):
    """A run state that cannot be saved, restored or installed: one line naming the file."""


def digest(path: Path) -> str:
    content = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            content.update(block)
    return content.hexdigest()


def adapter_files(adapter: Path) -> dict[str, str]:
    """Each file of an exported adapter folder, by relative path, with its SHA-256."""
    return {p.relative_to(adapter).as_posix(): digest(p) for p in sorted(adapter.rglob("*")) if p.is_file()}


def recorded(run_dir: Path) -> dict[str, dict[str, str]]:
    """The adapters ``run_dir``'s ``adapters.json`` records (relative folder -> files -> SHA-256)."""
    path = run_dir / DIGESTS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def exported(adapter: Path) -> bool:
    """An exported PEFT adapter: its config and its weights."""
    return (adapter / "adapter_config.json").is_file() and (adapter / WEIGHTS).is_file()


def trained(run_dir: Path, adapter: Path) -> bool:
    """The adapter is exported here, or a restored run state records it (its weights left behind)."""
    relative = adapter.resolve().relative_to(run_dir.resolve()).as_posix()
    return exported(adapter) or relative in recorded(run_dir)


def lost(run_dir: Path, adapter: Path) -> bool:
    """Recorded by a run state but not here: training it again gives the weights back."""
    return not exported(adapter) and trained(run_dir, adapter)


def in_flight(run_dir: Path) -> set[Path]:
    """The folders of the trainings under way (a ``fit_``/``sft_`` stage's ``.running`` marker, in the
    studies' layout: ``sft_start`` trains ``sft/``, ``fit_<run>`` and ``sft_<run>`` ``arms/<run>/``)."""
    folders = set()
    for marker in (run_dir / "compute").glob("*.running"):
        command, _, run = marker.stem.partition("_")
        if command in ("fit", "sft"):
            folders.add(marker)
            folders.add(run_dir / "sft" if run == "start" else run_dir / "arms" / run)
    return folders


def kept_files(run_dir: Path) -> Iterator[Path]:
    """The files :func:`save` copies: all but adapters (their configs kept), checkpoints, locks and the
    trainings under way."""
    skipped = in_flight(run_dir)
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file() or path.suffix in (".ckpt", ".lock") or path.name == DIGESTS:
            continue
        if (path.parent / "adapter_config.json").is_file() and path.name != "adapter_config.json":
            continue  # an adapter's weights and tokenizer: training it again gives them back
        if any(folder == path or folder in path.parents for folder in skipped):
            continue
        if path.relative_to(run_dir).parts[0] in ("checkpoints", "rebuild"):
            continue
        yield path


def save(run_dir: Path, state_dir: Path) -> int:
    """Replace ``state_dir`` by ``run_dir``'s run state (see the module docstring); the files copied."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise RunStateError(f"run_state: {run_dir} is not a run folder")
    files = list(kept_files(run_dir))
    for path in files:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise RunStateError(f"run_state: {path} is {path.stat().st_size >> 20} MiB, too large for a "
                                f"run state (at most {MAX_FILE_BYTES >> 20} MiB a file); nothing was saved")
    digests = dict(recorded(run_dir))
    for path in files:  # the configs kept are those of the finished adapters
        if path.name == "adapter_config.json" and exported(path.parent):
            digests[path.parent.relative_to(run_dir).as_posix()] = adapter_files(path.parent)
    staging = state_dir.with_name(state_dir.name + ".saving")
    shutil.rmtree(staging, ignore_errors=True)
    for path in files:
        target = staging / path.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    staging.mkdir(parents=True, exist_ok=True)
    write_text_atomically(staging / DIGESTS, json.dumps(digests, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(state_dir, ignore_errors=True)
    staging.rename(state_dir)
    return len(files)


def restore(state_dir: Path, run_dir: Path) -> int:
    """Copy ``state_dir``'s files into ``run_dir`` where ``run_dir`` has none of that name (a file the
    run folder holds is as new or newer); the recorded digests are merged. The files copied."""
    if not (state_dir / DIGESTS).is_file():
        raise RunStateError(f"run_state: {state_dir} holds no {DIGESTS}, so it is no saved run state")
    copied = 0
    for path in sorted(state_dir.rglob("*")):
        target = run_dir / path.relative_to(state_dir)
        if path.is_file() and path.name != DIGESTS and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied += 1
    digests = {**recorded(state_dir), **recorded(run_dir)}
    write_text_atomically(run_dir / DIGESTS, json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return copied


def forget(run_dir: Path, adapter: Path) -> None:
    """Drop ``adapter``'s recorded digests (its run is trained anew)."""
    digests = recorded(run_dir)
    if digests.pop(adapter.resolve().relative_to(run_dir.resolve()).as_posix(), None) is not None:
        write_text_atomically(run_dir / DIGESTS, json.dumps(digests, indent=1, sort_keys=True) + "\n")


def install(run_dir: Path, adapter: Path, rebuilt: Path) -> None:
    """Copy the files of the adapter trained again in ``rebuilt`` that the restored folder of the lost
    ``adapter`` lacks (all but its config) into it, when every file equals the recorded digests (the
    config up to the order of ``target_modules``); otherwise stop in one line: it is another adapter,
    and what was measured with the lost one would be mixed with it."""
    relative = adapter.resolve().relative_to(run_dir.resolve()).as_posix()
    want, got = recorded(run_dir).get(relative) or {}, adapter_files(rebuilt)
    differ = sorted(
        name for name in set(want) | set(got)
        if want.get(name) != got.get(name)
        and not (name == "adapter_config.json" and same_config(adapter / name, rebuilt / name))
    )
    if differ:
        raise RunStateError(
            f"run_state: {adapter} trained again in {rebuilt} differs from the recorded one in "
            f"{', '.join(differ)} (another machine's arithmetic, or another config); nothing was "
            f"installed: move that run's folders and validations aside to run it anew"
        )
    adapter.mkdir(parents=True, exist_ok=True)
    for name in got:
        if not (adapter / name).is_file():
            shutil.copy2(rebuilt / name, adapter / name)


def same_config(kept: Path, rebuilt: Path) -> bool:
    """Two PEFT adapter configs equal but for the order of ``target_modules``."""
    if not kept.is_file():
        return False
    configs = [json.loads(path.read_text(encoding="utf-8")) for path in (kept, rebuilt)]
    for config in configs:
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
    return configs[0] == configs[1]


def rebuild(run_dir: Path, adapter: Path, config_path: Path, train: Callable[[Path, Path], None]) -> None:
    """Train the run of the lost ``adapter`` again: ``train(config, log)`` (the study's ``memalpha`` command)
    of its own config redirected to ``rebuild/<run>/`` (its events, checkpoints and compute apart from
    the run's: the stage and log ``rebuild_<run>``), then :func:`install` it and drop the scratch folder."""
    name = adapter.parent.name
    scratch = run_dir / "rebuild" / name
    shutil.rmtree(scratch, ignore_errors=True)
    config = load_yaml(config_path)
    config["trainer"]["logger"] = logger(scratch, "events", name)
    config["model"]["export_adapter_dir"] = str(scratch / "adapter")
    for callback in config["trainer"]["callbacks"]:
        if "dirpath" in callback.get("init_args", {}):
            callback["init_args"]["dirpath"] = str(scratch / "checkpoints")
    with measured(run_dir, f"rebuild_{name}"):
        train(write_yaml(config, scratch / "config.yaml"), run_dir / "logs" / f"rebuild_{name}.log")
    install(run_dir, adapter, scratch / "adapter")
    shutil.rmtree(scratch)


@contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Try to hold an exclusive lock on ``path`` (made if missing) without waiting: yields whether this
    process holds it, until the block ends (or the process does: the kernel drops the lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_product(commit: str, script: str, repo: Path = REPO_ROOT) -> None:
    """Stop in one line, named after ``script``, unless the checkout's :data:`PRODUCT` folders, as they
    are on disk, equal ``commit``'s."""
    done = subprocess.run(["git", "diff", "--quiet", commit, "--", *PRODUCT], cwd=repo,
                          capture_output=True, text=True, check=False)
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", *PRODUCT],
                               cwd=repo, capture_output=True, text=True, check=False).stdout.strip()
    if done.returncode != 0 or untracked:
        why = done.stderr.strip() or ("untracked files" if untracked else "they differ")
        folders = " and ".join(f"{p}/" for p in PRODUCT)
        raise RunStateError(f"{script}: --product-commit {commit}: this checkout's {folders} are not that "
                            f"commit's ({why}); run from a checkout of it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, source, target in (("save", "run_dir", "state_dir"), ("restore", "state_dir", "run_dir")):
        command = sub.add_parser(name)
        command.add_argument(source, type=Path)
        command.add_argument(target, type=Path)
    args = parser.parse_args(argv)
    if args.command == "save":
        print(f"saved {save(args.run_dir, args.state_dir)} files of {args.run_dir} to {args.state_dir}")
    else:
        print(f"restored {restore(args.state_dir, args.run_dir)} files of {args.state_dir} to {args.run_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
