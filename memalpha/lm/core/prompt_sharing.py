"""The padded prompt+response layout, and prompt sharing: what the rows of a sampling or scoring call
share is computed once, behind one object, :class:`PromptSharing`, which both paths build once per call.

**The layout.** Layout used everywhere in memalpha for a batch of (prompt, response) pairs::

    input_ids      [B, P + R]   row i = [pad .. pad, prompt_i, response_i, pad .. pad]
    attention_mask [B, P + R]   1 on prompt and response tokens, 0 on padding
    response_mask  [B, R]       1 on response tokens; column j is input_ids[:, P + j]

``P`` is the longest prompt (prompts are left-padded, as for generation) and ``R`` the
longest response (responses are right-padded), so every response starts at column ``P``.
Position ids are ``cumsum(attention_mask) - 1``, exactly as ``transformers`` derives them
during generation, so a left-padded row is scored as if it had no padding at all.

With ``shared_prefix=L`` the first ``L`` tokens, identical in every prompt, stay in columns
``[0, L)`` and only the rest of each prompt is left-padded after them; the padding hole is
masked and skipped by the position ids, so each row still reads as unpadded. That layout
lets :class:`PromptSharing` compute the shared tokens once for the whole batch.

**Prompt sharing.** A GRPO batch repeats itself: every memorising turn starts with the same ~1k-token
system prompt, and a group samples the same prompt ``n`` times. Running the decoder over each copy is
pure waste, so the batch is laid out as (see :func:`pad_prompt_response` with ``shared_prefix``)::

    [ shared prefix (L) | pad .. pad, prompt suffix_i | response_i, pad .. pad ]

The prefix's keys and values are computed once at batch size 1 (:class:`SharedPrefix`) and
repeated to every row; identical prompt suffixes are computed once and repeated too
(:func:`prompt_cache`). The attention mask has a hole where a short suffix is padded and
position ids come from ``cumsum(mask) - 1``, so every row sees exactly the positions and keys
it would see alone: the results equal the plain padded forward up to float rounding (the
tests check both). With grad, one prefix can serve several micro-batches that each run their
own backward (:meth:`SharedPrefix.detached` and :meth:`SharedPrefix.pullback`).

**Packed responses (scoring).** The padded layout runs every response to the length of the longest
one in its micro-batch and repeats the prompt's keys and values to every row. When the response
lengths of a group differ, much of what the decoder runs can be padding, and with grad the
repeated cache also costs a gradient sum per layer. Like verl's removed padding and TRL's
padding-free collator, :func:`packed_response_hidden` lays out the responses of the rows that share
a prompt one after another in a single row over that prompt's cache::

    keys of row u:    [ prompt u (P - 1 columns) | segment a | segment b | ... | pad ]
    queries of row u:                            [ segment a | segment b | ... | pad ]

Each segment is one response's input (its prompt's last token, then the response without its
last token), so segment position ``j`` predicts response token ``j``. A segment sees the real
columns of its prompt and the earlier tokens of its own segment (an additive mask), at the
positions the padded layout gives it, so the values equal the padded path's up to float
rounding, and gradients reach each distinct prompt's cache once instead of through copies.

The layout is used when it runs fewer tokens than the padded one and its attention covers no
more (query, key) pairs (:func:`worth_packing`): a long group of long responses in one row
would make the attention quadratic in the group's total length. It takes decoders whose
attention adds a custom 4-D mask (PyTorch's SDPA or the eager implementation); others
(FlashAttention-2 on a GPU) keep the padded path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from memalpha.lm.core.attention import MASK_IMPLEMENTATIONS
from memalpha.lm.core.modes import accumulated_adapters

if TYPE_CHECKING:
    from transformers import Cache


class PaddedBatch(NamedTuple):
    """Prompt+response batch in the layout of this module's docstring (unpacks as a 3-tuple)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor

    @property
    def prompt_width(self) -> int:
        """``P``: the column where every response starts."""
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    @property
    def position_ids(self) -> torch.Tensor:
        """``cumsum(mask) - 1`` with padded positions set to 0: the positions ``transformers.generate``
        uses, which ignore left padding."""
        positions = self.attention_mask.long().cumsum(-1) - 1
        return positions.masked_fill(self.attention_mask == 0, 0)


