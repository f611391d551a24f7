"""Dated wrappers around chunk text, and their exact inverse.

The two styles of the Mem-α data (docs/data.md, *Wrapping chunks as dated events*, shows both):
``dialogue``, the chunk as a user turn of a dated conversation, and ``reading``, the chunk as what
the user read on a given day. The opening and closing lines are picked by ``variant``
(deterministic, no randomness). :func:`parse_wrapped_chunk` gives back exactly the text that was
wrapped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Literal, get_args

WrapStyle = Literal["dialogue", "reading"]
WRAP_STYLES: tuple[str, ...] = get_args(WrapStyle)

#: First day of a wrapped sequence, as in the official data (2024-01-01, one day per chunk).
DEFAULT_START = date(2024, 1, 1)

DIALOGUE_OPENINGS = (
    "Here is something new I want you to keep in mind:",
    "Some more things came up that you should know:",
    "Please take note of the following:",
    "I have a few updates for you:",
    "Let me tell you what I found out:",
    "Here is the next batch of information:",
)
DIALOGUE_REPLIES = (
    "Thanks, I have noted all of that.",
    "Understood, I will keep this in mind.",
    "Got it, this is stored for later.",
    "All right, I will remember these details.",
)
READING_REQUEST = (
    "Keep in mind what the user read on {day}: note its details and keep a summary of the book read so far."
)

_DIALOGUE_RE = re.compile(
    r"\A\[Dialogue between User and Assistant on (?P<day>\d{4}-\d{2}-\d{2}) \d{2}:\d{2}\]\n"
    r"<User>(?P<opening>[^\n]*)\n(?P<body>.*)\n<Assistant>(?P<reply>[^\n]*)\Z",
    re.DOTALL,
)
_READING_RE = re.compile(
    r"\A\[Reading event on (?P<day>\d{4}-\d{2}-\d{2}): the user is reading a book\]\n"
    r"<User> (?P<body>.*)\n\n<System> (?P<request>[^\n]*)\Z",
    re.DOTALL,
)


@dataclass(frozen=True)
class UnwrappedChunk:
    """What :func:`parse_wrapped_chunk` recovers from a wrapped chunk."""

    style: str
    day: date
    text: str


def chunk_day(index: int) -> date:
    """The date of chunk ``index`` of a wrapped sequence: :data:`DEFAULT_START`, one day per chunk."""
    return DEFAULT_START + timedelta(days=index)


def wrap_chunk(text: str, style: str, day: date, variant: int = 0) -> str:
    """Wrap ``text`` as a dated dialogue turn or a dated reading event."""
    if style == "dialogue":
        opening = DIALOGUE_OPENINGS[variant % len(DIALOGUE_OPENINGS)]
        reply = DIALOGUE_REPLIES[variant % len(DIALOGUE_REPLIES)]
        return (
            f"[Dialogue between User and Assistant on {day:%Y-%m-%d} 00:00]\n"
            f"<User>{opening}\n{text}\n<Assistant>{reply}"
        )
    if style == "reading":
        request = READING_REQUEST.format(day=f"{day:%Y-%m-%d}")
        return (
            f"[Reading event on {day:%Y-%m-%d}: the user is reading a book]\n"
            f"<User> {text}\n\n<System> {request}"
        )
    raise ValueError(f"unknown wrap style {style!r}; expected one of {WRAP_STYLES}")


def wrap_chunks(chunks: Sequence[str], style: str) -> list[str]:
    """Wrap a whole sequence: chunk ``i`` is dated :func:`chunk_day` ``(i)`` and uses variant ``i``."""
    return [wrap_chunk(text, style, chunk_day(i), variant=i) for i, text in enumerate(chunks)]


def parse_wrapped_chunk(wrapped: str) -> UnwrappedChunk | None:
    """Style, date and original text of a chunk made by :func:`wrap_chunk`; ``None`` if it is not one."""
    match = _DIALOGUE_RE.match(wrapped)
    if match and match["opening"] in DIALOGUE_OPENINGS and match["reply"] in DIALOGUE_REPLIES:
        return UnwrappedChunk("dialogue", date.fromisoformat(match["day"]), match["body"])
    match = _READING_RE.match(wrapped)
    if match and match["request"] == READING_REQUEST.format(day=match["day"]):
        return UnwrappedChunk("reading", date.fromisoformat(match["day"]), match["body"])
    return None
