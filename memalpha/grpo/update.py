"""The GRPO update loop on a :class:`~memalpha.grpo.batch.GRPOBatch`, without a model in sight:
:func:`train_minibatch` is one optimiser step on one mini-batch, the loss micro-batch by micro-batch
(:func:`accumulate_grpo_gradients`, :func:`micro_batch_loss`), the mini-batch's metrics
(:class:`LossMeter`), then clip and step (:func:`apply_gradients`, :func:`optimizer_step`). The
policy's log-probs come through a :data:`Scorer` the caller binds to its policy
(:func:`memalpha.lm.logprobs.per_token.micro_batch_scorer`), and what differs between the processes of
a data-parallel run through :class:`Ranks`. Every trainer (the Lightning modules, the single-turn
trainer, the benchmarks) goes through these functions; the optimiser itself is built in
:mod:`memalpha.grpo.optimizer`.

A step that meets a NaN or an infinity is skipped, never trained on; :class:`NonFiniteStreak`
stops the run after ``optimizer.max_consecutive_nonfinite`` such steps in a row
(``docs/metrics_and_rewards.md``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.loss import LossOutput, policy_loss
from memalpha.grpo.settings import UpdateSettings

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


Clock = Callable[[str], AbstractContextManager]
"""Around each stage of a step (``rollout``, ``logprobs``, ``gradients``, ``optimizer``): a
benchmark's timer or profiler label."""


def no_clock(stage: str) -> AbstractContextManager:
    """The clock of a step nobody times."""
    return nullcontext()


class Ranks(Protocol):
    """The calls of a step that differ across the processes of a data-parallel run; each is a
    collective there, so every rank makes the same calls in the same order."""

    @property
    def world_size(self) -> int: ...

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over the ranks."""
        ...

    def agree_on_nonfinite(self, problem: str | None) -> str | None:
        """What any rank found non-finite before its backward, else None."""
        ...

    def all_finite(self, finite: bool) -> bool:
        """Whether every rank's loss was finite."""
        ...


def sum_over_ranks(ranks: Ranks, count: int) -> int:
    """``count`` summed over the ranks (a collective: every rank calls it)."""
    return round(ranks.mean_over_ranks(float(count)) * ranks.world_size)


class OneProcess:
    """:class:`Ranks` of a run in one process: every value is its own mean and agreement."""

    world_size = 1

    def mean_over_ranks(self, value: float) -> float:
        return value

    def agree_on_nonfinite(self, problem: str | None) -> str | None:
        return problem

    def all_finite(self, finite: bool) -> bool:
        return finite


ONE_PROCESS = OneProcess()


class ScoredMicroBatch(Protocol):
    """One micro-batch of a :data:`Scorer`: its ``rows`` (indices into the mini-batch), the policy's
    log-probs (with grad) and entropy of their response tokens (``[b, R]``), and the loss its
    backward must take (:meth:`loss_to_backward`)."""

    rows: list[int]
    logprobs: torch.Tensor
    entropy: torch.Tensor | None

    def loss_to_backward(self, loss: torch.Tensor, grad_scale: float = 1.0) -> torch.Tensor: ...


Scorer = Callable[[list[list[int]], list[list[int]], int], Iterable[ScoredMicroBatch]]
"""The policy's log-probs of a mini-batch's rows ``(prompt_ids, response_ids, micro_batch_size)``,
one micro-batch at a time, each yielded before the next is computed (so its backward frees its
graph first): :func:`memalpha.lm.logprobs.per_token.micro_batch_scorer` bound to a policy."""


@dataclass
class Optimisation:
    """How a mini-batch's gradients become a step: the optimiser over ``params``, its schedule
    (None: stepped elsewhere, e.g. once per round), the clipping norm, the ``backward`` to call
    (Lightning's ``manual_backward`` in the module) and a mixed-precision grad scaler's current
    scale (1: none; with a scaler, ``check_grad_norm`` is False and the scaler skips overflows)."""

    optimizer: Any
    params: list[torch.nn.Parameter]
    grad_clip: float
    scheduler: Any = None
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward
    grad_scale: float = 1.0
    check_grad_norm: bool = True


@dataclass
class StepResult:
    """A trained mini-batch: the loss metrics, the gradient norm before clipping (NaN when the
    loss was non-finite) and what was non-finite (None: the optimiser stepped)."""

    metrics: dict[str, float]
    grad_norm: float
    problem: str | None


