"""The reader's prompt: the question (after its source's instruction, if any), with the memory
rendered for answering in the system message.

The reader sees the core memory and the entries retrieved for the question, never the text
that was read (see ``docs/metrics_and_rewards.md``).
"""

from __future__ import annotations

ANSWER_SYSTEM_TEMPLATE = """\
You answer questions from a memory that was written while a long text was read. You cannot see \
the text itself, only this memory:
- core_memory: a short paragraph that is always kept (who the user is, a summary, rules);
- semantic_memory: facts and knowledge, most relevant to the question first;
- episodic_memory: events with their times, most relevant to the question first.

{memory}

Answer the user's question from this memory. Give the answer itself, briefly, without \
repeating the question. If the memory does not contain the answer, say so in one sentence. \
If the question asks for a format (for example a label inside \\boxed{{}}), use it."""


def answer_messages(memory_text: str, question: str, instruction: str | None = None) -> list[dict[str, str]]:
    """The ``[system, user]`` messages of one reader question (docs/method.md: answering).

    The source's instruction opens the user message, one empty line before the question, where
    the official Mem-α code puts it; the system message is the same for every source.

    Args:
        memory_text: the memory rendered for answering (:func:`memalpha.memory.render.render_answer`).
        question: the question, verbatim.
        instruction: the question instruction of the instance's source
            (:mod:`memalpha.reader.question_instructions`), or ``None`` for the bare question.
    """
    return [
        {"role": "system", "content": ANSWER_SYSTEM_TEMPLATE.format(memory=memory_text)},
        {"role": "user", "content": question if instruction is None else f"{instruction}\n\n{question}"},
    ]
