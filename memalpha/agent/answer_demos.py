"""Answer demonstrations: the reader's prompt for a question asked of a memory, and the gold answer
as short as the source's metric wants it (docs/answer_agent.md).

They train the answer agent (``memalpha sft`` on them; ``reader.adapter_path`` then answers with the
adapter). The memories come from records a memory agent wrote in its own rollouts, a ``memalpha
predict`` output (JSONL, one record per instance) or a validation report (``{"records": [...]}``), so
that the answer agent learns to pick the right entry among the look-alike ones its memory agent
writes, not only from oracle memories. Each record needs its ``memory`` (the memory-file dictionary),
``data_source`` and ``questions`` (each with ``question`` and ``gold``); the prompt is the reader's own
(:meth:`~memalpha.reader.base.Reader.answer_conversations`: retrieval, question instruction, budget),
so the adapter learns on exactly what it will be shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memalpha.agent.scoring import metric_for_source
from memalpha.data.demos import Demonstration
from memalpha.data.schema import DataValidationError
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader

MEMORY_KEYS = ("core", "core_token_limit", "seed", "id_counter", "semantic", "episodic")
"""The keys of a memory as :meth:`~memalpha.memory.store.Memory.to_dict` writes it in a record."""
UNTEACHABLE = ("llm_judge",)
"""Metrics whose gold is not an answer to imitate (a judge's rubric): their questions are left out."""


def target_answer(gold: Any, metric: str) -> str | None:
    """The answer to learn for ``gold`` under ``metric``: the first gold of a list (``multi_part``:
    every part, joined by commas), ``\\boxed{label}`` for ``boxed``, the gold itself otherwise; None
    for a metric whose gold is no answer (:data:`UNTEACHABLE`)."""
    if metric in UNTEACHABLE:
        return None
    golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
    if metric == "multi_part":
        return ", ".join(golds)
    if metric == "boxed":
        return f"\\boxed{{{golds[0]}}}"
    return golds[0]


def read_memory_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``memalpha predict`` output (JSONL) or of a validation report (JSON with
    ``records``); each checked for what an answer demonstration needs, one line naming the file,
    record and field otherwise."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataValidationError(name, f"cannot be read ({exc})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "records" in whole:  # a validation report
        records = whole["records"]
        if not isinstance(records, list):
            raise DataValidationError(name, "'records' is not a list: not a validation report")
    else:  # JSONL, one record a line (a one-line file is a JSON object too)
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataValidationError(name, f"line {number} is not valid JSON: {exc.msg}") from None
    if not records:
        raise DataValidationError(name, "holds no records")
    for index, record in enumerate(records):
        check_record(record, name, index)
    return records


def check_record(record: Any, file: str, index: int) -> None:
    """One record's ``memory``, ``data_source`` and questions' ``question`` and ``gold``."""

    def fail(field: str | None, reason: str) -> DataValidationError:
        return DataValidationError(file, reason, index=index, field=field)

    if not isinstance(record, dict):
        raise fail(None, f"a record must be a JSON object, got {type(record).__name__}")
    memory = record.get("memory")
    if not isinstance(memory, dict) or not all(key in memory for key in MEMORY_KEYS):
        raise fail("memory", f"missing, or not a memory as a record writes it ({', '.join(MEMORY_KEYS)})")
    if not isinstance(record.get("data_source"), str):
        raise fail("data_source", "missing or not a string")
    questions = record.get("questions")
    if not isinstance(questions, list):
        raise fail("questions", "missing or not a list")
    for q, question in enumerate(questions):
        if not isinstance(question, dict) or not isinstance(question.get("question"), str):
            raise fail(f"questions[{q}].question", "missing or not a string")
        gold = question.get("gold")
        if not (isinstance(gold, str) and gold.strip()) and not (
            isinstance(gold, list) and gold and all(isinstance(g, str) and g.strip() for g in gold)
        ):
            raise fail(f"questions[{q}].gold", "missing, empty, or not a string or a list of strings")


def answer_demonstrations(
    records: Iterable[Mapping[str, Any]],
    reader: Reader,
    count_tokens: Callable[[str], int],
    *,
    metric_overrides: dict[str, str] | None = None,
) -> tuple[list[Demonstration], int]:
    """One demonstration per question of every record: the reader's answer prompt for the question
    over the record's memory (its tokens counted by ``count_tokens``), and :func:`target_answer` of
    its gold under the source's metric (``metric_overrides`` first). Returns the demonstrations and
    the number of questions left out because their metric's gold is no answer."""
    demos: list[Demonstration] = []
    skipped = 0
    for record in records:
        memory = Memory.from_dict(dict(record["memory"]), token_counter=count_tokens)
        source = record["data_source"]
        metric = metric_for_source(source, metric_overrides)
        asked: list[tuple[str, str, Mapping[str, Any]]] = []
        for question in record["questions"]:
            target = target_answer(question["gold"], metric)
            if target is None:
                skipped += 1
            else:
                asked.append((question["question"], target, question))
        conversations = reader.answer_conversations([(memory, q) for q, _, _ in asked], [source] * len(asked))
        for messages, (question, target, seen) in zip(conversations, asked):
            metadata = {"source": "answers", "instance_id": record.get("instance_id"), "data_source": source,
                        "question": question, **({"stored": seen["stored"]} if "stored" in seen else {})}
            demos.append(Demonstration(messages, target, metadata))
    return demos, skipped


def records_of(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The records of every file of ``paths`` in order (:func:`read_memory_records`)."""
    return [record for path in paths for record in read_memory_records(path)]
