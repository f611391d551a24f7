"""memalpha's CPU decoding loops against each other and against transformers' in the product's own
phases: `memalpha fit --config configs/tiny_cpu.yaml` with each ``model.rollout.backend``.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_cpu_decoders.py
      [--backends cpu-fused,hf-generate] [--repeats 2] [--steps 3] [--out PATH]

Each run is a real ``memalpha fit`` process of the embedded default's config (its own run folder,
validation off, ``--steps`` optimiser steps from the same seed), so what is timed is what a user
runs: the step's sampling phase (``perf/rollout_s``: the agent's turns, chunk by chunk) and its
reader phase (``perf/reader_s``: the local reader answering every question, through the same
backend), read from the run's TensorBoard events. The first step is a warm-up and is not counted.
The backends run in turn, repeat after repeat (a, b, c, a, b, c, ...), so a slow drift of the
shared cores hits each alike; the load average is recorded. Every backend samples the same
distribution from the same seed, but float rounding sends their draws apart after a few tokens,
so the rounds' lengths differ: the table also gives the tokens each run generated, and the
figure compared is the time per generated agent token and per reader question.

What it decides (issue 45, item 2): a decoder of memalpha's own stays only where it is more than
10 % faster than the alternative in these phases; the result and the decision are in
docs/results.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from memalpha_lab.common import REPO_ROOT, RESULTS_DIR, command_line, machine_info, print_table, write_json
from memalpha_lab.tb_scalars import event_scalars

DEFAULT_OUT = RESULTS_DIR / "bench_cpu_decoders.json"
TAGS = ("perf/rollout_s", "perf/reader_s", "step_s", "perf/generated_tokens", "reader/questions")
HEADERS = ("backend", "runs", "rollout s/step", "agent tokens/step", "ms/agent token", "reader s/step",
           "questions/step", "ms/question", "step s")


def run_config(folder: Path, backend: str, steps: int) -> Path:
    """configs/tiny_cpu.yaml with ``backend``, ``steps`` steps, no validation, logs in ``folder``."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "tiny_cpu.yaml").read_text(encoding="utf-8"))
    config["trainer"].update(max_steps=steps, limit_val_batches=0, enable_progress_bar=False)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(folder), name="tb", version=None)
    config["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(folder / "checkpoints")
    config["model"]["rollout"]["backend"] = backend
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def one_run(backend: str, steps: int, scratch: Path, index: int) -> dict[str, Any]:
    """One ``memalpha fit`` with ``backend``: its per-step timings and counts (the warm-up step dropped)."""
    folder = scratch / f"{index:02d}_{backend}"
    folder.mkdir(parents=True)
    config = run_config(folder, backend, steps)
    command = [str(Path(sys.executable).with_name("memalpha")), "fit", "--config", str(config)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{backend}: memalpha fit exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    [events] = (folder / "tb").glob("version_*")
    scalars = event_scalars(events, TAGS)
    missing = [tag for tag in TAGS if tag not in scalars]
    if missing:
        raise SystemExit(f"{backend}: the run logged no {missing}")
    counted = sorted(scalars["step_s"])[1:]  # the first step warms up
    return {
        "backend": backend,
        "steps": {tag: [scalars[tag][s] for s in counted] for tag in TAGS},
    }


def summary_row(backend: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step means over every counted step of ``runs``, and the times per token and question."""
    def total(tag: str) -> float:
        return sum(sum(run["steps"][tag]) for run in runs)

    steps = sum(len(run["steps"]["step_s"]) for run in runs)
    return {
        "backend": backend,
        "runs": len(runs),
        "steps": steps,
        "rollout_s": total("perf/rollout_s") / steps,
        "agent_tokens": total("perf/generated_tokens") / steps,
        "ms_per_agent_token": 1000 * total("perf/rollout_s") / total("perf/generated_tokens"),
        "reader_s": total("perf/reader_s") / steps,
        "questions": total("reader/questions") / steps,
        "ms_per_question": 1000 * total("perf/reader_s") / total("reader/questions"),
        "step_s": total("step_s") / steps,
        "ms_per_agent_token_by_run": [
            1000 * sum(r["steps"]["perf/rollout_s"]) / sum(r["steps"]["perf/generated_tokens"]) for r in runs
        ],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backends", default="cpu-fused,hf-generate",
                        help="model.rollout.backend values, run in turn")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each backend")
    parser.add_argument("--steps", type=int, default=3,
                        help="optimiser steps a run (the first is not counted)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        parser.error("--steps must be >= 2 (the first is a warm-up) and --repeats >= 1")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    machine = machine_info()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-decoders-") as scratch:
        for repeat in range(args.repeats):
            for backend in backends:
                run = one_run(backend, args.steps, Path(scratch), len(runs))
                runs.append(run)
                print(f"repeat {repeat + 1}/{args.repeats} {backend}: rollout "
                      f"{statistics.mean(run['steps']['perf/rollout_s']):.1f} s/step, reader "
                      f"{statistics.mean(run['steps']['perf/reader_s']):.1f} s/step", flush=True)
    rows = [summary_row(b, [r for r in runs if r["backend"] == b]) for b in backends]
    print_table(HEADERS, [
        (r["backend"], r["runs"], f"{r['rollout_s']:.1f}", f"{r['agent_tokens']:.0f}",
         f"{r['ms_per_agent_token']:.1f}", f"{r['reader_s']:.1f}", f"{r['questions']:.0f}",
         f"{r['ms_per_question']:.0f}", f"{r['step_s']:.1f}")
        for r in rows
    ])
    report = {
        "benchmark": "bench_cpu_decoders",
        "command": command_line(),
        "settings": {"config": "configs/tiny_cpu.yaml", "backends": backends, "repeats": args.repeats,
                     "steps": args.steps, "counted": "steps 2.. of each run"},
        "summary": rows,
        "runs": runs,
    }
    write_json(report, args.out, machine=machine)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
