"""The JSONL file ``memalpha predict`` writes: one record per instance, appended whole, resumable.

A record is one line: ``{"format": "memalpha.prediction/1", "agent": <digest>, ...}`` followed by
:meth:`~memalpha.agent.reading.Reading.record`'s fields (docs/inference.md, "memalpha predict",
lists them). ``agent`` is a digest of the settings that decide what a record holds (the model,
the adapter or checkpoint, the rollout, reader and chunking settings): a run resumes only a file
written with the same.

Each record is appended with one write, flushed and synced before the next instance starts, so a
killed run leaves complete lines and at most one torn last line (no newline yet). On restart
:func:`scan_records` reads the complete lines, and the torn tail is cut off
(:func:`drop_torn_tail`) before anything is appended; a line in the middle that is not a record,
a record of another agent, or one of an instance the input does not hold is refused in one line
(:class:`PredictionFileError`), and the file is left as it was. Under data parallelism each rank
appends to its own part file (:func:`part_path`); :func:`merge_records` writes the output and the
parts as one file in the input's order, atomically, then removes the parts. Only offsets are held
in memory, never the records. The reading of complete lines and the cut of a torn tail
(:func:`complete_lines`, :func:`cut_torn_tail`) serve ``memalpha validate``'s journal too
(:mod:`memalpha.train.validation_journal`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from memalpha.atomic_file import write_atomically
from memalpha.data.schema import DataValidationError

logger = logging.getLogger(__name__)

RECORD_FORMAT = "memalpha.prediction/1"
RECORD_START = json.dumps({"format": RECORD_FORMAT})[:-1].encode("utf-8")
"""How every record's line starts (``format`` is its first key): a torn last line is recognised
as one of ours, and only then cut off."""


class PredictionFileError(DataValidationError):
    """The prediction output cannot be resumed: the message names the file and the line."""


def part_path(output: Path, rank: int) -> Path:
    """Where rank ``rank`` appends its records under data parallelism."""
    return output.with_name(f"{output.name}.rank{rank}.part")


def part_paths(output: Path) -> list[Path]:
    """The part files beside ``output`` (a killed data-parallel run's, of any world size), by rank."""
    found = output.parent.glob(f"{output.name}.rank*.part") if output.parent.is_dir() else []
    parts = []
    for path in found:
        rank = path.name[len(output.name) + len(".rank"):-len(".part")]
        if rank.isdigit():
            parts.append((int(rank), path))
    return [path for _, path in sorted(parts)]


@dataclass
class Scan:
    """The complete records of one file: each one's instance id, byte offset and length, in file
    order; ``complete_bytes`` ends the last complete line (a torn tail starts there)."""

    path: Path
    records: list[tuple[str, int, int]] = field(default_factory=list)
    complete_bytes: int = 0
    torn_bytes: int = 0


def scan_records(path: Path, agent: str, known: Mapping[str, int]) -> Scan:
    """The complete records of ``path`` (none when it does not exist), each checked: a JSON
    record of :data:`RECORD_FORMAT`, written by ``agent``, of an instance in ``known``. A torn last
    line (one of ours: it starts as every record does) is counted in ``torn_bytes`` and left out;
    anything else wrong is a :class:`PredictionFileError`."""
    scan = Scan(path)
    if not path.exists():
        return scan
    if not path.is_file():
        raise PredictionFileError(str(path), "is not a file; give data.predict.output a file path")
    for number, offset, line in complete_lines(path, RECORD_START, lambda n: not_a_record(path, n)):
        instance_id = _check_line(line, path, number, agent, known)
        scan.records.append((instance_id, offset, len(line)))
        scan.complete_bytes = offset + len(line)
    scan.torn_bytes = path.stat().st_size - scan.complete_bytes
    return scan


def complete_lines(
    path: Path, line_start: bytes, not_ours: Callable[[int], Exception]
) -> Iterator[tuple[int, int, bytes]]:
    """Each complete line of an append-only JSONL file as ``(number, byte offset, line)``. A torn
    last line (no newline: an append cut short) ends the lines when it starts as every line of the
    file's format does (``line_start``); any other raises ``not_ours(number)``."""
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                if not (line.startswith(line_start) or line_start.startswith(line)):
                    raise not_ours(number)
                return
            yield number, offset, line
            offset += len(line)


def cut_torn_tail(path: Path, complete_bytes: int, again: str) -> None:
    """Cut what follows the complete lines (a torn last line) off ``path``, with a warning ending in
    ``again`` (what is done again instead); nothing when there is none."""
    torn = path.stat().st_size - complete_bytes
    if torn:
        logger.warning("%s: dropped a torn last line of %d bytes (a write cut short); %s", path, torn, again)
        os.truncate(path, complete_bytes)


def not_a_record(path: Path, number: int) -> PredictionFileError:
    """The error of a line that is not one of this file format's records."""
    return PredictionFileError(
        str(path), f"line {number} is not a memalpha prediction record ({RECORD_FORMAT}); nothing was"
        " changed: move the file or give data.predict.output another path",
    )  # fmt: skip


def _check_line(line: bytes, path: Path, number: int, agent: str, known: Mapping[str, int]) -> str:
    where = f"line {number}"
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise not_a_record(path, number)
    if record.get("agent") != agent:
        raise PredictionFileError(
            str(path), f"{where} was written by another agent or with other settings (agent"
            f" {record.get('agent')!r}, this run {agent!r}); nothing was changed: give data.predict.output"
            " another path to keep both",
        )  # fmt: skip
    instance_id = record.get("instance_id")
    if instance_id not in known:
        raise PredictionFileError(
            str(path), f"{where} holds instance {instance_id!r}, which data.predict.path does not;"
            " nothing was changed: give data.predict.output another path",
        )  # fmt: skip
    return instance_id


def drop_torn_tail(scan: Scan) -> None:
    """Cut a torn last line (an interrupted append) off ``scan.path``, keeping every complete record."""
    if scan.torn_bytes:
        cut_torn_tail(scan.path, scan.complete_bytes, "its instance is read again")
        scan.torn_bytes = 0


def append_record(handle: BinaryIO, record: Mapping[str, Any]) -> None:
    """Append one record as one line, flushed and synced before returning."""
    handle.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    handle.flush()
    os.fsync(handle.fileno())


def in_order(scan: Scan, order: Mapping[str, int]) -> bool:
    """Whether ``scan``'s records are in the input's order, each instance once."""
    positions = [order[instance_id] for instance_id, _, _ in scan.records]
    return all(a < b for a, b in itertools.pairwise(positions))


def replies_cut(path: Path) -> tuple[int, int]:
    """``(cut, turns)`` over the records of a complete ``memalpha predict`` output: the memorising
    replies cut at ``rollout.max_new_tokens`` (a cut reply may have lost its call), and all turns."""
    cut = turns = 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            for turn in json.loads(line).get("turns", []):
                turns += 1
                cut += bool(turn.get("truncated"))
    return cut, turns


def merge_records(output: Path, scans: Iterable[Scan], order: Mapping[str, int]) -> int:
    """Write every record of ``scans`` (the output's own and the parts') to ``output`` in the input's
    order, each instance once (its first record), atomically; then remove the part files. Returns
    the number of records."""
    first: dict[str, tuple[Path, int, int]] = {}
    scans = list(scans)
    for scan in scans:
        for instance_id, offset, length in scan.records:
            first.setdefault(instance_id, (scan.path, offset, length))
    chosen = sorted(first.items(), key=lambda item: order[item[0]])

    def lines() -> Iterator[str]:
        handles: dict[Path, BinaryIO] = {}
        try:
            for _, (path, offset, length) in chosen:
                handle = handles.get(path) or handles.setdefault(path, open(path, "rb"))  # noqa: SIM115
                handle.seek(offset)
                yield handle.read(length).decode("utf-8")
        finally:
            for handle in handles.values():
                handle.close()

    count = write_atomically(output, lines())
    for scan in scans:
        if scan.path != output:
            scan.path.unlink(missing_ok=True)
    return count
