"""Stop on ``SIGTERM`` with a checkpoint, so a preempted or cancelled run resumes where it stopped.

Lightning's signal connector notes a ``SIGTERM`` and, once the step in flight has finished,
raises ``SIGTERMException`` (a ``SystemExit``, status 0) at the step boundary. Nothing saves
there by default: a run that checkpoints every 50 steps would lose up to 49. The callback
below writes ``last.ckpt`` at that boundary (the same file ``ModelCheckpoint(save_last=True)``
keeps), so ``--ckpt_path <dir>/last.ckpt`` continues from the step the signal ended.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


def last_checkpoint_path(trainer: Trainer) -> str:
    """Where ``last.ckpt`` lives: the first ``ModelCheckpoint``'s folder, else ``<log_dir>/checkpoints``."""
    callback = trainer.checkpoint_callback
    if not isinstance(callback, ModelCheckpoint):
        callback = ModelCheckpoint  # its class constants: last.ckpt
    folder = getattr(callback, "dirpath", None) or os.path.join(
        trainer.log_dir or trainer.default_root_dir, "checkpoints"
    )
    return os.path.join(folder, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)


class CheckpointOnSigterm(Callback):
    """On ``SIGTERM`` during ``fit``, save ``last.ckpt`` at the step boundary and say how to resume."""

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank takes part (the module gathers its buffers)
        rank_zero_info(
            f"memalpha: SIGTERM: saved {path} after step {trainer.global_step}; "
            f"resume with --ckpt_path {path}"
        )
