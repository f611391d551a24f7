"""The optimiser and its learning-rate schedule: AdamW (or bitsandbytes' paged 8-bit AdamW) and a
linear warm-up counted in optimiser steps or rollout rounds (``optimizer.schedule_unit``), then a
constant rate. Every trainer builds its optimiser here; :func:`memalpha.grpo.update.optimizer_step`
steps it."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from memalpha.grpo.settings import OptimizerSettings, WarmupStart


def warmup_steps(settings: OptimizerSettings, total: int) -> int:
    """Length of the linear warm-up in a run of ``total`` scheduler steps (optimiser steps or
    rounds, ``settings.schedule_unit``); 0 is no warm-up.

    ``one_step``: ``ceil(warmup_ratio * total)``, at least 1 when warming up. ``zero`` (verl):
    ``int(warmup_ratio * total)``, floored as verl does (85 rounds at 0.05: 4).
    """
    if settings.warmup_ratio <= 0 or total <= 0:
        return 0
    if settings.warmup_start == "zero":
        return int(settings.warmup_ratio * total)
    return max(1, math.ceil(settings.warmup_ratio * total))


def lr_multiplier(step: int, warmup: int, start: WarmupStart) -> float:
    """The share of the peak learning rate at scheduler step ``step`` (counted from 0) of a
    ``warmup``-step linear warm-up, constant 1 after.

    ``one_step``: ``(step + 1) / (warmup + 1)`` (the first step trains at ``1 / (warmup + 1)``).
    ``zero``: ``step / warmup`` (the first step trains at 0: 4 warm-up rounds give 0, .25, .5, .75,
    then 1).
    """
    if start == "zero":
        return step / warmup if step < warmup else 1.0
    return min(1.0, (step + 1) / (warmup + 1))


def schedule_length(
    settings: OptimizerSettings,
    *,
    max_steps: int,
    run_rounds: int | None = None,
    steps_per_round: int | None = None,
) -> int:
    """The run's length in scheduler steps, what :func:`warmup_steps` takes a share of.

    ``optimizer_step``: ``max_steps`` (Lightning's ``trainer.max_steps``; 0 when unset).
    ``round``: ``run_rounds`` (``data.epochs`` times the rounds of a pass) when known, else
    ``ceil(max_steps / steps_per_round)`` when a round takes a fixed number of optimiser steps;
    without either the warm-up cannot be placed, which is an error unless there is none.
    """
    max_steps = max(max_steps, 0)
    if settings.schedule_unit == "optimizer_step":
        return max_steps
    if run_rounds is not None:
        return run_rounds
    if steps_per_round is not None and max_steps > 0:
        return math.ceil(max_steps / steps_per_round)
    if settings.warmup_ratio <= 0:
        return 0
    raise ValueError(
        "optimizer.schedule_unit=round needs the run's length "
        "in rollout rounds for its warm-up: set data.epochs"
        + ("" if steps_per_round is None else " or trainer.max_steps")
        + " (or optimizer.warmup_ratio=0)"
    )


def build_optimizer(params: Iterable[torch.nn.Parameter], settings: OptimizerSettings, max_steps: int = 0):
    """The optimiser of ``settings`` over ``params`` and its schedule, ``(optimizer, scheduler)``.

    ``max_steps`` is the run's length in the schedule's unit (:func:`schedule_length`): the
    learning rate follows :func:`lr_multiplier` over :func:`warmup_steps` of them, then stays
    constant. Whoever trains steps the scheduler once per optimiser step or once per round
    (``settings.schedule_unit``).
    """
    params = list(params)
    if settings.name == "paged_adamw_8bit":
        import bitsandbytes as bnb

        optimizer = bnb.optim.PagedAdamW8bit(
            params, lr=settings.learning_rate, weight_decay=settings.weight_decay
        )
    else:
        optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    warmup, start = warmup_steps(settings, max_steps), settings.warmup_start
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, warmup, start))
    return optimizer, scheduler
