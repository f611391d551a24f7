"""Confidence intervals for the learning-curve benchmark: per-instance values, t intervals.

A validation report holds one record per (instance, rollout); its questions and turns are not
independent draws (the questions of one instance read the same memory), so every interval here
is over instances: each instance contributes one number (its question accuracy, its tool
success, its mean turn reward, ...), and the 95 % interval is the Student t interval of their
mean. Comparing two checkpoints on the same instances uses the paired differences, which
removes the instance-to-instance variance both share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memalpha.intervals import mean_interval, t_quantile
from memalpha.train.instance_scores import InstanceScores, paired_change

METRICS = ("accuracy", "tool_success", "memory_tokens", "compression", "mean_reward")


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom
    (:func:`memalpha.intervals.t_quantile`)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return t_quantile(0.975, df)


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "half_width", "n"}``: the mean and the half width of its 95 % t interval
    (:func:`memalpha.intervals.mean_interval`; half width 0 for a single value)."""
    interval = mean_interval(values)
    return {"mean": interval["mean"], "half_width": interval["half_width"], "n": interval["n"]}


def summarise_with_ci(per_instance: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, Any]:
    """Per source and ``all``: each metric's mean and 95 % interval over instances."""
    groups = {source: list(instances.values()) for source, instances in sorted(per_instance.items())}
    groups["all"] = [v for instances in per_instance.values() for v in instances.values()]
    return {
        source: {metric: mean_ci([v[metric] for v in values]) for metric in METRICS}
        for source, values in groups.items()
    }


def paired_difference(before: InstanceScores, after: InstanceScores, metric: str) -> dict[str, float]:
    """Mean and 95 % interval of ``after - before`` over the instances both reports hold
    (:func:`memalpha.train.instance_scores.paired_change`); ValueError when they share none."""
    change = paired_change(before, after, metric)
    if change is None:
        raise ValueError("the two reports share no instance")
    return {"mean": change["mean"], "half_width": change["half_width"], "n": change["n"]}
