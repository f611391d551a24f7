"""Which validation reports ``memalpha compare`` may set side by side: reading one, and the one-line
reason two of them cannot be compared.

A report is read whole and its records checked for the fields the comparison reads, so a file that
is not a validation report stops with one line naming it (and the record and field) before any
number is printed. Two reports are comparable when they hold the same instances, each with the same
chunks and questions, scored the same way (the ``scoring`` settings a report records,
:func:`memalpha.train.validation_report.scoring_settings`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "data_source": str,
    "instance_id": str,
    "questions": list,
    "turns": list,
    "memory_tokens": (int, float),
    "chunk_tokens": (int, float),
    "r3": (int, float),
}
"""The fields of a record the comparison reads, and their JSON types."""

_STEP = re.compile(r"validation_step(\d+)\.json")


class ReportError(ValueError):
    """A file that is not a validation report, or two reports that cannot be compared: one line."""


def report_file(path: Path) -> Path:
    """``path`` itself, or for a run folder its report: ``validation.json`` (``memalpha validate``)
    or the last step's ``validation_step<N>.json`` (``memalpha fit``'s validation)."""
    if not path.is_dir():
        if not path.is_file():
            raise ReportError(f"{path}: no such file or folder")
        return path
    steps = sorted((int(m.group(1)), p) for p in path.iterdir() if (m := _STEP.fullmatch(p.name)))
    validated = path / "validation.json"
    if validated.is_file() and steps:
        raise ReportError(
            f"{path}: holds validation.json and validation_step*.json; name the report file to compare"
        )
    if validated.is_file():
        return validated
    if steps:
        return steps[-1][1]
    raise ReportError(f"{path}: no validation.json or validation_step*.json in this folder")


def read_report(path: Path) -> dict[str, Any]:
    """The report at ``path`` (JSON ``{"summary": {"overall": ...}, "records": [...]}``), its records
    checked for :data:`RECORD_FIELDS` and their questions for a ``score``."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    summary = report.get("summary") if isinstance(report, dict) else None
    if not isinstance(summary, dict) or not isinstance(summary.get("overall"), dict) \
            or not isinstance(report.get("records"), list):
        raise ReportError(f"{path}: not a validation report (no summary.overall and records)")
    if not report["records"]:
        raise ReportError(f"{path}: the report holds no records")
    for index, record in enumerate(report["records"]):
        where = f"{path}: record {index}"
        if not isinstance(record, dict):
            raise ReportError(f"{where}: not an object")
        for field, kind in RECORD_FIELDS.items():
            if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool):
                raise ReportError(f"{where}: field {field!r} missing or not {_name(kind)}")
        for q, question in enumerate(record["questions"]):
            if not isinstance(question, dict) or not isinstance(question.get("score"), (int, float)):
                raise ReportError(f"{where}: field 'questions[{q}].score' missing or not a number")
        for t, turn in enumerate(record["turns"]):
            if not isinstance(turn, dict) or not isinstance(turn.get("results"), list):
                raise ReportError(f"{where}: field 'turns[{t}].results' missing or not a list")
    return report


def _name(kind: type | tuple[type, ...]) -> str:
    return "a number" if isinstance(kind, tuple) else {str: "a string", list: "a list"}[kind]


def settings_difference(settings: tuple[Mapping[str, Any], Mapping[str, Any]]) -> str | None:
    """``key X vs Y`` for the first key the two settings groups hold differently (``and N more``
    when there are more); None when they agree."""
    keys = list(dict.fromkeys([*settings[0], *settings[1]]))
    differ = [k for k in keys if settings[0].get(k) != settings[1].get(k)]
    if not differ:
        return None
    first = differ[0]
    more = f" and {len(differ) - 1} more" if len(differ) > 1 else ""
    return f"{first} {settings[0].get(first)!r} vs {settings[1].get(first)!r}{more}"


def instance_signatures(records: list[Mapping[str, Any]]) -> dict[tuple[str, str], tuple]:
    """``{(source, instance_id): (chunk_tokens, questions)}``: what an instance reads and is asked
    (each question's text, gold, instruction and category), the same for each of its rollouts."""
    out: dict[tuple[str, str], tuple] = {}
    for record in records:
        asked = tuple(
            (q.get("question"), json.dumps(q.get("gold")), q.get("instruction"), q.get("category"))
            for q in record["questions"]
        )
        out[(record["data_source"], record["instance_id"])] = (record["chunk_tokens"], asked)
    return out


def instance_difference(
    records: tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]], names: tuple[str, str]
) -> str | None:
    """Why the two reports' records are not the same held-out set (other instances, or an instance
    with other chunks or questions), naming the first instance that differs; None when they are."""
    first, second = (instance_signatures(r) for r in records)
    only = [sorted(first.keys() - second.keys()), sorted(second.keys() - first.keys())]
    if only[0] or only[1]:
        parts = [
            f"{len(keys)} only in {name} (first {keys[0][0]}/{keys[0][1]})"
            for keys, name in zip(only, names) if keys
        ]
        return f"they hold different instances: {', '.join(parts)}"
    for key in sorted(first):
        (tokens_a, asked_a), (tokens_b, asked_b) = first[key], second[key]
        if tokens_a != tokens_b:
            return f"instance {key[0]}/{key[1]} reads other chunks ({tokens_a} vs {tokens_b} chunk tokens)"
        if asked_a != asked_b:
            return f"instance {key[0]}/{key[1]} is asked other questions (or with other instructions)"
    return None
