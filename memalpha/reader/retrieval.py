"""BM25 retrieval over a memory's semantic and episodic entries, and prompt-budgeted top-k.

For each question the reader sees the core memory (always) and the ``k`` best-scoring
entries of each list (official k = 20). Entries are tokenised into lower-cased word
tokens (``\\w+``, as the official server does); one BM25 index is built per list of one
memory and queried for all of that memory's questions in a single batched call.

Scoring uses ``bm25s`` (Lucene BM25, k1 = 1.5, b = 0.75). Entries with equal scores keep
their memory order, so rankings are deterministic (older entries first among ties).

:func:`fit_to_budget` shrinks ``k`` until a caller-measured prompt fits a token budget.
Prompt length only grows with ``k``, so the largest fitting ``k`` is found by bisection;
the result is the same as shrinking ``k`` one step at a time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    from memalpha.memory.store import Memory, MemoryEntry

_TOKEN = re.compile(r"\w+")

DEFAULT_TOP_K = 20


class _HasContent(Protocol):
    content: str


E = TypeVar("E", bound=_HasContent)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens, the unit BM25 counts."""
    return _TOKEN.findall(text.lower())


def rank_entries(entries: Sequence[E], questions: Sequence[str], top_k: int = DEFAULT_TOP_K) -> list[list[E]]:
    """For each question, up to ``top_k`` entries ordered by BM25 score (ties: memory order).

    A question without word tokens retrieves nothing (there is nothing to match on).
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    query_tokens = [tokenize(q) for q in questions]
    if not entries or top_k == 0:
        return [[] for _ in questions]
    import bm25s

    retriever = bm25s.BM25()
    retriever.index([tokenize(e.content) for e in entries], show_progress=False)
    live = [i for i, toks in enumerate(query_tokens) if toks]
    out: list[list[E]] = [[] for _ in questions]
    if not live:
        return out
    n = len(entries)
    # k = n returns every entry's score; the stable re-sort below fixes the order of ties.
    doc_ids, scores = retriever.retrieve(
        [query_tokens[i] for i in live], k=n, show_progress=False, n_threads=1
    )
    for row, qi in enumerate(live):
        full = np.zeros(n, dtype=np.float64)
        full[np.asarray(doc_ids[row], dtype=np.int64)] = scores[row]
        order = np.argsort(-full, kind="stable")[:top_k]
        out[qi] = [entries[int(j)] for j in order]
    return out


def retrieve_for_questions(
    memory: Memory, questions: Sequence[str], top_k: int = DEFAULT_TOP_K
) -> list[tuple[list[MemoryEntry], list[MemoryEntry]]]:
    """Per question, the top-``top_k`` (semantic, episodic) entries of ``memory``.

    Core memory is not part of the result: the reader always includes it.
    """
    semantic = rank_entries(list(memory.semantic), questions, top_k)
    episodic = rank_entries(list(memory.episodic), questions, top_k)
    return list(zip(semantic, episodic))


def fit_to_budget(
    semantic: Sequence[E],
    episodic: Sequence[E],
    measure: Callable[[Sequence[E], Sequence[E]], int],
    budget: int,
) -> tuple[list[E], list[E], bool]:
    """Keep the first ``k`` of each ranked list, ``k`` as large as fits ``measure(...) <= budget``.

    ``measure(sem, epi)`` returns the token length of the prompt built from those entries.
    Returns ``(semantic[:k], episodic[:k], fits)``; ``fits`` is False only when even ``k = 0``
    (core and question alone) is over the budget, in which case both lists are empty.
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
