"""Compute the tokens that rows of a batch share once, and reuse their key/value cache.

A GRPO batch repeats itself: every memorising turn starts with the same ~1k-token system
prompt, and a group samples the same prompt ``n`` times. Running the decoder over each
copy is pure waste, so the batch is laid out as (see :func:`memalpha.lm.core.layout.pad_prompt_response`
with ``shared_prefix``)::

    [ shared prefix (L) | pad .. pad, prompt suffix_i | response_i, pad .. pad ]

The prefix's keys and values are computed once at batch size 1 (:class:`SharedPrefix`) and
repeated to every row; identical prompt suffixes are computed once and repeated too
(:func:`prompt_cache`). The attention mask has a hole where a short suffix is padded and
position ids come from ``cumsum(mask) - 1``, so every row sees exactly the positions and keys
it would see alone: the results equal the plain padded forward up to float rounding (the
tests check both). With grad, one prefix can serve several micro-batches that each run their
own backward (:meth:`SharedPrefix.detached` and :meth:`SharedPrefix.pullback`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from memalpha.lm.core.accumulated_lora import accumulated_adapters
from memalpha.lm.core.layout import PaddedBatch

if TYPE_CHECKING:
    from transformers import Cache


def split_decoder_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module, object]:
    """The decoder stack, the output head and the config of a (PEFT-wrapped) causal LM.

    With PEFT the adapters are injected into the base model's layers, so calling these
    modules honours ``disable_adapter()`` exactly like calling the wrapper does.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    head = base.get_output_embeddings()
    if decoder is base or head is None:
        raise ValueError(f"{type(base).__name__} does not expose a separate decoder and output head")
    return decoder, head, base.config


