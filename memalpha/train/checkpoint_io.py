"""Checkpoint writes that a crash cannot corrupt, and a check of ``--ckpt_path`` before any model loads.

Lightning's default local save goes through an fsspec transaction whose temporary
file lives in the system temp dir; committing it is a *copy* into the target when the
two are on different filesystems, so a kill during that copy leaves a truncated
checkpoint where the previous good one was. Here the bytes go to a temporary file in
the checkpoint's own folder, are flushed to disk, and replace the target with one
``os.replace`` (atomic on POSIX): a reader sees the old file or the new one, never half.
A write that fails (a full disk, a read-only folder) raises :class:`CheckpointWriteError`
and leaves the previous checkpoint as it was; a process killed mid-write leaves only a
``.<name>.*.tmp`` file, which nothing reads and the next save of that name removes.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

MODULE_KEY = "memalpha_module"
"""Checkpoint key naming the memalpha LightningModule that wrote it (``GRPOModule``, ``SFTModule``)."""
LIGHTNING_PATHS = ("last", "best", "hpc", "registry")
"""``ckpt_path`` values Lightning resolves itself."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message names the file and says the previous one is intact."""


class _WriteErrorKeeper:
    """A binary file that remembers the ``OSError`` of a failed write: torch's archive writer
    reports one only as a ``RuntimeError`` about file positions, losing "No space left"."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()

    def fileno(self) -> int:
        return self.handle.fileno()


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` through a same-folder temporary file and ``os.replace``."""
    path = Path(path)
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed mid-write
            stale.unlink(missing_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            writer = _WriteErrorKeeper(handle)
            try:
                torch.save(obj, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise writer.error from None
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            kept = (
                "the previous checkpoint there is intact"
                if path.is_file()
                else "no earlier checkpoint was there"
            )
            reason = exc.strerror or str(exc)
            raise CheckpointWriteError(f"cannot write checkpoint {path}: {reason}; {kept}") from exc
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO whose saves are atomic on the local filesystem."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        atomic_torch_save(checkpoint, path)


def check_checkpoint(path: str, module: str, command: str) -> None:
    """Refuse a ``--ckpt_path`` that is not a checkpoint of ``module`` (raises ``ValueError``
    naming the file), before any model loads. Lightning's own names (``last``, ``best``, ...)
    pass unchecked. The file is memory-mapped, so the check reads little of a large checkpoint."""
    if path in LIGHTNING_PATHS or path.startswith("registry:"):
        return
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"ckpt_path: {path}: no such file")
    if not zipfile.is_zipfile(file):
        raise ValueError(f"ckpt_path: {path} is not a memalpha checkpoint (not a PyTorch checkpoint file)")
    try:
        checkpoint = torch.load(file, map_location="cpu", mmap=True, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for damaged archives; only
        # torch.load on the user's file runs here, and the run stops with the one line below
        raise ValueError(
            f"ckpt_path: {path} is not a readable checkpoint ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or MODULE_KEY not in checkpoint:
        raise ValueError(f"ckpt_path: {path} is not a memalpha checkpoint (no {MODULE_KEY!r} entry)")
    if checkpoint[MODULE_KEY] != module:
        raise ValueError(
            f"ckpt_path: {path} is a {checkpoint[MODULE_KEY]} checkpoint, not one of {command} ({module}); "
            "start from its exported adapter with --model.adapter_path instead"
        )
