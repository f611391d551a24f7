"""Compute the tokens that rows of a batch share once, and reuse their key/value cache.

A GRPO batch repeats itself: every memorising turn starts with the same ~1k-token system
prompt, and a group samples the same prompt ``n`` times. Running the decoder over each
copy is pure waste, so the batch is laid out as (see :func:`memalpha.generation.pad_prompt_response`
with ``shared_prefix``)::

    [ shared prefix (L) | pad .. pad, prompt suffix_i | response_i, pad .. pad ]

The prefix's keys and values are computed once at batch size 1 and repeated to every row;
identical prompt suffixes are computed once and repeated too. The attention mask has a hole
where a short suffix is padded and position ids come from ``cumsum(mask) - 1``, so every
row sees exactly the positions and keys it would see alone: the results equal the plain
padded forward up to float rounding (the tests check both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import Cache

    from memalpha.generation import PaddedBatch


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


def prefix_cache(decoder, batch: PaddedBatch, prefix_len: int) -> Cache:
    """Cache of the first ``prefix_len`` columns of row 0, at batch size 1 (grad follows grad mode)."""
    cache = new_cache(decoder)
    one_row = type(batch)(*(tensor[:1] for tensor in batch))
    extend_cache(decoder, cache, one_row, 0, prefix_len)
    return cache


def repeat_rows(cache: Cache, index: Sequence[int] | torch.Tensor) -> Cache:
    """``cache`` with its batch rows picked by ``index`` (in place; differentiable)."""
    cache.reorder_cache(torch.as_tensor(index, dtype=torch.long))
    return cache


@torch.no_grad()
def prompt_cache(decoder, batch: PaddedBatch, prompts: Sequence[Sequence[int]], prefix_len: int) -> Cache | None:
    """Cache of every column but the last of a prompt-only ``batch`` laid out with ``shared_prefix=prefix_len``.

    The shared prefix runs once and each distinct suffix once; None when no row shares
    anything (the caller then runs the plain path).
    """
    first, inverse = unique_rows([prompt[prefix_len:] for prompt in prompts])
    width = batch.input_ids.shape[1]
    if (prefix_len == 0 and len(first) == len(prompts)) or width == 1:
        return None
    if prefix_len > 0:
        cache = repeat_rows(prefix_cache(decoder, batch, prefix_len), [0] * len(first))
    else:
        cache = new_cache(decoder)
    if width - 1 > prefix_len:
        distinct = type(batch)(*(tensor[first] for tensor in batch))
        extend_cache(decoder, cache, distinct, prefix_len, width - 1)
    return repeat_rows(cache, inverse)
