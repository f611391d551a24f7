"""The agent's memory: a core paragraph and two ordered lists of entries (docs/method.md: the memory).

* ``core`` – one paragraph, capped at ``core_token_limit`` tokens; longer text is
  cut and ends with :data:`CORE_TRUNCATION_MARKER` so the agent can see it was cut.
* ``semantic`` / ``episodic`` – ordered lists of :class:`MemoryEntry` (insertion order).

Token counting is injected (in training: the policy tokenizer's length) and cached
by content, so the memory size of thousands of entries costs dictionary look-ups.
The methods here are the only operations the tools use; they assume validated
input and raise ``KeyError``/``ValueError`` on misuse. Validation and the
agent-facing error messages live in :mod:`memalpha.tools.executor`.

**Entry ids** (:class:`IdAllocator`): short, seeded, collision-free. The official code draws random
4-character ids; memalpha needs ids that are the same on every run with the same seed and that never
repeat inside one memory. The n-th id is a keyed bijection of ``n`` written in hexadecimal. Counters
0..65535 map one-to-one onto the 4-digit ids; the next 16**5 counters map onto 5-digit ids, and so
on. Because every step of the mixing function is invertible modulo a power of two, two different
counters never give the same id, so no "seen" set has to be stored: the allocator's whole state is
``(seed, counter)``.
Deleted ids are never handed out again, because the counter only moves forward.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MIN_ID_DIGITS = 4


@lru_cache(maxsize=64)
def _keys(seed: int, digits: int) -> tuple[int, int, int]:
    """Per-(seed, width) constants: an offset and two odd multipliers."""
    bits = 4 * digits
    mask = (1 << bits) - 1
    raw = hashlib.blake2b(f"memalpha-ids:{seed}:{digits}".encode(), digest_size=24).digest()
    offset = int.from_bytes(raw[0:8], "little") & mask
    mult_a = (int.from_bytes(raw[8:16], "little") & mask) | 1
    mult_b = (int.from_bytes(raw[16:24], "little") & mask) | 1
    return offset, mult_a, mult_b


def _mix(value: int, seed: int, digits: int) -> int:
    """A bijection of ``[0, 16**digits)`` keyed by ``seed`` (add, multiply by odd, xor-shift)."""
    bits = 4 * digits
    mask = (1 << bits) - 1
    offset, mult_a, mult_b = _keys(seed, digits)
    x = (value + offset) & mask
    x = (x * mult_a) & mask
    x ^= x >> (bits // 2)
    x = (x * mult_b) & mask
    x ^= x >> (bits // 3)
    return x


def id_for_counter(seed: int, counter: int) -> str:
    """The id with index ``counter`` (>= 0) under ``seed``; distinct counters give distinct ids."""
    digits = MIN_ID_DIGITS
    start = 0
    while counter - start >= 16**digits:
        start += 16**digits
        digits += 1
    return format(_mix(counter - start, seed, digits), f"0{digits}x")


class IdAllocator:
    """Hands out ids in a fixed order for a seed; state is ``seed`` and ``counter``."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.counter = 0

    def next_id(self) -> str:
        """The next id, never one handed out before."""
        memory_id = id_for_counter(self.seed, self.counter)
        self.counter += 1
        return memory_id


