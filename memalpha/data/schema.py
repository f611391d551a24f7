"""The instance schema and its validation.

An instance is what one rollout reads and is scored on (docs/data.md)::

    {"instance_id": str, "data_source": str, "chunks": [str, ...],
     "questions": [{"question": str, "answer": str | [str, ...], "metadata": {...}}, ...],
     "metadata": {...}}

A list answer holds several acceptable answers (MemoryAgentBench does this). Every
check raises :class:`DataValidationError`, whose message names the file, the record
(index and instance id) and the field at fault, so one bad line in a large file is
found at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NoReturn

Answer = str | list[str]

#: Fields of one record in memalpha's own JSONL/JSON layout.
REQUIRED_FIELDS = ("instance_id", "data_source", "chunks", "questions")
OPTIONAL_FIELDS = ("metadata",)


class DataValidationError(ValueError):
    """A data file or one of its records is not usable.

    ``file`` is always set; ``index`` (0-based record position), ``instance_id`` and
    ``field`` are set when the problem lies in one record.
    """

    def __init__(
        self,
        file: str,
        reason: str,
        *,
        index: int | None = None,
        instance_id: str | None = None,
        field: str | None = None,
    ) -> None:
        self.file = str(file)
        self.reason = reason
        self.index = index
        self.instance_id = instance_id
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.file]
        if self.index is not None:
            ident = f"instance_id={self.instance_id!r}" if self.instance_id is not None else "no instance_id"
            parts.append(f"record {self.index} ({ident})")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ": ".join(parts) + f": {self.reason}"


@dataclass
class QA:
    """One question and its gold answer (a list means several acceptable answers), with what the
    data says about this question alone in ``metadata`` (LoCoMo's category, say), which the
    question's scoring and the validation report read; never shown to the agent or the reader."""

    question: str
    answer: Answer
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready question; ``metadata`` only when it holds something."""
        out: dict[str, Any] = {
            "question": self.question,
            "answer": self.answer if isinstance(self.answer, str) else list(self.answer),
        }
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


@dataclass
class Instance:
    """A sequence of chunks to memorise and the questions answered from the memory afterwards."""

    instance_id: str
    data_source: str
    chunks: list[str]
    questions: list[QA]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict in the field order of memalpha's JSONL layout."""
        return {
            "instance_id": self.instance_id,
            "data_source": self.data_source,
            "chunks": list(self.chunks),
            "questions": [qa.to_dict() for qa in self.questions],
            "metadata": dict(self.metadata),
        }


class RecordChecker:
    """Type checks for one record that fail with the file, record and field named.

    Layout parsers share it so that every layout reports errors the same way.
    """

    def __init__(self, file: str, index: int, instance_id: str | None = None) -> None:
        self.file = str(file)
        self.index = index
        self.instance_id = instance_id

    def fail(self, field: str | None, reason: str) -> NoReturn:
        raise DataValidationError(
            self.file, reason, index=self.index, instance_id=self.instance_id, field=field
        )

    def require(self, record: dict[str, Any], key: str, field: str | None = None) -> Any:
        """``record[key]``; a missing key (or a null value) is a missing-field error."""
        if key not in record or record[key] is None:
            self.fail(field or key, "missing field")
        return record[key]

    def string(self, value: Any, field: str, *, allow_empty: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(field, f"expected a string, got {_type_name(value)}")
        if not allow_empty and not value.strip():
            self.fail(field, "empty string")
        return value

    def identifier(self, value: Any, field: str, *, coerce_int: bool = False) -> str:
        """A non-empty string id; with ``coerce_int`` an integer id is turned into its decimal string."""
        if coerce_int and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self.string(value, field)

    def mapping(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, f"expected an object, got {_type_name(value)}")
        bad_keys = [k for k in value if not isinstance(k, str)]
        if bad_keys:
            self.fail(field, f"keys must be strings, got {bad_keys[0]!r}")
        return value

    def sequence(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            self.fail(field, f"expected a list, got {_type_name(value)}")
        return list(value)

    def json_value(self, value: Any, field: str) -> Any:
        """A field that may hold a JSON string (official parquet) or the already decoded value."""
        if isinstance(value, (bytes, bytearray)):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(field, f"not valid JSON ({exc.msg} at char {exc.pos})")

    def chunks(self, value: Any, field: str = "chunks") -> list[str]:
        items = self.sequence(value, field)
        if not items:
            self.fail(field, "empty chunk list (an instance needs at least one chunk)")
        for j, chunk in enumerate(items):
            self.string(chunk, f"{field}[{j}]")
        return items

    def answer(self, value: Any, field: str, *, coerce_numbers: bool = False) -> Answer:
        """A gold answer: a non-empty string or a non-empty list of non-empty strings."""
        if value is None:
            self.fail(field, "question without answer")
        if coerce_numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            if not value.strip():
                self.fail(field, "question without answer (empty string)")
            return value
        if isinstance(value, (list, tuple)):
            if not value:
                self.fail(field, "question without answer (empty list)")
            out = []
            for j, item in enumerate(value):
                if coerce_numbers and isinstance(item, (int, float)) and not isinstance(item, bool):
                    item = str(item)
                out.append(self.string(item, f"{field}[{j}]"))
            return out
        self.fail(field, f"expected a string or a list of strings, got {_type_name(value)}")

    def questions(self, value: Any, field: str = "questions", *, coerce_numbers: bool = False) -> list[QA]:
        """A list of ``{question, answer}`` objects (``answers`` is accepted for ``answer``), each with
        an optional ``metadata`` object."""
        items = self.sequence(value, field)
        if not items:
            self.fail(field, "empty question list (an instance needs at least one question)")
        out = []
        for j, item in enumerate(items):
            where = f"{field}[{j}]"
            self.mapping(item, where)
            question = self.string(self.require(item, "question", f"{where}.question"), f"{where}.question")
            key = "answer" if "answer" in item or "answers" not in item else "answers"
            if item.get(key) is None:
                self.fail(f"{where}.answer", "question without answer")
            answer = self.answer(item[key], f"{where}.{key}", coerce_numbers=coerce_numbers)
            metadata = item.get("metadata")
            metadata = {} if metadata is None else self.mapping(metadata, f"{where}.metadata")
            out.append(QA(question, answer, dict(metadata)))
        return out


def parse_record(record: Any, *, file: str = "<dict>", index: int = 0) -> Instance:
    """Validate one record of memalpha's own layout and build its :class:`Instance`.

    Unknown top-level fields are refused (put extra information under ``metadata``),
    so a misspelt field name is reported instead of silently dropped.
    """
    check = RecordChecker(file, index)
    if not isinstance(record, dict):
        check.fail(None, f"expected an object, got {_type_name(record)}")
    raw_id = record.get("instance_id")
    if isinstance(raw_id, str):
        check.instance_id = raw_id
    instance_id = check.identifier(check.require(record, "instance_id"), "instance_id")
    unknown = sorted(set(record) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        check.fail(
            unknown[0],
            f"unknown field (expected {', '.join(REQUIRED_FIELDS + OPTIONAL_FIELDS)}; "
            "put extra data under metadata)",
        )
    data_source = check.string(check.require(record, "data_source"), "data_source")
    chunks = check.chunks(check.require(record, "chunks"))
    questions = check.questions(check.require(record, "questions"))
    metadata = record.get("metadata")
    metadata = {} if metadata is None else check.mapping(metadata, "metadata")
    return Instance(instance_id, data_source, list(chunks), questions, dict(metadata))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "list", tuple: "list", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def question_evidence(instance: Instance, *, file: str = "<data>", index: int = 0) -> list[int]:
    """The chunk after which each question of ``instance`` is answerable: the last of its evidence
    chunks, from ``metadata["evidence_chunks"]`` (one entry per question: a chunk index or a list
    of them; the synthetic generator writes it). Raises :class:`DataValidationError` naming the
    record and the field when it is missing or does not fit the instance."""
    evidence = instance.metadata.get("evidence_chunks")

    def fail(reason: str) -> NoReturn:
        raise DataValidationError(
            file, reason, index=index, instance_id=instance.instance_id, field="metadata.evidence_chunks"
        )

    if not isinstance(evidence, list) or len(evidence) != len(instance.questions):
        fail(
            "model.update.credit: per_chunk and hindsight need each question's evidence chunks, one"
            f" entry per question ({len(instance.questions)}), got {_type_name(evidence)}"
            + (f" of {len(evidence)}" if isinstance(evidence, list) else "")
        )
    last: list[int] = []
    below = len(instance.chunks)
    for q, entry in enumerate(evidence):
        chunks = entry if isinstance(entry, list) else [entry]
        if not chunks or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < below for c in chunks
        ):
            fail(f"question {q}: {entry!r} is not a chunk index (or a list of them) below {below}")
        last.append(max(chunks))
    return last
