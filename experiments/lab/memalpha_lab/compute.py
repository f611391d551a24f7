"""The compute of every stage of an experiment (issue 39, item 2), recorded where it is measured.

Two sources, never an estimate:

* **wall and CPU seconds of a stage** (one ``memalpha`` subprocess: a fit, an SFT run, a
  validation), measured by the experiment around the subprocess: ``time.perf_counter`` and
  ``resource.getrusage(RUSAGE_CHILDREN)`` (user + system seconds of the finished children, so of
  that subprocess alone: the experiment runs one at a time). Each attempt is appended to
  ``<run-dir>/compute/<stage>.json`` whether it finishes or fails, so a stage resumed under
  ``--reuse`` sums all its attempts, and a stage run before this record existed has none
  (``None``, reported as not recorded). An attempt killed together with the experiment records
  nothing; the ``<stage>.running`` file it leaves marks the next attempt ``after_unrecorded``, and
  :func:`stage_seconds` then reports the stage's seconds as not ``complete``;
* **what a training run did**, from the TensorBoard scalars its module logged: ``step_s`` (one
  per optimiser step: the step count and the training seconds, loading and validation excluded)
  and, per GRPO round (:func:`memalpha.train.step.round_metrics`), ``perf/rollouts``,
  ``perf/turn_samples``, ``perf/generated_tokens`` and ``reader/questions`` (each question one
  reader request). An SFT run samples nothing: those counts are 0 by construction. A GRPO run
  logged before those scalars existed has ``None`` for them.

A validation's rollouts and reader questions are counted from its report's records.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memalpha_lab.common import write_text_atomically

ROUND_COUNTS = {
    "rollouts": "perf/rollouts",
    "turn_samples": "perf/turn_samples",
    "tokens_sampled": "perf/generated_tokens",
    "reader_calls": "reader/questions",
}
"""A training record's count -> the per-round TensorBoard scalar summed for it."""
TRAIN_TAGS = ("step_s", *ROUND_COUNTS.values())


def children_cpu_s() -> float:
    """User plus system CPU seconds of this process's finished (waited-for) children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def ledger_path(run_dir: Path, stage: str) -> Path:
    return run_dir / "compute" / f"{stage}.json"


def append_attempt(run_dir: Path, stage: str, attempt: Mapping[str, Any]) -> None:
    """Add one attempt to the stage's ledger (a JSON list), written atomically."""
    path = ledger_path(run_dir, stage)
    attempts = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    write_text_atomically(path, json.dumps([*attempts, dict(attempt)], indent=1) + "\n")


def running_marker(run_dir: Path, stage: str) -> Path:
    """The file an attempt of ``stage`` holds while it runs; left behind when the experiment's own
    process was killed during the attempt (so the attempt was never recorded)."""
    return run_dir / "compute" / f"{stage}.running"


def unrecorded_attempt(run_dir: Path, stage: str) -> bool:
    """Whether an earlier attempt of ``stage`` ran and was never recorded (its marker is left)."""
    return running_marker(run_dir, stage).is_file()


@contextmanager
def measured(run_dir: Path, stage: str) -> Iterator[None]:
    """Record the wall and children-CPU seconds of the block as one attempt of ``stage``
    (``finished`` False when it raised, a failed or interrupted subprocess included;
    ``after_unrecorded`` True when an earlier attempt was never recorded, see
    :func:`unrecorded_attempt`; ``boot`` the machine's boot id, so seconds matched between two stages,
    as a study's arms are, can be seen to come from one machine)."""
    marker = running_marker(run_dir, stage)
    after_unrecorded = marker.is_file()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    wall, cpu = time.perf_counter(), children_cpu_s()
    finished = False
    try:
        yield
        finished = True
    finally:
        attempt = {
            "wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(children_cpu_s() - cpu, 3),
            "finished": finished, "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "boot": boot_id(),
        }
        if after_unrecorded:
            attempt["after_unrecorded"] = True
        append_attempt(run_dir, stage, attempt)
        marker.unlink(missing_ok=True)


def boot_id() -> str | None:
    """This machine's boot id (Linux: new at every boot and on every machine); None elsewhere."""
    path = Path("/proc/sys/kernel/random/boot_id")
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


def stage_seconds(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """``{"wall_s", "cpu_s", "attempts", "complete", "boots"}`` over the stage's recorded attempts: the
    seconds summed (``complete`` False when an attempt came after an unrecorded one, so the sums miss
    its seconds) and the boot ids they ran under (None for an attempt recorded before they were);
    None when none was recorded (the stage ran before this record, or has not run)."""
    path = ledger_path(run_dir, stage)
    if not path.is_file():
        return None
    attempts = json.loads(path.read_text(encoding="utf-8"))
    if not attempts:
        return None
    return {"wall_s": round(sum(a["wall_s"] for a in attempts), 3),
            "cpu_s": round(sum(a["cpu_s"] for a in attempts), 3), "attempts": len(attempts),
            "complete": not any(a.get("after_unrecorded", False) for a in attempts),
            "boots": sorted({a.get("boot") for a in attempts}, key=str)}


def training_counts(series: Mapping[str, Mapping[int, float]], sampled: bool) -> dict[str, Any]:
    """A training run's record from its ``{tag: {step: value}}`` scalars: ``optimiser_steps`` and
    ``train_s`` from ``step_s``, and each of :data:`ROUND_COUNTS` summed over the rounds; for a run
    that samples nothing (``sampled`` False: SFT) those are 0, for a GRPO run that did not log
    them None."""
    steps = series.get("step_s", {})
    out: dict[str, Any] = {"optimiser_steps": len(steps), "train_s": round(sum(steps.values()), 3)}
    for key, tag in ROUND_COUNTS.items():
        if not sampled:
            out[key] = 0
        elif tag in series:
            out[key] = round(sum(series[tag].values()))
        else:
            out[key] = None
    return out


def training_compute(folder: Path, sampled: bool) -> dict[str, Any]:
    """:func:`training_counts` of the TensorBoard events under ``folder``."""
    from memalpha_lab.tb_scalars import event_scalars

    return training_counts(event_scalars(folder, TRAIN_TAGS), sampled)


def validation_counts(records: list[Mapping[str, Any]]) -> dict[str, int]:
    """``{"rollouts", "turn_samples", "reader_calls"}`` of a validation report's records."""
    return {"rollouts": len(records), "turn_samples": sum(len(r["turns"]) for r in records),
            "reader_calls": sum(len(r["questions"]) for r in records)}


def stage_record(run_dir: Path, stage: str, counts: Mapping[str, Any]) -> dict[str, Any]:
    """One stage's compute: its counts, and its measured wall and CPU seconds (None when not
    recorded)."""
    seconds = stage_seconds(run_dir, stage)
    return {**counts, "wall_s": None if seconds is None else seconds["wall_s"],
            "cpu_s": None if seconds is None else seconds["cpu_s"],
            "attempts": None if seconds is None else seconds["attempts"]}
