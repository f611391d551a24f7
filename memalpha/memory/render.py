"""Text views of a memory (docs/method.md: the memory).

*Memorising* view – what the agent sees while it writes memory::

    <core_memory>
    ...core paragraph...
    </core_memory>

    <semantic_memory> (showing the most recent 2 of 7 entries)
    [3fa1] content
    [09cd] content
    </semantic_memory>

    <episodic_memory> (showing the most recent 0 of 0 entries)
    (empty)
    </episodic_memory>

*Answer* view – what the reader sees: the core (only if non-empty), then the
retrieved entries of each list numbered from 1, without ids.
"""

from __future__ import annotations

from memalpha.memory.store import Memory, MemoryEntry

EMPTY_CORE_NOTE = "(empty)"
EMPTY_LIST_NOTE = "(empty)"
HIDDEN_LIST_NOTE = "(entries not shown: prompt budget)"
NO_RETRIEVED_NOTE = "(no entries)"


def _block(tag: str, body: str, header: str = "") -> str:
    head = f"<{tag}> {header}" if header else f"<{tag}>"
    return f"{head}\n{body}\n</{tag}>"


def _recent_block(tag: str, entries: list[MemoryEntry], k: int) -> str:
    shown = entries[-k:] if k > 0 else []
    if shown:
        body = "\n".join(f"[{entry.id}] {entry.content}" for entry in shown)
    else:
        body = EMPTY_LIST_NOTE if not entries else HIDDEN_LIST_NOTE
    header = f"(showing the most recent {len(shown)} of {len(entries)} entries)"
    return _block(tag, body, header)


def render_memorise(memory: Memory, k: int = 5) -> str:
    """Core plus the ``k`` most recent entries of each list as ``[id] content``, with totals."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return "\n\n".join(
        [
            _block("core_memory", memory.core or EMPTY_CORE_NOTE),
            _recent_block("semantic_memory", memory.semantic, k),
            _recent_block("episodic_memory", memory.episodic, k),
        ]
    )


def _numbered_block(tag: str, entries: list[MemoryEntry]) -> str:
    if not entries:
        return _block(tag, NO_RETRIEVED_NOTE)
    return _block(tag, "\n".join(f"{i}. {entry.content}" for i, entry in enumerate(entries, start=1)))


def render_answer(memory: Memory, semantic: list[MemoryEntry], episodic: list[MemoryEntry]) -> str:
    """``memory``'s core (if non-empty), then the given semantic and episodic entries numbered, ids dropped."""
    parts = [_block("core_memory", memory.core)] if memory.core else []
    parts.append(_numbered_block("semantic_memory", semantic))
    parts.append(_numbered_block("episodic_memory", episodic))
    return "\n\n".join(parts)
