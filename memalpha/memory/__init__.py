"""The agent's memory: core paragraph, semantic and episodic entry lists (SPEC §1)."""

from memalpha.memory.ids import IdAllocator, id_for_counter
from memalpha.memory.render import (
    EMPTY_CORE_NOTE,
    EMPTY_LIST_NOTE,
    render_answer,
    render_memorise,
)
from memalpha.memory.store import (
    ALL_TYPES,
    CORE,
    CORE_TRUNCATION_MARKER,
    EPISODIC,
    LIST_TYPES,
    SEMANTIC,
    Memory,
    MemoryEntry,
    MemoryFormatError,
    TokenCounter,
    whitespace_token_count,
)

__all__ = [
    "ALL_TYPES",
    "CORE",
    "CORE_TRUNCATION_MARKER",
    "EMPTY_CORE_NOTE",
    "EMPTY_LIST_NOTE",
    "EPISODIC",
    "LIST_TYPES",
    "SEMANTIC",
    "IdAllocator",
    "Memory",
    "MemoryEntry",
    "MemoryFormatError",
    "TokenCounter",
    "id_for_counter",
    "render_answer",
    "render_memorise",
    "whitespace_token_count",
]
