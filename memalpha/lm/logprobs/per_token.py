"""Per-token log-probabilities of responses, with logits computed only where they are needed.

For each micro-batch the decoder runs once over prompt+response (layout of
:mod:`memalpha.lm.sampling.generation`); the hidden states that predict response tokens are gathered
(padding dropped) and pushed through the output head ``token_chunk`` rows at a time,
optionally ``vocab_chunk`` vocabulary columns at a time with a running log-sum-exp. The
log-prob of token ``y`` is ``z_y - logsumexp(z)`` with ``z = head(h) / temperature`` in
float32 -- the same scaling ``transformers`` applies before sampling (top-k/top-p truncation
is not part of the scored distribution). A full-vocabulary log-softmax is never built.

Without grad the head chunk is transformed in place, so the extra memory is one chunk of
logits plus row vectors. With grad only each chunk's hidden rows and log-sum-exps are kept and
its logits are recomputed during backward, one chunk at a time: through :class:`HeadLogprob`
(forward as without grad, a hand-written backward, both in place) for a plain linear head, and
under activation checkpointing for any other head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from memalpha.lm.core.logits import finalise_logits, score_dtype
from memalpha.lm.core.modes import accumulated_adapters, eval_mode
from memalpha.lm.core.prompt_sharing import (
    PromptSharing,
    SharedPrefix,
    prompt_order,
    shared_prefix,
    split_decoder_and_head,
)
from memalpha.lm.logprobs.spec import DEFAULT_SCORING, LogprobSpec


def _head_logits(head, hidden: torch.Tensor, config, columns: slice | None) -> torch.Tensor:
    if columns is None:
        logits = head(hidden)
    else:
        if type(head) is not torch.nn.Linear:
            raise ValueError(
                "vocab_chunk needs a plain torch.nn.Linear output head, this model has "
                f"{type(head).__name__}; use vocab_chunk=None"
            )
        bias = head.bias[columns] if head.bias is not None else None
        logits = torch.nn.functional.linear(hidden, head.weight[columns], bias)
    return finalise_logits(logits.to(score_dtype(logits.dtype)), config)


def _vocab_slices(head, vocab_chunk: int | None) -> list[slice | None]:
    """The vocabulary columns of ``head`` taken at a time (None: all at once)."""
    vocab = getattr(head, "out_features", None)
    if vocab is None or vocab_chunk is None or vocab_chunk >= vocab:
        return [None]
    return [slice(start, min(start + vocab_chunk, vocab)) for start in range(0, vocab, vocab_chunk)]


def _rows_logprob_nograd(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head,
    config,
    temperature: float,
    vocab_chunk,
    want_entropy: bool,
    want_hits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """Log-prob (and entropy, and whether the target is the most likely token) of ``targets`` for rows
    of ``hidden``, and each row's log-sum-exp of its scaled logits; in-place, no autograd."""
    rows = hidden.shape[0]
    like = {"device": hidden.device, "dtype": score_dtype(hidden.dtype)}
    running_max = torch.full((rows,), -math.inf, **like)
    running_sum = torch.zeros(rows, **like)
    running_dot = torch.zeros(rows, **like) if want_entropy else None
    target_logit = torch.zeros(rows, **like)
    for columns in _vocab_slices(head, vocab_chunk):
        logits = _head_logits(head, hidden, config, columns)
        if temperature != 1.0:
            logits.div_(temperature)
        start = 0 if columns is None else columns.start
        width = logits.shape[1]
        local = targets - start
        inside = (local >= 0) & (local < width)
        picked = logits.gather(1, local.clamp(0, width - 1).unsqueeze(1)).squeeze(1)
        target_logit = torch.where(inside, picked, target_logit)
        block_max = logits.amax(dim=1)
        new_max = torch.maximum(running_max, block_max)
        rescale = torch.exp(running_max - new_max)
        logits.sub_(new_max.unsqueeze(1))  # logits now hold z - m
        if want_entropy:
            # sum exp(z - m) * z, accumulated in row blocks so the temporary stays small
            block_dot = torch.empty(rows, **like)
            block_sum = torch.empty(rows, **like)
            step = max(1, rows // 4)
            for r0 in range(0, rows, step):
                shifted = logits[r0 : r0 + step]
                weights = shifted.exp()
                block_sum[r0 : r0 + step] = weights.sum(dim=1)
                block_dot[r0 : r0 + step] = weights.mul_(shifted).sum(dim=1)
            # block_dot holds sum e^(z-m)(z-m); convert to sum e^(z-m) z
            block_dot = block_dot + new_max * block_sum
            running_dot = running_dot * rescale + block_dot
        else:
            block_sum = logits.exp_().sum(dim=1)
        running_sum = running_sum * rescale + block_sum
        running_max = new_max
        del logits
    log_norm = running_max + running_sum.log()
    logprob = target_logit - log_norm
    entropy = log_norm - running_dot / running_sum if want_entropy else None
    hits = (target_logit >= running_max).to(logprob.dtype) if want_hits else None
    return logprob, entropy, hits, log_norm


def _rows_logprob_grad(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head,
    config,
    temperature: float,
    vocab_chunk,
    want_entropy: bool,
    want_hits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Differentiable log-prob of ``targets`` for rows of ``hidden`` (run under checkpointing).

    The entropy and the argmax hits (no grad) come from the same logits when the vocabulary is
    not chunked; otherwise they are None and the caller computes them separately.
    """
    slices = _vocab_slices(head, vocab_chunk)
    if slices == [None]:
        logits = _head_logits(head, hidden, config, None) / temperature
        log_norm = torch.logsumexp(logits, dim=1)
        entropy = hits = None
        with torch.no_grad():
            z = logits.detach()
            if want_entropy:
                entropy = log_norm.detach() - (torch.softmax(z, dim=1) * z).sum(dim=1)
            if want_hits:
                hits = (z.gather(1, targets.unsqueeze(1)).squeeze(1) >= z.amax(dim=1)).to(z.dtype)
        return logits.gather(1, targets.unsqueeze(1)).squeeze(1) - log_norm, entropy, hits
    norms = []
    target_logit = hidden.new_zeros(hidden.shape[0], dtype=score_dtype(hidden.dtype))
    for columns in slices:
        logits = _head_logits(head, hidden, config, columns) / temperature
        local = targets - columns.start
        inside = (local >= 0) & (local < logits.shape[1])
        picked = logits.gather(1, local.clamp(0, logits.shape[1] - 1).unsqueeze(1)).squeeze(1)
        target_logit = torch.where(inside, picked, target_logit)
        norms.append(torch.logsumexp(logits, dim=1))
    return target_logit - torch.logsumexp(torch.stack(norms, dim=1), dim=1), None, None


def streams_head(head, config) -> bool:
    """Whether :class:`HeadLogprob` can score through ``head``: a plain ``torch.nn.Linear`` whose
    logits the model uses as they come (no logit scale, no soft-capping) and that no forward hook
    watches (a hook may change the logits or hook their gradient, which a hand-written backward
    cannot follow; such heads keep the checkpointed path, under autograd)."""
    if type(head) is not torch.nn.Linear:
        return False
    every_module = torch.nn.modules.module
    hooks = (head._forward_hooks, head._forward_pre_hooks,
             every_module._global_forward_hooks, every_module._global_forward_pre_hooks)
    return (
        not any(hooks)
        and getattr(config, "logit_scale", None) is None
        and getattr(config, "final_logit_softcapping", None) is None
    )


class HeadLogprob(torch.autograd.Function):
    """Differentiable log-prob of ``targets`` under a linear head, with no logits kept for backward.

    Forward is :func:`_rows_logprob_nograd` (the vocabulary streamed through in place, entropy and
    argmax hits from the same pass). Backward recomputes each vocabulary slice's logits once and
    turns them in place into the gradient of ``z_y - logsumexp(z)``, ``g * (onehot(y) - softmax(z))``
    (divided by the temperature, as ``z = head(h) / T``), then multiplies it back through the head.
    Checkpointing :func:`_rows_logprob_grad` does the same products but recomputes the forward's
    elementwise passes under autograd and keeps their results; this is the path for plain heads.
    Only ``hidden``, ``weight`` and ``bias`` receive gradients; entropy and hits carry none.
    ``weight`` and ``bias`` must be ``head``'s own tensors: both passes read them through ``head``,
    and they are inputs only so that autograd routes their gradients.
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, head, config, temperature, vocab_chunk, want_entropy, want_hits
    ):
        logprob, entropy, hits, log_norm = _rows_logprob_nograd(
            hidden, targets, head, config, temperature, vocab_chunk, want_entropy, want_hits
        )
        ctx.save_for_backward(hidden, targets, log_norm)
        ctx.head, ctx.config, ctx.temperature, ctx.vocab_chunk = head, config, temperature, vocab_chunk
        extras = [t for t in (entropy, hits) if t is not None]
        ctx.mark_non_differentiable(*extras)
        return logprob, entropy, hits

    @staticmethod
    def backward(ctx, grad, _entropy_grad, _hits_grad):
        hidden, targets, log_norm = ctx.saved_tensors
        head, temperature = ctx.head, ctx.temperature
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(head.weight) if want_weight else None
        grad_bias = torch.zeros_like(head.bias) if want_bias else None
        grad = grad.to(log_norm.dtype)
        for columns in _vocab_slices(head, ctx.vocab_chunk):
            logits = _head_logits(head, hidden, ctx.config, columns)
            if temperature != 1.0:
                logits.div_(temperature)
            start = 0 if columns is None else columns.start
            local = targets - start
            rows = torch.nonzero((local >= 0) & (local < logits.shape[1])).squeeze(1)
            # d(z_y - lse z)/dz = onehot(y) - softmax(z), times the incoming gradient
            logits.sub_(log_norm.unsqueeze(1)).exp_().mul_(-grad.unsqueeze(1))
            logits.index_put_((rows, local[rows]), grad[rows], accumulate=True)
            if temperature != 1.0:
                logits.div_(temperature)
            d_out = logits.to(hidden.dtype)
            weight = head.weight if columns is None else head.weight[columns]
            if want_hidden:
                grad_hidden.addmm_(d_out, weight)
            if want_weight:
                target = grad_weight if columns is None else grad_weight[columns]
                target.addmm_(d_out.t(), hidden)
            if want_bias:
                target = grad_bias if columns is None else grad_bias[columns]
                target.add_(d_out.sum(dim=0))
            del logits, d_out
        return grad_hidden, grad_weight, grad_bias, *([None] * 7)


class TokenScores(NamedTuple):
    """What :func:`token_scores` computes for every response token, each ``[B, R]``."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    argmax_hits: torch.Tensor | None


def token_scores(
    model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    spec: LogprobSpec = DEFAULT_SCORING,
    *,
    with_entropy: bool = False,
    with_accuracy: bool = False,
    prefix: SharedPrefix | None = None,
) -> TokenScores:
    """Log-prob of every response token given its prompt and the preceding response tokens.

    Returns :class:`TokenScores` whose ``logprobs`` is a ``[B, R]`` tensor (``R`` = longest
    response; column ``j`` is response token ``j``; 0 where a response is shorter) in float32
    (float64 for a float64 model). ``with_entropy`` adds the entropy of the temperature-scaled
    next-token distribution, ``with_accuracy`` adds 1 where the response token is that
    distribution's most likely token (for SFT's token accuracy); both ``[B, R]``, without grad.

    Gradients flow into the result when grad mode is on (the policy); call it under
    ``torch.no_grad()`` for old/reference log-probs, and inside ``model.disable_adapter()``
    for the reference policy. ``spec`` (:class:`~memalpha.lm.logprobs.spec.LogprobSpec`) holds the
    temperature and the sizes: ``micro_batch_size`` sequences go through the decoder at a
    time; ``token_chunk`` response rows (times ``vocab_chunk`` vocabulary columns, when set)
    bound the logits held at once. Padding uses ``pad_id`` and is masked out of attention.

    With ``share_prefix`` the prompt prefix common to all rows (the system prompt of every
    memorising turn) goes through the decoder once per call, and within a micro-batch each
    distinct prompt goes through once; their key/value cache serves every row that shares them,
    and where it saves work the responses of a prompt's rows run as one row without padding
    (:class:`~memalpha.lm.core.prompt_sharing.PromptSharing`, built once per call). The values equal
    the plain path up to float rounding.
    ``prefix`` hands in a prefix computed by the caller (it must start every prompt), so that
    several calls can share one; HF gradient checkpointing drops caches, so a checkpointed
    model in training mode takes the plain path.
    """
    with accumulated_adapters(model):  # LoRA products added into the base outputs in place
        temperature, vocab_chunk, token_chunk = spec.temperature, spec.vocab_chunk, spec.token_chunk
        decoder, head, config = split_decoder_and_head(model)
        device = next(model.parameters()).device
        dtype = score_dtype(head.weight.dtype) if hasattr(head, "weight") else torch.float32
        width = max((len(r) for r in response_ids), default=0)
        grad = torch.is_grad_enabled()
        streams = streams_head(head, config)
        # A checkpointed layer in training mode drops any cache it is given, so nothing can be shared then.
        sharing = PromptSharing.of(
            decoder, prompt_ids, spec.share_prefix, prefix=prefix, compute_prefix=width > 0
        )
        kinds = ["logprobs"] + ["entropy"] * with_entropy + ["hits"] * with_accuracy
        out: dict[str, list[torch.Tensor]] = {
            kind: [torch.zeros(0, width, device=device, dtype=dtype)] for kind in kinds
        }
        for start in range(0, len(prompt_ids), spec.micro_batch_size):
            prompts = prompt_ids[start : start + spec.micro_batch_size]
            responses = response_ids[start : start + spec.micro_batch_size]
            batch = sharing.layout(prompts, responses, spec.pad_id, device)
            local_width = batch.response_mask.shape[1]
            if local_width == 0:
                for kind in kinds:
                    out[kind].append(torch.zeros(len(prompts), width, device=device, dtype=dtype))
                continue
            mask = batch.response_mask.bool()
            targets = batch.input_ids[:, batch.prompt_width :][mask]
            rows = sharing.response_hidden(batch, prompts)
            found: dict[str, list[torch.Tensor]] = {kind: [] for kind in kinds}
            for r0 in range(0, rows.shape[0], token_chunk):
                h, y = rows[r0 : r0 + token_chunk], targets[r0 : r0 + token_chunk]
                if grad and streams:
                    value, ent, hit = HeadLogprob.apply(
                        h,
                        head.weight,
                        head.bias,
                        y,
                        head,
                        config,
                        temperature,
                        vocab_chunk,
                        with_entropy,
                        with_accuracy,
                    )
                elif grad:
                    value, ent, hit = checkpoint(
                        _rows_logprob_grad,
                        h,
                        y,
                        head,
                        config,
                        temperature,
                        vocab_chunk,
                        with_entropy,
                        with_accuracy,
                        use_reentrant=False,
                    )
                    if (with_entropy and ent is None) or (with_accuracy and hit is None):  # chunked vocab
                        with torch.no_grad():
                            _, ent, hit, _ = _rows_logprob_nograd(
                                h.detach(), y, head, config, temperature, vocab_chunk, with_entropy,
                                with_accuracy,
                            )
                else:
                    value, ent, hit, _ = _rows_logprob_nograd(
                        h, y, head, config, temperature, vocab_chunk, with_entropy, with_accuracy
                    )
                for kind, piece in (("logprobs", value), ("entropy", ent), ("hits", hit)):
                    if kind in found:
                        found[kind].append(piece)
            placed = torch.nn.functional.pad(mask, (0, width - local_width))  # response tokens in [B, width]
            for kind in kinds:
                columns = torch.zeros(len(prompts), width, device=device, dtype=dtype)
                out[kind].append(columns.masked_scatter(placed, torch.cat(found[kind])))
            del rows
        return TokenScores(
            torch.cat(out["logprobs"]),
            torch.cat(out["entropy"]) if with_entropy else None,
            torch.cat(out["hits"]) if with_accuracy else None,
        )


def token_logprobs(
    model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    spec: LogprobSpec = DEFAULT_SCORING,
    *,
    with_entropy: bool = False,
    prefix: SharedPrefix | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_scores`' log-probs ``[B, R]``, or ``(logprobs, entropy)`` with ``with_entropy``."""
    scores = token_scores(model, prompt_ids, response_ids, spec, with_entropy=with_entropy, prefix=prefix)
    return (scores.logprobs, scores.entropy) if with_entropy else scores.logprobs


