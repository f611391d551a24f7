"""One GRPO update on a :class:`~memalpha.grpo.batch.GRPOBatch`, without the model: the loss of a
micro-batch from its log-probs (:func:`micro_batch_loss`, called by
:func:`memalpha.train.step.accumulate_grpo_gradients`), the mini-batch's metrics
(:class:`LossMeter`), the optimiser step, the optimiser and its warm-up schedule. Every trainer (the
Lightning modules, the single-turn trainer, the benchmarks) goes through these functions.

A step that meets a NaN or an infinity is skipped, never trained on; :class:`NonFiniteStreak`
stops the run after ``optimizer.max_consecutive_nonfinite`` such steps in a row
(``docs/metrics_and_rewards.md``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.loss import LossOutput, policy_loss
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings, WarmupStart

NONFINITE_KINDS = ("rewards", "reference log-probs", "old log-probs", "loss", "grad norm")
"""What a GRPO step can find non-finite, in the order it meets them."""


class NonFiniteTrainingError(RuntimeError):
    """Too many optimiser steps in a row were skipped for non-finite values, so the run stops."""


@dataclass
class NonFiniteStreak:
    """Optimiser steps skipped in a row for a non-finite value, and the count that stops the run.

    One skipped step is noise a long run should survive (a rare overflow, one broken judge
    reply). Several in a row mean the weights, the data or the reward are broken: going on would
    train on garbage, or spin without end, since a skipped step does not count towards
    ``trainer.max_steps``. ``count`` is part of a run's state (checkpointed by the Lightning
    modules), so a resumed run keeps counting.
    """

    limit: int
    count: int = 0

    def update(self, problem: str | None, step: int) -> str | None:
        """Count one step; ``problem`` names what was non-finite (None: the step trained, the streak ends).

        Returns the warning line of a skipped step (None otherwise); raises
        :class:`NonFiniteTrainingError` when ``count`` reaches ``limit``.
        """
        if problem is None:
            self.count = 0
            return None
        self.count += 1
        if self.count >= self.limit:
            raise NonFiniteTrainingError(
                f"non-finite values in {self.count} consecutive optimiser "
                f"step{'' if self.count == 1 else 's'} (optimizer.max_consecutive_nonfinite={self.limit}); "
                f"the last, at global step {step}, had non-finite {problem}; stopping rather than training "
                "on garbage (see docs/metrics_and_rewards.md)"
            )
        return (
            f"global step {step}: non-finite {problem}, the optimiser step is skipped "
            f"({self.count} in a row; the run stops at {self.limit})"
        )


def first_nonfinite(values: dict[str, torch.Tensor | Sequence[torch.Tensor] | None]) -> str | None:
    """The name of the first entry of ``values`` holding a NaN or an infinity; None when all are finite.

    An entry is a tensor, a list of per-sample tensors, or None (a value the step does not have).
    """
    for name, value in values.items():
        if value is None:
            continue
        tensors = [value] if isinstance(value, torch.Tensor) else value
        if not all(bool(torch.isfinite(tensor).all()) for tensor in tensors):
            return name
    return None


def pad_rows(rows: list[torch.Tensor], width: int, device, dtype=torch.float32) -> torch.Tensor:
    """Per-sample 1-D tensors right-padded with 0 into one ``[B, width]`` tensor."""
    out = torch.zeros(len(rows), width, device=device, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row.to(device)
    return out


def micro_batch_loss(
    logps: torch.Tensor,
    entropy: torch.Tensor | None,
    batch: GRPOBatch,
    settings: UpdateSettings,
    *,
    token_normaliser: float,
    seq_normaliser: float,
    max_response_len: int,
) -> LossOutput:
    """The clipped GRPO loss of one micro-batch whose policy log-probs (``[B, T]``, response
    columns) are ``logps``: the sampling and reference log-probs of ``batch`` padded to ``T``,
    the mini-batch's global normaliser for ``settings.loss_agg`` (so the micro-batch losses add
    up to the mini-batch's), the KL term at ``settings.kl_coef`` (a ``batch`` without reference
    log-probs under a coefficient above 0 is an error, never a silent 0)."""
    width = logps.shape[1]
    lengths = torch.tensor([len(r) for r in batch.response_ids], device=logps.device)
    mask = (torch.arange(width, device=logps.device)[None, :] < lengths[:, None]).to(logps.dtype)
    old = None if batch.old_logps is None else pad_rows(batch.old_logps, width, logps.device, logps.dtype)
    ref = None if batch.ref_logps is None else pad_rows(batch.ref_logps, width, logps.device, logps.dtype)
    return policy_loss(
        logps,
        old,
        ref,
        batch.advantages.to(logps.device),
        mask,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        clip_ratio_c=settings.clip_ratio_c,
        kl_coef=settings.kl_coef,  # above 0 without reference log-probs: policy_loss refuses it
        agg=settings.loss_agg,
        token_normaliser=token_normaliser if settings.loss_agg == "token-mean" else seq_normaliser,
        max_len=max_response_len,
        entropy=entropy,
    )


TOKEN_WEIGHTED = ("kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/dual", "ratio_mean", "entropy")
"""The per-micro-batch metrics a mini-batch reports as means over all its response tokens."""


class LossMeter:
    """A mini-batch's metrics from its micro-batches: the loss summed (the micro-batch losses
    carry the global normaliser already), the :data:`TOKEN_WEIGHTED` ones weighted by tokens."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)

    def add(self, out: LossOutput) -> None:
        tokens = out.metrics["tokens"]
        self.sums["loss"] += float(out.loss.detach())
        self.sums["tokens"] += tokens
        for key in TOKEN_WEIGHTED:
            self.sums[key] += out.metrics.get(key, 0.0) * tokens

    def metrics(self) -> dict[str, float]:
        weight = max(self.sums["tokens"], 1.0)
        return {"loss": self.sums["loss"], "tokens": self.sums["tokens"],
                **{key: self.sums[key] / weight for key in TOKEN_WEIGHTED}}


def optimizer_step(
    optimizer,
    params: Iterable[torch.nn.Parameter],
    *,
    finite: bool,
    grad_clip: float,
    scheduler=None,
    check_grad_norm: bool = True,
) -> float:
    """Finish an update whose gradients are accumulated: clip and step, or drop a non-finite one.

    With ``finite`` the global gradient norm of ``params`` is measured and clipped to
    ``grad_clip`` (0: measured only), then the optimiser and ``scheduler`` (if any) step. A
    non-finite loss (``finite`` False) or a non-finite norm (an overflow in backward) drops the
    gradients instead and nothing steps, so one bad batch never reaches the weights or the
    optimiser's moments. Under data parallelism ``finite`` must already be agreed by every rank;
    the norm is that of the all-reduced gradients, the same on every rank. ``check_grad_norm=False``
    leaves non-finite gradients to a mixed-precision grad scaler, which skips such a step itself
    and lowers its scale.

    Returns the norm before clipping, NaN when the loss was non-finite; with ``check_grad_norm``
    the optimiser stepped exactly when it is finite.
    """
    params = list(params)
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return float("nan")
    # an infinite max_norm measures without clipping: the clip factor is capped at 1
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf))
    if check_grad_norm and not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return grad_norm


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
