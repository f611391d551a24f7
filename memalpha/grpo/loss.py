"""The clipped GRPO policy loss with a k3 KL penalty, as pure tensor functions.

Notation: ``B`` sequences (turn samples) with ``T`` response columns; ``response_mask`` is 1
on real response tokens. Everything here is differentiable with respect to ``logps`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)
LOG_RATIO_CLAMP = 20.0
KL_MAX = 10.0


@dataclass
class LossOutput:
    """Result of :func:`policy_loss`.

    ``loss`` is the scalar to backpropagate; ``metrics`` are detached floats (token means over
    this call's response tokens); ``finite`` is False when the loss is NaN or infinite, in which
    case the caller should skip the optimiser step (the loss is returned as is, not zeroed).
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    finite: bool = True


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1`` with ``d = ref - logp``.

    ``d`` is clamped to ±20 and the result to at most 10, so one wild token cannot blow up the loss.
    """
    log_ratio = (ref_logps - logps).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(max=KL_MAX)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    if count == 0:
        return 0.0
    return float((torch.where(mask, values, 0.0).sum() / count).item())


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
    kl_coef: float = 0.0,
    agg: str = "token-mean",
    token_normaliser: float | None = None,
    max_len: int | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """Clipped GRPO surrogate with an optional k3 KL penalty.

    Per token: ``ratio = exp(logp - old_logp)`` and
    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3_kl``.
    With the dual clip (``clip_ratio_c``), a token with ``A < 0`` has its policy term capped
    at ``clip_ratio_c * |A|``: the clipped surrogate leaves a negative-advantage token's ratio
    unbounded above, and a stale sample whose probability has grown many-fold would otherwise
    dominate the loss of a late mini-batch. Such a capped token gets no gradient.

    Args:
        logps: ``[B, T]`` current log-probs (with grad).
        old_logps: ``[B, T]`` log-probs of the sampling policy; None means ``logps.detach()``
            (one PPO epoch: the ratio is 1 but its gradient is the policy gradient).
        ref_logps: ``[B, T]`` reference log-probs; needed when ``kl_coef != 0``.
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]``.
        response_mask: ``[B, T]``, nonzero on response tokens; other positions never contribute,
            whatever their values.
        clip_ratio_c: the dual-clip constant (> 1), or None: no dual clip.
        agg: ``token-mean``: sum over every response token / number of tokens;
            ``seq-mean-token-mean``: per-sequence token mean, then the mean over sequences;
            ``seq-mean-token-sum-norm`` (Dr. GRPO): per-sequence token sum / ``max_len``, then the
            mean over sequences.
        token_normaliser: the global denominator when one batch is split into micro-batches
            whose losses are summed: the batch's total number of response tokens for
            ``token-mean``, its number of sequences for the ``seq-mean-*`` aggregations. None uses
            this call's own count.
        max_len: the constant length of ``seq-mean-token-sum-norm`` (e.g. max new tokens); required there.
        entropy: optional ``[B, T]`` per-token entropy, only reported as a metric.

    Metrics: ``loss``, ``pg_loss``, ``kl``, ``clip_ratio/low`` (share of tokens with ``A < 0`` and
    ratio below ``1 - clip_low``), ``clip_ratio/high`` (``A > 0``, ratio above ``1 + clip_high``),
    ``clip_ratio``, ``clip_ratio/dual`` (``A < 0`` and the term capped by the dual clip; 0
    without it), ``ratio_mean``, ``ratio_max``, ``tokens`` and, if given, ``entropy``.
    """
    if agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"agg must be one of {LOSS_AGGREGATIONS}, got {agg!r}")
    if logps.dim() != 2 or response_mask.shape != logps.shape:
        raise ValueError(
            "logps and response_mask must both be [B, T]; got "
            f"{tuple(logps.shape)} and {tuple(response_mask.shape)}"
        )
    if kl_coef != 0.0 and ref_logps is None:
        raise ValueError(f"kl_coef is {kl_coef:g} but the batch has no reference log-probs (ref_logps None)")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None: off), got {clip_ratio_c}")
    if agg == "seq-mean-token-sum-norm" and (max_len is None or max_len <= 0):
        raise ValueError(f"agg 'seq-mean-token-sum-norm' needs a positive max_len, got {max_len}")
    mask = response_mask.bool()
    # sanitise masked positions so padding can never leak NaN into values or gradients
    logps = torch.where(mask, logps, 0.0)
    old = logps.detach() if old_logps is None else torch.where(mask, old_logps.detach().to(logps.dtype), 0.0)
    if advantages.dim() == 1:
        if advantages.shape[0] != logps.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} rows, logps has {logps.shape[0]}")
        advantages = advantages.unsqueeze(1)
    advantages = advantages.detach().to(logps.dtype)

    ratio = torch.exp(logps - old)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = -torch.minimum(ratio * advantages, clipped * advantages)
    dual = torch.zeros_like(mask)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        dual = (advantages < 0) & (pg > cap)
        pg = torch.where(dual, cap.expand_as(pg), pg)
    per_token = pg
    kl = None
    if ref_logps is not None:
        ref = torch.where(mask, ref_logps.detach().to(logps.dtype), 0.0)
        kl = k3_kl(logps, ref)
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * kl
    per_token = torch.where(mask, per_token, 0.0)

    batch = logps.shape[0]
    if agg == "token-mean":
        denominator = token_normaliser if token_normaliser is not None else max(float(mask.sum().item()), 1.0)
        loss = per_token.sum() / denominator
    else:
        if agg == "seq-mean-token-mean":
            per_sequence = per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1).to(per_token.dtype)
        else:
            per_sequence = per_token.sum(dim=1) / float(max_len)
        denominator = token_normaliser if token_normaliser is not None else max(float(batch), 1.0)
        loss = per_sequence.sum() / denominator

    with torch.no_grad():
        ratio_d, adv_b = ratio.detach(), advantages.expand_as(ratio)
        low = (ratio_d < 1.0 - clip_low) & (adv_b < 0)
        high = (ratio_d > 1.0 + clip_high) & (adv_b > 0)
        metrics = {
            "loss": float(loss.detach().item()),
            "pg_loss": _masked_mean(pg.detach(), mask),
            "kl": _masked_mean(kl.detach(), mask) if kl is not None else 0.0,
            "clip_ratio/low": _masked_mean(low.to(ratio_d.dtype), mask),
            "clip_ratio/high": _masked_mean(high.to(ratio_d.dtype), mask),
            "clip_ratio": _masked_mean((low | high).to(ratio_d.dtype), mask),
            "clip_ratio/dual": _masked_mean(dual.to(ratio_d.dtype), mask),
            "ratio_mean": _masked_mean(ratio_d, mask),
            "ratio_max": float(torch.where(mask, ratio_d, 0.0).max().item()) if mask.any() else 0.0,
            "tokens": float(mask.sum().item()),
        }
        if entropy is not None:
            metrics["entropy"] = _masked_mean(entropy.detach().to(ratio_d.dtype), mask)
        finite = bool(torch.isfinite(loss.detach()).all().item())
    return LossOutput(loss=loss, metrics=metrics, finite=finite)
