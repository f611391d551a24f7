"""PolicyModule: what every memalpha LightningModule does with its LoRA policy.

:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.sft_module.SFTModule`
both load the policy from the same settings groups, optimise its adapter with the same
optimiser and schedule under manual optimisation, checkpoint the adapter only, average token
counts and agree on skipping a non-finite step across ranks, and export the adapter as a PEFT
folder when training ends. This base class holds that once.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from memalpha.grpo.settings import OptimizerSettings
from memalpha.grpo.update import build_optimizer, optimizer_step
from memalpha.lm.adapters import export_adapter
from memalpha.lm.policy import LMSettings, LoraSettings, load_policy


def typed(cls, value):
    """Lightning's CLI hands nested settings groups over as dicts; modules keep them typed."""
    return cls(**value) if isinstance(value, dict) else value


class PolicyModule(LightningModule):
    """A LoRA/QLoRA policy under manual optimisation; subclasses call :meth:`_init_policy` in ``__init__``."""

    def _init_policy(self, lm: LMSettings | dict, lora: LoraSettings | dict, optimizer: OptimizerSettings | dict) -> None:
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the adapter only, never the frozen base
        self.lm_settings: LMSettings = typed(LMSettings, lm)
        self.lora_settings: LoraSettings = typed(LoraSettings, lora)
        self.optimizer_settings: OptimizerSettings = typed(OptimizerSettings, optimizer)
        self.policy = None
        self.tokenizer = None

    def load_policy(self) -> bool:
        """Load the policy and tokenizer once (``hparams.model``, ``hparams.adapter_path``); False if already loaded."""
        if self.policy is not None:
            return False
        self.policy, self.tokenizer = load_policy(
            self.hparams.model,
            precision=self.lm_settings.precision,
            lora=self.lora_settings,
            compute_dtype=self.lm_settings.compute_dtype,
            gradient_checkpointing=self.lm_settings.gradient_checkpointing,
            adapter_path=self.hparams.adapter_path,
            device=self.device,
        )
        return True

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        max_steps = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else 0
        optimizer, scheduler = build_optimizer(self.trainable_parameters(), self.optimizer_settings, max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter's weights in the checkpoint."""
        trainable = {f"policy.{name}" for name, p in self.policy.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over the data-parallel ranks (itself on one rank)."""
        if self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(torch.tensor(value, device=self.device), reduce_op="mean").item()

    def finish_step(self, optimizer, scheduler, finite: bool) -> tuple[float, bool]:
        """Clip and step when every rank's loss was finite (else drop the gradients); ``(grad_norm, finite)``."""
        if self.trainer.world_size > 1:  # every rank must agree to skip, or DDP ranks diverge
            flag = torch.tensor(float(finite), device=self.device)
            finite = self.trainer.strategy.reduce(flag, reduce_op="min").item() > 0.5
        grad_norm = optimizer_step(
            optimizer,
            self.trainable_parameters(),
            finite=finite,
            grad_clip=self.optimizer_settings.grad_clip,
            scheduler=scheduler,
        )
        return grad_norm, finite

    def on_train_end(self) -> None:
        target = self.hparams.export_adapter_dir or os.path.join(self.trainer.log_dir or ".", "adapter")
        if self.global_rank == 0:
            export_adapter(self.policy, self.tokenizer, target)
            rank_zero_info(f"memalpha: adapter saved to {target}")
