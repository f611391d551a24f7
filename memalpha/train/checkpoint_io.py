"""Checkpoint writes that a crash cannot corrupt.

Lightning's default local save goes through an fsspec transaction whose temporary
file lives in the system temp dir; committing it is a *copy* into the target when the
two are on different filesystems, so a kill during that copy leaves a truncated
checkpoint where the previous good one was. Here the bytes go to a temporary file in
the checkpoint's own folder, are flushed to disk, and replace the target with one
``os.replace`` (atomic on POSIX): a reader sees the old file or the new one, never half.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` through a same-folder temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO whose saves are atomic on the local filesystem."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)
