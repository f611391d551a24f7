"""Fact recall: the share of an instance's gold facts that its final memory holds (no reader involved).

An instance knows its facts when ``metadata["notes"]`` lists, per chunk, the facts it tells
(the synthetic tasks write them: :mod:`memalpha.data.synthetic`); other data has no facts and no
recall (``None``, never 0). A fact is **present** when one memory item (the core paragraph, or
one entry of either list) holds at least :data:`FACT_MIN_SHARE` of the fact's content tokens
(:func:`memalpha.agent.reward_math.content_tokens`). docs/metrics_and_rewards.md ("Fact recall")
says why token overlap within one item, with examples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memalpha.agent.reward_math import content_tokens
from memalpha.memory.sentences import sentences
from memalpha.memory.store import LIST_TYPES, Memory

FACT_MIN_SHARE = 0.8
"""Share of a fact's content tokens one memory item must hold for the fact to count as present."""


def instance_facts(metadata: Mapping[str, Any]) -> list[str] | None:
    """The gold facts of an instance (each dated one with its date first), or None when its
    metadata lists none (``metadata["notes"]``: a list per chunk of ``{"fact", "date"?}``)."""
    notes = metadata.get("notes")
    if not isinstance(notes, list):
        return None
    facts = [
        f"{note['date']} {note['fact']}" if note.get("date") else str(note["fact"])
        for chunk_notes in notes
        if isinstance(chunk_notes, list)
        for note in chunk_notes
        if isinstance(note, Mapping) and note.get("fact")
    ]
    return facts or None


def memory_items(memory: Memory) -> list[str]:
    """The texts a fact may be found in: the core paragraph and every list entry."""
    items = [memory.core] if memory.core else []
    items.extend(entry.content for kind in LIST_TYPES for entry in memory.entries(kind))
    return items


def fact_present(fact: str, items: Iterable[frozenset[str]], min_share: float = FACT_MIN_SHARE) -> bool:
    """Whether one item (its content tokens) holds at least ``min_share`` of ``fact``'s content tokens."""
    wanted = content_tokens(fact)
    if not wanted:
        return False
    return any(len(wanted & item) >= min_share * len(wanted) for item in items)


def fact_recall(facts: Sequence[str], items: Sequence[str], min_share: float = FACT_MIN_SHARE) -> float:
    """The share of ``facts`` present in the memory ``items`` (0 for no facts)."""
    if not facts:
        return 0.0
    tokenised = [content_tokens(item) for item in items]
    return sum(fact_present(fact, tokenised, min_share) for fact in facts) / len(facts)


def questions_stored(metadata: Mapping[str, Any], memory: Memory) -> list[bool] | None:
    """Per question, whether ``memory`` holds the one fact that answers it
    (``metadata["question_facts"]``): present, by fact recall's share, in one *sentence* of one item
    (:func:`memalpha.memory.sentences.sentences`, an opening date dating each), so an entry that swaps
    two people's facts does not count as holding either; None when the instance does not name those
    facts."""
    facts = metadata.get("question_facts")
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        return None
    tokenised = [content_tokens(part) for item in memory_items(memory) for part in sentences(item)]
    return [fact_present(fact, tokenised) for fact in facts]


def memory_fact_recall(metadata: Mapping[str, Any], memory: Memory) -> float | None:
    """Fact recall of ``memory`` for an instance with ``metadata``; None when it knows no facts."""
    facts = instance_facts(metadata)
    return None if facts is None else fact_recall(facts, memory_items(memory))
