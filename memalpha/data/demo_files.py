"""Demonstrations for supervised fine-tuning: chat messages and the response to learn.

One JSONL record per demonstration, ``{"messages": [{"role", "content"}, ...], "response": str,
"metadata": {...}}`` (docs/cold_start.md, *Demonstrations*): ``messages`` is the conversation up to
the reply, ``response`` the text whose tokens (and the end-of-turn token) are trained, ``metadata``
optional. Every check raises :class:`~memalpha.data.schema.DataValidationError` naming the file, the
record and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memalpha.atomic_file import write_atomically
from memalpha.data.schema import DataValidationError

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Demonstration:
    """A conversation and the assistant reply that should follow it."""

    messages: list[dict[str, str]]
    response: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": [dict(m) for m in self.messages],
            "response": self.response,
            "metadata": dict(self.metadata),
        }


def parse_demonstration(record: Any, *, file: str, index: int) -> Demonstration:
    """A validated :class:`Demonstration` from one decoded JSON record."""

    def fail(field_name: str | None, reason: str) -> DataValidationError:
        return DataValidationError(file, reason, index=index, field=field_name)

    if not isinstance(record, dict):
        raise fail(None, f"a demonstration must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - {"messages", "response", "metadata"})
    if unknown:
        raise fail(unknown[0], "unknown field (expected messages, response and optional metadata)")
    if "messages" not in record:
        raise fail("messages", "missing")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise fail("messages", "must be a non-empty list of {role, content} objects")
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise fail(where, f"must be an object, got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise fail(f"{where}.role", f"must be one of {list(ROLES)}, got {message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise fail(f"{where}.content", "must be a string")
    if messages[-1]["role"] == "assistant":
        raise fail("messages", "the last message is the assistant's: put the reply to learn in 'response'")
    response = record.get("response")
    if not isinstance(response, str) or not response.strip():
        raise fail("response", "must be a non-empty string")
    metadata = record.get("metadata", {})
    if not isinstance(metadata, dict):
        raise fail("metadata", f"must be an object, got {type(metadata).__name__}")
    return Demonstration(
        [{"role": m["role"], "content": m["content"]} for m in messages], response, dict(metadata)
    )


def load_demonstrations(path: str | os.PathLike, limit: int | None = None) -> list[Demonstration]:
    """Every demonstration of a JSONL file (blank lines skipped); the first bad record raises."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataValidationError(name, f"cannot read demonstrations: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataValidationError(name, f"not UTF-8 text (byte {exc.start}): expected a JSONL file") from exc
    demos: list[Demonstration] = []
    index = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if limit is not None and len(demos) >= limit:
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataValidationError(
                name, f"line {line_number} is not valid JSON: {exc.msg}", index=index
            ) from exc
        demos.append(parse_demonstration(record, file=name, index=index))
        index += 1
    if not demos:
        raise DataValidationError(name, "holds no demonstrations")
    return demos


def save_demonstrations(path: str | os.PathLike, demos: Iterable[Demonstration]) -> int:
    """Write ``demos`` as JSONL (atomically: a crash leaves the previous file); returns the count."""
    return write_atomically(path, (json.dumps(demo.to_dict(), ensure_ascii=False) + "\n" for demo in demos))
