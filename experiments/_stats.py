"""Confidence intervals for the learning-curve benchmark: per-instance values, t intervals.

A validation report holds one record per (instance, rollout); its questions and turns are not
independent draws (the questions of one instance read the same memory), so every interval here
is over instances: each instance contributes one number (its question accuracy, its tool
success, its mean turn reward, ...), and the 95 % interval is the Student t interval of their
mean. Comparing two checkpoints on the same instances uses the paired differences, which
removes the instance-to-instance variance both share.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memalpha.tools.executor import SUCCESS_STATUSES

# Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom, then the normal value.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
_T975_40, _T975_60, _T975_120, _Z975 = 2.021, 2.000, 1.980, 1.960

METRICS = ("accuracy", "tool_success", "memory_tokens", "compression", "mean_reward")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (table values; between
    the tabulated 30, 40, 60 and 120 the next smaller df's, which is conservative)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= 30:
        return _T975[df - 1]
    if df < 40:
        return _T975[29]
    if df < 60:
        return _T975_40
    if df < 120:
        return _T975_60
    return _T975_120 if df < 1000 else _Z975


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "half_width", "n"}``: the mean and the half width of its 95 % t interval
    (half width 0 for a single value: there is no spread to estimate)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "half_width": 0.0, "n": 1}
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return {"mean": mean, "half_width": t975(n - 1) * math.sqrt(var / n), "n": n}


def instance_values(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{source: {instance_id: {metric: value}}}`` from a validation report's records.

    Per instance (averaged over its rollouts when there are several): ``accuracy`` the share of
    its questions scored correct, ``tool_success`` the share of its tool calls that succeeded
    (instances without a call count 0: no call stored nothing), ``memory_tokens`` and
    ``compression`` as recorded, ``mean_reward`` the mean turn reward.
    """
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for record in records:
        key = (record["data_source"], record["instance_id"])
        scores = [q["score"] for q in record["questions"]]
        results = [res for turn in record["turns"] for res in turn["results"]]
        rewards = [turn.get("reward", 0.0) for turn in record["turns"]]
        values = {
            "accuracy": sum(scores) / len(scores) if scores else 0.0,
            "tool_success": (
                sum(res["status"] in SUCCESS_STATUSES for res in results) / len(results) if results else 0.0
            ),
            "memory_tokens": float(record["memory_tokens"]),
            "compression": float(record["r3"]),
            "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        }
        for metric, value in values.items():
            sums[key][metric] += value
        counts[key] += 1
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (source, instance), total in sums.items():
        out[source][instance] = {m: v / counts[(source, instance)] for m, v in total.items()}
    return dict(out)


def summarise_with_ci(per_instance: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, Any]:
    """Per source and ``all``: each metric's mean and 95 % interval over instances."""
    groups = {source: list(instances.values()) for source, instances in sorted(per_instance.items())}
    groups["all"] = [v for instances in per_instance.values() for v in instances.values()]
    return {
        source: {metric: mean_ci([v[metric] for v in values]) for metric in METRICS}
        for source, values in groups.items()
    }


def paired_difference(
    before: Mapping[str, Mapping[str, Mapping[str, float]]],
    after: Mapping[str, Mapping[str, Mapping[str, float]]],
    metric: str,
) -> dict[str, float]:
    """Mean and 95 % interval of ``after - before`` over the instances both reports hold."""
    flat_before = {(s, i): v for s, inst in before.items() for i, v in inst.items()}
    flat_after = {(s, i): v for s, inst in after.items() for i, v in inst.items()}
    shared = sorted(flat_before.keys() & flat_after.keys())
    if not shared:
        raise ValueError("the two reports share no instance")
    return mean_ci([flat_after[k][metric] - flat_before[k][metric] for k in shared])
