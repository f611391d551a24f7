"""The ``longmemeval`` layout: one LongMemEval question record as an instance, a chunk per session.

docs/data.md, *LongMemEval*, maps each field of a record (``longmemeval_s.json``,
``longmemeval_m.json``, ``longmemeval_oracle.json``: a JSON list) to the instance. The sessions of
``answer_session_ids`` become ``metadata.evidence_chunks`` (what ``model.update.credit: per_chunk``
reads); one that is not among the record's sessions is an error naming the record and the field,
and a record with none keeps no ``evidence_chunks``.
"""

from __future__ import annotations

from typing import Any

from memalpha.data.schema import QA, Instance, RecordChecker

DATA_SOURCE = "longmemeval"
ROLE_LABELS = {"user": "User", "assistant": "Assistant"}


def render_session(turns: list[Any], date: str | None, check: RecordChecker, field: str) -> str:
    """One session as a chunk: a dated header line, then one ``<Role> text`` line per turn."""
    lines = [f"[Chat session on {date}]" if date else "[Chat session]"]
    for t, turn in enumerate(check.sequence(turns, field)):
        where = f"{field}[{t}]"
        turn = check.mapping(turn, where)
        role = check.string(check.require(turn, "role", f"{where}.role"), f"{where}.role")
        if role not in ROLE_LABELS:
            check.fail(f"{where}.role", f"expected one of {sorted(ROLE_LABELS)}, got {role!r}")
        content = check.string(check.require(turn, "content", f"{where}.content"), f"{where}.content",
                               allow_empty=True)  # fmt: skip
        lines.append(f"<{ROLE_LABELS[role]}> {content}")
    return "\n".join(lines)


def parse_longmemeval_record(record: Any, file: str, index: int) -> Instance:
    """One LongMemEval question record as an :class:`Instance` (the table of docs/data.md, *LongMemEval*)."""
    check = RecordChecker(file, index)
    record = check.mapping(record, "record")
    instance_id = check.identifier(check.require(record, "question_id"), "question_id", coerce_int=True)
    check.instance_id = instance_id
    question = check.string(check.require(record, "question"), "question")
    answer = check.answer(check.require(record, "answer"), "answer", coerce_numbers=True)
    sessions = check.sequence(check.require(record, "haystack_sessions"), "haystack_sessions")
    if not sessions:
        check.fail("haystack_sessions", "no session (an instance needs at least one chunk)")
    ids = [
        check.identifier(value, f"haystack_session_ids[{s}]", coerce_int=True)
        for s, value in enumerate(check.sequence(check.require(record, "haystack_session_ids"),
                                                 "haystack_session_ids"))
    ]  # fmt: skip
    if len(ids) != len(sessions):
        check.fail("haystack_session_ids", f"{len(ids)} ids for {len(sessions)} sessions")
    dates = record.get("haystack_dates")
    dates = [None] * len(sessions) if dates is None else check.sequence(dates, "haystack_dates")
    if len(dates) != len(sessions):
        check.fail("haystack_dates", f"{len(dates)} dates for {len(sessions)} sessions")
    chunks = [
        render_session(turns, None if date is None else check.string(date, f"haystack_dates[{s}]"), check,
                       f"haystack_sessions[{s}]")
        for s, (turns, date) in enumerate(zip(sessions, dates, strict=True))
    ]  # fmt: skip
    asked = record.get("question_date")
    if asked is not None:
        question = f"{question}\n(Asked on {check.string(asked, 'question_date')}.)"
    where = {session_id: s for s, session_id in enumerate(ids)}
    answer_ids = check.sequence(record.get("answer_session_ids") or [], "answer_session_ids")
    evidence = []
    for a, value in enumerate(answer_ids):
        session_id = check.identifier(value, f"answer_session_ids[{a}]", coerce_int=True)
        if session_id not in where:
            check.fail(f"answer_session_ids[{a}]", f"{session_id!r} is not one of its haystack_session_ids")
        evidence.append(where[session_id])
    metadata: dict[str, Any] = {"question_type": record.get("question_type"), "question_date": asked}
    if evidence:
        metadata["evidence_chunks"] = [sorted(set(evidence))]
    return Instance(instance_id, DATA_SOURCE, chunks, [QA(question, answer)], metadata)
