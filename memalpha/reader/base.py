"""The reader interface: answer questions, each from its own memory, in batches.

A reader turns every ``(memory, question)`` item into one chat: the answer-mode prompt
of :mod:`memalpha.reader.answer_prompts` holding the core memory and the BM25-retrieved entries
(:mod:`memalpha.reader.retrieval`), ``k`` cut by the ``k_reduction`` rule, and, given the items'
data sources, each question preceded by its source's instruction
(:mod:`memalpha.reader.question_instructions`; ``bm25_query`` says whether retrieval ranks for
the bare question or, as the official code does, for the instruction and the question). Backends
only implement :meth:`Reader.chat` (conversations in, replies out) and token counting.

:meth:`Reader.complete` may take a :class:`ReaderSampling` that answers those prompts with another
temperature or reply length than the reader's own settings (the r4 content judge's official
0.1 and 512 tokens); every other call samples with the reader's settings.

A fault is never a score. The one failure a backend may return instead of raising is a remote
reader's transport failure after its retries (:mod:`memalpha.reader.openai_compat`: a refused or
dropped connection, a timeout, an HTTP 5xx or 429): that item comes back as
``ReaderAnswer(text="", ok=False, error=...)``, is counted in :attr:`Reader.failures` and logged;
the metrics score it 0, a training round with more than ``reader.max_failed_share`` of its answers
failed is not trained on, and a validation over it is invalid (:mod:`memalpha.train.step_faults`).
Anything else a backend raises (running out of memory, a refused request, a bug of our own)
propagates out of :meth:`Reader.answer` and :meth:`Reader.complete` and stops the run.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memalpha.reader.answer_prompts import answer_messages, render_answer
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.question_instructions import QuestionInstructions
from memalpha.reader.retrieval import K_RULES, retrieve_for_questions
from memalpha.templates.loader import PromptTemplates, default_templates

if TYPE_CHECKING:
    from memalpha.memory.store import Memory, MemoryEntry

logger = logging.getLogger(__name__)

Message = dict[str, str]
Conversation = list[Message]

PER_MESSAGE_OVERHEAD_TOKENS = 8
"""Tokens a chat template adds around each message (role markers), for estimated counts."""


@dataclass(frozen=True)
class ReaderSampling:
    """Sampling settings for one :meth:`Reader.complete` call, in place of the reader's own.

    Args:
        temperature: Sampling temperature (0 = greedy); ``None`` keeps the reader's.
        max_tokens: Reply length cap in tokens; ``None`` keeps the reader's.
    """

    temperature: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and not self.temperature >= 0:
            raise ValueError(f"sampling temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"sampling max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def overrides(self) -> bool:
        """Whether any setting differs from the reader's own (a field is not ``None``)."""
        return self.temperature is not None or self.max_tokens is not None


@dataclass
class ReaderAnswer:
    """One reply: ``ok`` is False (and ``text`` empty) when the backend failed for this item."""

    text: str
    ok: bool
    error: str | None = None


