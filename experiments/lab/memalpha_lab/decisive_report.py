"""The pre-registered decisive experiment's verdict, rebuilt from its committed files alone.

Run:  .venv/bin/python -m memalpha_lab.decisive_report
          [--scores experiments/results/decisive/instance_scores.json]
          [--summary experiments/results/decisive.json] [--check]

``experiments/studies/decisive.py`` writes the per-instance scores of every validation
(``{"start": {source: {instance: {metric: value}}}, "seeds": {seed: {"grpo": ..., "sft_continued":
...}}}``, the control arms' layout, each instance also holding ``memory_share``) and a summary. This
script rebuilds from the scores file, with the control arms' functions (``control_arms_report``), the
paired comparisons, the arm means, the guard and the verdict, prints them, and with ``--check`` exits 1
when they differ from the summary's. The planned seeds come from the summary's settings.

The rule (docs/results.md, "Pre-registered: does GRPO beat SFT continued for the same time?"):

* primary metric: local-reader ``accuracy``, ``grpo - sft_continued`` paired per held-out instance;
  each seed's paired mean change, then the 95 % Student t interval over the seeds (``seeds - 1``
  degrees of freedom, :func:`memalpha_lab.seed_intervals.seed_interval`);
* guard: ``memory_share`` (an instance's final memory tokens over its input tokens) averaged over the
  held-out instances is at most :data:`GUARD_LIMIT` in every seed's ``grpo`` run (a policy that
  copies its input fails it);
* verdict, only once every planned seed holds both arms (before that: ``pending``): "GRPO is worse"
  when the interval's high end is below 0; "GRPO beats" when its low end is above 0 and the guard
  holds; "not shown" otherwise (the interval holds 0, or it is above 0 but the guard fails).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memalpha_lab.common import RESULTS_DIR, print_table
from memalpha_lab.control_arms_report import (
    START,
    arm_means,
    arm_scores,
    compare,
    comparison_rows,
    print_compute,
    read_json,
    same_numbers,
    seed_average,
    seeds_with,
)

GRPO, SFT = "grpo", "sft_continued"
PRIMARY = "accuracy"
SECONDARY = ("fact_recall", "tool_success")
METRICS = (PRIMARY, *SECONDARY, "answer_stored", "mean_reward", "memory_tokens", "memory_share")
COMPARISONS: tuple[tuple[str, str], ...] = ((GRPO, SFT), (GRPO, START), (SFT, START))
GUARD_METRIC = "memory_share"
GUARD_LIMIT = 0.5
VERDICTS = ("GRPO beats", "not shown", "GRPO is worse")
PENDING = "pending"
SCORES_PATH = RESULTS_DIR / "decisive" / "instance_scores.json"
SUMMARY_PATH = RESULTS_DIR / "decisive.json"


def comparisons(scores: Mapping[str, Any], metrics: Sequence[str] = METRICS) -> dict[str, dict[str, Any]]:
    """``{"A - B": {metric: control_arms_report.compare(...)}}`` for every pair of :data:`COMPARISONS`."""
    return {f"{a} - {b}": {m: compare(scores, a, b, m) for m in metrics} for a, b in COMPARISONS}


def run_guard(scores: Mapping[str, Any], seed: str, arm: str) -> float | None:
    """The mean over held-out instances of ``memory_share`` of one run; None when it is not run."""
    run = arm_scores(scores, seed, arm)
    if run is None:
        return None
    values = list(seed_average([run], GUARD_METRIC).values())
    return sum(values) / len(values) if values else None


def guard(scores: Mapping[str, Any], arm: str = GRPO) -> dict[str, Any]:
    """``{"limit", "per_seed": {seed: mean memory share}, "passed"}`` of ``arm``: passed when every run
    of it has one and it is at most :data:`GUARD_LIMIT`."""
    per_seed = {s: run_guard(scores, s, arm) for s in sorted(scores.get("seeds", {}), key=int)}
    per_seed = {s: v for s, v in per_seed.items() if v is not None}
    passed = bool(per_seed) and all(v <= GUARD_LIMIT for v in per_seed.values())
    return {"limit": GUARD_LIMIT, "per_seed": per_seed, "passed": passed}


def verdict_of(interval: Mapping[str, float] | None, guard_passed: bool, complete: bool,
               verdicts: Sequence[str] = VERDICTS) -> str:
    """The pre-registered rule: one of ``verdicts`` (beats, not shown, is worse; :data:`VERDICTS`) from the
    t interval over seeds of the primary comparison, or :data:`PENDING` while planned seeds are missing."""
    if not complete or interval is None:
        return PENDING
    if interval["high"] < 0:
        return verdicts[2]
    if interval["low"] > 0 and guard_passed:
        return verdicts[0]
    return verdicts[1]


def decision(scores: Mapping[str, Any], planned_seeds: Sequence[int], treatment: str, control: str,
             arms: Sequence[str], verdicts: Sequence[str] = VERDICTS,
             metric: str = PRIMARY) -> dict[str, Any]:
    """A study's verdict with what it rests on: the primary ``treatment - control`` t interval over the
    seeds on ``metric``, the seeds that hold every one of ``arms``, the planned ones, and each arm's
    guard (the treatment's decides)."""
    level = compare(scores, treatment, control, metric)["seed_level"]
    done = [int(s) for s in seeds_with(scores, arms)]
    complete = bool(planned_seeds) and set(planned_seeds) <= set(done)
    guards = {arm: guard(scores, arm) for arm in arms}
    interval = None if level is None else level["t"]
    return {
        "verdict": verdict_of(interval, guards[treatment]["passed"], complete, verdicts),
        "metric": metric, "comparison": f"{treatment} - {control}", "t_over_seeds": interval,
        "seeds_done": done, "seeds_planned": list(planned_seeds), "guard": guards,
    }


def decide(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> dict[str, Any]:
    """The decisive study's :func:`decision`: ``grpo - sft_continued``."""
    return decision(scores, planned_seeds, GRPO, SFT, (GRPO, SFT))


def rebuild(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> dict[str, Any]:
    """Everything the summary holds that the scores file determines."""
    return {"arm_means": arm_means(scores, METRICS), "comparisons": comparisons(scores),
            "decision": decide(scores, planned_seeds)}


def print_decisive(rebuilt: Mapping[str, Any]) -> None:
    """The paired comparisons (seed level first), then the guard and the verdict."""
    print("\npaired differences, mean [95 % interval]: t over seeds (seeds - 1 df), two-level bootstrap,"
          " then over held-out instances (each averaged over the seeds first)")
    headline = (PRIMARY, *SECONDARY)
    rows = [row for name, by_metric in rebuilt["comparisons"].items()
            for row in comparison_rows(name, by_metric, headline)]
    print_table(["comparison", "over", "n", *headline], rows)
    decision = rebuilt["decision"]
    for arm, held in decision["guard"].items():
        shares = ", ".join(f"seed {s}: {v:.3f}" for s, v in held["per_seed"].items()) or "no run"
        print(f"guard ({arm}: memory tokens / input tokens <= {held['limit']}): "
              f"{'passed' if held['passed'] else 'NOT passed'} ({shares})")
    t = decision["t_over_seeds"]
    where = "-" if t is None else f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]"
    print(
        f"verdict ({decision['comparison']}, {decision['metric']}, t over seeds {decision['seeds_done']} of "
        f"{decision['seeds_planned']}: {where}): {decision['verdict']}"
    )


def report_main(argv: list[str] | None, description: str, rebuild_from: Callable[..., dict[str, Any]],
                scores_path: Path, summary_path: Path,
                printer: Callable[[Mapping[str, Any]], None] | None = None) -> int:
    """A study report's command line: rebuild (``rebuild_from(scores, planned seeds)``) from the scores
    file, print it (``printer``, :func:`print_decisive` by default), and with ``--check`` exit 1 when
    the summary's numbers differ."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--scores", type=Path, default=scores_path)
    parser.add_argument("--summary", type=Path, default=summary_path)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless the summary's numbers are rebuilt"
    )
    args = parser.parse_args(argv)
    scores = read_json(args.scores)
    summary = read_json(args.summary) if args.summary.exists() else {}
    planned = summary.get("settings", {}).get("seeds", [])
    rebuilt = rebuild_from(scores, planned)
    (printer or print_decisive)(rebuilt)
    if summary:
        print_compute(summary.get("runs", {}))
    if args.check:
        ok = bool(summary) and all(same_numbers(rebuilt[key], summary.get(key)) for key in rebuilt)
        print("rebuilt numbers " + ("match" if ok else "DIFFER from") + f" {args.summary}")
        return 0 if ok else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, __doc__.split("\n", 1)[0], rebuild, SCORES_PATH, SUMMARY_PATH)


if __name__ == "__main__":
    raise SystemExit(main())
