"""Kill a training run at random moments and resume it: the checkpoint must always load, and the
resumed steps must log what an uninterrupted run logs.

    .venv/bin/python experiments/kill_resume.py [--trials 20] [--steps 6] [--seed 0]

On a tiny random model (the embedded tokenizer, 2 layers) with a checkpoint after every step:

1. one uninterrupted ``memalpha fit`` of ``--steps`` steps gives the reference metrics and its
   wall time;
2. each trial starts the same run afresh and sends it ``SIGKILL`` at a moment drawn uniformly
   from the start of its first step to the end of the reference's wall time (so a kill lands
   in a rollout, an optimiser step, a checkpoint write, the final validation or the export, as
   often as each takes time; the first step's start is estimated from the reference's
   checkpoint times);
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
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO_ROOT, RESULTS_DIR, command_line, machine_info, print_table, tiny_model_folder, write_json

from memalpha.train.demo_summary import event_scalars

COMPARED = ("train/reward", "train/loss", "train/kl", "train/grad_norm", "memory/tokens", "lr")


def write_config(run_dir: Path, model_dir: str, steps: int) -> Path:
    """configs/tiny_cpu.yaml on the tiny model: a checkpoint every step, validation at the end only."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "tiny_cpu.yaml").read_text())
    config["trainer"].update(max_steps=steps, val_check_interval=steps, limit_val_batches=1)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(run_dir), name="tb", version=None)
    config["trainer"]["callbacks"][0]["init_args"].update(dirpath=str(run_dir / "checkpoints"), every_n_train_steps=1)
    config["model"].update(model=model_dir, log_text_every_n_steps=0)
    config["model"]["reader"].update(max_new_tokens=6)
    config["model"]["rollout"].update(group_size=2, max_new_tokens=12, max_prompt_tokens=2048)
    config["model"]["update"].update(micro_batch_size=4)
    config["data"].update(synthetic_train=8, synthetic_val=2, synthetic_chunks=2, synthetic_questions=2,
                          synthetic_chunk_words=30, instances_per_step=2, val_batch_size=2)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


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


def timed_run(config: Path, run_dir: Path) -> tuple[float, list[float]]:
    """Run ``memalpha fit`` to the end; its wall time and the moments ``last.ckpt`` was (re)written."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    start = time.perf_counter()
    process = subprocess.Popen(fit_command(config), env=run_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    saves: list[float] = []
    last_mtime = None
    while process.poll() is None:
        mtime = ckpt.stat().st_mtime_ns if ckpt.exists() else None
        if mtime != last_mtime and mtime is not None:
            saves.append(time.perf_counter() - start)
            last_mtime = mtime
        time.sleep(0.05)
    if process.returncode != 0 or not saves:
        raise SystemExit(f"the uninterrupted run failed (status {process.returncode}); run its config by hand: {config}")
    return time.perf_counter() - start, saves


def trial(index: int, config: Path, run_dir: Path, kill_at_s: float, reference: dict, steps: int) -> dict[str, Any]:
    process = subprocess.Popen(fit_command(config), env=run_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        process.wait(timeout=kill_at_s)
        finished_first = True
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        finished_first = False
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    leftovers = len(list(ckpt.parent.glob(".*.tmp"))) if ckpt.parent.is_dir() else 0
    row: dict[str, Any] = {"trial": index, "kill_at_s": round(kill_at_s, 2), "finished_first": finished_first,
                           "temp_files_left": leftovers}
    saved_step = 0
    if ckpt.exists():
        try:
            saved_step = int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])
            row["checkpoint"] = "loads"
        except Exception as exc:  # the failure this loop exists to catch
            row.update(checkpoint=f"BROKEN: {type(exc).__name__}: {exc}", saved_step=None, matches=False)
            return row
    else:
        row["checkpoint"] = "none yet"
    row["saved_step"] = saved_step
    resume = ["--ckpt_path", str(ckpt)] if ckpt.exists() else []
    start = time.perf_counter()
    done = subprocess.run(fit_command(config, *resume), env=run_env(), capture_output=True, text=True, check=False)
    row["resume_s"] = round(time.perf_counter() - start, 1)
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
        straight_s, save_times = timed_run(write_config(straight_dir, model_dir, args.steps), straight_dir)
        reference = logged(straight_dir)[0]
        step_s = (save_times[-1] - save_times[0]) / max(len(save_times) - 1, 1)
        window = (max(0.0, save_times[0] - step_s), straight_s)  # from the first step's start to the end
        rows = []
        for index in range(args.trials):
            run_dir = scratch / f"trial{index}"
            config = write_config(run_dir, model_dir, args.steps)
            rows.append(trial(index, config, run_dir, rng.uniform(*window), reference, args.steps))
            row = rows[-1]
            print(f"trial {index}: killed at {row['kill_at_s']} s, checkpoint {row['checkpoint']}, "
                  f"step {row.get('saved_step')}, matches {row.get('matches')}", flush=True)
    killed = [r for r in rows if not r["finished_first"]]
    summary = {
        "trials": len(rows),
        "killed": len(killed),
        "checkpoints_loaded": sum(r["checkpoint"] == "loads" for r in rows),
        "broken_checkpoints": sum(r["checkpoint"].startswith("BROKEN") for r in rows),
        "killed_before_first_checkpoint": sum(r["checkpoint"] == "none yet" for r in rows),
        "resumed_runs_matching": sum(bool(r.get("matches")) for r in rows),
        "saved_steps_seen": sorted({r["saved_step"] for r in rows if r.get("saved_step") is not None}),
        "straight_run_s": round(straight_s, 1),
        "kill_window_s": [round(t, 1) for t in window],
    }
    print_table(["trial", "kill at s", "checkpoint", "saved step", "tmp left", "resume s", "matches"],
                [[r["trial"], r["kill_at_s"], r["checkpoint"], r.get("saved_step"), r["temp_files_left"],
                  r.get("resume_s"), r.get("matches")] for r in rows])
    print_table(list(summary), [list(summary.values())])
    write_json({"benchmark": "kill_resume", "command": command_line(), "steps": args.steps, "seed": args.seed,
                "summary": summary, "trials": rows}, args.out, machine=machine)
    print(f"wrote {args.out}")
    ok = summary["broken_checkpoints"] == 0 and summary["resumed_runs_matching"] == len(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