class Reader(ABC):
    """Answers ``(memory, question)`` items through a chat backend.

    Args:
        retrieval: what reaches the answer prompt (:class:`~memalpha.reader.options.RetrievalSettings`:
            ``top_k_entries`` entries from each of the semantic and episodic lists, ranked as
            ``bm25`` and ``bm25_query`` say, their number cut by ``k_reduction`` to fit
            ``prompt_tokens`` or ``system_prompt_limit``; see :mod:`memalpha.reader.retrieval`);
            ``None``: its defaults. The reader copies the values (``top_k_entries``,
            ``prompt_budget_tokens``, ``bm25``, ``k_rule``, ``system_prompt_limit``,
            ``bm25_query``, ``unit``).
        question_instructions: the per-source instruction table; ``None`` gives every question bare.
        templates: the prompt texts of the answer prompt, the memory view and the judges that
            use this reader (:mod:`memalpha.templates`; ``None``: memalpha's own).
    """

    def __init__(
        self,
        *,
        retrieval: RetrievalSettings | None = None,
        question_instructions: QuestionInstructions | None = None,
        templates: PromptTemplates | None = None,
    ) -> None:
        retrieval = retrieval if retrieval is not None else RetrievalSettings()
        self.top_k_entries = retrieval.top_k_entries
        self.prompt_budget_tokens = retrieval.prompt_tokens
        self.bm25 = retrieval.bm25
        self.k_rule = K_RULES[retrieval.k_reduction]
        self.system_prompt_limit = retrieval.system_prompt_limit
        self.bm25_query = retrieval.bm25_query
        self.unit = retrieval.unit
        self.templates = templates or default_templates()
        self.question_instructions = question_instructions or QuestionInstructions()
        self.failures = 0
        self.over_budget = 0

    # -- backend ------------------------------------------------------------------------
    @abstractmethod
    def chat(self, conversations: Sequence[Conversation]) -> list[ReaderAnswer]:
        """Reply to each conversation; one :class:`ReaderAnswer` per conversation, in order. Only a
        transport failure of a remote backend may come back as a failed answer; anything else raises.

        A backend that can sample with other settings per call also takes a keyword
        ``sampling`` (a :class:`ReaderSampling`); it is passed only when :meth:`complete` is given
        one that overrides something, so a backend without it serves every other call.
        """

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

    def bm25_query_text(self, question: str, instruction: str | None) -> str:
        """The text BM25 ranks the entries for (see ``bm25_query``)."""
        if instruction is None or self.bm25_query == "question":
            return question
        # the user message
        return self.templates.render("answer_user", instruction=instruction, question=question)

    def prompt_limit(self) -> int:
        """The token limit ``k`` is reduced against: the prompt budget, or the system-prompt limit."""
        return self.prompt_budget_tokens if self.k_rule.counts_whole_prompt else self.system_prompt_limit

    def measure_prompt(self, conversation: Conversation) -> int:
        """What ``k_reduction`` counts: the whole chat-formatted prompt (``budget``) or the system
        message's text alone (``official``, as the official server counts it)."""
        if self.k_rule.counts_whole_prompt:
            return self.conversation_tokens(conversation)
        return self.count_tokens(conversation[0]["content"])

    def _answer_messages(
        self, memory: Memory, semantic, episodic, question: str, instruction: str | None
    ) -> Conversation:
        view = render_answer(memory, semantic, episodic, self.templates)
        return answer_messages(view, question, instruction, self.templates, has_core=bool(memory.core))

    def prompt_size(
        self, memory: Memory, semantic: Sequence[MemoryEntry], episodic: Sequence[MemoryEntry], question: str,
        instruction: str | None,
    ) -> int:  # fmt: skip
        """What ``k_reduction`` holds against :meth:`prompt_limit`: the answer prompt of ``question``
        showing ``memory``'s core and these entries, measured by :meth:`measure_prompt`."""
        return self.measure_prompt(self._answer_messages(memory, semantic, episodic, question, instruction))

    def retrieved(
        self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None,
        top_k: int | None = None,
    ) -> list[tuple[str | None, list[MemoryEntry], list[MemoryEntry]]]:  # fmt: skip
        """Per item, ``(instruction, semantic, episodic)``: its question's instruction and the
        ``top_k_entries`` entries of each list ranked for it (``top_k`` when given: a baseline's,
        :mod:`memalpha.agent.baselines`); BM25 runs once per distinct memory.

        ``sources`` (one data source per item) picks each question's instruction; without it
        every question goes bare.
        """
        if sources is not None and len(sources) != len(items):
            raise ValueError(f"{len(sources)} data sources for {len(items)} reader items")
        instructions = [None] * len(items) if sources is None else [self.instruction_for(s) for s in sources]
        groups: dict[int, list[int]] = {}
        for index, (memory, _question) in enumerate(items):
            groups.setdefault(id(memory), []).append(index)
        out: list[tuple[str | None, list[MemoryEntry], list[MemoryEntry]] | None] = [None] * len(items)
        for indices in groups.values():
            queries = [self.bm25_query_text(items[i][1], instructions[i]) for i in indices]
            ranked = retrieve_for_questions(
                items[indices[0]][0], queries, self.top_k_entries if top_k is None else top_k, self.bm25,
                self.unit,
            )
            for i, (semantic, episodic) in zip(indices, ranked):
                out[i] = (instructions[i], semantic, episodic)
        return [r for r in out if r is not None]

    def answer_conversations(
        self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None,
        top_k: int | None = None,
    ) -> list[Conversation]:  # fmt: skip
        """The answer-mode chat for every item (:meth:`retrieved` entries, ``k`` cut by ``k_reduction``)."""
        conversations: list[Conversation] = []
        limit = self.prompt_limit()
        for (memory, question), (instruction, semantic, episodic) in zip(
            items, self.retrieved(items, sources, top_k)
        ):

            def measure(sem, epi, _memory=memory, _question=question, _instruction=instruction) -> int:
                return self.prompt_size(_memory, sem, epi, _question, _instruction)

            semantic, episodic, fits = self.k_rule.reduce(semantic, episodic, measure, limit)
            if not fits:
                self.over_budget += 1
                logger.warning(
                    "reader prompt for question %r is over the %d-token limit (k_reduction %s) even "
                    "without retrieved entries (core memory and question alone); sending it as is",
                    question[:80], limit, self.k_rule.name,
                )
            conversations.append(self._answer_messages(memory, semantic, episodic, question, instruction))
        return conversations

    # -- public entry points --------------------------------------------------------------
    def answer(
        self, items: Sequence[tuple[Memory, str]], sources: Sequence[str] | None = None,
        top_k: int | None = None,
    ) -> list[ReaderAnswer]:  # fmt: skip
        """Answer each question from its memory (one reply per item, in order); ``sources``, one
        data source per item, gives each question its source's instruction; ``top_k`` retrieves
        that many entries per list in place of ``top_k_entries`` (a baseline's)."""
        if not items:
            return []
        return self._run(self.answer_conversations(items, sources, top_k))

    def complete(
        self,
        prompts: Sequence[str],
        systems: Sequence[str | None] | None = None,
        sampling: ReaderSampling | None = None,
    ) -> list[ReaderAnswer]:
        """Reply to bare prompts (one user message each), e.g. judge questions; ``systems``, one
        per prompt, puts a system message before each prompt whose entry is not ``None``;
        ``sampling`` answers these prompts with its settings in place of the reader's own
        (``None``, or a field left ``None``: the reader's)."""
        if not prompts:
            return []
        if systems is None:
            systems = [None] * len(prompts)
        elif len(systems) != len(prompts):
            raise ValueError(f"{len(systems)} system messages for {len(prompts)} prompts")
        return self._run(
            [
                ([] if system is None else [{"role": "system", "content": system}])
                + [{"role": "user", "content": prompt}]
                for prompt, system in zip(prompts, systems)
            ],
            sampling,
        )

    def _run(
        self, conversations: Sequence[Conversation], sampling: ReaderSampling | None = None
    ) -> list[ReaderAnswer]:
        if sampling is not None and sampling.overrides:
            answers = self.chat(conversations, sampling=sampling)  # type: ignore[call-arg]
        else:
            answers = self.chat(conversations)
        if len(answers) != len(conversations):
            raise RuntimeError(
                f"{type(self).__name__}.chat returned {len(answers)} "
                f"answers for {len(conversations)} conversations"
            )
        failed = [a for a in answers if not a.ok]
        if failed:
            self.failures += len(failed)
            logger.warning(
                "reader %s: %d of %d answers failed (scored 0; %d failures so far); first error: %s",
                type(self).__name__, len(failed), len(answers), self.failures, failed[0].error,
            )
        return answers
