"""One GRPO update's model work, shared by the Lightning module and the plain loop.

``response_logprobs`` gives per-sample (unpadded) log-probs without grad: the
reference pass (inside ``disable_adapter()``) and the old-policy pass.
``accumulate_grpo_gradients`` runs a mini-batch through the policy in micro-batches,
computes the clipped GRPO loss with the global normaliser, and calls ``backward`` on
each micro-batch's loss; the caller clips, steps and zeroes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memalpha.grpo import policy_loss
from memalpha.logprobs import token_logprobs
from memalpha.prefix_cache import prompt_order, shared_prefix, split_decoder_and_head


@dataclass
class LossSettings:
    """The GRPO loss knobs (see :func:`memalpha.grpo.policy_loss`)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"
    micro_batch_size: int = 4
    temperature: float = 1.0
    max_len: int | None = None
    share_prefix: bool = True  # compute shared prompt tokens once (memalpha.prefix_cache)


@torch.no_grad()
def response_logprobs(
    policy,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    temperature: float,
    micro_batch_size: int,
    pad_id: int,
    share_prefix: bool = True,
) -> list[torch.Tensor]:
    """Per-sample response log-probs (no grad, eval mode) as CPU float tensors of each response's length.

    The rows go through in :func:`memalpha.prefix_cache.prompt_order`, so the prompt prefix all of
    them share runs once for the whole call and identical prompts land in the same micro-batch.
    """
    order = prompt_order(prompts) if share_prefix else list(range(len(prompts)))
    result: list[torch.Tensor | None] = [None] * len(prompts)
    was_training = policy.training
    policy.eval()
    try:
        logps = token_logprobs(
            policy,
            [prompts[i] for i in order],
            [responses[i] for i in order],
            temperature=temperature,
            micro_batch_size=micro_batch_size,
            pad_id=pad_id,
            share_prefix=share_prefix,
        )
    finally:
        policy.train(was_training)
    for row, i in enumerate(order):
        result[i] = logps[row, : len(responses[i])].float().cpu()
    return result  # type: ignore[return-value]


def response_mask(responses: list[list[int]], width: int, device) -> torch.Tensor:
    lengths = torch.tensor([len(r) for r in responses], device=device)
    return (torch.arange(width, device=device)[None, :] < lengths[:, None]).float()


def pad_rows(rows: list[torch.Tensor], width: int, device) -> torch.Tensor:
    out = torch.zeros(len(rows), width, device=device)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row.to(device)
    return out


def _rows(batch: dict[str, Any], index: list[int]) -> dict[str, Any]:
    """The per-sample fields of ``batch`` (lists, tensors or None) picked and ordered by ``index``."""
    picked: dict[str, Any] = {}
    for key in ("prompt_ids", "response_ids", "old_logps", "ref_logps"):
        values = batch.get(key)
        picked[key] = None if values is None else [values[i] for i in index]
    picked["advantages"] = batch["advantages"][torch.as_tensor(index, dtype=torch.long)]
    return picked


def accumulate_grpo_gradients(
    policy,
    batch: dict[str, Any],
    settings: LossSettings,
    *,
    pad_id: int,
    token_normaliser: float,
    seq_normaliser: float,
    backward: Callable[[torch.Tensor], None],
    grad_scale: float = 1.0,
) -> tuple[dict[str, float], bool]:
    """Backward the GRPO loss of one mini-batch, micro-batch by micro-batch.

    ``batch`` holds ``prompt_ids``, ``response_ids`` (lists of token lists), ``advantages``
    ``[B]`` and optional ``old_logps`` / ``ref_logps`` (lists of per-sample tensors, or None:
    on-policy ratio / no KL). The normalisers are the mini-batch's global response-token and
    sequence counts, so summing the micro-batch losses gives the mini-batch loss (and the
    order of the rows does not matter).

    With ``settings.share_prefix`` the rows are put in :func:`~memalpha.prefix_cache.prompt_order`
    and the prompt prefix they all share runs through the policy once for the whole mini-batch:
    each micro-batch reads it through detached leaves that collect its gradient, and the last
    micro-batch's backward carries the sum through the prefix's pass
    (:meth:`~memalpha.prefix_cache.SharedPrefix.pullback`). ``backward`` is therefore still
    called exactly once per micro-batch. ``grad_scale`` is the factor ``backward`` multiplies
    a loss by (a mixed-precision grad scaler's current scale; 1 otherwise).

    Returns token-weighted metrics and whether every micro-batch loss was finite.
    """
    n = len(batch["prompt_ids"])
    if settings.share_prefix:
        batch = _rows(batch, prompt_order(batch["prompt_ids"]))
    device = next(p.device for p in policy.parameters())
    normaliser = token_normaliser if settings.loss_agg == "token-mean" else seq_normaliser
    prefix = leaves = None
    if settings.share_prefix and any(batch["response_ids"]):
        prefix = shared_prefix(split_decoder_and_head(policy)[0], batch["prompt_ids"])
        if prefix is not None and n > settings.micro_batch_size:
            leaves = prefix.detached()
    sums: dict[str, float] = defaultdict(float)
    finite = True
    for lo in range(0, n, settings.micro_batch_size):
        last = lo + settings.micro_batch_size >= n
        sl = slice(lo, lo + settings.micro_batch_size)
        responses = batch["response_ids"][sl]
        logps, entropy = token_logprobs(
            policy,
            batch["prompt_ids"][sl],
            responses,
            temperature=settings.temperature,
            micro_batch_size=settings.micro_batch_size,
            pad_id=pad_id,
            with_entropy=True,
            share_prefix=settings.share_prefix,
            prefix=prefix if leaves is None or last else leaves,
        )
        width = logps.shape[1]
        mask = response_mask(responses, width, device)
        old = None if batch.get("old_logps") is None else pad_rows(batch["old_logps"][sl], width, device)
        ref = None if batch.get("ref_logps") is None else pad_rows(batch["ref_logps"][sl], width, device)
        out = policy_loss(
            logps,
            old,
            ref,
            batch["advantages"][sl].to(device),
            mask,
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            kl_coef=settings.kl_coef if ref is not None else 0.0,
            agg=settings.loss_agg,
            token_normaliser=normaliser,
            max_len=settings.max_len,
        )
        finite = finite and out.finite
        if last and leaves is not None:
            backward(out.loss + prefix.pullback(leaves, grad_scale))
        else:
            backward(out.loss)
        tokens = float(mask.sum().item())
        sums["loss"] += float(out.loss.detach())
        sums["tokens"] += tokens
        for key in ("kl", "clip_ratio/low", "clip_ratio/high", "ratio_mean"):
            sums[key] += out.metrics[key] * tokens
        sums["entropy"] += float((entropy * mask).sum().item())
    weight = max(sums["tokens"], 1.0)
    metrics = {"loss": sums["loss"], "tokens": sums["tokens"]}
    metrics.update(
        {
            key: sums[key] / weight
            for key in ("kl", "clip_ratio/low", "clip_ratio/high", "ratio_mean", "entropy")
        }
    )
    return metrics, finite
