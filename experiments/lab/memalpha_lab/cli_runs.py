"""The product's commands as the studies and benchmarks run them: each ``memalpha`` command in a child
process of its own (its output in a log; :func:`memalpha_stage` also prints its seconds, for the studies
whose stages take minutes), and the demo's cold start (oracle demonstrations, then ``memalpha sft``) that
several of them start from."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from memalpha_lab.common import REPO_ROOT
from memalpha_lab.recipe_configs import load_yaml, sft_config, write_yaml
from memalpha_lab.run_state import exported


def memalpha(args: list[str], log: Path, who: str = "study") -> None:
    """One ``memalpha`` command in a child process, the command line and then its output in ``log``; a
    failure stops the caller in one line naming the command and the log (``who`` names the caller)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "memalpha.cli", *args]
    with open(log, "w", encoding="utf-8") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{who}: `memalpha {' '.join(args)}` failed (status {done.returncode}); see {log}")


def memalpha_stage(*args: str, log: Path) -> None:
    """One stage of a study: :func:`memalpha`, its seconds printed; a failure names the study's script."""
    start = time.perf_counter()
    memalpha(list(args), log, who=Path(sys.argv[0]).stem)
    name = " ".join(a for a in args[:2] if not a.startswith("-"))
    print(f"  memalpha {name} -> {log} ({time.perf_counter() - start:.0f} s)", flush=True)


def cold_start(run_dir: Path, config: Path, sft: Path, who: str = "study") -> Path:
    """The demo's cold start in ``run_dir`` (24 oracle demonstrations of ``config``'s synthetic data,
    2 of its test split, ``sft``'s steps): its adapter, ``run_dir/sft/adapter`` (kept when exported)."""
    adapter = run_dir / "sft" / "adapter"
    if exported(adapter):
        return adapter
    demos = run_dir / "demos"
    memalpha(["data", "demos", "--config", str(config), "--out", str(demos / "train.jsonl"), "--count", "24"],
             run_dir / "logs" / "demos_train.log", who)
    memalpha(["data", "demos", "--config", str(config), "--out", str(demos / "val.jsonl"), "--split", "test",
              "--count", "2"], run_dir / "logs" / "demos_val.log", who)
    base = load_yaml(sft)
    path = write_yaml(sft_config(base, run_dir, base["trainer"]["max_steps"]), run_dir / "sft.yaml")
    memalpha(["sft", "--config", str(path)], run_dir / "logs" / "sft.log", who)
    return adapter
