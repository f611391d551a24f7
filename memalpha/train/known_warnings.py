"""The dependencies' warnings and notices that say nothing to a memalpha user, hidden in one place.

A run should print its stage lines, the progress bar and the tables; a user should not have to
read past library notices to find them. Each entry below says why it is harmless here. Anything
not listed still shows, and memalpha's own errors are never filtered.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownWarning:
    """A message start (``warnings`` messages and log records alike are matched from their
    beginning), where it comes from, and why memalpha hides it."""

    message: str
    source: str
    reason: str


PYTHON_WARNINGS: tuple[KnownWarning, ...] = (
    KnownWarning(
        "Using ModelCheckpoint with manual optimization",
        "lightning ModelCheckpoint, at every save",
        "the checkpoint of step N holds the weights after N updates and resumes at step N, as memalpha"
        " wants (the resume tests check it)",
    ),
    KnownWarning(
        "LightningCLI's args parameter is intended to run from within Python",
        "lightning LightningCLI",
        "memalpha sft, make demo and Python callers pass explicit arguments on purpose, and sys.argv"
        " must stay whole: Lightning's DDP launcher starts the other ranks by running it again",
    ),
    KnownWarning(
        "You are using the `dataloader_iter` step flavor",
        "lightning configuration validator",
        "GRPOModule.training_step takes one round from the iterator only when its experience buffer is"
        " empty, by design (a round serves several optimiser steps); no hook uses batch_idx",
    ),
    KnownWarning(
        "Found `dataloader_iter` argument in the `training_step`",
        "lightning training loop",
        "the same design, announced a second time",
    ),
    KnownWarning(
        "`isinstance(treespec, LeafSpec)` is deprecated",
        "lightning's pytree helper under torch >= 2.10",
        "inside Lightning; nothing a caller can change",
    ),
    KnownWarning(
        "Total length of `DataLoader` across ranks is zero",
        "lightning predict loop",
        "memalpha predict started again after every instance was written: it has nothing left to read,"
        " and says so in its own line",
    ),
    KnownWarning(
        "`is_gradient_checkpointing` is deprecated",
        "transformers, read by peft when it wraps the model",
        "inside peft; nothing a caller can change",
    ),
)
"""``warnings`` messages hidden by :func:`silence_known_warnings`."""

LOG_RECORDS: dict[str, tuple[KnownWarning, ...]] = {
    "lightning.pytorch.utilities.rank_zero": (
        KnownWarning("💡 Tip:", "lightning's logger connector", "an advertisement for a cloud logger"),
        KnownWarning("TPU available:", "lightning trainer setup", "memalpha runs on CPUs and GPUs"),
        KnownWarning("HPU available:", "lightning trainer setup", "memalpha runs on CPUs and GPUs"),
    ),
    "bitsandbytes.backends.cpu.ops": (
        KnownWarning(
            "Failed to load CPU gemm_4bit_forward from kernels-community",
            "bitsandbytes, at import on a CPU",
            "an optional kernel package; bitsandbytes falls back to its own CPU kernel, and memalpha's"
            " 4-bit tests check that path",
        ),
    ),
}
"""Log records hidden by :func:`silence_known_warnings`, by the logger that emits them."""


class _DropKnown(logging.Filter):
    """Drops the records whose message starts with one of ``known``."""

    def __init__(self, known: tuple[KnownWarning, ...]) -> None:
        super().__init__()
        self.starts = tuple(k.message for k in known)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def silence_known_warnings() -> None:
    """Hide :data:`PYTHON_WARNINGS` and :data:`LOG_RECORDS` for this process (idempotent)."""
    for known in PYTHON_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(known.message))  # matched from the start
    for name, known_records in LOG_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(known_records))

