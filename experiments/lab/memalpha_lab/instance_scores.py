"""The studies' per-instance scores of a validation report: the product's
(:func:`memalpha.train.instance_scores.instance_values`, what ``memalpha compare`` reads) plus two
values that separate what the memory holds from what the reader makes of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from memalpha.agent.answer_metrics import metric_for_source, score_answer
from memalpha.train.instance_scores import InstanceScores, instance_values, record_values

EXTRACTABLE_METRICS = ("substring", "multi_part", "keyword")
"""The answer metrics that look for the gold inside the answer, so a memory text can be scored as one."""


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


def study_values(record: Mapping[str, Any]) -> dict[str, float]:
    """:func:`~memalpha.train.instance_scores.record_values` of one rollout, and for the sources
    whose metric looks for the gold inside the answer (:func:`stored_answer_scores`):
    ``answer_stored``, the share of its questions whose gold is written in the final memory (what a
    reader that quoted the whole memory would score), and ``reader_given_stored``, the reader's
    accuracy on those questions alone (absent when none of its questions has a stored answer)."""
    values = record_values(record)
    stored = stored_answer_scores(record)
    if stored:
        values["answer_stored"] = sum(stored) / len(stored)
        scores = [q["score"] for q in record["questions"]]
        readable = [score for score, held in zip(scores, stored) if held == 1.0]
        if readable:
            values["reader_given_stored"] = sum(readable) / len(readable)
    return values


def study_instance_values(records: Iterable[Mapping[str, Any]]) -> InstanceScores:
    """``{source: {instance_id: {metric: value}}}``: :func:`study_values` averaged over each
    instance's rollouts (:func:`memalpha.train.instance_scores.instance_values`; a value only some
    rollouts of an instance hold is left out of it)."""
    return instance_values(records, study_values)
