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

The header and the notes for an empty core, an empty list and a hidden list are prompt templates
(``view_*`` and ``answer_view_empty_list`` in :mod:`memalpha.templates`); above are memalpha's.
"""

from __future__ import annotations

from memalpha.memory.store import Memory, MemoryEntry
from memalpha.templates.loader import PromptTemplates, default_templates

_MEMALPHA = default_templates()  # read now, at import: rendering itself never touches a file


def _block(tag: str, body: str, header: str = "") -> str:
    head = f"<{tag}> {header}" if header else f"<{tag}>"
    return f"{head}\n{body}\n</{tag}>"


def _recent_block(tag: str, entries: list[MemoryEntry], k: int, t: PromptTemplates) -> str:
    shown = entries[-k:] if k > 0 else []
    if shown:
        body = "\n".join(f"[{entry.id}] {entry.content}" for entry in shown)
    else:
        body = t.render("view_empty_list" if not entries else "view_hidden_list")
    header = t.render("view_recent_header", shown=len(shown), total=len(entries))
    return _block(tag, body, header)


def render_memorise(memory: Memory, k: int = 5, templates: PromptTemplates | None = None) -> str:
    """Core plus the ``k`` most recent entries of each list as ``[id] content``, with totals;
    ``templates`` gives the header and notes (``None``: memalpha's)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    t = templates or _MEMALPHA
    return "\n\n".join(
        [
            _block("core_memory", memory.core or t.render("view_empty_core")),
            _recent_block("semantic_memory", memory.semantic, k, t),
            _recent_block("episodic_memory", memory.episodic, k, t),
        ]
    )


def _numbered_block(tag: str, entries: list[MemoryEntry], t: PromptTemplates) -> str:
    if not entries:
        return _block(tag, t.render("answer_view_empty_list"))
    return _block(tag, "\n".join(f"{i}. {entry.content}" for i, entry in enumerate(entries, start=1)))


def render_answer(
    memory: Memory,
    semantic: list[MemoryEntry],
    episodic: list[MemoryEntry],
    templates: PromptTemplates | None = None,
) -> str:
    """``memory``'s core (if non-empty), then the given semantic and episodic entries numbered, ids
    dropped."""
    t = templates or _MEMALPHA
    parts = [_block("core_memory", memory.core)] if memory.core else []
    parts.append(_numbered_block("semantic_memory", semantic, t))
    parts.append(_numbered_block("episodic_memory", episodic, t))
    return "\n\n".join(parts)
