"""PolicyModule: what every memalpha LightningModule does with its LoRA policy.

:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.sft_module.SFTModule`
both load the policy from the same settings groups, optimise its adapter with the same
optimiser and schedule under manual optimisation, checkpoint the adapter only, average token
counts, skip a step with a non-finite value on every rank at once (and stop a run after
``optimizer.max_consecutive_nonfinite`` such steps in a row), and export the adapter as a PEFT
folder when training ends. This base class holds that once.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from memalpha.grpo.optimizer import build_optimizer, schedule_length
from memalpha.grpo.settings import OptimizerSettings
from memalpha.grpo.update import NONFINITE_KINDS, NonFiniteStreak, Optimisation
from memalpha.lm.core.adapters import check_adapter_folder, export_adapter
from memalpha.lm.core.embedded import check_model_source
from memalpha.lm.core.policy import LMSettings, LoraSettings, load_policy
from memalpha.train.checkpoint_io import MODULE_KEY

NONFINITE_STREAK_KEY = "memalpha_nonfinite_streak"


def typed(cls, value):
    """Lightning's CLI hands nested settings groups over as dicts; modules keep them typed."""
    return cls(**value) if isinstance(value, dict) else value


class PolicyModule(LightningModule):
    """A LoRA/QLoRA policy under manual optimisation; subclasses call :meth:`_init_policy` in ``__init__``.

    The module is itself the step's :class:`~memalpha.grpo.update.Ranks`: its trainer's world size
    and its collectives (Lightning's strategy reduces over the ranks).
    """

    def _init_policy(
        self, lm: LMSettings | dict, lora: LoraSettings | dict, optimizer: OptimizerSettings | dict
    ) -> None:
        check_model_source(self.hparams.model, "model.model")
        adapter = self.hparams.get("adapter_path")
        if adapter:
            check_adapter_folder(adapter, "model.adapter_path")
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the adapter only, never the frozen base
        self.lm_settings: LMSettings = typed(LMSettings, lm)
        self.lora_settings: LoraSettings = typed(LoraSettings, lora)
        self.optimizer_settings: OptimizerSettings = typed(OptimizerSettings, optimizer)
        self.nonfinite_streak = NonFiniteStreak(self.optimizer_settings.max_consecutive_nonfinite)
        self.policy = None
        self.tokenizer = None
        self._adapter_exported = False  # set by the end-of-fit export (on_train_end, else on_fit_end)

    def load_policy(self) -> bool:
        """Load the policy and tokenizer once (``hparams.model``, ``hparams.adapter_path``); False if already
        loaded."""
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
            attention_score_mib=self.lm_settings.attention_score_mib,
            upcast_unquantised=self.lm_settings.upcast_unquantised,
        )
        return True

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        """The optimiser and its warm-up schedule over the run's length in ``optimizer.schedule_unit``
        (:func:`~memalpha.grpo.optimizer.schedule_length`).

        Under manual optimisation Lightning steps no scheduler:
        :func:`~memalpha.grpo.update.apply_gradients` steps it with each optimiser step
        (``optimizer_step``), or the GRPO module once per rollout round (``round``).
        ``trainer.max_steps`` counts optimiser steps either way.
        """
        settings = self.optimizer_settings
        max_steps = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else 0
        run_rounds = steps_per_round = None
        if settings.schedule_unit == "round":
            run_rounds, steps_per_round = self.schedule_rounds()
        elif settings.warmup_ratio > 0 and max_steps == 0:
            rank_zero_warn(
                f"memalpha: optimizer.warmup_ratio={settings.warmup_ratio} but trainer.max_steps is unset, "
                "so there is no warm-up (optimizer.schedule_unit=round warms up over data.epochs' rounds)"
            )
        total = schedule_length(
            settings, max_steps=max_steps, run_rounds=run_rounds, steps_per_round=steps_per_round
        )
        optimizer, scheduler = build_optimizer(self.trainable_parameters(), settings, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def schedule_rounds(self) -> tuple[int | None, int | None]:
        """``(rollout rounds of the run or None, optimiser steps per round when fixed or None)`` for
        ``optimizer.schedule_unit: round``; only a module that rolls out rounds has them."""
        raise ValueError(
            f"optimizer.schedule_unit=round counts rollout rounds, which {type(self).__name__} does not have;"
            " use optimizer_step"
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter's weights in the checkpoint, and name the module that wrote it."""
        trainable = {f"policy.{name}" for name, p in self.policy.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint[MODULE_KEY] = type(self).__name__
        checkpoint[NONFINITE_STREAK_KEY] = self.nonfinite_streak.count

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Take back the count of non-finite steps in a row, so a resumed run stops where the whole run
        would."""
        self.nonfinite_streak.count = int(checkpoint.get(NONFINITE_STREAK_KEY, 0))

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over the data-parallel ranks (itself on one rank)."""
        if self.trainer.world_size == 1:
            return value
        return self.trainer.strategy.reduce(torch.tensor(value, device=self.device), reduce_op="mean").item()

    def agree_on_nonfinite(self, problem: str | None) -> str | None:
        """What any rank found non-finite before its backward (one of ``NONFINITE_KINDS``), else None.

        A rank that skips its backward alone would leave the others waiting in DDP's gradient
        all-reduce, so every rank asks (a collective: call it on every rank, every step) and all
        skip together.
        """
        if self.trainer.world_size == 1:
            return problem
        code = torch.tensor(float(NONFINITE_KINDS.index(problem) + 1 if problem else 0), device=self.device)
        agreed = int(self.trainer.strategy.reduce(code, reduce_op="max").item())
        return NONFINITE_KINDS[agreed - 1] if agreed else None

    def all_finite(self, finite: bool) -> bool:
        """Whether every rank's loss was finite (a collective under data parallelism)."""
        if self.trainer.world_size == 1:
            return finite
        flag = torch.tensor(float(finite), device=self.device)
        return self.trainer.strategy.reduce(flag, reduce_op="min").item() > 0.5

    def optimisation(self, scheduler) -> Optimisation:
        """How this module's gradients become a step (:func:`~memalpha.grpo.update.apply_gradients`):
        its optimiser over the trainable parameters, ``scheduler`` stepped with it (None: stepped
        elsewhere), Lightning's ``manual_backward`` and its grad scaler, whose overflowing steps are
        its own business (it skips them and lowers its scale), so the norm is not checked then."""
        scaler = self.trainer.scaler
        return Optimisation(
            self.optimizers(), self.trainable_parameters(), self.optimizer_settings.grad_clip,
            scheduler=scheduler, backward=self.manual_backward,
            grad_scale=float(scaler.get_scale()) if scaler is not None else 1.0,
            check_grad_norm=scaler is None,
        )

    def count_nonfinite(self, problem: str | None) -> None:
        """Count a step skipped for a non-finite ``problem`` (None: it trained); warn, or stop at the limit.

        Every rank counts the same steps (the skips are agreed), so every rank stops together.
        """
        warning = self.nonfinite_streak.update(problem, self.global_step)
        if warning is not None:
            rank_zero_warn(f"memalpha: {warning}")

    def on_train_end(self) -> None:
        self._export_final_adapter()

    def on_fit_end(self) -> None:
        """A run resumed from the checkpoint of its last step (one SIGTERM stopped after that step
        saved it) skips training and so ``on_train_end``: export its adapter here instead."""
        done = self.trainer.max_steps > 0 and self.global_step >= self.trainer.max_steps
        if done and not self._adapter_exported:
            self._export_final_adapter()

    def _export_final_adapter(self) -> None:
        target = self.hparams.export_adapter_dir or os.path.join(self.trainer.log_dir or ".", "adapter")
        if self.global_rank == 0:
            export_adapter(self.policy, self.tokenizer, target)
            rank_zero_info(f"memalpha: adapter saved to {target}")
        self._adapter_exported = True
