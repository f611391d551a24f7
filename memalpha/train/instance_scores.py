"""Per-instance scores of a validation report, and the paired interval of their change between two
reports of the same held-out instances: the math of ``memalpha compare``.

A validation report holds one record per (instance, rollout); the questions and turns of one
instance are not independent draws (its questions read the same memory), so a comparison is over
instances: each contributes one number per metric, and the 95 % interval of a change is the
Student t interval of the paired per-instance differences
(:func:`memalpha.intervals.paired_interval`), which removes the instance-to-instance variance both
reports share. Pure functions over the report's JSON records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memalpha.intervals import paired_interval
from memalpha.tools.executor import SUCCESS_STATUSES

InstanceScores = dict[str, dict[str, dict[str, float]]]
"""``{data_source: {instance_id: {metric: value}}}``."""

CategoryScores = dict[str, dict[str, dict[str, float]]]
"""``{data_source: {category: {instance_id: accuracy}}}``."""


def record_values(record: Mapping[str, Any]) -> dict[str, float]:
    """One rollout's values: ``accuracy`` the share of its questions scored correct,
    ``tool_success`` the share of its tool calls that succeeded (a rollout without a call counts
    0: no call stored nothing), ``memory_tokens`` and ``compression`` (r3) as recorded,
    ``mean_reward`` the mean turn reward, and ``fact_recall`` (the share of its gold facts in the
    final memory, :mod:`memalpha.agent.fact_recall`) when the record holds one. A record without
    turns (a baseline stored the text, :mod:`memalpha.agent.baselines`) has no ``tool_success`` and
    no ``mean_reward``."""
    scores = [q["score"] for q in record["questions"]]
    results = [res for turn in record["turns"] for res in turn["results"]]
    rewards = [turn.get("reward", 0.0) for turn in record["turns"]]
    values = {
        "accuracy": sum(scores) / len(scores) if scores else 0.0,
        "memory_tokens": float(record["memory_tokens"]),
        "compression": float(record["r3"]),
    }
    if record["turns"]:
        values["tool_success"] = (
            sum(res["status"] in SUCCESS_STATUSES for res in results) / len(results) if results else 0.0
        )
        values["mean_reward"] = sum(rewards) / len(rewards)
    if record.get("fact_recall") is not None:
        values["fact_recall"] = float(record["fact_recall"])
    return values


def instance_values(
    records: Iterable[Mapping[str, Any]],
    values_of: Callable[[Mapping[str, Any]], dict[str, float]] = record_values,
) -> InstanceScores:
    """``{source: {instance_id: {metric: value}}}``: each instance's ``values_of`` its records,
    averaged over its rollouts. A metric only some rollouts of an instance hold (``fact_recall``
    of an instance that knows no facts) is left out of that instance: a mean over some rollouts
    only would not be the instance's."""
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    recorded: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in records:
        key = (record["data_source"], record["instance_id"])
        for metric, value in values_of(record).items():
            sums[key][metric] += value
            recorded[key][metric] += 1
        counts[key] += 1
    out: InstanceScores = defaultdict(dict)
    for key, total in sums.items():
        n = counts[key]
        out[key[0]][key[1]] = {m: v / n for m, v in total.items() if recorded[key][m] == n}
    return dict(out)


def category_accuracy(records: Iterable[Mapping[str, Any]]) -> CategoryScores:
    """``{source: {category: {instance_id: accuracy}}}`` over the questions whose record names a
    ``category`` (LoCoMo's question types): each instance's share of its questions of that category
    scored correct, all its rollouts pooled. Sources whose questions name none are absent."""
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for record in records:
        for question in record["questions"]:
            if question.get("category") is not None:
                key = (record["data_source"], str(question["category"]), record["instance_id"])
                sums[key].append(question["score"])
    out: CategoryScores = defaultdict(lambda: defaultdict(dict))
    for (source, category, instance), scores in sums.items():
        out[source][category][instance] = sum(scores) / len(scores)
    return {source: dict(categories) for source, categories in out.items()}


def paired_change(before: InstanceScores, after: InstanceScores, metric: str) -> dict[str, Any] | None:
    """``{mean, half_width, low, high, n}`` of ``after - before`` for ``metric`` over the instances
    both hold with that metric (matched by source and instance id, in sorted order); ``None`` when
    they share none. A single shared instance gives its change and no interval (``half_width``,
    ``low`` and ``high`` None)."""
    flat_before = {(s, i): v[metric] for s, inst in before.items() for i, v in inst.items() if metric in v}
    flat_after = {(s, i): v[metric] for s, inst in after.items() for i, v in inst.items() if metric in v}
    shared = sorted(flat_before.keys() & flat_after.keys())
    if not shared:
        return None
    change: dict[str, Any] = paired_interval(
        [flat_after[k] for k in shared], [flat_before[k] for k in shared]
    )
    if change["n"] < 2:
        change.update(half_width=None, low=None, high=None)
    return change


COMPARED_METRICS = ("accuracy", "fact_recall", "tool_success", "memory_tokens", "mean_reward")
"""What ``memalpha compare`` pairs per instance (category rows: ``accuracy`` only)."""


def change_rows(
    before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]], left_out: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """``after - before`` of two reports' records, paired per instance (:func:`paired_change`):
    one row for all instances, then one per source, each followed by one per question category of
    that source (:func:`category_accuracy`). A row is ``{source, category, instances, <metric>:
    change or None}`` for each of :data:`COMPARED_METRICS`: None for a metric no instance of the
    row holds in both reports, for the metrics in ``left_out``, and in a category row for all
    but accuracy."""
    before, after = list(before), list(after)
    values = instance_values(before), instance_values(after)
    categories = category_accuracy(before), category_accuracy(after)

    def row(source: str, category: str | None, pair: tuple[InstanceScores, ...]) -> dict[str, Any]:
        category_free = COMPARED_METRICS if category is None else ()
        compared = [m for m in COMPARED_METRICS if m not in left_out and m in ("accuracy", *category_free)]
        return {
            "source": source,
            "category": category,
            "instances": sum(len(instances) for instances in pair[1].values()),
            **{m: paired_change(pair[0], pair[1], m) if m in compared else None for m in COMPARED_METRICS},
        }

    rows = [row("all", None, values)]
    for source in sorted(values[1]):
        rows.append(row(source, None, tuple({source: v.get(source, {})} for v in values)))
        for category in sorted(categories[1].get(source, {})):
            rows.append(row(source, category, tuple(
                {source: {i: {"accuracy": a} for i, a in c.get(source, {}).get(category, {}).items()}}
                for c in categories
            )))
    return rows
