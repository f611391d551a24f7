"""A reference decoding loop for the tests and the GPU benchmark: a preallocated cache that attends
over its filled part only, and rows that leave the batch when they finish.

It was memalpha's ``growing-cache`` sampling backend until the transformers path, given the same
pre-filled prefix cache, matched it in the product's phases (docs/results.md, bench_cpu_decoders);
it stays here because it draws the variates of :func:`memalpha.lm.sampling.filters.next_tokens`
one per live row per step, as the CUDA graph step does, and reads teacher-forced logits through a
``pick`` callback, which the tests of :mod:`memalpha.lm.sampling.graph_decode` and
``experiments/bench/bench_graph_decode.py`` compare against.

* :class:`GrowingLayer` holds a layer's keys and values in a buffer allocated once for the
  prompt plus ``max_new_tokens``, and hands attention a view of the columns filled so far;
* a row that emits an end-of-sequence token is dropped from the batch (its cache rows, mask
  and positions);
* the next token comes from ``pick``.

Only decoders whose every layer is plain full attention qualify (:func:`growing_cache` returns
None otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from memalpha.lm.core.logits import finalise_logits, score_dtype
from memalpha.lm.core.prompt_sharing import PaddedBatch, full_attention_layers
from memalpha.lm.sampling.responses import Responses


class GrowingLayer(DynamicLayer):
    """One layer's keys and values in a buffer of ``capacity`` columns; ``keys``/``values`` are
    views of the filled columns (so the mask and attention span those only)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.filled = 0
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        rows, heads = key_states.shape[:2]
        self.key_buffer = key_states.new_empty((rows, heads, self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        stop = self.filled + key_states.shape[-2]
        if stop > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} columns, {stop} were asked for")
        self.key_buffer[:, :, self.filled : stop] = key_states
        self.value_buffer[:, :, self.filled : stop] = value_states
        self.filled = stop
        self._expose()
        return self.keys, self.values

    def _expose(self) -> None:
        self.keys = self.key_buffer[:, :, : self.filled]
        self.values = self.value_buffer[:, :, : self.filled]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer[indices]
            self.value_buffer = self.value_buffer[indices]
            self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` columns (the negative count ``transformers`` passes)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes the negative number of columns to drop, got {tokens_to_remove}")
        self.filled = max(self.filled + tokens_to_remove, 0)
        if self.is_initialized:
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self._expose()


def growing_cache(decoder, capacity: int, filled: Cache | None = None) -> Cache | None:
    """A cache of :class:`GrowingLayer` for ``capacity`` columns holding ``filled``'s columns first;
    None for decoders with sliding-window, chunked or other non-plain layers."""
    count = full_attention_layers(decoder.config)
    if count is None:
        return None
    cache = Cache(layers=[GrowingLayer(capacity) for _ in range(count)])
    if filled is not None:
        for layer, source in zip(cache.layers, filled.layers):
            if source.is_initialized and source.keys is not None and source.keys.numel():
                layer.update(source.keys, source.values)
    return cache


def decode(
    decoder,
    head: torch.nn.Module,
    config,
    batch: PaddedBatch,
    cache: Cache,
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[list[list[int]], list[bool]]:
    """New tokens for every row of ``batch`` (laid out as :mod:`memalpha.lm.core.prompt_sharing` says).

    ``cache`` is a :func:`growing_cache` holding the batch's first ``cache.get_seq_length()``
    columns (0 or more; the rest of the prompt runs in the first step) with room for
    ``max_new_tokens`` more. ``pick`` maps ``[B, V]`` logits (float32; float64 for a float64
    model) to ``[B]`` token ids. Returns each row's tokens up to and including its first
    end-of-sequence token, and whether the row ran out of ``max_new_tokens`` without one.
    Call under ``torch.no_grad()``.
    """
    start = cache.get_seq_length()
    if start >= batch.input_ids.shape[1]:
        raise ValueError("the cache must leave at least the last prompt column to run")
    responses = Responses(batch.input_ids.shape[0], eos_ids)
    inputs = batch.input_ids[:, start:]
    positions = batch.position_ids[:, start:]
    mask = batch.attention_mask
    for step in range(max_new_tokens):
        hidden = decoder(
            input_ids=inputs,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[:, -1:]
        logits = head(hidden)[:, -1]  # [B, 1, H] in, as model.forward calls the head
        tokens = pick(finalise_logits(logits.to(score_dtype(logits.dtype)), config))
        keep = responses.add(tokens)
        if not keep or step == max_new_tokens - 1:
            break
        inputs = tokens[:, None]
        positions = positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        if len(keep) < len(responses.live):
            index = torch.tensor(keep, device=inputs.device)
            cache.batch_select_indices(index)
            inputs, positions, mask = inputs[index], positions[index], mask[index]
            responses.keep_only(keep)
    return responses.tokens, responses.truncated
