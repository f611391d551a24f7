"""Scalars of a run's TensorBoard events, for the studies and benchmarks that read a run's curves."""

from __future__ import annotations

from pathlib import Path


def event_scalars(folder: Path, tags: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the ``tags`` present in the TensorBoard events under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    present = acc.Tags()["scalars"]
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in tags if tag in present}
