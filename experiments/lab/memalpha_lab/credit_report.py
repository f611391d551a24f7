"""The pre-registered credit study's verdict (issue 47), rebuilt from its committed files alone.

Run:  .venv/bin/python experiments/studies/credit_study.py --check
      (this module's ``main``: [--scores experiments/results/credit_study/instance_scores.json]
       [--summary experiments/results/credit_study.json] [--check])

``experiments/studies/credit_study.py`` writes the per-instance scores of every validation
(``{"start": ..., "seeds": {seed: {"grpo_per_chunk": ..., "grpo": ..., "sft_continued": ...}}}``, the
control arms' layout, each instance holding ``memory_share``) and a summary. This module rebuilds
from the scores file the arm means, the paired comparisons (pooled and per family), the guards and
the verdict, prints them, and with ``--check`` exits 1 when they differ from the summary's.

The rule (docs/results.md, "Pre-registered: does per-chunk credit make GRPO beat SFT continued?"):

* primary metric: local-reader ``accuracy``, ``grpo_per_chunk - sft_continued`` paired per held-out
  instance; each seed's paired mean change, then the 95 % Student t interval over the seeds;
* guard: ``memory_share`` averaged over the held-out instances is at most
  :data:`~memalpha_lab.decisive_report.GUARD_LIMIT` in every seed's ``grpo_per_chunk`` run;
* verdict, once every planned seed holds all three arms (before that: ``pending``): "per-chunk GRPO
  is worse" when the interval's high end is below 0; "per-chunk GRPO beats" when its low end is above 0
  and the guard holds; "not shown" otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memalpha_lab.common import RESULTS_DIR
from memalpha_lab.control_arms_report import (
    START,
    arm_means,
    compare,
)
from memalpha_lab.decisive_report import METRICS, PRIMARY, SECONDARY, decision, report_main
from memalpha_lab.decisive_report import verdict_of as decisive_verdict

PER_CHUNK, GRPO, SFT = "grpo_per_chunk", "grpo", "sft_continued"
ARMS = (PER_CHUNK, GRPO, SFT)
COMPARISONS: tuple[tuple[str, str], ...] = (
    (PER_CHUNK, SFT), (PER_CHUNK, GRPO), (GRPO, SFT), (PER_CHUNK, START), (GRPO, START), (SFT, START),
)
FAMILIES = ("synth_personal", "synth_timeline")
FAMILY_COMPARISONS: tuple[tuple[str, str], ...] = ((PER_CHUNK, GRPO), (PER_CHUNK, SFT))
VERDICTS = ("per-chunk GRPO beats", "not shown", "per-chunk GRPO is worse")
SCORES_PATH = RESULTS_DIR / "credit_study" / "instance_scores.json"
SUMMARY_PATH = RESULTS_DIR / "credit_study.json"


def family_scores(scores: Mapping[str, Any], family: str) -> dict[str, Any]:
    """``scores`` with every run restricted to the held-out instances of one data source."""

    def only(run: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if run is None else {family: run[family]} if family in run else {}

    return {START: only(scores.get(START)),
            "seeds": {seed: {arm: only(run) for arm, run in arms.items()}
                      for seed, arms in scores.get("seeds", {}).items()}}


def comparisons(scores: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"A - B": {metric: compare(...)}}`` for :data:`COMPARISONS` on every metric, then
    ``{"A - B (family)": ...}`` for :data:`FAMILY_COMPARISONS` on the primary and secondary metrics."""
    out = {f"{a} - {b}": {m: compare(scores, a, b, m) for m in METRICS} for a, b in COMPARISONS}
    for family in FAMILIES:
        part = family_scores(scores, family)
        for a, b in FAMILY_COMPARISONS:
            out[f"{a} - {b} ({family})"] = {m: compare(part, a, b, m) for m in (PRIMARY, *SECONDARY)}
    return out


def verdict_of(interval: Mapping[str, float] | None, guard_passed: bool, complete: bool) -> str:
    """The pre-registered rule on the t interval over seeds of the primary comparison."""
    return decisive_verdict(interval, guard_passed, complete, VERDICTS)


def decide(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> dict[str, Any]:
    """The verdict (:func:`~memalpha_lab.decisive_report.decision`) of ``grpo_per_chunk - sft_continued``
    over the seeds that hold all three arms, with every trained arm's guard."""
    return decision(scores, planned_seeds, PER_CHUNK, SFT, ARMS, VERDICTS)


def rebuild(scores: Mapping[str, Any], planned_seeds: Sequence[int]) -> dict[str, Any]:
    """Everything the summary holds that the scores file determines."""
    return {"arm_means": arm_means(scores, METRICS, ARMS), "comparisons": comparisons(scores),
            "decision": decide(scores, planned_seeds)}


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, __doc__.split("\n", 1)[0], rebuild, SCORES_PATH, SUMMARY_PATH)


if __name__ == "__main__":
    raise SystemExit(main())
