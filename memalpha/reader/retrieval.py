"""BM25 retrieval over a memory's semantic and episodic entries, and how many of them fit a prompt
(docs/method.md, "Answering": retrieval and the prompt budget).

For each question the reader sees the core memory (always) and the ``k`` best-scoring entries of
each list. Entries are lower-cased word tokens (``\\w+``, as the official server tokenises); one
BM25 index is built per list of one memory and queried for all of that memory's questions, and
entries with equal scores keep their memory order, as the official server's stable sort does.
``reader.retrieval.bm25`` (:data:`BM25_VARIANTS`) scores with ``bm25s``'s Lucene BM25 (``lucene``,
the default) or with ``BM25Okapi`` of the ``rank_bm25`` package (``okapi``, pinned at 0.2.2, the
scorer the official server imports, with its defaults and its idf floor).

``reader.retrieval.unit`` (:data:`RETRIEVAL_UNITS`) says what is ranked and shown: whole entries
(``entry``, the official behaviour) or each entry's sentences on their own (``sentence``, an opening
date kept with each: :func:`sentence_units`), so an entry that tells facts about several people shows
only the sentence about the one asked about.

``reader.retrieval.k_reduction`` (:data:`K_RULES`) says how many entries are kept:
:func:`fit_to_budget` (``budget``, the default) or :func:`shrink_while_over` (``official``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, get_args

import numpy as np
from rank_bm25 import BM25Okapi

from memalpha.memory.sentences import sentences

if TYPE_CHECKING:
    from memalpha.memory.store import Memory, MemoryEntry

_TOKEN = re.compile(r"\w+")

DEFAULT_TOP_K = 20
BM25Variant = Literal["lucene", "okapi"]
BM25_VARIANTS: tuple[str, ...] = get_args(BM25Variant)
"""``reader.retrieval.bm25``: ``lucene`` (bm25s) or ``okapi`` (rank_bm25's BM25Okapi, the official
scoring)."""
RetrievalUnit = Literal["entry", "sentence"]
RETRIEVAL_UNITS: tuple[str, ...] = get_args(RetrievalUnit)
"""``reader.retrieval.unit``: what is ranked and shown, whole entries or their sentences."""
KReduction = Literal["budget", "official"]
"""``reader.retrieval.k_reduction``: bisect k to fit the whole prompt, or the official one-by-one rule on the
system prompt (:data:`K_RULES`)."""
DEFAULT_SYSTEM_PROMPT_LIMIT = 30_000
"""The official server's limit on the reader's system prompt, in tokens."""


class _HasContent(Protocol):
    content: str


E = TypeVar("E", bound=_HasContent)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens, the unit BM25 counts."""
    return _TOKEN.findall(text.lower())


def _score_rows(documents: list[list[str]], queries: list[list[str]], bm25: str) -> list[np.ndarray]:
    """Every document's score for each (non-empty) query, float64."""
    n = len(documents)
    if bm25 == "okapi":
        if not any(documents):  # rank_bm25 divides by zero on a list without a word; nothing matches
            return [np.zeros(n, dtype=np.float64) for _ in queries]
        index = BM25Okapi(documents)
        return [index.get_scores(q) for q in queries]
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(documents, show_progress=False)
    # k = n returns every entry's score
    doc_ids, scores = retriever.retrieve(queries, k=n, show_progress=False, n_threads=1)
    rows = []
    for row in range(len(queries)):
        full = np.zeros(n, dtype=np.float64)
        full[np.asarray(doc_ids[row], dtype=np.int64)] = scores[row]
        rows.append(full)
    return rows


