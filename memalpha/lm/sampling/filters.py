"""Picking the next token from a batch of logits: temperature, top-k, top-p, then a draw.

The filters follow the order and the rules ``transformers`` applies when it samples
(temperature, then top-k, then top-p keeping at least one token), so a setting means the same
here and in ``model.generate``. The draw itself differs: ``torch.multinomial`` draws one
exponential variate per vocabulary entry, while :func:`draw` inverts the cumulative
distribution with one uniform variate per row. Both sample the same distribution; they do not pick the same
tokens for the same seed.
"""

from __future__ import annotations

import torch


def filter_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """``[B, V]`` logits divided by ``temperature``, with the tokens top-k and top-p drop set to ``-inf``.

    ``top_k`` 0 and ``top_p`` 1.0 are off. Top-k keeps every token whose logit reaches the
    k-th largest (ties included); top-p then drops the tokens of lowest probability whose
    cumulative probability stays within ``1 - top_p``, never the most likely one.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    scores = logits / temperature
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        dropped[..., -1] = False
        scores = scores.masked_fill(dropped.scatter(-1, order, dropped), float("-inf"))
    return scores


def draw(probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``[B, V]`` probabilities (rows need not sum to 1), by inverting the
    cumulative sum with a uniform variate per row: ``uniform`` ``[B, 1]`` when given (drawn
    beforehand, as the captured sampler of :mod:`memalpha.lm.sampling.graph_decode` draws them),
    else one from the global RNG. A token of probability 0 is never drawn; a row holding NaN
    gets the last id (a valid token: the caller's non-finite checks catch such a model)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    if uniform is None:
        uniform = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    target = uniform * total
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def next_tokens(
    logits: torch.Tensor,
    *,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B]`` next tokens: the argmax when not sampling, else a draw from the filtered softmax
    (with ``uniform``'s variates when given: :func:`draw`)."""
    if not do_sample:
        return logits.argmax(dim=-1)
    return draw(filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1), uniform)