@torch.no_grad()
def response_logprobs(
    policy,
    prompts: list[list[int]],
    responses: list[list[int]],
    spec: LogprobSpec,
) -> list[torch.Tensor]:
    """Per-sample response log-probs (no grad, eval mode) as CPU float tensors of each response's length.

    The rows go through in :func:`memalpha.lm.core.prompt_sharing.prompt_order`, so the prompt prefix all of
    them share runs once for the whole call and identical prompts land in the same micro-batch.
    """
    order = prompt_order(prompts) if spec.share_prefix else list(range(len(prompts)))
    result: list[torch.Tensor | None] = [None] * len(prompts)
    with eval_mode(policy):
        logps = token_logprobs(
            policy,
            [prompts[i] for i in order],
            [responses[i] for i in order],
            spec,
        )
    for row, i in enumerate(order):
        result[i] = logps[row, : len(responses[i])].cpu()
    return result  # type: ignore[return-value]


@dataclass
class MicroBatchScores:
    """One micro-batch of :func:`micro_batch_scores`: its ``rows`` (indices into the caller's rows),
    the log-probs and entropy of their response tokens (``[b, R]``, the log-probs with grad), and
    what their loss needs before its backward (:meth:`loss_to_backward`)."""

    rows: list[int]
    logprobs: torch.Tensor
    entropy: torch.Tensor
    policy: torch.nn.Module
    prefix: SharedPrefix | None = None
    leaves: SharedPrefix | None = None

    def loss_to_backward(self, loss: torch.Tensor, grad_scale: float = 1.0) -> torch.Tensor:
        """``loss`` as this micro-batch's backward must take it. A loss without grad (no trained
        token: responses cut to nothing at a result marker) gets a zero-weighted term reaching every
        trainable weight, so each micro-batch still runs one backward, as data parallelism expects;
        the last micro-batch of a shared prefix adds the term that carries every micro-batch's
        gradient through the prefix's own pass (:meth:`SharedPrefix.pullback`; ``grad_scale``: the
        factor the backward multiplies losses by, a mixed-precision scaler's)."""
        if not loss.requires_grad:
            loss = loss + sum(p.sum() for p in self.policy.parameters() if p.requires_grad) * 0.0
        if self.leaves is not None:
            return loss + self.prefix.pullback(self.leaves, grad_scale)
        return loss


