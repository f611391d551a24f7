"""Callbacks the DDP tests inject through the CLI: each rank saves what it trained on and its adapter
(:class:`RankProbe`), or stops as a validation batch starts, as a kill would (:class:`KillAtBatch`)."""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import Callback


class RankProbe(Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_end(self, trainer, pl_module) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        lora = {
            n: p.detach().cpu().clone() for n, p in pl_module.policy.named_parameters() if p.requires_grad
        }
        torch.save(
            {
                "instances": list(trainer.datamodule.seen_instance_ids),
                "lora": lora,
                "world": trainer.world_size,
            },
            self.out_dir / f"rank{trainer.global_rank}.pt",
        )


class KillAtBatch(Callback):
    """Every rank raises as validation batch ``batch`` starts: the batches before it are finished."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0):
        if batch_idx == self.batch:
            raise RuntimeError(f"killed as validation batch {batch_idx} starts")
