"""Soak: hundreds of `memalpha fit` steps on a tiny random model; does memory or the descriptor count creep?

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python experiments/checks/soak.py
        [--steps 300] [--val-every 50]

A run that lasts days dies of what grows a little every step: a list that keeps every round, a
file opened per checkpoint and never closed, a thread per reader call. This script runs
``memalpha fit`` in its own process (``run_lightning_cli``, what the command runs) on
``configs/tiny_cpu.yaml`` pointed at a tiny random Llama (the embedded tokenizer, 2 layers), so a
step takes about a second and every part of a real run takes part: rollouts with tool calls
parsed and executed, the local reader answering from memory, reward scoring, the reference pass,
the update, TensorBoard scalars every step and a rollout as text every 10 steps, ``last.ckpt``
written after every step, and a validation (with its JSON report) every ``--val-every`` steps.

``ResourceProbe``, a Lightning callback, records after every training step the resident set
size (``VmRSS`` of ``/proc/self/status``), the open file descriptors (``/proc/self/fd``), the
threads, and the wall time since the previous step (so a step's time includes the previous
step's checkpoint and any validation). The goal (issue 16): after warm-up, the first 10 % of
the steps, RSS grows by less than 5 % and the descriptor count does not grow. The script prints
a table and writes ``experiments/results/soak.json`` with every step's record; it exits 1 when
the goal is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from lightning.pytorch import Callback

from memalpha_lab.common import (
    RESULTS_DIR,
    command_line,
    machine_info,
    print_table,
    tiny_fit_config,
    tiny_model_folder,
    write_json,
)

DEFAULT_OUT = RESULTS_DIR / "soak.json"
WARMUP_SHARE = 0.1
MAX_RSS_GROWTH_PERCENT = 5.0


def process_status() -> dict[str, int]:
    """This process's resident set size (bytes), open file descriptors and threads, from ``/proc``."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
    fds = len(os.listdir("/proc/self/fd"))
    return {"rss_bytes": fields["VmRSS"] * 1024, "fds": fds, "threads": fields["Threads"]}