def rank_entries(
    entries: Sequence[E], questions: Sequence[str], top_k: int = DEFAULT_TOP_K, bm25: str = "lucene"
) -> list[list[E]]:
    """For each question, up to ``top_k`` entries ordered by BM25 score (ties: memory order).

    ``bm25`` is ``lucene`` or ``okapi`` (see the module docstring). A question without word
    tokens retrieves nothing (there is nothing to match on).
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if bm25 not in BM25_VARIANTS:
        raise ValueError(f"bm25 must be one of {list(BM25_VARIANTS)}, got {bm25!r}")
    query_tokens = [tokenize(q) for q in questions]
    out: list[list[E]] = [[] for _ in questions]
    live = [i for i, toks in enumerate(query_tokens) if toks]
    if not entries or top_k == 0 or not live:
        return out
    rows = _score_rows([tokenize(e.content) for e in entries], [query_tokens[i] for i in live], bm25)
    for qi, full in zip(live, rows):
        order = np.argsort(-full, kind="stable")[:top_k]  # stable: ties keep memory order
        out[qi] = [entries[int(j)] for j in order]
    return out


def sentence_units(entries: Sequence[MemoryEntry]) -> list[MemoryEntry]:
    """Each entry's sentences as entries of their own (:func:`memalpha.memory.sentences.sentences`: an
    opening date dates every sentence), in memory order; the ``k``-th sentence of entry ``id`` has the
    id ``id.k``."""
    from memalpha.memory.store import MemoryEntry

    return [MemoryEntry(f"{entry.id}.{k}", text)
            for entry in entries for k, text in enumerate(sentences(entry.content))]


def retrieve_for_questions(
    memory: Memory, questions: Sequence[str], top_k: int = DEFAULT_TOP_K, bm25: str = "lucene",
    unit: str = "entry",
) -> list[tuple[list[MemoryEntry], list[MemoryEntry]]]:
    """Per question, the top-``top_k`` (semantic, episodic) units of ``memory``, scored by ``bm25``:
    its entries (``unit: entry``) or their sentences (``unit: sentence``, :func:`sentence_units`).

    Core memory is not part of the result: the reader always includes it.
    """
    if unit not in RETRIEVAL_UNITS:
        raise ValueError(f"unit must be one of {list(RETRIEVAL_UNITS)}, got {unit!r}")
    cut = sentence_units if unit == "sentence" else list
    semantic = rank_entries(cut(memory.semantic), questions, top_k, bm25)
    episodic = rank_entries(cut(memory.episodic), questions, top_k, bm25)
    return list(zip(semantic, episodic))


def fit_to_budget(
    semantic: Sequence[E],
    episodic: Sequence[E],
    measure: Callable[[Sequence[E], Sequence[E]], int],
    budget: int,
) -> tuple[list[E], list[E], bool]:
    """Keep the first ``k`` of each ranked list, ``k`` as large as fits ``measure(...) <= budget``.

    ``measure(sem, epi)`` returns the token length of the prompt built from those entries; it only
    grows with ``k``, so ``k`` is found by bisection. Returns ``(semantic[:k], episodic[:k], fits)``;
    ``fits`` is False only when even ``k = 0`` (core and question alone) is over the budget, in
    which case both lists are empty.
    """
    hi = max(len(semantic), len(episodic))
    if measure(semantic, episodic) <= budget:
        return list(semantic), list(episodic), True
    if measure(semantic[:0], episodic[:0]) > budget:
        return [], [], False
    lo = 0  # invariant: k = lo fits, k = hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if measure(semantic[:mid], episodic[:mid]) <= budget:
            lo = mid
        else:
            hi = mid
    return list(semantic[:lo]), list(episodic[:lo]), True


def shrink_while_over(
    semantic: Sequence[E],
    episodic: Sequence[E],
    measure: Callable[[Sequence[E], Sequence[E]], int],
    limit: int,
) -> tuple[list[E], list[E], bool]:
    """The official rule: lower ``k`` by one (both lists together) while ``measure(...) > limit``.

    ``k`` starts at the longer list's length (a larger ``k`` gives the same lists) and stops at the
    first value whose prompt fits, measured at every step, so no assumption on ``measure`` is made.
    Returns ``(semantic[:k], episodic[:k], fits)``; ``fits`` is False when even ``k = 0`` is over
    (the official loop stops at ``k = 1`` and aborts there; both agree wherever it runs).
    """
    k = max(len(semantic), len(episodic))
    while k > 0 and measure(semantic[:k], episodic[:k]) > limit:
        k -= 1
    if k == 0 and measure(semantic[:0], episodic[:0]) > limit:
        return [], [], False
    return list(semantic[:k]), list(episodic[:k]), True


@dataclass(frozen=True)
class KRule:
    """How the number of retrieved entries is cut (``reader.retrieval.k_reduction``), picked once
    when the reader is built (:data:`K_RULES`): the search, and whether it measures the whole
    chat-formatted prompt against ``reader.retrieval.prompt_tokens`` or the system prompt alone
    against ``reader.retrieval.system_prompt_limit``."""

    name: str
    reduce: Callable[..., tuple[list, list, bool]]
    counts_whole_prompt: bool


K_RULES: dict[str, KRule] = {
    "budget": KRule("budget", fit_to_budget, counts_whole_prompt=True),
    "official": KRule("official", shrink_while_over, counts_whole_prompt=False),
}
"""Each ``reader.retrieval.k_reduction`` name's :class:`KRule`."""
