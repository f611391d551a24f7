"""Rebuild every interval of the GRPO-levers experiment from its committed files alone.

Run:  .venv/bin/python experiments/grpo_levers_report.py
          [--scores experiments/results/grpo_levers/instance_scores.json]
          [--summary experiments/results/grpo_levers.json] [--check]

``experiments/grpo_levers.py`` writes the per-instance scores of every validation it compares
(``{"start": ..., "seeds": {seed: {"grpo": ..., "sft_continued": ..., "lever_<name>": ...}}}``, the
layout of the control arms) and a summary with the intervals. This script recomputes each lever's
paired 95 % t intervals against the seed's ``grpo`` run, its ``sft_continued`` run and the
``start`` with the control arms' functions, prints them, and with ``--check`` exits 1 when they
differ from the summary's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, print_table
from control_arms_report import START, compare, format_interval, read_json, same_numbers

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
    print("\npaired over held-out instances, 95 % t intervals (over the seeds run: one by default)")
    rows = [[name, *[format_interval(by_metric[m]["pooled"]) for m in metrics]] for name, by_metric in compared.items()]
    print_table(["comparison", *metrics], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scores", type=Path, default=SCORES_PATH)
    parser.add_argument("--summary", type=Path, default=SUMMARY_PATH)
    parser.add_argument("--check", action="store_true", help="exit 1 when the summary's intervals differ")
    args = parser.parse_args(argv)
    scores = read_json(args.scores)
    compared = lever_comparisons(scores)
    print_levers(compared)
    if args.check:
        ok = same_numbers(compared, read_json(args.summary).get("comparisons"))
        print("rebuilt intervals " + ("match" if ok else "DIFFER from") + f" {args.summary}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
