"""Resuming a killed ``memalpha validate``: each finished batch's rollout records, journaled.

A validation of long instances runs for hours on a CPU (a 32-chunk set of 64 instances is about
2.7 CPU hours of the embedded model; docs/results.md, the length study). ``memalpha validate``
therefore appends each finished batch to ``validation.partial.jsonl`` in its log folder (one line,
flushed and synced before the next batch starts; under data parallelism one file per rank), and,
started again into the same log folder (the same ``trainer.logger.init_args.version``), takes the
batches it finds there instead of running them again. A validation batch is greedy and seeded by
its index alone (``GRPOModule.validation_step``), so the resumed report holds the records an
uninterrupted run writes, and its ``seconds`` are those the batches took. Once the report is
written the journal is removed.

A batch with a failed reader answer is not journaled: a rerun asks again. Each line carries the
digest of what decides the records (:func:`~memalpha.train.agent_digest.agent_digest` and the
world size) and of the batch's instances. A journal of another adapter, other settings or other
data is refused in one line (:class:`ValidationJournalError`) and left as it was; a torn last
line (a kill during the append) is cut off.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

from memalpha.agent.rollout import RolloutOutput, RolloutRecord
from memalpha.data.schema import DataValidationError, Instance
from memalpha.train.predict_file import append_record, complete_lines, cut_torn_tail

JOURNAL_FORMAT = "memalpha.validation-batch/1"
LINE_START = json.dumps({"format": JOURNAL_FORMAT})[:-1].encode("utf-8")
"""How every line starts (``format`` is its first key): a torn last line is recognised as ours."""
SECONDS = ("rollout_s", "reader_s", "rollout_cpu_s", "reader_cpu_s")
"""The :class:`~memalpha.agent.rollout.RolloutOutput` timings a journaled batch keeps."""


class ValidationJournalError(DataValidationError):
    """A validation journal this run cannot resume: the message names the file and the line."""


def journal_path(log_dir: Path, rank: int, world_size: int) -> Path:
    """Where rank ``rank`` of ``world_size`` journals its validation batches."""
    suffix = "" if world_size == 1 else f".rank{rank}"
    return log_dir / f"validation.partial{suffix}.jsonl"


def instances_digest(batch: Sequence[Instance]) -> str:
    """A digest of a batch's instances, their chunks and questions included."""
    text = json.dumps([instance.to_dict() for instance in batch], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class ValidationJournal:
    """The finished batches of ``path`` (read when made; see the module docstring), and the
    appends of the batches this run finishes."""

    def __init__(self, path: Path, agent: str) -> None:
        self.path = path
        self.agent = agent
        self.batches: dict[int, tuple[str, RolloutOutput]] = {}
        self._handle: BinaryIO | None = None
        if path.exists():
            self._read()

    def _read(self) -> None:
        if not self.path.is_file():
            raise self._error(f"is not a file; move it to validate into {self.path.parent}")
        complete = 0
        for number, offset, line in complete_lines(self.path, LINE_START, self._not_ours):
            self._take(line, number)
            complete = offset + len(line)
        cut_torn_tail(self.path, complete, "its batch runs again")

    def _take(self, line: bytes, number: int) -> None:
        try:
            entry = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            entry = None
        if not isinstance(entry, dict) or entry.get("format") != JOURNAL_FORMAT:
            raise self._not_ours(number)
        if entry.get("agent") != self.agent:
            raise self._error(
                f"line {number} was written by another adapter or with other settings (agent"
                f" {entry.get('agent')!r}, this run {self.agent!r}); nothing was changed: delete it to"
                " validate from the start, or validate into another trainer.logger.init_args.version"
            )
        try:
            output = RolloutOutput(
                samples=[], records=[RolloutRecord(**record) for record in entry["records"]],
                generated_tokens=0, **{name: float(entry["seconds"][name]) for name in SECONDS},
            )  # fmt: skip
            self.batches[int(entry["batch"])] = (str(entry["instances"]), output)
        except (KeyError, TypeError, ValueError):
            raise self._not_ours(number) from None

    def resumed(self, batch_idx: int, batch: Sequence[Instance]) -> RolloutOutput | None:
        """The journaled output of batch ``batch_idx``, or None when it has not finished; a batch
        journaled with other instances is refused."""
        entry = self.batches.get(batch_idx)
        if entry is None:
            return None
        digest, output = entry
        if digest != instances_digest(batch):
            raise self._error(
                f"batch {batch_idx} was journaled with other instances than this run's"
                f" ({', '.join(i.instance_id for i in batch[:3])}{', ...' if len(batch) > 3 else ''});"
                " nothing was changed: delete it to validate from the start, or validate into another"
                " trainer.logger.init_args.version"
            )
        return output

    def append(self, batch_idx: int, batch: Sequence[Instance], output: RolloutOutput) -> None:
        """Journal a batch this run finished, unless it was resumed or a reader answer failed."""
        if batch_idx in self.batches or any(record.reader_failures for record in output.records):
            return
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "ab")  # noqa: SIM115 - kept open for the run, closed at its end
        append_record(self._handle, {
            "format": JOURNAL_FORMAT, "agent": self.agent, "batch": batch_idx,
            "instances": instances_digest(batch),
            "seconds": {name: getattr(output, name) for name in SECONDS},
            "records": [asdict(record) for record in output.records],
        })  # fmt: skip

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def remove(self) -> None:
        """Close and delete the journal (the report it was for is written)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def _not_ours(self, number: int) -> ValidationJournalError:
        return self._error(
            f"line {number} is not a memalpha validation journal line ({JOURNAL_FORMAT}); nothing was"
            " changed: move the file to validate into this folder"
        )

    def _error(self, reason: str) -> ValidationJournalError:
        return ValidationJournalError(str(self.path), reason)

