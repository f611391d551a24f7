"""The reader interface: answer questions, each from its own memory, in batches.

A reader turns every ``(memory, question)`` item into one chat: the answer-mode prompt
of :mod:`memalpha.reader.prompts` holding the core memory and the BM25-retrieved entries
(:mod:`memalpha.reader.retrieval`), with ``k`` shrunk until the prompt fits the reader's token
budget. Given the items' data sources, each question is preceded by its source's instruction
from the reader's table (:mod:`memalpha.reader.question_instructions`); retrieval ranks the
entries for the bare question, since the instruction, the same for every question of a source,
says nothing about which entries answer it. Backends only implement :meth:`Reader.chat`
(conversations in, replies out) and token counting.

Failures never raise out of :meth:`Reader.answer` or :meth:`Reader.complete`: a failed
item comes back as ``ReaderAnswer(text="", ok=False, error=...)``, is counted in
:attr:`Reader.failures` and logged; the metrics score it 0.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memalpha.memory.render import render_answer
from memalpha.reader.prompts import answer_messages
from memalpha.reader.question_instructions import QuestionInstructions
from memalpha.reader.retrieval import DEFAULT_TOP_K, fit_to_budget, retrieve_for_questions

if TYPE_CHECKING:
    from memalpha.memory.store import Memory

logger = logging.getLogger(__name__)

Message = dict[str, str]
Conversation = list[Message]

PER_MESSAGE_OVERHEAD_TOKENS = 8
"""Tokens a chat template adds around each message (role markers), for estimated counts."""


@dataclass
class ReaderAnswer:
    """One reply: ``ok`` is False (and ``text`` empty) when the backend failed for this item."""

    text: str
    ok: bool
    error: str | None = None


class Reader(ABC):
    """Answers ``(memory, question)`` items through a chat backend.

    Args:
        top_k_entries: entries retrieved from each of the semantic and episodic lists.
        prompt_budget_tokens: the longest prompt (system + question, chat-formatted) to send;
            ``k`` shrinks until the prompt fits.
        question_instructions: the per-source instruction table; ``None`` gives every question bare.
    """

    def __init__(
        self,
        *,
        top_k_entries: int = DEFAULT_TOP_K,
        prompt_budget_tokens: int = 4096,
        question_instructions: QuestionInstructions | None = None,
    ) -> None:
        if top_k_entries < 0:
            raise ValueError(f"top_k_entries must be >= 0, got {top_k_entries}")
        if prompt_budget_tokens <= 0:
            raise ValueError(f"prompt_budget_tokens must be > 0, got {prompt_budget_tokens}")
        self.top_k_entries = top_k_entries
        self.prompt_budget_tokens = prompt_budget_tokens
        self.question_instructions = question_instructions or QuestionInstructions()
        self.requests = 0
        self.failures = 0
        self.over_budget = 0

    # -- backend ------------------------------------------------------------------------
    @abstractmethod
    def chat(self, conversations: Sequence[Conversation]) -> list[ReaderAnswer]:
        """Reply to each conversation; one :class:`ReaderAnswer` per conversation, in order."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Token count of ``text`` as this reader's model sees it (or a close estimate)."""

    def conversation_tokens(self, conversation: Conversation) -> int:
        """Token length of a chat-formatted conversation; backends with a template override it."""
        return sum(self.count_tokens(m["content"]) + PER_MESSAGE_OVERHEAD_TOKENS for m in conversation)

    # -- prompts ------------------------------------------------------------------------
    def instruction_for(self, data_source: str) -> str | None:
        """The instruction this reader puts before the questions of ``data_source`` (``None``: none)."""
        return self.question_instructions.for_source(data_source)

    def answer_conversations(
        self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None
    ) -> list[Conversation]:
        """The answer-mode chat for every item; retrieval runs once per distinct memory.

        ``sources`` (one data source per item) picks each question's instruction; without it
        every question goes bare.
        """
        if sources is not None and len(sources) != len(items):
            raise ValueError(f"{len(sources)} data sources for {len(items)} reader items")
        instructions = [None] * len(items) if sources is None else [self.instruction_for(s) for s in sources]
        groups: dict[int, list[int]] = {}
        for index, (memory, _question) in enumerate(items):
            groups.setdefault(id(memory), []).append(index)
        conversations: list[Conversation | None] = [None] * len(items)
        for indices in groups.values():
            memory = items[indices[0]][0]
            questions = [items[i][1] for i in indices]
            ranked = retrieve_for_questions(memory, questions, self.top_k_entries)
            for i, question, (semantic, episodic) in zip(indices, questions, ranked):
                instruction = instructions[i]

                def measure(sem, epi, _memory=memory, _question=question, _instruction=instruction) -> int:
                    return self.conversation_tokens(
                        answer_messages(render_answer(_memory, sem, epi), _question, _instruction)
                    )

                semantic, episodic, fits = fit_to_budget(semantic, episodic, measure, self.prompt_budget_tokens)
                if not fits:
                    self.over_budget += 1
                    logger.warning(
                        "reader prompt for question %r is over the %d-token budget even without "
                        "retrieved entries (core memory and question alone); sending it as is",
                        question[:80], self.prompt_budget_tokens,
                    )
                conversations[i] = answer_messages(render_answer(memory, semantic, episodic), question, instruction)
        return [c for c in conversations if c is not None]

    # -- public entry points --------------------------------------------------------------
    def answer(self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None) -> list[ReaderAnswer]:
        """Answer each question from its memory (one reply per item, in order); ``sources``, one
        data source per item, gives each question its source's instruction."""
        if not items:
            return []
        return self._run(self.answer_conversations(items, sources))

    def complete(self, prompts: Sequence[str]) -> list[ReaderAnswer]:
        """Reply to bare prompts (one user message each), e.g. judge questions."""
        if not prompts:
            return []
        return self._run([[{"role": "user", "content": p}] for p in prompts])

    def _run(self, conversations: Sequence[Conversation]) -> list[ReaderAnswer]:
        try:
            answers = self.chat(conversations)
        except Exception as exc:  # a backend bug must not kill a training run
            logger.exception("reader backend %s failed on a batch of %d", type(self).__name__, len(conversations))
            answers = [ReaderAnswer("", False, f"{type(exc).__name__}: {exc}") for _ in conversations]
        if len(answers) != len(conversations):
            raise RuntimeError(
                f"{type(self).__name__}.chat returned {len(answers)} answers for {len(conversations)} conversations"
            )
        self.requests += len(answers)
        failed = [a for a in answers if not a.ok]
        if failed:
            self.failures += len(failed)
            logger.warning(
                "reader %s: %d of %d answers failed (scored 0; %d failures so far); first error: %s",
                type(self).__name__, len(failed), len(answers), self.failures, failed[0].error,
            )
        return answers
