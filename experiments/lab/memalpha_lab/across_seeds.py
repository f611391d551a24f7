"""Learning-curve reports combined over seeds (``experiments/results/learning_curve_seeds.json``; its
script, ``experiments/studies/learning_curve_seeds.py``, is retired: docs/results.md says where it is).

Each report of ``experiments/studies/learning_curve.py`` holds, per seed run, its last-validation-
minus-start change paired over the held-out instances (with its own 95 % interval). :func:`combine`
takes those per-seed means and gives their mean with a 95 % t interval over seeds (``n - 1`` degrees
of freedom, :func:`memalpha_lab.stats.mean_ci`), after checking that the reports share their recipe.
"""

from __future__ import annotations

from typing import Any

from memalpha_lab.stats import METRICS, mean_ci

SEED_ONLY = ("seeds",)  # settings allowed to differ between the reports


def seed_changes(report: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """``[{"seed", "source", "change": {metric: {mean, half_width, n}}}]`` for every seed run of a report."""
    try:
        return [
            {"seed": run["seed"], "source": where, "change": run["change_last_minus_start"]}
            for run in report["seeds"]
        ]
    except (KeyError, TypeError) as error:
        raise ValueError(f"{where}: not a learning_curve.py report (missing {error})") from None


def combine(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-seed changes and their across-seed mean ± 95 % t interval, per metric."""
    if not reports:
        raise ValueError("no reports")
    settings = {where: {k: v for k, v in r.get("settings", {}).items() if k not in SEED_ONLY}
                for where, r in reports.items()}
    first_where, first = next(iter(settings.items()))
    for where, other in settings.items():
        if other != first:
            keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            raise ValueError(f"{where}: settings differ from {first_where}'s in {keys}")
    runs = [run for where, report in reports.items() for run in seed_changes(report, where)]
    seeds = [run["seed"] for run in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed appears twice: {seeds}")
    across = {metric: mean_ci([run["change"][metric]["mean"] for run in runs]) for metric in METRICS}
    beyond = {
        metric: sum(run["change"][metric]["mean"] > run["change"][metric]["half_width"] for run in runs)
        for metric in METRICS
    }
    return {"settings": first, "runs": runs, "across_seeds": across,
            "seeds_rising_beyond_own_interval": beyond}
