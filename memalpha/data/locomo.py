"""The ``locomo`` layout: one LoCoMo conversation (``locomo10.json``, a JSON list) as an instance.

docs/data.md, *LoCoMo*, maps each field to the instance. In short: the sessions in their numbered
order are the chunks, each opened by a line with the speakers, the session's number and its date,
then one ``Speaker: text`` line per turn; a session longer than ``chunk_tokens`` is split between
turns into parts, each opened by the same line with its part number (never inside a turn). Every
question keeps its LoCoMo ``category`` in the question's metadata, and its evidence turn ids
(``D<session>:<turn>``) become ``metadata.evidence_chunks``: the chunks that hold those turns.

Category 5 (adversarial) questions have no answer in the conversation: the record gives the
wrong answer a careless reader would give (``adversarial_answer``). As LoCoMo's own evaluation
does, the question offers two options, "not mentioned" and that wrong answer, the first one being
right; the option letters alternate from one adversarial question of a conversation to the next,
so half of them have the right option first, in a fixed order instead of LoCoMo's unseeded coin.

A record's ``observation`` (per session, per speaker, the facts worth remembering with the turns
that state them) becomes ``metadata.observations``: per chunk, the notes an ideal memory keeps
(each fact, dated with its session, in the chunk of the first turn it names), from which
``memalpha data demos --data`` writes oracle demonstrations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memalpha.data.schema import QA, Instance, RecordChecker

DATA_SOURCE = "locomo"
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
"""LoCoMo's category numbers, as its evaluation code treats them (the paper lists them in another
order: single-hop, multi-hop, temporal, open-domain, adversarial)."""
ADVERSARIAL = 5
NOT_MENTIONED = "Not mentioned in the conversation"
"""The right option of an adversarial question (LoCoMo's scoring looks for "not mentioned")."""

_SESSION = re.compile(r"^session_(\d+)$")
_TURN_ID = re.compile(r"^D(\d+):(\d+)$")
_ID_SEPARATORS = re.compile(r"[;,\s]+")


@dataclass(frozen=True)
class Session:
    """One session of a conversation: its number, date and turns (as in the record)."""

    number: int
    date: str
    turns: list[dict[str, Any]]


def turn_key(value: str) -> tuple[int, int] | None:
    """``(session, turn)`` of a dialogue id ``D<session>:<turn>`` (zero-padded numbers allowed),
    None when ``value`` is not one."""
    match = _TURN_ID.match(value.strip())
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def session_header(speakers: tuple[str, str], number: int, date: str, part: int | None) -> str:
    """The line that opens a session's chunk: who talks, the session's number (and part) and date."""
    where = f"session {number}" if part is None else f"session {number} (part {part})"
    return f"[Chat between {speakers[0]} and {speakers[1]}, {where}, {date}]"


def parse_locomo_record(
    record: Any,
    file: str,
    index: int,
    *,
    count: Callable[[str], int],
    chunk_tokens: int,
    unit: str = "tokens",
) -> Instance:
    """One LoCoMo conversation as an :class:`Instance` (the table of docs/data.md, *LoCoMo*).

    ``count`` measures a chunk in ``unit`` (tokens of the policy's tokenizer, or white-space words);
    a session over ``chunk_tokens`` is split between turns. The instance's metadata says which sessions were
    split (``split_sessions``) and which evidence ids were left out (``dropped_evidence``), for the
    load to report.
    """
    check = RecordChecker(file, index)
    record = check.mapping(record, "record")
    instance_id = check.identifier(check.require(record, "sample_id"), "sample_id", coerce_int=True)
    check.instance_id = instance_id
    conversation = check.mapping(check.require(record, "conversation"), "conversation")
    speakers = tuple(
        check.string(check.require(conversation, key, f"conversation.{key}"), f"conversation.{key}")
        for key in ("speaker_a", "speaker_b")
    )
    sessions = read_sessions(conversation, check)
    chunks: list[str] = []
    where: dict[tuple[int, int], int] = {}  # (session, turn) -> its chunk
    split: list[int] = []
    for session in sessions:
        parts = split_session(session, speakers, count, chunk_tokens, unit, check)
        if len(parts) > 1:
            split.append(session.number)
        for part in parts:
            for key in part.keys:
                if key in where:
                    check.fail("conversation", f"two turns have the dialogue id D{key[0]}:{key[1]}")
                where[key] = len(chunks)
            chunks.append(part.text)
    if not chunks:
        check.fail("conversation", "no session with turns (an instance needs at least one chunk)")
    qa = check.sequence(check.require(record, "qa"), "qa")
    if not qa:
        check.fail("qa", "empty question list (an instance needs at least one question)")
    questions: list[QA] = []
    evidence_chunks: list[list[int]] = []
    dropped: list[str] = []
    adversarial = 0
    for j, item in enumerate(qa):
        question, chunks_of, lost = read_question(item, j, adversarial, where, len(chunks), check)
        adversarial += question.metadata["category"] == ADVERSARIAL
        questions.append(question)
        evidence_chunks.append(chunks_of)
        dropped.extend(lost)
    metadata: dict[str, Any] = {
        "speakers": list(speakers),
        "sessions": [s.number for s in sessions],
        "chunk_tokens": chunk_tokens,
        "split_sessions": split,
        "dropped_evidence": dropped,
        "evidence_chunks": evidence_chunks,
    }
    if "observation" in record:
        observation = record["observation"]
        metadata["observations"] = read_observations(observation, sessions, where, len(chunks), check)
    return Instance(instance_id, DATA_SOURCE, chunks, questions, metadata)


def session_day(date: str) -> str | None:
    """A session's date line (``1:56 pm on 8 May, 2023``) as ``2023-05-08``; None when it is not
    in that form."""
    try:
        return f"{datetime.strptime(date.rsplit(' on ', 1)[-1].strip(), '%d %B, %Y'):%Y-%m-%d}"
    except ValueError:
        return None


def read_observations(
    value: Any,
    sessions: list[Session],
    where: dict[tuple[int, int], int],
    num_chunks: int,
    check: RecordChecker,
) -> list[list[dict[str, str]]]:
    """``observation`` as notes per chunk: each fact an episodic note dated with its session (a
    semantic one when the session's date has another form), in the chunk of the first turn it
    names that exists, else in its session's first chunk."""
    observation = check.mapping(value, "observation")
    notes: list[list[dict[str, str]]] = [[] for _ in range(num_chunks)]
    for session in sessions:
        key = f"session_{session.number}_observation"
        if key not in observation:
            continue
        first = min((c for (number, _), c in where.items() if number == session.number), default=None)
        day = session_day(session.date)
        for speaker, facts in check.mapping(observation[key], f"observation.{key}").items():
            field = f"observation.{key}.{speaker}"
            for f, fact in enumerate(check.sequence(facts, field)):
                entry = check.sequence(fact, f"{field}[{f}]")
                if len(entry) != 2:
                    check.fail(f"{field}[{f}]", "must be [fact, dialogue id or ids]")
                text = check.string(entry[0], f"{field}[{f}][0]")
                ids = entry[1] if isinstance(entry[1], list) else [entry[1]]
                keys = [turn_key(i) for i in ids if isinstance(i, str)]
                chunk = next((where[k] for k in keys if k in where), first)
                if chunk is None:
                    continue  # a session without turns has no chunk to hold its notes
                note = {"memory_type": "episodic_memory", "fact": text, "date": day} if day else {
                    "memory_type": "semantic_memory", "fact": text}
                notes[chunk].append(note)
    return notes


def read_sessions(conversation: dict[str, Any], check: RecordChecker) -> list[Session]:
    """The conversation's sessions with turns, in the order of their numbers, each with its date
    (``session_<n>_date_time``; a session without one is an error). Dates of sessions that are not
    in the record, and sessions without turns, are left out, as LoCoMo's own code does."""
    numbered = sorted(
        (int(match.group(1)), key) for key in conversation if (match := _SESSION.match(key)) is not None
    )
    sessions = []
    for number, key in numbered:
        turns = check.sequence(conversation[key], f"conversation.{key}")
        if not turns:
            continue
        date_key = f"{key}_date_time"
        date = check.string(check.require(conversation, date_key, f"conversation.{date_key}"),
                            f"conversation.{date_key}")  # fmt: skip
        sessions.append(Session(number, date, [check.mapping(t, f"conversation.{key}[{i}]")
                                                for i, t in enumerate(turns)]))  # fmt: skip
    return sessions


@dataclass(frozen=True)
class Part:
    """A chunk of one session: its text and the ``(session, turn)`` keys of the turns it holds."""

    text: str
    keys: list[tuple[int, int]]


def render_turn(turn: dict[str, Any], field: str, check: RecordChecker) -> tuple[tuple[int, int], str]:
    """A turn's ``(session, turn)`` key (from its ``dia_id``) and its line: ``Speaker: text``, and
    ``[shares <caption>]`` after it when the turn shared an image (LoCoMo keeps only a caption)."""
    dia_id = check.string(check.require(turn, "dia_id", f"{field}.dia_id"), f"{field}.dia_id")
    key = turn_key(dia_id)
    if key is None:
        check.fail(f"{field}.dia_id", f"{dia_id!r} is not a dialogue id D<session>:<turn>")
    speaker = check.string(check.require(turn, "speaker", f"{field}.speaker"), f"{field}.speaker")
    text = check.string(check.require(turn, "text", f"{field}.text"), f"{field}.text", allow_empty=True)
    line = f"{speaker}: {text.strip()}"
    caption = turn.get("blip_caption")
    if caption is not None:
        line += f" [shares {check.string(caption, f'{field}.blip_caption').strip()}]"
    return key, line


def split_session(
    session: Session,
    speakers: tuple[str, str],
    count: Callable[[str], int],
    chunk_tokens: int,
    unit: str,
    check: RecordChecker,
) -> list[Part]:
    """The session as one chunk, or, when that is over ``chunk_tokens``, as parts filled turn by
    turn up to ``chunk_tokens`` each (counted with their opening line). A turn that does not fit
    in a part of its own is an error naming it: a turn is never cut."""
    field = f"conversation.session_{session.number}"
    lines = [render_turn(turn, f"{field}[{t}]", check) for t, turn in enumerate(session.turns)]
    header = session_header(speakers, session.number, session.date, None)
    whole = "\n".join([header, *(line for _, line in lines)])
    if count(whole) <= chunk_tokens:
        return [Part(whole, [key for key, _ in lines])]
    parts: list[Part] = []
    start = 0
    while start < len(lines):
        header = session_header(speakers, session.number, session.date, len(parts) + 1)
        end = start
        text = header
        while end < len(lines):
            candidate = f"{text}\n{lines[end][1]}"
            if count(candidate) > chunk_tokens:
                break
            text, end = candidate, end + 1
        if end == start:
            size = count(f"{header}\n{lines[start][1]}")
            check.fail(
                f"{field}[{start}]",
                f"this turn is {size} {unit} with its session line, over data.load.chunk_tokens="
                f"{chunk_tokens}; a session is split between turns, never inside one: raise chunk_tokens",
            )
        parts.append(Part(text, [key for key, _ in lines[start:end]]))
        start = end
    return parts


def read_question(
    item: Any,
    j: int,
    adversarial: int,
    where: dict[tuple[int, int], int],
    num_chunks: int,
    check: RecordChecker,
) -> tuple[QA, list[int], list[str]]:
    """Question ``j`` as a :class:`QA` with its metadata, the chunks of its evidence, and the
    evidence ids left out (each described for the load's report).

    ``adversarial`` counts the adversarial questions before this one (it picks the option order).
    An evidence entry may hold several ids (``"D8:6; D9:17"``); an id that names no turn is left
    out when another id of the question names one, and is an error otherwise. A question without
    evidence may draw on any chunk: its evidence is every chunk.
    """
    at = f"qa[{j}]"
    item = check.mapping(item, at)
    question = check.string(check.require(item, "question", f"{at}.question"), f"{at}.question")
    category = check.require(item, "category", f"{at}.category")
    if isinstance(category, bool) or category not in CATEGORY_NAMES:
        check.fail(f"{at}.category", f"expected one of {sorted(CATEGORY_NAMES)}, got {category!r}")
    metadata: dict[str, Any] = {"category": category, "category_name": CATEGORY_NAMES[category]}
    if category == ADVERSARIAL:
        wrong = gold_text(check.require(item, "adversarial_answer", f"{at}.adversarial_answer"),
                          f"{at}.adversarial_answer", check)  # fmt: skip
        options = (NOT_MENTIONED, wrong) if adversarial % 2 == 0 else (wrong, NOT_MENTIONED)
        question = f"{question} Choose one: (a) {options[0]} (b) {options[1]}."
        metadata.update(adversarial_answer=wrong, options={"a": options[0], "b": options[1]})
        if item.get("answer") is not None:
            metadata["answer"] = gold_text(item["answer"], f"{at}.answer", check)
        answer = NOT_MENTIONED
    else:
        answer = gold_text(check.require(item, "answer", f"{at}.answer"), f"{at}.answer", check)
    ids: list[str] = []
    chunks: set[int] = set()
    lost: list[tuple[str, str]] = []
    entries = check.sequence(item.get("evidence") or [], f"{at}.evidence")
    for e, entry in enumerate(entries):
        field = f"{at}.evidence[{e}]"
        for piece in _ID_SEPARATORS.split(check.string(entry, field)):
            if not piece:
                continue
            key = turn_key(piece)
            if key is None or key not in where:
                why = "is not a dialogue id D<session>:<turn>" if key is None else "names no turn"
                lost.append((field, f"{piece!r} {why}"))
                continue
            ids.append(f"D{key[0]}:{key[1]}")
            chunks.add(where[key])
    if lost and not chunks:
        field, reason = lost[0]
        check.fail(field, f"{reason} (and no other evidence id of the question does)")
    metadata["evidence"] = ids
    described = [f"{check.instance_id} {field}: {reason}" for field, reason in lost]
    return QA(question, answer, metadata), sorted(chunks) if chunks else list(range(num_chunks)), described


def gold_text(value: Any, field: str, check: RecordChecker) -> str:
    """A LoCoMo answer as text: a non-empty string, or a number written as a string."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return check.string(value, field)


def load_notes(instances: list[Instance], label: str, unit: str) -> list[str]:
    """The load's messages about its LoCoMo instances, one line each: which sessions were split
    (over ``chunk_tokens`` in ``unit``) and which evidence ids were left out; none when neither."""
    notes = []
    split = [(i.instance_id, i.metadata["split_sessions"]) for i in instances if i.metadata["split_sessions"]]
    if split:
        sessions = sum(len(numbers) for _, numbers in split)
        total = sum(len(i.metadata["sessions"]) for i in instances)
        where = "; ".join(f"{name}: {', '.join(map(str, numbers))}" for name, numbers in split)
        budget = instances[0].metadata["chunk_tokens"]
        notes.append(
            f"{label}: {sessions} of {total} LoCoMo sessions are over data.load.chunk_tokens={budget} {unit} "
            f"and were split between turns into parts (sessions {where})"
        )
    dropped = [d for i in instances for d in i.metadata["dropped_evidence"]]
    if dropped:
        notes.append(
            f"{label}: {len(dropped)} evidence ids name no turn and were left out (the question keeps its "
            f"other ids): {'; '.join(dropped)}"
        )
    return notes

