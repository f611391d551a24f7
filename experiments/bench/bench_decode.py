"""Decoding-step time of memalpha's CPU sampling paths on the parity job's generation.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_decode.py
          [--adapter-path runs/learning_curve/sft/adapter]

The job is ``bench_vs_trl.py --parity``'s: the embedded model with an adapter, ``--prompts``
memorising prompts of the memory job (~560 tokens) sampled ``--group-size`` times each, up to
``--max-new-tokens`` tokens, temperature 1. No end token stops a row (every row decodes the
full length), so every path runs the same number of steps at the same batch and the time per
step compares like with like. The paths, in one process, alternating ``--repeats`` times:

* ``peft``    -- ``backend="hf-generate"``: ``model.generate`` from the prompts' prefix cache,
                 through PEFT's LoRA layers (base product plus two thin ones per adapted layer);
* ``fused``   -- ``backend="cpu-fused"``: memalpha's own decoding step
                 (:mod:`memalpha.lm.sampling.fused_decode`), q/k/v stacked, prompt keys read once per
                 prompt, float32 products packed for the batch's rows
                 (:mod:`memalpha.lm.sampling.packed_linear`);
* ``fused_plain`` -- the same step with its products through ``F.linear`` (packing off).

Prefill (the prompts' keys, once per distinct prompt) is timed apart from the decoding steps.
Without ``--adapter-path`` a fresh adapter with drawn B matrices stands in (same shapes, same
cost). Writes ``experiments/results/bench_decode.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.lm.sampling import fused_decode, generation, packed_linear
from memalpha_lab.common import command_line, machine_info, print_table, write_json
from memalpha_lab.parity_job import add_job_arguments, check_job_arguments, job_settings, load_job

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench_decode.json"
PATHS = ("peft", "fused", "fused_plain")
NO_END = 10**9  # an end token no row emits


class DecodeTimer:
    """Times the decoding loops that :func:`memalpha.lm.sampling.generation.generate` calls
    (not the prefill)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def run_path(
    path: str, model, tokenizer, rows: list[list[int]], max_new_tokens: int, seed: int
) -> dict[str, float]:
    """One generation of ``rows`` through ``path``; total and decoding seconds."""
    timer = DecodeTimer()
    saved = (generation._hf_generate, generation.decode_fused)

    generation._hf_generate = timer.wrap(saved[0])
    generation.decode_fused = timer.wrap(fused_decode.decode_fused)
    packing = packed_linear.packing_available
    if path == "fused_plain":
        packed_linear.packing_available = lambda: False
    try:
        start = time.perf_counter()
        out = generation.generate(
            model, tokenizer, rows, max_new_tokens=max_new_tokens, seed=seed, eos_token_id=NO_END,
            backend="hf-generate" if path == "peft" else "cpu-fused",
        )
        total = time.perf_counter() - start
    finally:
        generation._hf_generate, generation.decode_fused = saved
        packed_linear.packing_available = packing
    return {
        "total_s": total,
        "decode_s": timer.seconds,
        "prefill_s": total - timer.seconds,
        "tokens": out.num_generated_tokens,
        "ms_per_step": 1000 * timer.seconds / max_new_tokens,
    }


def summarise(records: list[dict[str, float]]) -> dict[str, float]:
    return {
        "runs": len(records),
        "total_s_median": statistics.median(r["total_s"] for r in records),
        "prefill_s_median": statistics.median(r["prefill_s"] for r in records),
        "decode_s_median": statistics.median(r["decode_s"] for r in records),
        "ms_per_step_median": statistics.median(r["ms_per_step"] for r in records),
        "ms_per_step_min": min(r["ms_per_step"] for r in records),
        "ms_per_step_max": max(r["ms_per_step"] for r in records),
        "tokens_per_s": sum(r["tokens"] for r in records) / sum(r["total_s"] for r in records),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of all paths, alternating")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS), help="JSON report path")
    args = parser.parse_args(argv)
    check_job_arguments(parser, args, "repeats")
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        parser.error(f"--paths: unknown {unknown or 'empty list'}; choose from {list(PATHS)}")
    args.paths = paths
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = machine_info()
    torch.manual_seed(args.seed)
    model, tokenizer, prompts, rows = load_job(args, job_seed=args.seed)
    records: dict[str, list[dict[str, float]]] = {path: [] for path in args.paths}
    for repeat in range(args.repeats):
        for path in args.paths:
            record = run_path(path, model, tokenizer, rows, args.max_new_tokens, args.seed + repeat)
            records[path].append(record)
            print(
                f"[bench_decode] repeat {repeat + 1}/{args.repeats} {path}: {record['ms_per_step']:.1f} "
                f"ms/step, prefill {record['prefill_s']:.2f} s",
                flush=True,
            )
    summary = {path: summarise(recs) for path, recs in records.items()}
    print_table(
        ["path", "runs", "ms/step med", "min", "max", "prefill s", "decode s", "total s", "tok/s"],
        [
            [path, s["runs"], s["ms_per_step_median"], s["ms_per_step_min"], s["ms_per_step_max"],
             s["prefill_s_median"], s["decode_s_median"], s["total_s_median"], s["tokens_per_s"]]
            for path, s in summary.items()
        ],
        floats=2,
    )
    report = {
        "benchmark": "bench_decode",
        "command": command_line(),
        "settings": job_settings(args, prompts),
        "summary": summary,
        "runs": records,
    }
    path = write_json(report, args.out, machine=machine)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