def _unshift(value: int, shift: int, bits: int) -> int:
    """The ``x`` with ``x ^ (x >> shift) == value`` (``x`` of ``bits`` bits)."""
    x = value
    for _ in range(bits // shift + 1):
        x = value ^ (x >> shift)
    return x


def counter_for_id(seed: int, memory_id: str) -> int | None:
    """The counter whose id under ``seed`` is ``memory_id`` (the inverse of :func:`id_for_counter`),
    or None when no counter gives that text (not lowercase hexadecimal of at least
    :data:`MIN_ID_DIGITS` digits)."""
    digits = len(memory_id)
    if digits < MIN_ID_DIGITS or any(c not in "0123456789abcdef" for c in memory_id):
        return None
    bits = 4 * digits
    mask = (1 << bits) - 1
    offset, mult_a, mult_b = _keys(seed, digits)
    x = _unshift(int(memory_id, 16), bits // 3, bits)
    x = (x * pow(mult_b, -1, 1 << bits)) & mask
    x = _unshift(x, bits // 2, bits)
    x = (x * pow(mult_a, -1, 1 << bits)) & mask
    value = (x - offset) & mask
    start = sum(16**d for d in range(MIN_ID_DIGITS, digits))
    return start + value


TokenCounter = Callable[[str], int]

SEMANTIC = "semantic_memory"
EPISODIC = "episodic_memory"
CORE = "core_memory"
LIST_TYPES: tuple[str, str] = (SEMANTIC, EPISODIC)

CORE_TRUNCATION_MARKER = " [truncated: core memory is limited to {limit} tokens]"
DICT_FORMAT = "memalpha.memory/1"
_SHORT_NAMES = {"semantic": SEMANTIC, "episodic": EPISODIC, SEMANTIC: SEMANTIC, EPISODIC: EPISODIC}


def whitespace_token_count(text: str) -> int:
    """Cheap default token counter: the number of whitespace-separated words."""
    return len(text.split())


def list_type(memory_type: str) -> str:
    """Normalise ``semantic``/``episodic`` (with or without ``_memory``) or raise ``ValueError``."""
    try:
        return _SHORT_NAMES[memory_type]
    except (KeyError, TypeError):
        raise ValueError(
            f"memory_type must be one of {list(LIST_TYPES)}, got {memory_type!r}"
        ) from None


@dataclass
class MemoryEntry:
    """One semantic or episodic memory item."""

    id: str
    content: str


class Memory:
    """Core paragraph + semantic and episodic entry lists, with seeded ids.

    Args:
        token_counter: ``text -> number of tokens``; ``None`` uses
            :func:`whitespace_token_count`. Counts are cached per distinct content.
        core_token_limit: the core is cut to at most this many tokens (marker included).
        seed: seed of the id sequence; the same seed and operations give the same ids.
    """

    def __init__(
        self,
        token_counter: TokenCounter | None = None,
        core_token_limit: int = 512,
        seed: int = 0,
    ) -> None:
        self.token_counter: TokenCounter = token_counter or whitespace_token_count
        self.core_token_limit = int(core_token_limit)
        marker_tokens = self.token_counter(self.core_marker)
        if self.core_token_limit < marker_tokens + 1:
            raise ValueError(
                f"core_token_limit={core_token_limit} is too small: the truncation marker alone "
                f"takes {marker_tokens} tokens"
            )
        self.seed = int(seed)
        self._ids = IdAllocator(self.seed)
        self._core = ""
        self.semantic: list[MemoryEntry] = []
        self.episodic: list[MemoryEntry] = []
        self._token_cache: dict[str, int] = {}

    # ------------------------------------------------------------------ tokens
    @property
    def core_marker(self) -> str:
        """The text appended to a core that was cut at the token limit."""
        return CORE_TRUNCATION_MARKER.format(limit=self.core_token_limit)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this memory's counter, cached by content."""
        cached = self._token_cache.get(text)
        if cached is None:
            if len(self._token_cache) > 4 * (len(self.semantic) + len(self.episodic)) + 1024:
                self._token_cache.clear()  # drop counts of contents that were replaced
            cached = int(self.token_counter(text))
            self._token_cache[text] = cached
        return cached

    def total_tokens(self) -> int:
        """Memory size (docs/method.md: the memory): tokens(core) + tokens of every entry's content."""
        total = self.count_tokens(self._core) if self._core else 0
        for entries in (self.semantic, self.episodic):
            for entry in entries:
                total += self.count_tokens(entry.content)
        return total

    # -------------------------------------------------------------------- core
    @property
    def core(self) -> str:
        """The core paragraph. Assigning to it applies the token cap (see :meth:`set_core`)."""
        return self._core

    @core.setter
    def core(self, text: str) -> None:
        self.set_core(text)

    def set_core(self, text: str) -> bool:
        """Replace the core; returns ``True`` when it had to be cut to ``core_token_limit``."""
        if not isinstance(text, str):
            raise TypeError(f"core must be a str, got {type(text).__name__}")
        if self.count_tokens(text) <= self.core_token_limit:
            self._core = text
            return False
        self._core = self._cut_core(text)
        return True

    def _fits(self, prefix: str) -> bool:
        return self.token_counter(prefix + self.core_marker) <= self.core_token_limit

    def _cut_core(self, text: str) -> str:
        """Longest prefix (preferably ending at a word boundary) that fits with the marker."""
        lo, hi = 0, len(text)  # invariant: text[:lo] fits (checked in the constructor for lo=0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(text[:mid].rstrip()):
                lo = mid
            else:
                hi = mid - 1
        prefix = text[:lo]
        boundary = max(prefix.rfind(" "), prefix.rfind("\n"))
        if 0 < boundary < len(prefix) and not text[lo : lo + 1].isspace():
            prefix = prefix[:boundary]  # do not end in the middle of a word
        prefix = prefix.rstrip()
        while prefix and not self._fits(prefix):  # counters that are not monotone in length
            prefix = prefix[:-1].rstrip()
        return prefix + self.core_marker

    def clear_core(self) -> None:
        """Empty the core."""
        self._core = ""

    # ----------------------------------------------------------------- entries
    def entries(self, memory_type: str) -> list[MemoryEntry]:
        """The live list for ``semantic_memory`` or ``episodic_memory`` (short names accepted)."""
        return self.semantic if list_type(memory_type) == SEMANTIC else self.episodic

    def find(self, memory_type: str, memory_id: str) -> MemoryEntry | None:
        """The entry with ``memory_id`` in that list, or ``None``."""
        for entry in self.entries(memory_type):
            if entry.id == memory_id:
                return entry
        return None

    def find_content(self, memory_type: str, content: str) -> MemoryEntry | None:
        """The first entry of that list whose content equals ``content`` exactly, or ``None``."""
        for entry in self.entries(memory_type):
            if entry.content == content:
                return entry
        return None

    def insert(self, memory_type: str, content: str) -> MemoryEntry | None:
        """Append a new entry; returns ``None`` (nothing inserted) if identical content exists."""
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, got {type(content).__name__}")
        entries = self.entries(memory_type)
        if self.find_content(memory_type, content) is not None:
            return None
        entry = MemoryEntry(id=self._ids.next_id(), content=content)
        entries.append(entry)
        return entry

    def update(self, memory_type: str, memory_id: str, content: str) -> MemoryEntry:
        """Replace the content of entry ``memory_id`` in place (``KeyError`` if unknown)."""
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, got {type(content).__name__}")
        entry = self.find(memory_type, memory_id)
        if entry is None:
            raise KeyError(f"no entry {memory_id!r} in {list_type(memory_type)}")
        entry.content = content
        return entry

    def delete(self, memory_type: str, memory_id: str) -> MemoryEntry:
        """Remove entry ``memory_id`` and return it (``KeyError`` if unknown)."""
        entries = self.entries(memory_type)
        for index, entry in enumerate(entries):
            if entry.id == memory_id:
                return entries.pop(index)
        raise KeyError(f"no entry {memory_id!r} in {list_type(memory_type)}")

    # ----------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state, as the rollout records write it (the id counter included)."""
        return {
            "format": DICT_FORMAT,
            "core": self._core,
            "core_token_limit": self.core_token_limit,
            "seed": self.seed,
            "id_counter": self._ids.counter,
            "semantic": [{"id": e.id, "content": e.content} for e in self.semantic],
            "episodic": [{"id": e.id, "content": e.content} for e in self.episodic],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], token_counter: TokenCounter | None = None) -> Memory:
        """The memory :meth:`to_dict` wrote, restored exactly: the core as stored (not cut again),
        the entries in order, and the id counter, so the next insert gets the id it would have got.

        ``data`` is trusted (:mod:`memalpha.inference.memory_file` checks a file's dictionary first);
        ``token_counter`` counts the restored memory's tokens (None: white-space words).
        """
        memory = cls(token_counter, core_token_limit=data["core_token_limit"], seed=data["seed"])
        memory._core = data["core"]
        memory.semantic = [MemoryEntry(e["id"], e["content"]) for e in data["semantic"]]
        memory.episodic = [MemoryEntry(e["id"], e["content"]) for e in data["episodic"]]
        memory._ids.counter = int(data["id_counter"])
        return memory

    def __repr__(self) -> str:
        return (
            f"Memory(core={len(self._core)} chars, semantic={len(self.semantic)}, "
            f"episodic={len(self.episodic)}, seed={self.seed})"
        )
