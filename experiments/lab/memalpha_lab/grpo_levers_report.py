"""Rebuild every interval of the GRPO-levers experiment from its committed files alone.

Run:  .venv/bin/python -m memalpha_lab.grpo_levers_report
          [--scores experiments/results/grpo_levers/instance_scores.json]
          [--summary experiments/results/grpo_levers.json] [--check] [--update]

``experiments/studies/grpo_levers.py`` writes the per-instance scores of every validation it compares
(``{"start": ..., "seeds": {seed: {"grpo": ..., "sft_continued": ..., "lever_<name>": ...}}}``, the
layout of the control arms) and a summary with the intervals. This script recomputes each lever's
paired 95 % intervals against the seed's ``grpo`` run, its ``sft_continued`` run and the ``start``
with the control arms' functions (``control_arms_report.compare``: over seeds first, a t interval
and a two-level bootstrap, where two seeds or more ran; then over instances, pooled), prints them
with each run's recorded compute, and with ``--check`` exits 1 when they differ from the
summary's; ``--update`` rewrites the summary's intervals from the scores file.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memalpha_lab.common import RESULTS_DIR, print_table
from memalpha_lab.control_arms_report import (
    START,
    compare,
    comparison_rows,
    print_compute,
    read_json,
    report_command,
    same_numbers,
    update_summary,
)

REFERENCES = ("grpo", "sft_continued")
"""The seed's control-arms runs every lever is compared with (besides ``start``)."""
LEVER_METRICS = ("accuracy", "fact_recall", "answer_stored", "reader_given_stored", "mean_reward",
                 "tool_success", "memory_tokens")
HEADLINE = ("accuracy", "fact_recall", "answer_stored", "mean_reward")
SCORES_PATH = RESULTS_DIR / "grpo_levers" / "instance_scores.json"
SUMMARY_PATH = RESULTS_DIR / "grpo_levers.json"


def levers_in(scores: Mapping[str, Any]) -> list[str]:
    """The arms named ``lever_*`` of any seed, in the order first seen."""
    found: list[str] = []
    for arms in scores.get("seeds", {}).values():
        found += [arm for arm in arms if arm.startswith("lever_") and arm not in found]
    return found


def lever_comparisons(scores: Mapping[str, Any], metrics: Sequence[str] = LEVER_METRICS) -> dict[str, Any]:
    """``{"lever_X - B": {metric: compare(...)}}`` for every lever and B in the references and ``start``;
    also ``grpo - start`` and ``sft_continued - start`` for scale."""
    pairs = [(lever, other) for lever in levers_in(scores) for other in (*REFERENCES, START)]
    pairs += [(arm, START) for arm in REFERENCES]
    return {f"{a} - {b}": {m: compare(scores, a, b, m) for m in metrics} for a, b in pairs}


def print_levers(compared: Mapping[str, Any], metrics: Sequence[str] = HEADLINE) -> None:
    print(
        "\npaired differences, mean [95 % interval]: over seeds first where 2 or more ran (t with seeds - 1 "
        "df; two-level bootstrap), then over held-out instances (each averaged over the seeds run)"
    )
    rows = [row for name, by_metric in compared.items() for row in comparison_rows(name, by_metric, metrics)]
    print_table(["comparison", "over", "n", *metrics], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scores", type=Path, default=SCORES_PATH)
    parser.add_argument("--summary", type=Path, default=SUMMARY_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the summary's intervals differ")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the summary's intervals from the scores file, keeping the rest of it")
    args = parser.parse_args(argv)
    scores = read_json(args.scores)
    compared = lever_comparisons(scores)
    print_levers(compared)
    if args.update:
        update_summary(args.summary, {"comparisons": compared}, report_command(__file__, argv))
        print(f"(intervals written to {args.summary})")
    if args.summary.exists():
        print_compute(read_json(args.summary).get("runs", {}))
    if args.check:
        ok = same_numbers(compared, read_json(args.summary).get("comparisons"))
        print("rebuilt intervals " + ("match" if ok else "DIFFER from") + f" {args.summary}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
