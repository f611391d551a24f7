"""Kill a training run at random moments and resume it: the checkpoint must always load, and the
resumed steps must log what an uninterrupted run logs.

    .venv/bin/python experiments/checks/kill_resume.py [--trials 20] [--steps 6] [--seed 0]

On a tiny random model (the embedded tokenizer, 2 layers) with a checkpoint after every step:

1. one uninterrupted ``memalpha fit`` of ``--steps`` steps gives the reference metrics and its
   wall time;
2. each trial starts the same run afresh and sends it ``SIGKILL`` at a random moment of its
   own progress: after a number of checkpoint writes drawn uniformly from 0 to ``--steps``, a
   delay drawn uniformly over one step (over the validation and export after the last save).
   Within a step the kill lands in the rollout, the reference pass, the optimiser step or the
   checkpoint write as often as each takes time;
3. ``last.ckpt`` must then load with ``torch.load`` (or not exist yet, when the kill came before
   the first save), and the run resumed from it must log, for every step after the checkpoint,
   the reference's ``train/reward``, ``train/loss``, ``train/kl``, ``train/grad_norm``,
   ``memory/tokens`` and ``lr`` (relative 1e-4).

``tests/test_faults.py`` kills at each named phase deterministically; this loop samples
moments the tests did not choose. It prints one row per trial and writes
``experiments/results/kill_resume.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from memalpha_lab.common import (
    RESULTS_DIR,
    command_line,
    machine_info,
    print_table,
    tiny_fit_config,
    tiny_model_folder,
    write_json,
)
from memalpha_lab.tb_scalars import event_scalars

COMPARED = ("train/reward", "train/loss", "train/kl", "train/grad_norm", "memory/tokens", "lr")


def fit_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memalpha.cli", "fit", "--config", str(config), *extra]


def run_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def logged(run_dir: Path) -> list[dict[str, dict[int, float]]]:
    """Each version folder's scalars, oldest first."""
    versions = sorted((run_dir / "tb").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    return [event_scalars(folder, COMPARED) for folder in versions]


def mismatches(reference: dict[str, dict[int, float]], resumed: dict[str, dict[int, float]], start: int,
               steps: int) -> list[str]:
    """The (tag, step) pairs of the resumed run that differ from the reference or are missing."""
    wrong = []
    for tag in COMPARED:
        for step in range(start, steps):
            expected, got = reference[tag][step], resumed.get(tag, {}).get(step)
            if got is None or abs(got - expected) > 1e-4 * abs(expected) + 1e-6:
                wrong.append(f"{tag}@{step}: {got} != {expected}")
    return wrong


class SaveWatcher:
    """Moments, since ``start``, at which a run's ``last.ckpt`` was (re)written (polled every 20 ms)."""

    def __init__(self, ckpt: Path, start: float) -> None:
        self.ckpt, self.start = ckpt, start
        self.saves: list[float] = []
        self._mtime: int | None = None

    def poll(self) -> None:
        mtime = self.ckpt.stat().st_mtime_ns if self.ckpt.exists() else None
        if mtime is not None and mtime != self._mtime:
            self.saves.append(time.perf_counter() - self.start)
            self._mtime = mtime


def timed_run(config: Path, run_dir: Path) -> tuple[float, list[float]]:
    """Run ``memalpha fit`` to the end; its wall time and the moments ``last.ckpt`` was (re)written."""
    start = time.perf_counter()
    process = subprocess.Popen(fit_command(config), env=run_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    watcher = SaveWatcher(run_dir / "checkpoints" / "last.ckpt", start)
    while process.poll() is None:
        watcher.poll()
        time.sleep(0.02)
    if process.returncode != 0 or not watcher.saves:
        raise SystemExit(
            f"the uninterrupted run failed (status {process.returncode}); run its config by hand: {config}"
        )
    return time.perf_counter() - start, watcher.saves


def kill_at(process: subprocess.Popen, watcher: SaveWatcher, after_saves: int, delay_s: float,
            first_step_s: float) -> dict[str, Any]:
    """SIGKILL ``process`` ``delay_s`` after its ``after_saves``-th checkpoint (0: ``delay_s`` after
    ``first_step_s``, the reference's start of the first step). Anchoring on the run's own saves
    keeps the moment inside the intended step however loaded the machine is."""
    while process.poll() is None:
        watcher.poll()
        anchor = first_step_s if after_saves == 0 else (
            watcher.saves[after_saves - 1] if len(watcher.saves) >= after_saves else None)
        if anchor is not None and time.perf_counter() - watcher.start >= anchor + delay_s:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return {"killed": True, "kill_at_s": round(time.perf_counter() - watcher.start, 2)}
        time.sleep(0.005)
    return {"killed": False, "kill_at_s": None}


def trial(index: int, config: Path, run_dir: Path, aim: tuple[int, float], timing: dict[str, float],
          reference: dict, steps: int) -> dict[str, Any]:
    after_saves, delay_s = aim
    start = time.perf_counter()
    process = subprocess.Popen(fit_command(config), env=run_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    row: dict[str, Any] = {
        "trial": index,
        "after_saves": after_saves,
        "delay_s": round(delay_s, 2),
        **kill_at(process, SaveWatcher(ckpt, start), after_saves, delay_s, timing["first_step_s"]),
    }
    row["temp_files_left"] = len(list(ckpt.parent.glob(".*.tmp"))) if ckpt.parent.is_dir() else 0
    saved_step = 0
    if ckpt.exists():
        try:
            saved_step = int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])
            row["checkpoint"] = "loads"
        except Exception as exc:  # noqa: BLE001 - any failure to load is what this loop exists to catch
            row.update(checkpoint=f"BROKEN: {type(exc).__name__}: {exc}", saved_step=None, matches=False)
            return row
    else:
        row["checkpoint"] = "none yet"
    row["saved_step"] = saved_step
    resume = ["--ckpt_path", str(ckpt)] if ckpt.exists() else []
    resume_start = time.perf_counter()
    done = subprocess.run(
        fit_command(config, *resume), env=run_env(), capture_output=True, text=True, check=False
    )
    row["resume_s"] = round(time.perf_counter() - resume_start, 1)
    if done.returncode != 0:
        row.update(matches=False, error=done.stderr.strip().splitlines()[-1:])
        return row
    wrong = mismatches(reference, logged(run_dir)[-1], saved_step, steps)
    row.update(matches=not wrong, mismatches=wrong[:5])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "kill_resume.json")
    args = parser.parse_args(argv)
    machine = machine_info()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="kill_resume_") as scratch:
        scratch = Path(scratch)
        model_dir = tiny_model_folder(scratch / "model")
        straight_dir = scratch / "straight"
        config = tiny_fit_config(
            straight_dir, model_dir, steps=args.steps, val_every=args.steps, log_text_every_n_steps=0
        )
        straight_s, save_times = timed_run(config, straight_dir)
        reference = logged(straight_dir)[0]
        step_s = (save_times[-1] - save_times[0]) / max(len(save_times) - 1, 1)
        timing = {"first_step_s": max(0.0, save_times[0] - step_s), "step_s": step_s,
                  "tail_s": straight_s - save_times[-1], "straight_run_s": straight_s}
        rows = []
        for index in range(args.trials):
            run_dir = scratch / f"trial{index}"
            config = tiny_fit_config(
                run_dir, model_dir, steps=args.steps, val_every=args.steps, log_text_every_n_steps=0
            )
            after_saves = rng.randint(0, args.steps)  # args.steps: after the last save (validation, export)
            delay_s = rng.uniform(0.0, timing["tail_s"] if after_saves == args.steps else step_s)
            rows.append(trial(index, config, run_dir, (after_saves, delay_s), timing, reference, args.steps))
            row = rows[-1]
            print(
                f"trial {index}: killed {row['delay_s']} s after save {after_saves}, checkpoint "
                f"{row['checkpoint']}, step {row.get('saved_step')}, matches {row.get('matches')}",
                flush=True,
            )
    killed = [r for r in rows if r["killed"]]
    summary = {
        "trials": len(rows),
        "killed": len(killed),
        "checkpoints_loaded": sum(r["checkpoint"] == "loads" for r in rows),
        "broken_checkpoints": sum(r["checkpoint"].startswith("BROKEN") for r in rows),
        "killed_before_first_checkpoint": sum(r["checkpoint"] == "none yet" for r in rows),
        "resumed_runs_matching": sum(bool(r.get("matches")) for r in rows),
        "saved_steps_seen": sorted({r["saved_step"] for r in rows if r.get("saved_step") is not None}),
        **{key: round(value, 2) for key, value in timing.items()},
    }
    print_table(
        ["trial", "after save", "+ s", "killed at s", "checkpoint", "saved step", "tmp left", "matches"],
        [
            [
                r["trial"],
                r["after_saves"],
                r["delay_s"],
                r["kill_at_s"],
                r["checkpoint"],
                r.get("saved_step"),
                r["temp_files_left"],
                r.get("matches"),
            ]
            for r in rows
        ],
    )
    print_table(list(summary), [list(summary.values())])
    write_json({"benchmark": "kill_resume", "command": command_line(), "steps": args.steps, "seed": args.seed,
                "summary": summary, "trials": rows}, args.out, machine=machine)
    print(f"wrote {args.out}")
    ok = summary["broken_checkpoints"] == 0 and summary["resumed_runs_matching"] == len(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