def check_pairs(prompt_ids: list[list[int]], response_ids: list[list[int]] | None) -> None:
    if response_ids is not None and len(prompt_ids) != len(response_ids):
        raise ValueError(
            f"prompt_ids has {len(prompt_ids)} rows but "
            f"response_ids has {len(response_ids)}; they must pair up"
        )
    for index, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt_ids[{index}] is empty; every prompt needs at least one token")


def pad_prompt_response(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    device: str | torch.device = "cpu",
    *,
    shared_prefix: int = 0,
) -> PaddedBatch:
    """Build the padded layout (see module docstring) for lists of token ids.

    ``shared_prefix`` is the number of leading tokens every prompt has in common (they must
    be identical and every prompt must be longer); 0 gives plain left padding.
    """
    check_pairs(prompt_ids, response_ids)
    if shared_prefix < 0:
        raise ValueError(f"shared_prefix must be >= 0, got {shared_prefix}")
    if shared_prefix > 0:
        head = list(prompt_ids[0][:shared_prefix])
        for index, prompt in enumerate(prompt_ids):
            if len(prompt) <= shared_prefix or list(prompt[:shared_prefix]) != head:
                raise ValueError(
                    f"prompt_ids[{index}] does not extend the "
                    f"{shared_prefix}-token prefix shared by the batch"
                )
    batch = len(prompt_ids)
    prompt_width = max((len(p) for p in prompt_ids), default=0)
    response_width = max((len(r) for r in response_ids), default=0)
    input_ids = torch.full((batch, prompt_width + response_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, prompt_width + response_width), dtype=torch.long)
    response_mask = torch.zeros((batch, response_width), dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        start = prompt_width - len(prompt)
        if shared_prefix:
            input_ids[row, :shared_prefix] = torch.as_tensor(prompt[:shared_prefix], dtype=torch.long)
            attention_mask[row, :shared_prefix] = 1
            start += shared_prefix
            prompt = prompt[shared_prefix:]
        input_ids[row, start:prompt_width] = torch.as_tensor(prompt, dtype=torch.long)
        attention_mask[row, start : prompt_width + len(response)] = 1
        if response:
            input_ids[row, prompt_width : prompt_width + len(response)] = torch.as_tensor(
                response, dtype=torch.long
            )
            response_mask[row, : len(response)] = 1
    return PaddedBatch(input_ids.to(device), attention_mask.to(device), response_mask.to(device))


def response_mask(
    responses: Sequence[Sequence[int]], width: int, device: str | torch.device = "cpu", dtype=torch.float32
) -> torch.Tensor:
    """``[B, width]``: 1 on each response's tokens, 0 on the padding after them (``response_mask`` of
    :class:`PaddedBatch` for responses scored on their own)."""
    lengths = torch.tensor([len(r) for r in responses], device=device)
    return (torch.arange(width, device=device)[None, :] < lengths[:, None]).to(dtype)


def additive_mask(masked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``masked`` (True where a query may not attend) as an additive attention mask: the dtype's
    minimum there, 0 elsewhere; None when nothing is masked. The minimum rather than ``-inf``
    keeps a fully masked row finite: its log-sum-exp then lies near the dtype's minimum, so it
    weighs nothing when two attention parts are combined
    (:func:`memalpha.lm.sampling.fused_decode.combine`)."""
    if not bool(masked.any()):
        return None
    return torch.zeros(masked.shape, dtype=dtype, device=masked.device).masked_fill_(
        masked, torch.finfo(dtype).min
    )


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

def worth_packing(lengths: Sequence[int], prompt_of_row: Sequence[int], cached: int) -> bool:
    """Whether one row per distinct prompt runs fewer tokens than the padded layout and attends
    over no more (query, key) pairs. ``lengths``: each row's response tokens; ``cached``: the
    prompt columns in the cache (``P - 1``)."""
    rows, width = len(lengths), max(lengths, default=0)
    totals: dict[int, int] = {}
    for length, prompt in zip(lengths, prompt_of_row):
        totals[prompt] = totals.get(prompt, 0) + length
    packed_width = max(totals.values(), default=0)
    packed_tokens, padded_tokens = len(totals) * packed_width, rows * width
    return (
        packed_tokens < padded_tokens
        and packed_tokens * (cached + packed_width) <= padded_tokens * (cached + width)
    )


@dataclass
class SegmentLayout:
    """One row per distinct prompt holding its rows' segments.

    ``input_ids``/``position_ids`` ``[U, S]``; ``visible`` ``[U, S, P - 1 + S]`` (True where a
    query may attend: its prompt's real columns and its segment's earlier tokens; a padding
    query sees itself only); ``order`` ``[N]`` indexes the flattened ``[U * S]`` queries so that
    they follow the padded batch's real response tokens row by row.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    visible: torch.Tensor
    order: torch.Tensor

    @classmethod
    def build(cls, batch: PaddedBatch, prompt_of_row: Sequence[int]) -> SegmentLayout:
        stop = batch.prompt_width - 1  # the prompts' cached columns; column `stop` is their last token
        lengths = [int(n) for n in batch.response_mask.sum(dim=1).tolist()]
        distinct = max(prompt_of_row) + 1
        first_row = [prompt_of_row.index(p) for p in range(distinct)]
        filled = [0] * distinct
        placed = []
        for length, prompt in zip(lengths, prompt_of_row):
            placed.append(filled[prompt])
            filled[prompt] += length
        width = max(filled)
        device = batch.input_ids.device
        input_ids = batch.input_ids.new_zeros(distinct, width)
        position_ids = batch.position_ids.new_zeros(distinct, width)
        visible = torch.zeros(distinct, width, stop + width, dtype=torch.bool, device=device)
        visible[:, :, stop:] = torch.eye(width, dtype=torch.bool, device=device)  # padding sees itself
        order = []
        for row, (length, prompt, start) in enumerate(zip(lengths, prompt_of_row, placed)):
            if length == 0:
                continue
            segment = slice(start, start + length)
            input_ids[prompt, segment] = batch.input_ids[row, stop : stop + length]
            position_ids[prompt, segment] = batch.position_ids[row, stop : stop + length]
            visible[prompt, segment, :stop] = batch.attention_mask[first_row[prompt], :stop].bool()
            visible[prompt, segment, stop + start : stop + start + length] = torch.ones(
                length, length, dtype=torch.bool, device=device
            ).tril()
            order.extend(range(prompt * width + start, prompt * width + start + length))
        return cls(input_ids, position_ids, visible, torch.tensor(order, dtype=torch.long, device=device))


def packed_response_hidden(
    decoder, batch: PaddedBatch, prompts: Sequence[Sequence[int]], prefix: SharedPrefix | None
) -> torch.Tensor | None:
    """The decoder's last hidden states ``[N, hidden]`` that predict ``batch``'s ``N`` real
    response tokens (row-major), from one padding-free row per distinct prompt over its cache.

    ``batch`` is laid out with ``shared_prefix=prefix.length``; grad follows grad mode. None when
    the layout does not apply (prompts one column wide, a decoder whose attention takes no
    custom mask, or :func:`worth_packing` says no): the caller then runs the padded path.
    """
    implementation = getattr(decoder.config, "_attn_implementation", None)
    if implementation not in MASK_IMPLEMENTATIONS or batch.prompt_width <= 1:
        return None
    length = prefix.length if prefix is not None else 0
    _, prompt_of_row = unique_rows([prompt[length:] for prompt in prompts])
    lengths = [int(n) for n in batch.response_mask.sum(dim=1).tolist()]
    if not worth_packing(lengths, prompt_of_row, batch.prompt_width - 1):
        return None
    cache, prompt_of_row = distinct_prompt_cache(decoder, batch, prompts, prefix)
    layout = SegmentLayout.build(batch, prompt_of_row)
    mask = additive_mask(~layout.visible, cache.layers[0].keys.dtype)
    hidden = decoder(
        input_ids=layout.input_ids,
        attention_mask=None if mask is None else mask[:, None],  # None: one query per row, it sees all
        position_ids=layout.position_ids,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])[layout.order]


def _padded_response_hidden(
    decoder, batch: PaddedBatch, prompts, prefix: SharedPrefix | None, share: bool
) -> torch.Tensor:
    """The hidden states predicting ``batch``'s real response tokens (row-major) from the padded
    layout: on top of the prompts' shared cache where rows share one, else the plain forward."""
    cache = prompt_cache(decoder, batch, prompts, prefix) if share else None
    if cache is not None:  # every prompt column but the last is cached
        first_column = batch.prompt_width - 1
        hidden = extend_cache(decoder, cache, batch, first_column, batch.input_ids.shape[1])
        del cache
    else:
        first_column = 0
        hidden = decoder(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state
    # hidden at column t predicts the token at column t + 1 (hidden starts at first_column)
    first = batch.prompt_width - 1 - first_column
    predicting = hidden[:, first : first + batch.response_mask.shape[1]]
    return predicting[batch.response_mask.bool()]


@dataclass
class PromptSharing:
    """What the prompts of one sampling or scoring call share, computed once: the one interface of
    prompt sharing that :func:`memalpha.lm.sampling.generation.generate` and
    :func:`memalpha.lm.logprobs.per_token.token_scores` call.

    ``enabled``: whether rows may share computed keys and values at all (asked and
    :func:`can_share_cache`); ``prefix``: the tokens every prompt starts with, run once
    (:class:`SharedPrefix`; None when nothing is shared). Every batch of the call is laid out with
    :meth:`layout`, and what the decoder reads of its prompts comes from :meth:`row_cache`,
    :meth:`distinct_cache` (sampling) or :meth:`response_hidden` (scoring).
    """

    decoder: torch.nn.Module
    enabled: bool
    prefix: SharedPrefix | None = None

    @classmethod
    def of(
        cls, decoder, prompts: Sequence[Sequence[int]], enabled: bool = True, *,
        prefix: SharedPrefix | None = None, compute_prefix: bool = True,
    ) -> PromptSharing:
        """The sharing of ``prompts``: ``prefix`` when the caller computed one (it must start every
        prompt; several calls can then share it), else their common prefix run now (unless
        ``compute_prefix`` is off). A handed-in prefix on a decoder that cannot share is an error."""
        enabled = enabled and can_share_cache(decoder)
        if not enabled:
            if prefix is not None:
                raise ValueError(
                    "a prefix was handed in, but this model cannot share caches "
                    "(it drops caches under gradient checkpointing in training, or has sliding-window layers)"
                )
            return cls(decoder, False)
        if prefix is not None:
            prefix.check_extends(prompts)
        elif compute_prefix:
            prefix = shared_prefix(decoder, prompts)
        return cls(decoder, True, prefix)

    @property
    def length(self) -> int:
        """The shared prefix's tokens (0 without one): the ``shared_prefix`` of every layout."""
        return self.prefix.length if self.prefix is not None else 0

    def layout(
        self, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device
    ) -> PaddedBatch:
        """``prompts`` and ``responses`` in the padded layout, the shared prefix in its own columns."""
        return pad_prompt_response(prompts, responses, pad_id, device, shared_prefix=self.length)

    def prompt_of_row(self, prompts: Sequence[Sequence[int]]) -> list[int] | None:
        """Every row's distinct prompt after the prefix (None when sharing is off)."""
        if not self.enabled:
            return None
        return unique_rows([list(prompt[self.length :]) for prompt in prompts])[1]

    def row_cache(self, batch: PaddedBatch, prompts: Sequence[Sequence[int]]) -> Cache | None:
        """:func:`prompt_cache`: each row's prompt columns but the last (None when nothing is shared)."""
        return prompt_cache(self.decoder, batch, prompts, self.prefix) if self.enabled else None

    def distinct_cache(
        self, batch: PaddedBatch, prompts: Sequence[Sequence[int]]
    ) -> tuple[Cache | None, list[int]]:
        """:func:`distinct_prompt_cache`: each distinct prompt's columns but the last once (every row
        distinct when sharing is off), and each row's prompt."""
        return distinct_prompt_cache(self.decoder, batch, prompts, self.prefix, dedupe=self.enabled)

    def response_hidden(self, batch: PaddedBatch, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """The decoder's last hidden states ``[N, hidden]`` predicting ``batch``'s ``N`` real
        response tokens (row-major): one packed row per distinct prompt where that is worth it
        (:func:`packed_response_hidden`), else the padded rows over the prompts' shared cache, else
        the plain forward. Grad follows grad mode."""
        rows = packed_response_hidden(self.decoder, batch, prompts, self.prefix) if self.enabled else None
        if rows is None:
            rows = _padded_response_hidden(self.decoder, batch, prompts, self.prefix, self.enabled)
        return rows