def cache_is_kept(decoder) -> bool:
    """False while HF gradient checkpointing is active (a checkpointed layer in training mode
    drops ``past_key_values``), so callers must not pass a cache then."""
    return not any(
        getattr(module, "gradient_checkpointing", False)
        and module.training
        and not getattr(module, "_can_checkpoint_with_cache", False)
        for module in decoder.modules()
    )


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the prefix common to all rows, leaving at least one token of every row after it.

    The last prompt token must stay outside the cache: it is the one whose output predicts
    the first response token.
    """
    if len(rows) < 2:
        return 0
    limit = min(len(row) for row in rows) - 1
    if limit <= 0:
        return 0
    head = torch.tensor([list(row[:limit]) for row in rows])
    same = (head == head[0]).all(dim=0)
    differing = (~same).nonzero()
    return int(differing[0]) if differing.numel() else limit


def unique_rows(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """``(first, inverse)``: the index of each distinct row's first occurrence, and for every
    row the position of its distinct row in ``first``."""
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for index, row in enumerate(rows):
        key = tuple(row)
        if key not in seen:
            seen[key] = len(first)
            first.append(index)
        inverse.append(seen[key])
    return first, inverse


def new_cache(decoder) -> Cache:
    from transformers import DynamicCache

    return DynamicCache(config=decoder.config)


def extend_cache(decoder, cache: Cache, batch: PaddedBatch, start: int, stop: int) -> torch.Tensor:
    """Run ``batch`` columns ``[start, stop)`` through ``decoder`` on top of ``cache`` (which must hold
    columns ``[0, start)`` for the same rows); returns their last hidden states."""
    return decoder(
        input_ids=batch.input_ids[:, start:stop],
        attention_mask=batch.attention_mask[:, :stop],
        position_ids=batch.position_ids[:, start:stop],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state


@dataclass
class SharedPrefix:
    """Keys and values of the tokens every row of a batch starts with, computed once at batch size 1.

    ``layers`` holds one ``(keys, values)`` pair per decoder layer, each ``[1, kv_heads, length,
    head_dim]``. They carry the autograd graph of the pass that made them when grad was on.
    """

    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def length(self) -> int:
        return len(self.tokens)

    @classmethod
    def compute(cls, decoder, tokens: Sequence[int]) -> SharedPrefix:
        """Run ``tokens`` (positions ``0..len-1``, no padding) through ``decoder``; grad follows grad mode."""
        device = next(decoder.parameters()).device
        ids = torch.as_tensor([list(tokens)], dtype=torch.long, device=device)
        cache = new_cache(decoder)
        decoder(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(ids.shape[1], device=device)[None, :],
            past_key_values=cache,
            use_cache=True,
        )
        return cls(tuple(int(t) for t in tokens), [(layer.keys, layer.values) for layer in cache.layers])

    def cache(self, decoder, rows: int) -> Cache:
        """A fresh cache holding the prefix for ``rows`` rows (differentiable back to ``layers``)."""
        cache = new_cache(decoder)
        for index, (keys, values) in enumerate(self.layers):
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
        return cache

    def check_extends(self, rows: Sequence[Sequence[int]]) -> None:
        """Raise unless every row starts with this prefix and has at least one token after it."""
        for index, row in enumerate(rows):
            if len(row) <= self.length or tuple(row[: self.length]) != self.tokens:
                raise ValueError(f"prompt_ids[{index}] does not extend the {self.length}-token shared prefix")

    def detached(self) -> SharedPrefix:
        """Leaf copies that collect the gradient reaching the prefix (see :meth:`pullback`)."""
        return SharedPrefix(
            self.tokens,
            [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in self.layers],
        )

    def pullback(self, leaves: SharedPrefix, grad_scale: float = 1.0) -> torch.Tensor:
        """A scalar whose backward sends the gradient collected in ``leaves`` on into this prefix's graph.

        Several micro-batches can read the same prefix through its :meth:`detached` leaves, each
        backward adding to the leaves' ``.grad``; adding this term to the last micro-batch's loss
        carries their sum through the prefix's own pass once, inside an ordinary backward (so a
        distributed strategy syncs it like any other gradient). ``grad_scale`` is the factor the
        backward multiplies losses by (a mixed-precision grad scaler's scale): the collected
        gradients already contain it once.
        """
        terms = [
            (tensor * leaf.grad).sum() / grad_scale
            for pair, leaf_pair in zip(self.layers, leaves.layers)
            for tensor, leaf in zip(pair, leaf_pair)
            if leaf.grad is not None
        ]
        if not terms:
            return self.layers[0][0].new_zeros(())
        return torch.stack(terms).sum()


def full_attention_layers(config) -> int | None:
    """The number of decoder layers when every one is plain full attention (a
    :class:`~transformers.DynamicLayer`), else None: sliding-window, chunked, indexed or
    linear-attention layers keep or cut their caches in ways a copied cache cannot follow."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return len(layers)


def can_share_cache(decoder) -> bool:
    """Whether rows of a batch may share computed keys and values: not while the decoder drops
    caches (gradient checkpointing in training), nor unless every layer is plain full attention
    (a sliding window's cut cache could not be repeated and extended as one). Every sharing path
    asks this one question."""
    return cache_is_kept(decoder) and full_attention_layers(decoder.config) is not None


def shared_prefix(decoder, rows: Sequence[Sequence[int]]) -> SharedPrefix | None:
    """The :class:`SharedPrefix` of ``rows``; None when they share nothing or :func:`can_share_cache` says
    no."""
    if not can_share_cache(decoder):
        return None
    length = shared_prefix_length(rows)
    if not length:
        return None
    with accumulated_adapters(decoder):
        return SharedPrefix.compute(decoder, rows[0][:length])


def prompt_cache(
    decoder, batch: PaddedBatch, prompts: Sequence[Sequence[int]], prefix: SharedPrefix | None
) -> Cache | None:
    """Cache of every prompt column but the last of ``batch`` (laid out with ``shared_prefix=prefix.length``).

    The prefix is reused, and each distinct rest of a prompt runs once and is repeated to the
    rows that share it; grad follows grad mode. None when no row shares anything with another
    (the caller then runs the plain path).
    """
    length = prefix.length if prefix is not None else 0
    first, inverse = unique_rows([prompt[length:] for prompt in prompts])
    if (length == 0 and len(first) == len(prompts)) or batch.prompt_width <= 1:
        return None
    cache = _rows_cache(decoder, batch, prefix, first)
    cache.reorder_cache(torch.as_tensor(inverse, dtype=torch.long))  # each row its prompt's (differentiable)
    return cache


def distinct_prompt_cache(
    decoder,
    batch: PaddedBatch,
    prompts: Sequence[Sequence[int]],
    prefix: SharedPrefix | None,
    dedupe: bool = True,
) -> tuple[Cache | None, list[int]]:
    """``(cache, prompt_of_row)``: the cache of every prompt column but the last for each distinct
    prompt of ``batch`` once (rows in order of first appearance; None when the prompts are one
    column wide), and for every row the index of its distinct prompt. With ``dedupe`` off every
    row counts as distinct. ``batch`` is laid out with ``shared_prefix=prefix.length``."""
    length = prefix.length if prefix is not None else 0
    if dedupe:
        first, inverse = unique_rows([prompt[length:] for prompt in prompts])
    else:
        first = inverse = list(range(len(prompts)))
    if batch.prompt_width <= 1:
        return None, inverse
    return _rows_cache(decoder, batch, prefix, first), inverse


def _rows_cache(decoder, batch: PaddedBatch, prefix: SharedPrefix | None, rows: list[int]) -> Cache:
    """Every prompt column but the last of ``batch``'s ``rows``, on top of ``prefix`` (reused)."""
    length = prefix.length if prefix is not None else 0
    stop = batch.prompt_width - 1
    cache = prefix.cache(decoder, len(rows)) if prefix is not None else new_cache(decoder)
    if stop > length:
        extend_cache(decoder, cache, PaddedBatch(*(tensor[rows] for tensor in batch)), length, stop)
    return cache


def prompt_order(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Row order that puts identical prompts next to each other (stable), so micro-batches can share them."""
    return sorted(range(len(prompts)), key=lambda index: list(prompts[index]))
