"""Typed settings of the GRPO update and of the optimiser, shared by every trainer.

Each group is a small dataclass whose fields are documented in its ``Args:`` section (the
configuration reference is generated from them) and checked in ``__post_init__``, so a bad
value fails when the config is read, before any model loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from memalpha.grpo.advantages import AdvantageScale
from memalpha.grpo.credit import CreditScheme, credit_scheme
from memalpha.grpo.loss import LossAggregation

KLReference = Literal["base", "start"]
OptimizerName = Literal["adamw", "paged_adamw_8bit"]
ScheduleUnit = Literal["optimizer_step", "round"]
WarmupStart = Literal["one_step", "zero"]


def _choice(group: str, name: str, value: object, choices: object) -> None:
    """Raise ValueError naming ``group.name`` when ``value`` is not one of the ``Literal`` ``choices``."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{group}.{name} must be one of {list(allowed)}, got {value!r}")


@dataclass
class UpdateSettings:
    """How a round of samples becomes optimiser steps: advantages, the clipped loss, batching.

    Args:
        advantage_scale: ``group`` (divide by the group's std), ``batch`` (by the batch std) or
            ``none`` (Dr. GRPO: only subtract the group mean).
        credit: Which turn earns the accuracy reward. ``broadcast`` (Mem-α, the default): every
            memorising turn gets the final accuracy r1, and a group is all turns of an instance's
            rollouts. ``per_chunk``: after every turn the reader answers the questions whose
            evidence lies in the chunks read so far, from the memory as it stands; turn k is paid
            the accuracy it added (scaled by the number of turns, so the turns' credits sum to the
            broadcast's), and a group is turn k of an instance's rollouts. Needs each question's
            evidence chunks in the data (``metadata.evidence_chunks``); costs the extra reader
            questions (``reader/turn_questions``). ``hindsight``: as ``per_chunk``, but each
            question's final answer is credited to the turn that read its last evidence chunk (no
            extra reader questions; a later turn that spoils a stored answer is not blamed).
            Any other scheme registered from Python (``memalpha/grpo/credit.py``) is accepted by
            its name. docs/metrics_and_rewards.md, "Credit".
        clip_low: Lower PPO clip (ratio >= 1 - clip_low).
        clip_high: Upper PPO clip (ratio <= 1 + clip_high; above clip_low is DAPO's clip-higher).
        clip_ratio_c: Dual clip (Ye et al. 2019, verl's ``clip_ratio_c``; official 3.0): a token with
            a negative advantage loses at most ``clip_ratio_c * |A|``, however far its ratio has
            grown since sampling, so one stale token cannot dominate a late mini-batch. None: off
            (memalpha's default); must be > 1 when set.
        kl_coef: Weight of the k3 KL penalty to the reference (official script 0.001; 0 skips
            the reference pass).
        kl_reference: What the KL term pulls towards. ``base``: the base model (the adapter
            switched off). ``start``: the policy the run started from; with ``model.adapter_path``
            (e.g. after a cold start) that adapter, loaded a second time and frozen, as TRL and
            verl do after SFT; with a fresh adapter the same as ``base`` (LoRA starts at zero).
        loss_agg: ``token-mean``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (Dr. GRPO).
        ppo_epochs: Passes over each round's samples (official 1).
        num_mini_batches: Optimiser steps per pass over a round's samples, a fixed count (1: one
            step per round, the ratio is then always 1). Leave at 1 when ``mini_batch_size`` is set.
        mini_batch_size: Turn samples per optimiser step, as verl's ``ppo_mini_batch_size``
            (official 32: about 80 steps per round of ~2.5k samples, so the ratio and the clips
            act). A round of ``N`` samples then takes ``ceil(N / mini_batch_size)`` steps per pass,
            its samples spread evenly over them (sizes differ by at most one; verl instead keeps
            full batches and one short last batch). ``N`` counts the whole round, summed over DDP
            ranks, as verl's size is global: every rank takes the same number of steps with about
            ``mini_batch_size / world_size`` of its own samples each. None: use
            ``num_mini_batches``.
        micro_batch_size: Samples per forward/backward; gradients accumulate over a mini-batch.
            Also the batch of the reference and old-policy log-prob passes.
    """

    advantage_scale: AdvantageScale = "group"
    credit: str = "broadcast"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None
    kl_coef: float = 0.001
    kl_reference: KLReference = "base"
    loss_agg: LossAggregation = "token-mean"
    ppo_epochs: int = 1
    num_mini_batches: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 4

    def __post_init__(self) -> None:
        _choice("update", "advantage_scale", self.advantage_scale, AdvantageScale)
        credit_scheme(self.credit)  # a registered scheme, or a one-line error naming them
        _choice("update", "kl_reference", self.kl_reference, KLReference)
        _choice("update", "loss_agg", self.loss_agg, LossAggregation)
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"update.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ValueError(f"update.clip_high must be >= 0, got {self.clip_high}")
        if self.kl_coef < 0.0:
            raise ValueError(f"update.kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("ppo_epochs", "num_mini_batches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"update.{name} must be >= 1, got {getattr(self, name)}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(f"update.clip_ratio_c must be > 1 (or null: off), got {self.clip_ratio_c}")
        if self.mini_batch_size is not None:
            if self.mini_batch_size < 1:
                raise ValueError(f"update.mini_batch_size must be >= 1 (or null), got {self.mini_batch_size}")
            if self.num_mini_batches != 1:
                raise ValueError(
                    "update.mini_batch_size and update.num_mini_batches both set the steps per round: "
                    "set one (num_mini_batches must stay 1 with "
                    f"mini_batch_size, got {self.num_mini_batches})"
                )

    def mini_batches_per_epoch(self, round_samples: int) -> int:
        """Optimiser steps per pass over a round of ``round_samples`` turn samples (over all ranks).

        ``ceil(round_samples / mini_batch_size)``, or ``num_mini_batches`` when no size is set;
        never more than ``round_samples`` (a mini-batch holds at least one sample).
        """
        if round_samples < 1:
            raise ValueError(f"a round needs at least one sample, got {round_samples}")
        if self.mini_batch_size is None:
            return min(self.num_mini_batches, round_samples)
        return math.ceil(round_samples / self.mini_batch_size)

    def needs_old_logps(self, round_samples: int) -> bool:
        """Whether a round of ``round_samples`` feeds more than one optimiser step, so the ratio
        needs the sampling policy's log-probs (with ``mini_batch_size`` it depends on the round)."""
        return self.ppo_epochs * self.mini_batches_per_epoch(round_samples) > 1

    @property
    def credit_scheme(self) -> CreditScheme:
        """The credit-assignment scheme :attr:`credit` names (:mod:`memalpha.grpo.credit`)."""
        return credit_scheme(self.credit)


@dataclass
class OptimizerSettings:
    """The optimiser and its learning-rate schedule.

    Args:
        name: ``adamw`` (torch) or ``paged_adamw_8bit`` (bitsandbytes; saves optimiser memory on GPU).
        learning_rate: Peak learning rate (official 1e-6 for full fine-tuning; LoRA wants more).
        weight_decay: Decoupled weight decay (official 0.01).
        warmup_ratio: Share of the run spent warming the learning rate up linearly, constant after
            (official 0.05), the run counted in ``schedule_unit``.
        schedule_unit: What the schedule counts. ``optimizer_step`` (memalpha's default): the
            warm-up is a share of ``trainer.max_steps`` (Lightning's optimiser steps; none when
            unset) and the learning rate moves at every optimiser step. ``round`` (official): the
            warm-up is a share of the run's rollout rounds and the learning rate moves once per
            round, so every optimiser step of a round (``update.mini_batch_size``) shares its rate;
            the rounds are ``data.epochs`` times the rounds of a pass when that is set, else
            ``trainer.max_steps`` over the fixed optimiser steps of a round (``ppo_epochs *
            num_mini_batches``; with ``update.mini_batch_size`` the steps per round vary, so
            ``data.epochs`` is then required unless ``warmup_ratio`` is 0). A round dropped for
            non-finite values still counts. GRPO training only.
        warmup_start: Where the warm-up starts. ``one_step`` (memalpha's default): over
            ``ceil(warmup_ratio * total)`` steps (at least 1) the multiplier is ``(s + 1) / (w + 1)``
            at step ``s``, so the first step already trains. ``zero`` (official, verl's constant
            schedule with warm-up): over ``int(warmup_ratio * total)`` steps (floored; 0 is no
            warm-up) the multiplier is ``s / w``, so the first step (or round) trains at learning
            rate 0 (AdamW's moments still take its gradient).
        grad_clip: Max global gradient norm (official 1.0; 0 disables clipping).
        max_consecutive_nonfinite: Optimiser steps skipped in a row for a NaN or infinity (in the
            rewards, the log-probs, the loss or the gradient norm) that stop the run with an error
            (1: the first stops it); fewer in a row are skipped and the run goes on.
    """

    name: OptimizerName = "adamw"
    learning_rate: float = 1e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    schedule_unit: ScheduleUnit = "optimizer_step"
    warmup_start: WarmupStart = "one_step"
    grad_clip: float = 1.0
    max_consecutive_nonfinite: int = 3

    def __post_init__(self) -> None:
        _choice("optimizer", "name", self.name, OptimizerName)
        _choice("optimizer", "schedule_unit", self.schedule_unit, ScheduleUnit)
        _choice("optimizer", "warmup_start", self.warmup_start, WarmupStart)
        if not self.learning_rate > 0.0:
            raise ValueError(f"optimizer.learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0.0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"optimizer.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.grad_clip < 0.0:
            raise ValueError(f"optimizer.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if self.max_consecutive_nonfinite < 1:
            raise ValueError(
                f"optimizer.max_consecutive_nonfinite must be >= 1, got {self.max_consecutive_nonfinite}"
            )
