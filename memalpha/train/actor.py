"""The actor: a :class:`~memalpha.grpo.batch.GRPOBatch` run through the policy, micro-batch by
micro-batch, into accumulated gradients.

The algorithm (the loss, its normaliser, the metrics) is :mod:`memalpha.grpo.update`'s; this
module owns what needs the model: the rows' order and the prompt prefix they share
(:mod:`memalpha.lm.core.prefix_cache`), the policy's log-probs
(:func:`memalpha.lm.scoring.logprobs.token_logprobs`), one ``backward`` per micro-batch and the
zero-weighted backward that keeps data parallelism's gradient hooks in step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import LossMeter, micro_batch_loss
from memalpha.lm.core.prefix_cache import prompt_order, shared_prefix, split_decoder_and_head
from memalpha.lm.scoring.logprobs import token_logprobs
from memalpha.lm.scoring.spec import ScoringSpec


def accumulate_grpo_gradients(
    policy,
    batch: GRPOBatch,
    settings: UpdateSettings,
    scoring: ScoringSpec,
    *,
    max_response_len: int,
    token_normaliser: float,
    seq_normaliser: float,
    backward: Callable[[torch.Tensor], None],
    grad_scale: float = 1.0,
) -> tuple[dict[str, float], bool]:
    """Backward the GRPO loss of one mini-batch, micro-batch by micro-batch.

    ``batch`` without ``old_logps`` takes the ratio on-policy; without ``ref_logps`` it needs
    ``kl_coef`` 0 (above 0 it is an error). ``scoring`` says how the policy's log-probs are
    computed (the temperature sampling used, the pad id, whether prefixes are shared);
    ``max_response_len`` is the constant
    of the ``seq-mean-token-sum-norm`` aggregation (the response cap). The normalisers are the
    mini-batch's global response-token and sequence counts, so summing the micro-batch losses gives the
    mini-batch loss (and the order of the rows does not matter).

    With ``scoring.share_prefix`` the rows are put in :func:`~memalpha.lm.core.prefix_cache.prompt_order`
    and the prompt prefix they all share runs through the policy once for the whole mini-batch:
    each micro-batch reads it through detached leaves that collect its gradient, and the last
    micro-batch's backward carries the sum through the prefix's pass
    (:meth:`~memalpha.lm.core.prefix_cache.SharedPrefix.pullback`). ``backward`` is therefore still
    called exactly once per micro-batch. ``grad_scale`` is the factor ``backward`` multiplies
    a loss by (a mixed-precision grad scaler's current scale; 1 otherwise).

    Returns token-weighted metrics and whether every micro-batch loss was finite.
    """
    n = len(batch)
    share_prefix = scoring.share_prefix
    if share_prefix:
        batch = batch.select(prompt_order(batch.prompt_ids))
    prefix = leaves = None
    if share_prefix and any(batch.response_ids):
        prefix = shared_prefix(split_decoder_and_head(policy)[0], batch.prompt_ids)
        if prefix is not None and n > settings.micro_batch_size:
            leaves = prefix.detached()
    meter = LossMeter()
    finite = True
    for lo in range(0, n, settings.micro_batch_size):
        last = lo + settings.micro_batch_size >= n
        part = batch.select(list(range(lo, min(lo + settings.micro_batch_size, n))))
        logps, entropy = token_logprobs(
            policy, part.prompt_ids, part.response_ids, scoring, with_entropy=True,
            prefix=prefix if leaves is None or last else leaves,
        )
        out = micro_batch_loss(
            logps, entropy, part, settings, token_normaliser=token_normaliser, seq_normaliser=seq_normaliser,
            max_response_len=max_response_len,
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
        meter.add(out)
    return meter.metrics(), finite
