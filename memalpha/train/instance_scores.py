"""Per-instance scores of a validation report, and the paired interval of their change between
two reports of the same held-out instances.

A validation report holds one record per (instance, rollout); the questions and turns of one
instance are not independent draws (its questions read the same memory), so a comparison is over
instances: each contributes one number per metric, and the 95 % interval of a change is the t
interval of the paired per-instance differences (:func:`memalpha.intervals.paired_interval`),
which removes the instance-to-instance variance both reports share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from memalpha.intervals import paired_interval
from memalpha.tools.executor import SUCCESS_STATUSES

InstanceScores = dict[str, dict[str, dict[str, float]]]
"""``{data_source: {instance_id: {metric: value}}}``."""


def instance_values(records: Iterable[Mapping[str, Any]]) -> InstanceScores:
    """``{source: {instance_id: {metric: value}}}`` from a validation report's records.

    Per instance (averaged over its rollouts when there are several): ``accuracy`` the share of
    its questions scored correct, ``tool_success`` the share of its tool calls that succeeded
    (instances without a call count 0: no call stored nothing), ``memory_tokens`` and
    ``compression`` as recorded, ``mean_reward`` the mean turn reward, and ``fact_recall`` (the
    share of its gold facts in the final memory, :mod:`memalpha.agent.fact_recall`) when every
    rollout of the instance records one (an instance that knows no facts has none).
    """
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    recalls: dict[tuple[str, str], int] = defaultdict(int)
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
        if record.get("fact_recall") is not None:
            values["fact_recall"] = float(record["fact_recall"])
            recalls[key] += 1
        for metric, value in values.items():
            sums[key][metric] += value
        counts[key] += 1
    out: InstanceScores = defaultdict(dict)
    for key, total in sums.items():
        n = counts[key]
        if recalls[key] != n:  # a mean over some rollouts only would not be the instance's
            total.pop("fact_recall", None)
        out[key[0]][key[1]] = {m: v / n for m, v in total.items()}
    return dict(out)


def paired_change(before: InstanceScores, after: InstanceScores, metric: str) -> dict[str, float]:
    """``{mean, half_width, low, high, n}`` of ``after - before`` for ``metric`` over the
    instances both hold (matched by source and instance id); ValueError when they share none."""
    flat_before = {(s, i): v for s, inst in before.items() for i, v in inst.items()}
    flat_after = {(s, i): v for s, inst in after.items() for i, v in inst.items()}
    shared = sorted(flat_before.keys() & flat_after.keys())
    if not shared:
        raise ValueError("the two reports share no instance")
    return paired_interval([flat_after[k][metric] for k in shared], [flat_before[k][metric] for k in shared])
