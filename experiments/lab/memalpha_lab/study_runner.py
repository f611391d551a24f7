"""What every study's command line repeats: its seeds and counts checked, its common options (the run
folder, the summary, ``--reuse``; a pre-registered study's plan and product commits and ``--check``), what
becomes of a run folder left by an earlier run, and the lock two processes over one folder build their
shared start under.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memalpha_lab.common import REPO_ROOT, RESULTS_DIR


def parse_seeds(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--seeds`` as a list of distinct integers; stops with the option's name otherwise."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {text!r}")
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must not repeat a seed, got {text!r}")
    return seeds


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Stop with the option's name when any of ``names`` is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def add_recipe_arguments(parser: argparse.ArgumentParser, *, sft_steps: int, sft_help: str, steps: int,
                         steps_help: str) -> None:
    """The options of the recipe the learning studies run (configs, demonstrations, SFT and GRPO steps)."""
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny_cpu.yaml")
    parser.add_argument("--sft-config", type=Path, default=REPO_ROOT / "configs" / "sft_tiny_cpu.yaml")
    parser.add_argument(
        "--demos", type=int, default=24, help="training instances to draw demonstrations from"
    )
    parser.add_argument("--sft-steps", type=int, default=sft_steps, help=sft_help)
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)


def add_run_arguments(parser: argparse.ArgumentParser, run: str, out: str,
                      reuse_help: str = "keep the stages whose outputs exist") -> None:
    """``--run-dir`` (default ``runs/<run>``), ``--out`` (default ``experiments/results/<out>.json``) and
    ``--reuse``."""
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / run)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / f"{out}.json")
    parser.add_argument("--reuse", action="store_true", help=reuse_help)


def add_plan_arguments(parser: argparse.ArgumentParser, report: str) -> None:
    """A pre-registered study's ``--plan-commit``, ``--product-commit`` and ``--check`` (only ``report``'s
    rebuild of the committed files)."""
    parser.add_argument("--plan-commit", default=None, help="the commit of the pre-registered plan")
    parser.add_argument("--product-commit", default=None,
                        help="the commit whose memalpha/ and configs/ every stage must run (a study that "
                             "spans sessions and machines keeps its product fixed): refused otherwise")
    parser.add_argument("--check", action="store_true",
                        help=f"only rebuild the verdict from the committed files ({report} --check)")


def clear_run_dir(run_dir: Path, reuse: bool) -> None:
    """Without ``--reuse``, delete what an earlier run left in ``run_dir`` (a study that starts afresh)."""
    if not reuse and run_dir.exists():
        shutil.rmtree(run_dir)


def refuse_run_dir(run_dir: Path, reuse: bool, name: str) -> None:
    """Without ``--reuse``, stop in one line when ``run_dir`` exists (a study whose folder is kept)."""
    if not reuse and run_dir.exists():
        raise SystemExit(f"{name}: {run_dir} exists; pass --reuse to continue it (nothing is deleted)")


@contextmanager
def start_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir/start.lock``: a second process over the same folder waits while the first
    builds the start."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "start.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