def micro_batch_scores(
    policy, prompt_ids: list[list[int]], response_ids: list[list[int]], spec: LogprobSpec,
    micro_batch_size: int | None = None,
) -> Iterator[MicroBatchScores]:
    """The rows' response log-probs and entropy with grad, ``micro_batch_size`` rows at a time
    (default ``spec.micro_batch_size``), for a caller that runs one backward per micro-batch (the
    GRPO update).

    With ``spec.share_prefix`` the rows go in
    :func:`~memalpha.lm.core.prompt_sharing.prompt_order` and the prompt prefix they all share runs
    through the policy once for all of them: each micro-batch reads it through detached leaves that
    collect its gradient, and the last one's :meth:`MicroBatchScores.loss_to_backward` carries the
    sum through the prefix's pass. Each micro-batch is yielded before the next is computed, so its
    backward frees its graph first.
    """
    n, size = len(prompt_ids), micro_batch_size or spec.micro_batch_size
    order = prompt_order(prompt_ids) if spec.share_prefix else list(range(n))
    prompts = [prompt_ids[i] for i in order]
    responses = [response_ids[i] for i in order]
    prefix = leaves = None
    if spec.share_prefix and any(responses):
        prefix = shared_prefix(split_decoder_and_head(policy)[0], prompts)
        if prefix is not None and n > size:
            leaves = prefix.detached()
    for lo in range(0, n, size):
        last = lo + size >= n
        logps, entropy = token_logprobs(
            policy, prompts[lo : lo + size], responses[lo : lo + size], spec, with_entropy=True,
            prefix=prefix if leaves is None or last else leaves,
        )
        yield MicroBatchScores(
            order[lo : lo + size], logps, entropy, policy, prefix, leaves if last else None
        )


def micro_batch_scorer(
    policy, spec: LogprobSpec
) -> Callable[[list[list[int]], list[list[int]], int], Iterator[MicroBatchScores]]:
    """:func:`micro_batch_scores` bound to ``policy`` and ``spec``: the scorer the GRPO update takes
    (:data:`memalpha.grpo.update.Scorer`, called with a mini-batch's prompt and response ids and its
    micro-batch size), so that ``grpo/`` computes its loss without a model in sight."""

    def scorer(prompt_ids: list[list[int]], response_ids: list[list[int]], micro_batch_size: int):
        return micro_batch_scores(policy, prompt_ids, response_ids, spec, micro_batch_size)

    return scorer
