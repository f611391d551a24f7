"""The reader's prompt: the question (after its source's instruction, if any), with the memory
rendered for answering in the system message.

The reader sees the core memory and the entries retrieved for the question, never the text
that was read (see ``docs/metrics_and_rewards.md``). The texts are prompt templates
(``answer_system``, ``answer_system_no_core``, ``answer_user`` in :mod:`memalpha.templates`).
"""

from __future__ import annotations

from memalpha.memory.store import Memory, MemoryEntry
from memalpha.templates.loader import PromptTemplates, default_templates


def _numbered_block(tag: str, entries: list[MemoryEntry], t: PromptTemplates) -> str:
    if not entries:
        return t.block(tag, t.render("answer_view_empty_list"))
    return t.block(tag, "\n".join(f"{i}. {entry.content}" for i, entry in enumerate(entries, start=1)))


def render_answer(
    memory: Memory,
    semantic: list[MemoryEntry],
    episodic: list[MemoryEntry],
    templates: PromptTemplates | None = None,
) -> str:
    """The memory as the reader sees it: ``memory``'s core (only if non-empty), then the given
    (retrieved) semantic and episodic entries numbered from 1, ids dropped; ``templates`` gives the
    note of an empty list (``answer_view_empty_list``; ``None``: memalpha's)."""
    t = templates or default_templates()
    parts = [t.block("core_memory", memory.core)] if memory.core else []
    parts.append(_numbered_block("semantic_memory", semantic, t))
    parts.append(_numbered_block("episodic_memory", episodic, t))
    return "\n\n".join(parts)


def answer_messages(
    memory_text: str,
    question: str,
    instruction: str | None = None,
    templates: PromptTemplates | None = None,
    has_core: bool = True,
) -> list[dict[str, str]]:
    """The ``[system, user]`` messages of one reader question (docs/method.md: answering).

    The source's instruction opens the user message, one empty line before the question, where
    the official Mem-α code puts it; the system message is the same for every source.

    Args:
        memory_text: the memory rendered for answering (:func:`render_answer`).
        question: the question, verbatim.
        instruction: the question instruction of the instance's source
            (:mod:`memalpha.reader.question_instructions`), or ``None`` for the bare question.
        templates: the prompt texts (``None``: memalpha's own).
        has_core: whether the memory's core is non-empty (picks ``answer_system`` or
            ``answer_system_no_core``; memalpha's two are the same text).
    """
    t = templates or default_templates()
    system = t.render("answer_system" if has_core else "answer_system_no_core", memory=memory_text)
    user = (
        question
        if instruction is None
        else t.render("answer_user", instruction=instruction, question=question)
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