class ResourceProbe(Callback):
    """After every training step: RSS, descriptors, threads, the step's wall time; Python objects
    every 10 steps."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._last = time.perf_counter()

    def on_train_start(self, trainer, module) -> None:
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        record: dict[str, Any] = {"step": len(self.records), "global_step": trainer.global_step,
                                  "step_s": round(now - self._last, 4), **process_status()}
        if record["step"] % 10 == 0:
            record["python_objects"] = len(gc.get_objects())
        self.records.append(record)
        self._last = now


def slope_per_100_steps(records: Sequence[dict[str, Any]], key: str) -> float:
    """Least-squares slope of ``key`` against the step, per 100 steps (0 for fewer than two records)."""
    if len(records) < 2:
        return 0.0
    xs = [r["step"] for r in records]
    ys = [r[key] for r in records]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal's numbers: RSS, descriptors and threads just after warm-up and at the end.

    RSS moves by tens of MiB from step to step (the allocator hands freed activations back, or
    not), so one sample can sit on a spike: the goal compares the median RSS of the steps just
    after warm-up with that of as many steps at the end. A leak raises the floor those medians
    sit on; a spike does not.
    """
    warm = max(1, round(WARMUP_SHARE * len(records)))
    after = records[warm:] or records[-1:]
    first, last = after[:warm], after[-warm:]
    mib = 2**20
    rss_start = statistics.median(r["rss_bytes"] for r in first)
    rss_end = statistics.median(r["rss_bytes"] for r in last)
    growth = 100 * (rss_end - rss_start) / rss_start
    summary = {
        "steps": len(records),
        "warmup_steps": warm,
        "window_steps": len(first),
        "rss_first_step_mib": round(records[0]["rss_bytes"] / mib, 1),
        "rss_after_warmup_mib": round(rss_start / mib, 1),
        "rss_end_mib": round(rss_end / mib, 1),
        "rss_min_after_warmup_mib": round(min(r["rss_bytes"] for r in after) / mib, 1),
        "rss_max_after_warmup_mib": round(max(r["rss_bytes"] for r in after) / mib, 1),
        "rss_growth_percent": round(growth, 2),
        "rss_slope_mib_per_100_steps": round(slope_per_100_steps(after, "rss_bytes") / mib, 2),
        "fds_after_warmup": after[0]["fds"],
        "fds_end": after[-1]["fds"],
        "fds_max_after_warmup": max(r["fds"] for r in after),
        "threads_after_warmup": after[0]["threads"],
        "threads_end": after[-1]["threads"],
        "step_s_median": round(statistics.median(r["step_s"] for r in records), 3),
    }
    counted = [r for r in after if "python_objects" in r]
    if counted:
        summary["python_objects_after_warmup"] = [counted[0]["python_objects"], counted[-1]["python_objects"]]
    summary["passed"] = growth < MAX_RSS_GROWTH_PERCENT and after[-1]["fds"] <= after[0]["fds"]
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps to run")
    parser.add_argument("--val-every", type=int, default=50, help="steps between validations (4 instances)")
    parser.add_argument(
        "--model", default=None, help="a local HF folder (default: a fresh tiny random Llama)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.val_every < 1:
        parser.error(f"--steps and --val-every must be >= 1, got {args.steps} and {args.val_every}")
    machine = machine_info()
    from memalpha.train.lightning_cli import run_lightning_cli

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soak_") as scratch:
        scratch = Path(scratch)
        model_dir = args.model or tiny_model_folder(scratch / "model")
        run_dir = scratch / "run"
        config = tiny_fit_config(
            run_dir,
            model_dir,
            steps=args.steps,
            val_every=args.val_every,
            train_instances=64,
            val_instances=4,
            log_text_every_n_steps=10,
            export_adapter_dir=str(run_dir / "adapter"),
        )
        probe = f"{ResourceProbe.__module__}.ResourceProbe"
        cli = run_lightning_cli(["fit", "--config", str(config), f"--trainer.callbacks+={probe}"])
        records = next(c for c in cli.trainer.callbacks if isinstance(c, ResourceProbe)).records
        del cli
    wall_s = time.perf_counter() - started
    summary = summarise(records)
    summary["wall_s"] = round(wall_s, 1)
    print_table(
        [
            "steps",
            "RSS after warm-up MiB",
            "RSS end MiB",
            "growth %",
            "MiB/100 steps",
            "fds start",
            "fds end",
            "threads",
            "step s (median)",
            "wall s",
        ],
        [
            [
                summary["steps"],
                summary["rss_after_warmup_mib"],
                summary["rss_end_mib"],
                summary["rss_growth_percent"],
                summary["rss_slope_mib_per_100_steps"],
                summary["fds_after_warmup"],
                summary["fds_end"],
                f"{summary['threads_after_warmup']}->{summary['threads_end']}",
                summary["step_s_median"],
                summary["wall_s"],
            ]
        ],
    )
    verdict = "met" if summary["passed"] else "MISSED"
    print(f"goal (RSS growth after warm-up < {MAX_RSS_GROWTH_PERCENT} %, descriptors not growing): {verdict}")
    report = {
        "benchmark": "soak",
        "command": command_line(),
        "model": args.model or "tiny random Llama (2 layers, hidden 32, embedded tokenizer)",
        "config": "configs/tiny_cpu.yaml: group 2, 2 instances x 2 chunks x 2 questions, 12 new tokens, "
                  f"reader 6 tokens, checkpoint every step, validation every {args.val_every} steps",
        "goal": {"max_rss_growth_percent": MAX_RSS_GROWTH_PERCENT, "warmup_share": WARMUP_SHARE,
                 "rss": "median of the last warm-up-sized window vs the one just after warm-up",
                 "descriptors": "end <= just after warm-up"},
        "summary": summary,
        "records": records,
    }
    write_json(report, args.out, machine=machine)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    raise SystemExit(0 if main()["summary"]["passed"] else 1)
