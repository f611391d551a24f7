"""Memory files: one agent's memory as a versioned JSON file, saved and loaded back exactly.

A memory file is the dictionary :meth:`~memalpha.memory.store.Memory.to_dict` writes, as JSON
(UTF-8, two-space indent, keys in a fixed order, one newline at the end)::

    {
      "format": "memalpha.memory/1",
      "core": "...",
      "core_token_limit": 512,
      "seed": 0,
      "id_counter": 3,
      "semantic": [{"id": "3f2a", "content": "..."}],
      "episodic": [{"id": "91c0", "content": "..."}]
    }

``format`` names the format and its version. Loading a file and saving it again gives the same
bytes, and the id counter comes back with the entries, so the next insert gets the id it would
have got had the memory never left the process. docs/inference.md ("Memory files") documents the
fields. A file this module cannot read (not JSON, another format, a newer version, a field of
the wrong type, an id the memory could not have handed out) raises :class:`MemoryFileError`, one
line naming the file and the field; :func:`save_memory` refuses, with the same line, to replace a
file it cannot read, so a save never overwrites something that is not an older copy of a memory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NoReturn

from memalpha.atomic_file import write_atomically
from memalpha.memory.store import DICT_FORMAT, Memory, TokenCounter, counter_for_id

FORMAT_NAME, _, _version = DICT_FORMAT.partition("/")
FORMAT_VERSION = int(_version)
"""The newest memory-file version this memalpha reads and the one it writes."""
FIELDS = ("format", "core", "core_token_limit", "seed", "id_counter", "semantic", "episodic")
_FORMAT = re.compile(rf"^{re.escape(FORMAT_NAME)}/(\d+)$")


class MemoryFileError(ValueError):
    """A memory file (or a record's memory) cannot be read; the message names it and the field."""


def memory_json(memory: Memory) -> str:
    """The text of ``memory``'s file: the same memory always gives the same text."""
    return json.dumps(memory.to_dict(), ensure_ascii=False, indent=2) + "\n"


def save_memory(memory: Memory, path: str | Path) -> Path:
    """Write ``memory`` to ``path`` atomically and return the path.

    An existing file is replaced only when it is a memory file this memalpha reads (an older
    state of a memory); anything else there raises :class:`MemoryFileError` and stays untouched.
    """
    path = Path(path)
    if path.exists():
        read_memory(path, None, "it exists and ")
    write_atomically(path, [memory_json(memory)])
    return path


def load_memory(path: str | Path, token_counter: TokenCounter | None = None) -> Memory:
    """The memory in the file at ``path``, its tokens counted by ``token_counter`` (None: white-space
    words; an agent counts with its tokenizer). Raises :class:`MemoryFileError`."""
    return read_memory(Path(path), token_counter)


def read_memory(path: Path, token_counter: TokenCounter | None, prefix: str = "") -> Memory:
    """:func:`load_memory`, with ``prefix`` starting the reason of an error (``"it exists and "``)."""
    data = read_memory_dict(path, prefix)
    try:
        return Memory.from_dict(data, token_counter)
    except ValueError as exc:  # the core cap cannot hold the truncation marker under this counter
        raise MemoryFileError(f"{path}: {prefix}field 'core_token_limit': {exc}") from None


def read_memory_dict(path: Path, prefix: str = "") -> dict[str, Any]:
    """The checked dictionary of the memory file at ``path`` (``prefix`` starts the reason of an
    error, e.g. ``"it exists and "``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MemoryFileError(f"{path}: no such memory file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.reason if isinstance(exc, UnicodeDecodeError) else (exc.strerror or str(exc))
        raise MemoryFileError(f"{path}: {prefix}cannot be read as a memory file ({reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemoryFileError(
            f"{path}: {prefix}is not a memalpha memory file (not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    return check_memory_dict(data, str(path), prefix)


def check_memory_dict(data: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """``data`` if it is a memory dictionary of a version this memalpha reads, else
    :class:`MemoryFileError` naming ``where`` and the field."""

    def fail(field: str | None, reason: str) -> NoReturn:
        at = f"field {field!r}: " if field else ""
        raise MemoryFileError(f"{where}: {prefix}{at}{reason}")

    if not isinstance(data, dict):
        fail(None, f"is not a memalpha memory file (expected a JSON object, got {type(data).__name__})")
    match = _FORMAT.match(data["format"]) if isinstance(data.get("format"), str) else None
    if match is None:
        fail(None, f"is not a memalpha memory file (no \"format\": \"{DICT_FORMAT}\")")
    version = int(match.group(1))
    if version > FORMAT_VERSION:
        fail(
            None,
            f"was written by a newer memalpha (memory format version {version}; this memalpha reads up to "
            f"version {FORMAT_VERSION}): upgrade memalpha to read it",
        )
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        fail(unknown[0], f"unknown in memory format version {version} (its fields: {', '.join(FIELDS)})")
    missing = [name for name in FIELDS if name not in data]
    if missing:
        fail(missing[0], "missing")
    if not isinstance(data["core"], str):
        fail("core", f"expected a string, got {type(data['core']).__name__}")
    for name, least in (("core_token_limit", 1), ("seed", None), ("id_counter", 0)):
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
            fail(name, f"expected an integer{'' if least is None else f' >= {least}'}, got {value!r:.40}")
    for kind in ("semantic", "episodic"):
        entries = data[kind]
        if not isinstance(entries, list):
            fail(kind, f"expected a list of entries, got {type(entries).__name__}")
        seen: set[str] = set()
        for j, entry in enumerate(entries):
            at = f"{kind}[{j}]"
            if not isinstance(entry, dict) or set(entry) != {"id", "content"}:
                fail(at, 'expected an object with exactly "id" and "content"')
            if not isinstance(entry["content"], str):
                fail(f"{at}.content", f"expected a string, got {type(entry['content']).__name__}")
            memory_id = entry["id"]
            counter = counter_for_id(data["seed"], memory_id) if isinstance(memory_id, str) else None
            if counter is None or counter >= data["id_counter"]:
                fail(
                    f"{at}.id",
                    f"{memory_id!r:.40} is not an id this memory handed out (seed {data['seed']}, "
                    f"id_counter {data['id_counter']})",
                )
            if memory_id in seen:
                fail(f"{at}.id", f"{memory_id!r} appears twice in {kind}")
            seen.add(memory_id)
    return data
