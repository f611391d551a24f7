"""A reader with no language model: each answer is the memory text retrieval finds for the question.

:class:`ExtractiveReader` answers a question with the core memory and the entries that BM25
ranks highest for it (``reader.retrieval.top_k_entries`` from each of the semantic and
episodic lists, ranked as ``bm25`` and ``bm25_query`` say), their contents one per line.
The answer metric then compares that text with the gold: under the ``substring`` metric a
question scores 1 exactly when its gold answer is written in a retrieved entry (or the core).

That makes r1 a measure of the memory alone, with no reader model's mistakes between the memory
and the score (docs/method.md, "Answering").

It suits the metrics that look for the gold inside the prediction (``substring``,
``multi_part``, ``keyword``); a ``boxed`` label or an ``llm_judge`` rubric cannot be read off
memory text, and it answers no judge prompt (:meth:`chat`, hence :meth:`Reader.complete`,
raises): ``reward.content_judge: llm`` needs a language-model reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memalpha.reader.base import Conversation, Reader, ReaderAnswer

if TYPE_CHECKING:
    from memalpha.memory.store import Memory


class ExtractiveReader(Reader):
    """Answers each ``(memory, question)`` item with the memory text retrieved for the question."""

    def answer(
        self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None,
        top_k: int | None = None,
    ) -> list[ReaderAnswer]:  # fmt: skip
        """One answer per item: the core memory, then the retrieved semantic and episodic
        entries' contents (``top_k`` per list when given), one per line (empty when the memory is empty)."""
        answers = []
        for (memory, _question), (_instruction, semantic, episodic) in zip(
            items, self.retrieved(items, sources, top_k)
        ):
            lines = ([memory.core] if memory.core else []) + [
                entry.content for entry in (*semantic, *episodic)
            ]
            answers.append(ReaderAnswer("\n".join(lines), True))
        return answers

    def chat(self, conversations: Sequence[Conversation]) -> list[ReaderAnswer]:
        raise RuntimeError(
            "the extractive reader (reader.kind: extractive) answers questions from memory only and "
            "cannot reply to prompts such as judge questions: "
            "use a language-model reader (local, openai or engine)"
        )

    def count_tokens(self, text: str) -> int:
        return len(text.split())
