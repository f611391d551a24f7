"""A callback the DDP test injects through the CLI: each rank saves what it trained on and its adapter."""

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
