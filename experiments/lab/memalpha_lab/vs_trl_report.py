"""The timing report of ``experiments/bench/bench_vs_trl.py``: each side's runs pooled (step 0
dropped as warm-up when a run has more than one step), memalpha / TRL for the headline figures,
the table rows, and each side's reward per step (a description; the learning comparison is the
parity mode's, :mod:`.vs_trl_parity`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from memalpha_lab.vs_trl_job import SIDES, BenchSettings


def kept_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of a run that count: all but step 0 (warm-up) when the run has more than one."""
    steps = run["steps"]
    return steps[1:] if len(steps) > 1 else steps


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled statistics over the kept steps of one side's runs."""
    steps = [s for run in runs for s in kept_steps(run)]
    step_s = [s["step_s"] for s in steps]
    gen_s = [s["gen_s"] for s in steps]
    tokens = sum(s["generated_tokens"] for s in steps)
    return {
        "runs": len(runs),
        "steps_kept": len(steps),
        "step_s_median": statistics.median(step_s),
        "step_s_min": min(step_s),
        "step_s_max": max(step_s),
        "gen_s_median": statistics.median(gen_s),
        "train_s_median": statistics.median(s["step_s"] - s["gen_s"] for s in steps),
        "tokens_per_step_mean": tokens / len(steps),
        "tokens_per_s": tokens / sum(step_s),
        "gen_tokens_per_s": tokens / sum(gen_s),
        "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        "rss_after_import_mib": max(run["rss_after_import_mib"] for run in runs),
        "setup_s_median": statistics.median(run["setup_s"] for run in runs),
        "reward_mean": statistics.fmean(s["reward"] for s in steps),
    }


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """memalpha / TRL for the headline figures (below 1 is better for times and memory, above 1
    for tokens/s)."""
    keys = ("step_s_median", "gen_s_median", "train_s_median", "tokens_per_s", "gen_tokens_per_s",
            "peak_rss_mib")
    return {key: ours[key] / theirs[key] if theirs[key] else float("nan") for key in keys}


TABLE_HEADERS = (
    "side", "runs", "steps", "step s med", "min", "max", "gen s", "train s", "tok/step",
    "tok/s", "gen tok/s", "peak RSS MiB", "reward",
)


def table_rows(summary: dict[str, dict[str, Any]], ratio: dict[str, float] | None) -> list[list[Any]]:
    rows = []
    for side, s in summary.items():
        rows.append([
            side, s["runs"], s["steps_kept"], s["step_s_median"], s["step_s_min"], s["step_s_max"],
            s["gen_s_median"], s["train_s_median"], s["tokens_per_step_mean"], s["tokens_per_s"],
            s["gen_tokens_per_s"], s["peak_rss_mib"], s["reward_mean"],
        ])
    if ratio is not None:
        rows.append([
            "memalpha/trl", None, None, ratio["step_s_median"], None, None, ratio["gen_s_median"],
            ratio["train_s_median"], None, ratio["tokens_per_s"], ratio["gen_tokens_per_s"],
            ratio["peak_rss_mib"], None,
        ])
    return rows


def build_report(settings: BenchSettings, repeats: int, sides: Sequence[str],
                 runs: dict[str, list[dict[str, Any]]], order: list[str]) -> dict[str, Any]:
    """The report over the runs so far; ``complete`` is False until every planned run is in."""
    summary = {side: summarise(done) for side, done in runs.items() if done}
    ratio = ratios(summary["memalpha"], summary["trl"]) if set(SIDES) <= set(summary) else None
    learning = learning_summary(runs, settings.steps) if any(runs.values()) else None
    return {"settings": asdict(settings), "repeats": repeats, "complete": len(order) == repeats * len(sides),
            "order": order, "summary": summary, "ratio_memalpha_over_trl": ratio, "learning": learning,
            "runs": runs}


def learning_summary(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """Mean reward per step of each side (mean, min and max over its runs) and each run's mean
    reward over the last half of its steps. A description only: the learning comparison is the
    parity mode's (``experiments/lab/memalpha_lab/parity.py``)."""
    window = max(1, steps // 2)
    per_side: dict[str, Any] = {}
    for side in [side for side in runs if runs.get(side)]:
        curves = [[s["reward"] for s in run["steps"]] for run in runs[side]]
        per_side[side] = {
            "reward_per_step_mean": [statistics.fmean(c[i] for c in curves) for i in range(steps)],
            "reward_per_step_min": [min(c[i] for c in curves) for i in range(steps)],
            "reward_per_step_max": [max(c[i] for c in curves) for i in range(steps)],
            "final_window_per_run": [statistics.fmean(c[-window:]) for c in curves],
        }
        per_side[side]["final_window_mean"] = statistics.fmean(per_side[side]["final_window_per_run"])
    return {"final_window_steps": window, "sides": per_side}
