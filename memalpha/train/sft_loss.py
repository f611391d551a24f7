"""Supervised fine-tuning's loss: the negative log-likelihood of response tokens only.

Prompt tokens are never scored: :func:`~memalpha.lm.logprobs.per_token.token_scores` gives the log-prob
of response tokens alone (chunked over the vocabulary, never a full-vocabulary log-softmax), so
the loss needs no label mask over the prompt. With ``share_prefix`` the system prompt the rows
of a micro-batch share runs through the decoder once per micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memalpha.lm.core.modes import eval_mode
from memalpha.lm.core.prompt_sharing import response_mask
from memalpha.lm.logprobs.per_token import token_scores
from memalpha.lm.logprobs.spec import LogprobSpec


def masked_nll(logprobs: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """``-sum(logprobs over response tokens) / normaliser``; positions outside the mask never count.

    Args:
        logprobs: ``[B, R]`` log-probs of the response tokens (with grad).
        mask: ``[B, R]``, nonzero on real response tokens.
        normaliser: the step's total number of response tokens (so micro-batch losses add up to
            the step's token mean).
    """
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    return -torch.where(mask.bool(), logprobs, 0.0).sum() / normaliser


def accumulate_sft_gradients(
    policy,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    logprob_spec: LogprobSpec,
    *,
    token_normaliser: float,
    backward: Callable[[torch.Tensor], None],
) -> tuple[dict[str, float], bool]:
    """Backward the token-mean NLL of a batch, ``logprob_spec.micro_batch_size`` rows at a time.

    ``token_normaliser`` is the batch's response-token count (averaged over ranks under data
    parallelism), so the micro-batch losses add up to the batch's token mean. Returns the summed
    ``loss``, ``token_accuracy`` (the share of response tokens that are the most likely next
    token), ``tokens``, and whether every micro-batch loss was finite.
    """
    micro_batch_size = logprob_spec.micro_batch_size
    loss_sum, hits, tokens, finite = 0.0, 0.0, 0.0, True
    for start in range(0, len(prompt_ids), micro_batch_size):
        prompts = prompt_ids[start : start + micro_batch_size]
        responses = response_ids[start : start + micro_batch_size]
        scores = token_scores(policy, prompts, responses, logprob_spec, with_accuracy=True)
        mask = response_mask(responses, scores.logprobs.shape[1], scores.logprobs.device, torch.bool)
        loss = masked_nll(scores.logprobs, mask, token_normaliser)
        finite = finite and bool(torch.isfinite(loss.detach()))
        backward(loss)
        loss_sum += float(loss.detach())
        hits += float(torch.where(mask, scores.argmax_hits, 0.0).sum())
        tokens += float(mask.sum())
    return {"loss": loss_sum, "token_accuracy": hits / max(tokens, 1.0), "tokens": tokens}, finite


@torch.no_grad()
def sft_eval(policy, prompt_ids: list[list[int]], response_ids: list[list[int]], logprob_spec: LogprobSpec):
    """Summed NLL, argmax hits and token count of a batch, without grad (for ``val/loss``)."""
    with eval_mode(policy):
        scores = token_scores(policy, prompt_ids, response_ids, logprob_spec, with_accuracy=True)
    mask = response_mask(response_ids, scores.logprobs.shape[1], scores.logprobs.device, torch.bool)
    nll = float(-torch.where(mask, scores.logprobs, 0.0).sum())
    return nll, float(torch.where(mask, scores.argmax_hits, 0.0).sum()), float(mask.sum())
