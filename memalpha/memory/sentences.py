"""A memory text cut into its sentences, each able to stand alone.

An agent often writes several facts into one entry ("2024-06-22 - Delphine Prendergast rented a flat
on Granary Lane. Perpetua Esterhazy rented a flat on Heron Drive."). Read as one unit, such an entry
answers a question about either person with both facts side by side, and a small reader mixes them
up; counted as one bag of words, it seems to hold "Delphine Prendergast rented a flat on Heron Drive"
though it says the opposite. :func:`sentences` cuts a text into sentences that keep what they are
about: a date the text opens with ("2024-03-05 - ...", "On 2024-03-05, ...", "2024-03-05: ...") dates
every sentence of it, so it is put before each later one. The reader's ``retrieval.unit: sentence``
ranks and shows these (:mod:`memalpha.reader.retrieval`), and a question's answer counts as stored
when one of them holds it (:func:`memalpha.agent.fact_recall.questions_stored`).
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_OPENING_DATE = re.compile(r"^\W*(?:on\s+)?(\d{4}-\d{2}-\d{2})\b", re.IGNORECASE)
_ANY_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def sentences(text: str) -> list[str]:
    """``text``'s sentences (split after ``.``, ``!`` or ``?`` and white space), the date it opens with
    put before every later sentence that names no date of its own; a text of one sentence comes back
    whole, an empty one as no sentence."""
    parts = [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]
    opening = _OPENING_DATE.match(text)
    if opening is None or len(parts) < 2:
        return parts
    day = opening.group(1)
    return [parts[0]] + [part if _ANY_DATE.search(part) else f"{day}: {part}" for part in parts[1:]]