def accumulate_grpo_gradients(
    scorer: Scorer,
    batch: GRPOBatch,
    settings: UpdateSettings,
    *,
    max_response_len: int,
    token_normaliser: float,
    seq_normaliser: float,
    backward: Callable[[torch.Tensor], None],
    grad_scale: float = 1.0,
) -> tuple[dict[str, float], bool]:
    """Backward the GRPO loss of one mini-batch, micro-batch by micro-batch of
    ``settings.micro_batch_size``.

    The policy's log-probs come from ``scorer`` (how they are computed is its own business: the
    sampling temperature, the pad id, prompt prefixes shared across the micro-batches); the loss is
    :func:`micro_batch_loss`'s, and ``backward`` runs once per micro-batch. ``batch`` without
    ``old_logps`` takes the ratio on-policy; without ``ref_logps`` it needs ``kl_coef`` 0 (above 0 it
    is an error). ``max_response_len`` is the constant of the ``seq-mean-token-sum-norm``
    aggregation (the response cap). The normalisers are the mini-batch's global response-token and
    sequence counts, so summing the micro-batch losses gives the mini-batch loss (and the order of
    the rows does not matter). ``grad_scale`` is the factor ``backward`` multiplies a loss by (a
    mixed-precision grad scaler's current scale; 1 otherwise).

    Returns token-weighted metrics and whether every micro-batch loss was finite.
    """
    meter = LossMeter()
    finite = True
    for part in scorer(batch.prompt_ids, batch.response_ids, settings.micro_batch_size):
        out = micro_batch_loss(
            part.logprobs, part.entropy, batch.select(part.rows), settings, token_normaliser=token_normaliser,
            seq_normaliser=seq_normaliser, max_response_len=max_response_len,
        )
        finite = finite and out.finite
        backward(part.loss_to_backward(out.loss, grad_scale))
        meter.add(out)
    return meter.metrics(), finite


def train_minibatch(
    scorer: Scorer,
    batch: GRPOBatch,
    update: UpdateSettings,
    ranks: Ranks,
    optimisation: Optimisation,
    *,
    max_response_len: int,
    clock: Clock = no_clock,
) -> StepResult:
    """One optimiser step on one mini-batch: the clipped GRPO loss micro-batch by micro-batch
    (:func:`accumulate_grpo_gradients`), its gradients, then clip and step
    (:func:`apply_gradients`), or drop them when a rank's loss or the gradient norm is non-finite.

    The loss is normalised by the mini-batch's response tokens and rows averaged over the ranks:
    data parallelism averages gradients, so the global token mean needs the mean count.
    ``max_response_len`` is the response cap (the constant of ``seq-mean-token-sum-norm``).
    """
    token_normaliser = max(ranks.mean_over_ranks(float(batch.response_tokens)), 1.0)
    seq_normaliser = ranks.mean_over_ranks(float(len(batch)))
    optimisation.optimizer.zero_grad(set_to_none=True)
    with clock("gradients"):
        metrics, finite = accumulate_grpo_gradients(
            scorer, batch, update, max_response_len=max_response_len, token_normaliser=token_normaliser,
            seq_normaliser=seq_normaliser, backward=optimisation.backward, grad_scale=optimisation.grad_scale,
        )
    grad_norm, problem = apply_gradients(optimisation, ranks, finite, clock)
    return StepResult(metrics, grad_norm, problem)


def apply_gradients(
    optimisation: Optimisation, ranks: Ranks, finite: bool, clock: Clock = no_clock
) -> tuple[float, str | None]:
    """Clip and step (:func:`optimizer_step`) the gradients a backward left, unless a rank's loss
    (``finite`` False on any rank) or the gradient norm is non-finite: then they are dropped.
    ``(gradient norm before clipping, what was non-finite or None)``; GRPO's mini-batches and SFT's
    batches end here alike."""
    finite = ranks.all_finite(finite)  # every rank must agree to skip, or data-parallel ranks diverge
    with clock("optimizer"):
        grad_norm = optimizer_step(
            optimisation.optimizer, optimisation.params, finite=finite, grad_clip=optimisation.grad_clip,
            scheduler=optimisation.scheduler, check_grad_norm=optimisation.check_grad_norm,
        )
    if not finite:
        return grad_norm, "loss"
    if optimisation.check_grad_norm and not math.isfinite(grad_norm):
        return grad_norm, "grad norm"
    return grad_norm, None
