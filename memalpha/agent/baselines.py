"""The memories that learn nothing, which a trained memory agent has to beat (docs/baselines.md).

Mem-α's headline table sets its agent against two agents that store the text instead of
memorising it; a third, the empty memory, is the floor: what the reader answers from its priors.
``model.rollout.baseline.kind`` (:class:`BaselineSettings`) runs any of them in place of the
agent, wherever an agent is evaluated or used (``memalpha validate``, ``memalpha predict``, the
Python API), with the run's own reader, question instructions, answer metrics and report:

* ``raw_chunks``: every chunk is stored as it came, one episodic entry each, and the reader answers
  from the ``model.rollout.baseline.top_k`` entries its BM25 ranks highest for the question (top 2 is the
  paper's RAG-top2). The reader's ``k_reduction`` still cuts them to its prompt budget.
* ``full_text``: the reader reads the input itself: one entry holding every chunk, cut from its
  start so that the answer prompt with the instance's longest question fits the reader's prompt
  limit (:meth:`~memalpha.reader.base.Reader.prompt_limit`), as the official long-context baseline
  keeps the input's end.
* ``empty``: nothing is stored; the reader answers every question from an empty memory.

No policy writes these memories, so no adapter is loaded and a turn makes no call; the memory's
tokens are counted with the policy's tokenizer, as an agent's are, so the reports compare memory
sizes too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from memalpha.memory.store import EPISODIC, Memory, MemoryEntry
from memalpha.reader.base import Reader

BaselineKind = Literal["raw_chunks", "full_text", "empty"]
BASELINE_KINDS: tuple[str, ...] = get_args(BaselineKind)
BASELINE_KIND_KEY, BASELINE_TOP_K_KEY = "model.rollout.baseline.kind", "model.rollout.baseline.top_k"
"""The options as a user types them, and as a report's ``settings["memory"]`` records them."""
CHUNK_SEPARATOR = "\n\n"
"""What joins the chunks of the ``full_text`` memory."""


@dataclass
class BaselineSettings:
    """A memory that learns nothing, in place of the memory agent (docs/baselines.md).

    Args:
        kind: ``null`` (the memory agent writes the memory), ``raw_chunks`` (every chunk stored as
            it came, one entry each; the reader answers from the ``top_k`` entries BM25 ranks
            highest for the question), ``full_text`` (the reader reads the input itself, cut from
            its start to the reader's prompt budget) or ``empty`` (nothing stored: the reader's
            priors alone). A baseline loads no adapter and trains
            nothing: ``memalpha validate``, ``predict`` and the Python API run it.
        top_k: Chunks the ``raw_chunks`` reader retrieves per question (2: Mem-α's RAG-top2),
            in place of ``reader.retrieval.top_k_entries``.
    """

    kind: BaselineKind | None = None
    top_k: int = 2

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in BASELINE_KINDS:
            raise ValueError(
                f"rollout.baseline.kind must be null or one of {list(BASELINE_KINDS)}, got {self.kind!r}"
            )
        if self.top_k < 1:
            raise ValueError(f"rollout.baseline.top_k must be >= 1, got {self.top_k}")

    @property
    def label(self) -> str:
        """What wrote the memory, for tables (:func:`memory_label`)."""
        return memory_label(self.kind, self.top_k)

    @property
    def answer_top_k(self) -> int | None:
        """The entries the reader retrieves per question in place of its own ``top_k_entries``
        (None: its own, for the agent's memory)."""
        return {"raw_chunks": self.top_k, "full_text": 1}.get(self.kind or "")

    def record(self) -> dict[str, object]:
        """The settings as a report records them (``model.rollout.baseline.*`` keys)."""
        return {BASELINE_KIND_KEY: self.kind, BASELINE_TOP_K_KEY: self.top_k if self.kind else None}


def memory_label(kind: str | None, top_k: int | None) -> str:
    """What wrote a memory, for tables: ``agent``, ``raw_chunks top 2`` or ``full_text``."""
    if kind == "raw_chunks":
        return f"raw_chunks top {top_k}"
    return kind or "agent"


def stored_memory(kind: str, chunks: Sequence[str], memory: Memory) -> Memory:
    """``memory`` (changed in place and returned) holding ``chunks`` as the baseline ``kind``
    stores them: each chunk an episodic entry (``raw_chunks``; a chunk equal to one stored already
    is not stored twice), one entry of them all (``full_text``, uncut: :func:`cut_full_text` cuts
    it once the questions are known) or none (``empty``)."""
    if kind == "raw_chunks":
        for chunk in chunks:
            memory.insert(EPISODIC, chunk)
    elif kind == "full_text":
        memory.insert(EPISODIC, CHUNK_SEPARATOR.join(chunks))
    elif kind != "empty":
        raise ValueError(f"baseline kind must be one of {list(BASELINE_KINDS)}, got {kind!r}")
    return memory


def cut_full_text(
    memory: Memory, questions: Sequence[str], source: str, reader: Reader, tokenizer
) -> Memory:
    """The ``full_text`` memory with its text cut from the start, on token boundaries of
    ``tokenizer`` (the policy's), to the most tokens for which every question's answer prompt
    fits ``reader``'s prompt limit; ``memory`` itself when it fits whole.

    The prompt is measured as the reader measures it (:meth:`~memalpha.reader.base.Reader.prompt_size`),
    with ``source``'s instruction, for the question whose prompt is longest. Raises ``ValueError``
    when even an empty text cannot fit (the question alone is over the limit).
    """
    (entry,) = memory.episodic
    instruction = reader.instruction_for(source)
    limit = reader.prompt_limit()

    def size(text: str, question: str) -> int:
        return reader.prompt_size(memory, [], [MemoryEntry(entry.id, text)], question, instruction)

    question = max(questions or [""], key=lambda q: size("", q))
    if size(entry.content, question) <= limit:
        return memory
    if size("", question) > limit:
        raise ValueError(
            f"rollout.baseline.kind full_text: the reader's prompt for the question {question[:60]!r} is "
            f"over its {limit}-token limit with no text at all"
        )
    ids = tokenizer(entry.content, add_special_tokens=False)["input_ids"]
    lo, hi = 0, len(ids)  # invariant: the last lo tokens fit, the last hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size(tokenizer.decode(ids[-mid:]), question) <= limit:
            lo = mid
        else:
            hi = mid
    cut = Memory(memory.token_counter, core_token_limit=memory.core_token_limit, seed=memory.seed)
    cut.insert(EPISODIC, tokenizer.decode(ids[-lo:]) if lo else "")
    return cut
