"""The ``memories`` layout: records of memories an agent wrote, with each instance's questions.

What the answer agent trains on (docs/answer_agent.md): one ``memalpha predict`` output record (or a
validation report's record) per line, ``{"instance_id", "data_source", "memory": {...}, "questions":
[{"question", "gold", "metadata"?}, ...]}``; the memory is the dictionary a memory file and every
record hold (:meth:`memalpha.memory.store.Memory.to_dict`). Loaded as an :class:`Instance` with no
chunk to read, the questions as :class:`QA`, and the memory in ``metadata["memory"]``. Every check
fails with the file, record and field named.
"""

from __future__ import annotations

from typing import Any

from memalpha.data.schema import QA, DataValidationError, Instance

MEMORY_KEYS = ("core", "core_token_limit", "seed", "id_counter", "semantic", "episodic")
"""The keys of a memory as a record writes it."""
MEMORY = "memory"
"""The metadata key of a ``memories`` instance's memory dictionary."""


def is_memory_record(record: Any) -> bool:
    """Whether ``record`` looks like a record of the ``memories`` layout (layout detection): a memory
    and questions, and no list of chunks (a ``memalpha predict`` record counts its chunks)."""
    return (isinstance(record, dict) and MEMORY in record and "questions" in record
            and not isinstance(record.get("chunks"), list))


def parse_memory_record(record: Any, file: str, index: int) -> Instance:
    """The :class:`Instance` of one record: no chunks, its questions, its memory in ``metadata``."""

    def fail(field: str | None, reason: str) -> DataValidationError:
        return DataValidationError(file, reason, index=index, field=field)

    if not isinstance(record, dict):
        raise fail(None, f"a record must be a JSON object, got {type(record).__name__}")
    memory = record.get(MEMORY)
    if not isinstance(memory, dict) or not all(key in memory for key in MEMORY_KEYS):
        raise fail(MEMORY, f"missing, or not a memory as a record writes it ({', '.join(MEMORY_KEYS)})")
    if not isinstance(record.get("data_source"), str) or not record["data_source"]:
        raise fail("data_source", "missing or not a string")
    instance_id = record.get("instance_id", f"record-{index}")
    if not isinstance(instance_id, str) or not instance_id:
        raise fail("instance_id", "not a non-empty string")
    questions = record.get("questions")
    if not isinstance(questions, list):
        raise fail("questions", "missing or not a list")
    asked = []
    for q, question in enumerate(questions):
        if not isinstance(question, dict) or not isinstance(question.get("question"), str):
            raise fail(f"questions[{q}].question", "missing or not a string")
        gold = question.get("gold")
        if not (isinstance(gold, str) and gold.strip()) and not (
            isinstance(gold, list) and gold and all(isinstance(g, str) and g.strip() for g in gold)
        ):
            raise fail(f"questions[{q}].gold", "missing, empty, or not a string or a list of strings")
        metadata = question.get("metadata", {})
        asked.append(QA(question["question"], gold, dict(metadata) if isinstance(metadata, dict) else {}))
    return Instance(instance_id, record["data_source"], [], asked, {MEMORY: dict(memory)})
