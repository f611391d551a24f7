"""Whether a memory write carries something of the chunk it was written for (the r2/r4 support rule).

A written text is **supported by the chunk** when the content tokens it adds to the memory are
mostly tokens of the chunk (:func:`is_supported`; docs/metrics_and_rewards.md, "Supported by the
chunk", with examples). Cheap (set operations on words), deterministic and model-free. It does
not tell a paraphrase from a copy or a useful fact from filler; r1 and fact recall
(:mod:`memalpha.agent.fact_recall`) measure that.
"""

from __future__ import annotations

import re

from memalpha.data.wrapping import parse_wrapped_chunk

STOP_WORDS = frozenset(
    (
        "a", "an", "the", "and", "or", "but", "if", "then", "than", "so", "of", "to", "in", "on", "at",
        "by", "for", "with", "from", "into", "onto", "over", "under", "about", "as", "is", "are", "was",
        "were", "be", "been", "being", "am", "do", "does", "did", "has", "have", "had", "having", "will",
        "would", "shall", "should", "can", "could", "may", "might", "must", "not", "no", "nor", "it", "its",
        "this", "that", "these", "those", "there", "here", "i", "me", "my", "we", "our", "you", "your",
        "he", "him", "his", "she", "her", "they", "them", "their", "what", "which", "who", "whom", "whose",
        "when", "where", "why", "how", "all", "any", "some", "each", "every", "also", "just", "very", "too",
        "only", "own", "same", "such", "up", "down", "out", "off", "again", "once"
    )
)
"""Function words that carry no content of their own; they never count as support."""

_TOKEN = re.compile(r"[a-z0-9]+")


def content_tokens(text: str) -> frozenset[str]:
    """The set of lower-cased letter/digit runs of ``text`` that are not :data:`STOP_WORDS`."""
    return frozenset(t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS)


def chunk_tokens(chunk: str) -> frozenset[str]:
    """Content tokens of ``chunk``'s own text: a chunk made by memalpha's wrapper loses the wrapper's
    words and keeps its date; any other chunk counts whole."""
    wrapped = parse_wrapped_chunk(chunk)
    if wrapped is None:
        return content_tokens(chunk)
    return content_tokens(f"{wrapped.day:%Y-%m-%d} {wrapped.text}")


def added_tokens(text: str, replaced: str | None = None) -> frozenset[str]:
    """Content tokens of ``text`` that ``replaced`` (the text it overwrites) does not hold."""
    tokens = content_tokens(text)
    return tokens - content_tokens(replaced) if replaced else tokens


def is_supported(
    text: str, source: frozenset[str], *, replaced: str | None = None, min_share: float, min_tokens: int
) -> bool:
    """Whether ``text``, written over ``replaced``, adds at least ``min_tokens`` tokens of ``source``
    (a chunk's :func:`chunk_tokens`) that are at least ``min_share`` of all it adds."""
    added = added_tokens(text, replaced)
    shared = len(added & source)
    return shared >= min_tokens and shared >= min_share * len(added)
