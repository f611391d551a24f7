"""The per-source question instructions: a text the reader gets before each question of a source.

The data sets' questions carry no answer format. The official Mem-α code therefore puts a
per-source instruction before every question it sends to the reader, in training and in
evaluation alike: for the classification sources, that the core memory holds the label rules and
that the label goes into ``\\boxed{}`` as one number; for the book-summary sources, that the core
memory holds the book's summary. Without it the reader rarely writes ``\\boxed{}`` and the boxed
metric (and with it r1) is close to noise for those sources.

The table is a YAML file mapping a ``data_source`` name or glob pattern to an instruction (or to
``null``: none). An exact name wins over the patterns; among patterns the first one in the file
that matches wins, so a narrow pattern is listed before a broad one. A source the table does not
name gets no instruction. memalpha ships its own table, ``question_instructions.yaml`` next to
this module (the wording is memalpha's; ``docs/method.md`` lists what it covers).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

BUILTIN = "builtin"
"""The setting value naming the table shipped with memalpha."""

BUILTIN_FILE = "question_instructions.yaml"
"""The shipped table's file name inside the ``memalpha.reader`` package."""


@dataclass(frozen=True)
class QuestionInstructions:
    """A loaded table: ``entries`` maps names or glob patterns to an instruction (``None``: none),
    in file order. The empty table gives none."""

    entries: Mapping[str, str | None] = field(default_factory=dict)

    def for_source(self, data_source: str) -> str | None:
        """The instruction for the questions of ``data_source``, or ``None``."""
        if data_source in self.entries:
            return self.entries[data_source]
        for pattern, instruction in self.entries.items():
            if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(data_source, pattern):
                return instruction
        return None


def load_question_instructions(
    path: str | None, option: str = "reader.question_instructions"
) -> QuestionInstructions:
    """The table named by ``path``: :data:`BUILTIN` for the shipped one, ``None`` for none, else a YAML file.

    An empty file is an empty table. Raises a one-line ``ValueError`` starting with ``option`` and
    naming the file when it is missing, is not YAML, or is not a mapping of non-empty names to a
    non-empty text or ``null``.
    """
    if path is None:
        return QuestionInstructions()
    if path == BUILTIN:
        resource = resources.files("memalpha.reader").joinpath(BUILTIN_FILE)
        origin, text = str(resource), resource.read_text(encoding="utf-8")
    else:
        file = Path(path).expanduser()
        origin = str(file)
        if not file.is_file():
            raise ValueError(
                f"{option}: {origin}: no such file (give a YAML file, "
                f"{BUILTIN!r} for memalpha's table, or null for none)"
            )
        text = file.read_text(encoding="utf-8")
    return QuestionInstructions(parse_table(text, f"{option}: {origin}"))


def parse_table(text: str, where: str) -> dict[str, str | None]:
    """The entries of a table's YAML ``text`` (white space around an instruction dropped, so a block
    scalar's last newline does not reach the prompt); errors are one line starting with ``where``."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ValueError(f"{where}: not valid YAML{at}: {problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(  # noqa: TRY004 - every problem of the file is one kind of error: a bad setting
            f"{where}: expected a mapping of data_source names or patterns to instructions, "
            f"got {type(loaded).__name__}"
        )
    entries: dict[str, str | None] = {}
    for key, value in loaded.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"{where}: key {key!r} must be a non-empty data_source name or glob pattern")
        if value is not None and (not isinstance(value, str) or not value.strip()):
            got = repr(value) if isinstance(value, str) else type(value).__name__
            raise ValueError(f"{where}: {key!r} must map to a non-empty text or null (none), got {got}")
        entries[key] = None if value is None else value.strip()
    return entries
