"""Per-instance scores of a validation report, and the paired interval of their change between
two reports of the same held-out instances.

A validation report holds one record per (instance, rollout); the questions and turns of one
instance are not independent draws (its questions read the same memory), so a comparison is over
instances: each contributes one number per metric, and the 95 % interval of a change is the t
interval of the paired per-instance differences (:func:`memalpha_lab.intervals.paired_interval`),
which removes the instance-to-instance variance both reports share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from memalpha.agent.scoring import metric_for_source, score_answer
from memalpha.tools.executor import SUCCESS_STATUSES
from memalpha_lab.intervals import paired_interval

InstanceScores = dict[str, dict[str, dict[str, float]]]
"""``{data_source: {instance_id: {metric: value}}}``."""

EXTRACTABLE_METRICS = ("substring", "multi_part", "keyword")
"""The answer metrics that look for the gold inside the answer, so a memory text can be scored as one."""
OPTIONAL_METRICS = ("fact_recall", "answer_stored", "reader_given_stored")
"""Metrics a record may lack; an instance gets one only when every rollout of it records it."""


def memory_text(memory: Mapping[str, Any]) -> str:
    """A serialised memory (a record's ``memory``) as one text: the core and every entry, one per line."""
    entries = [e["content"] for kind in ("semantic", "episodic") for e in memory.get(kind, [])]
    return "\n".join(([memory["core"]] if memory.get("core") else []) + entries)


def stored_answer_scores(record: Mapping[str, Any]) -> list[float] | None:
    """Per question, its source's metric applied to the whole final memory as the answer: 1 when
    the gold is written in the memory (a share for ``multi_part`` and ``keyword`` golds). ``None``
    when the source's metric cannot read a memory text (``boxed``, ``llm_judge``) or the record
    holds no memory."""
    source = record["data_source"]
    if metric_for_source(source) not in EXTRACTABLE_METRICS or not isinstance(record.get("memory"), Mapping):
        return None
    text = memory_text(record["memory"])
    return [score_answer(source, text, q["gold"]) for q in record["questions"]]


def instance_values(records: Iterable[Mapping[str, Any]]) -> InstanceScores:
    """``{source: {instance_id: {metric: value}}}`` from a validation report's records.

    Per instance (averaged over its rollouts when there are several): ``accuracy`` the share of
    its questions scored correct, ``tool_success`` the share of its tool calls that succeeded
    (instances without a call count 0: no call stored nothing), ``memory_tokens`` and
    ``compression`` as recorded, ``mean_reward`` the mean turn reward, and ``fact_recall`` (the
    share of its gold facts in the final memory, :mod:`memalpha.agent.fact_recall`) when every
    rollout of the instance records one (an instance that knows no facts has none).

    Two more separate what the memory holds from what the reader makes of it, for the sources whose
    metric looks for the gold inside the answer (:func:`stored_answer_scores`): ``answer_stored``,
    the share of its questions whose gold is written in the final memory (what a reader that
    quoted the whole memory would score), and ``reader_given_stored``, the reader's accuracy on
    those questions alone (absent when none of its questions has a stored answer).
    """
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    # rollouts recording each optional metric
    recorded: dict[tuple[tuple[str, str], str], int] = defaultdict(int)
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
        stored = stored_answer_scores(record)
        if stored:
            values["answer_stored"] = sum(stored) / len(stored)
            readable = [score for score, held in zip(scores, stored) if held == 1.0]
            if readable:
                values["reader_given_stored"] = sum(readable) / len(readable)
        for metric in OPTIONAL_METRICS:
            recorded[(key, metric)] += metric in values
        for metric, value in values.items():
            sums[key][metric] += value
        counts[key] += 1
    out: InstanceScores = defaultdict(dict)
    for key, total in sums.items():
        n = counts[key]
        for metric in OPTIONAL_METRICS:
            if recorded[(key, metric)] != n:  # a mean over some rollouts only would not be the instance's
                total.pop(metric, None)
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
