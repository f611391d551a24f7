"""One GRPO update: the micro-batched backward of a mini-batch, the optimiser step, the optimiser.

``accumulate_grpo_gradients`` runs a :class:`~memalpha.grpo.batch.GRPOBatch` through the policy
in micro-batches, computes the clipped GRPO loss with the mini-batch's global normaliser and
calls ``backward`` on each micro-batch's loss. ``optimizer_step`` then clips and steps, or drops
the gradients of a non-finite loss or gradient norm. ``build_optimizer`` makes the optimiser and
its warm-up schedule from :class:`~memalpha.grpo.settings.OptimizerSettings` (its arithmetic:
the pure :func:`schedule_length`, :func:`warmup_steps` and :func:`lr_multiplier`). Every trainer
(the Lightning module, the single-turn trainer, the benchmarks) goes through these three functions.

A step that meets a NaN or an infinity (in the rewards, the round's reference or old log-probs,
the loss or the gradient norm) is skipped, never trained on; :class:`NonFiniteStreak` counts
such steps in a row and stops the run with :class:`NonFiniteTrainingError` at
``optimizer.max_consecutive_nonfinite`` (``docs/metrics_and_rewards.md``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.loss import policy_loss
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings, WarmupStart
from memalpha.lm.core.layout import response_mask
from memalpha.lm.scoring.logprobs import token_logprobs
from memalpha.lm.core.prefix_cache import prompt_order, shared_prefix, split_decoder_and_head

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
                f"non-finite values in {self.count} consecutive optimiser step{'' if self.count == 1 else 's'}"
                f" (optimizer.max_consecutive_nonfinite={self.limit}); the last, at global step {step},"
                f" had non-finite {problem}; stopping rather than training on garbage"
                " (see docs/metrics_and_rewards.md)"
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


def accumulate_grpo_gradients(
    policy,
    batch: GRPOBatch,
    settings: UpdateSettings,
    *,
    temperature: float,
    max_response_len: int,
    share_prefix: bool,
    pad_id: int,
    token_normaliser: float,
    seq_normaliser: float,
    backward: Callable[[torch.Tensor], None],
    grad_scale: float = 1.0,
) -> tuple[dict[str, float], bool]:
    """Backward the GRPO loss of one mini-batch, micro-batch by micro-batch.

    ``batch`` without ``old_logps`` takes the ratio on-policy; without ``ref_logps`` it has no KL
    term. ``temperature`` scales the logits as sampling did; ``max_response_len`` is the constant
    of the ``seq-mean-token-sum-norm`` aggregation (the response cap). The normalisers are the
    mini-batch's global response-token and sequence counts, so summing the micro-batch losses gives the mini-batch loss (and the
    order of the rows does not matter).

    With ``share_prefix`` the rows are put in :func:`~memalpha.lm.core.prefix_cache.prompt_order`
    and the prompt prefix they all share runs through the policy once for the whole mini-batch:
    each micro-batch reads it through detached leaves that collect its gradient, and the last
    micro-batch's backward carries the sum through the prefix's pass
    (:meth:`~memalpha.lm.core.prefix_cache.SharedPrefix.pullback`). ``backward`` is therefore still
    called exactly once per micro-batch. ``grad_scale`` is the factor ``backward`` multiplies
    a loss by (a mixed-precision grad scaler's current scale; 1 otherwise).

    Returns token-weighted metrics and whether every micro-batch loss was finite.
    """
    n = len(batch)
    if share_prefix:
        batch = batch.select(prompt_order(batch.prompt_ids))
    device = next(p.device for p in policy.parameters())
    normaliser = token_normaliser if settings.loss_agg == "token-mean" else seq_normaliser
    prefix = leaves = None
    if share_prefix and any(batch.response_ids):
        prefix = shared_prefix(split_decoder_and_head(policy)[0], batch.prompt_ids)
        if prefix is not None and n > settings.micro_batch_size:
            leaves = prefix.detached()
    sums: dict[str, float] = defaultdict(float)
    finite = True
    for lo in range(0, n, settings.micro_batch_size):
        last = lo + settings.micro_batch_size >= n
        sl = slice(lo, lo + settings.micro_batch_size)
        responses = batch.response_ids[sl]
        logps, entropy = token_logprobs(
            policy,
            batch.prompt_ids[sl],
            responses,
            temperature=temperature,
            micro_batch_size=settings.micro_batch_size,
            pad_id=pad_id,
            with_entropy=True,
            share_prefix=share_prefix,
            prefix=prefix if leaves is None or last else leaves,
        )
        width = logps.shape[1]
        mask = response_mask(responses, width, device, logps.dtype)
        old = None if batch.old_logps is None else pad_rows(batch.old_logps[sl], width, device, logps.dtype)
        ref = None if batch.ref_logps is None else pad_rows(batch.ref_logps[sl], width, device, logps.dtype)
        out = policy_loss(
            logps,
            old,
            ref,
            batch.advantages[sl].to(device),
            mask,
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            clip_ratio_c=settings.clip_ratio_c,
            kl_coef=settings.kl_coef if ref is not None else 0.0,
            agg=settings.loss_agg,
            token_normaliser=normaliser,
            max_len=max_response_len,
        )
        finite = finite and out.finite
        loss = out.loss
        if not loss.requires_grad:  # no trained token (responses cut to nothing at a result marker):
            # still one backward per micro-batch, reaching every trainable weight, as DDP expects
            loss = loss + sum(p.sum() for p in policy.parameters() if p.requires_grad) * 0.0
        if last and leaves is not None:
            backward(loss + prefix.pullback(leaves, grad_scale))
        else:
            backward(loss)
        tokens = float(mask.sum().item())
        sums["loss"] += float(out.loss.detach())
        sums["tokens"] += tokens
        for key in ("kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/dual", "ratio_mean"):
            sums[key] += out.metrics[key] * tokens
        sums["entropy"] += float((entropy * mask).sum().item())
    weight = max(sums["tokens"], 1.0)
    metrics = {"loss": sums["loss"], "tokens": sums["tokens"]}
    metrics.update(
        {
            key: sums[key] / weight
            for key in ("kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/dual", "ratio_mean", "entropy")
        }
    )
    return metrics, finite


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
    settings: OptimizerSettings, *, max_steps: int, run_rounds: int | None = None, steps_per_round: int | None = None
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
        "optimizer.schedule_unit=round needs the run's length in rollout rounds for its warm-up: set data.epochs"
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

        optimizer = bnb.optim.PagedAdamW8bit(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    else:
        optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    warmup, start = warmup_steps(settings, max_steps), settings.warmup_start
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, warmup, start))
    return optimizer, scheduler
