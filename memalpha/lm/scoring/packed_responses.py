"""Score a micro-batch's responses without padding: each distinct prompt's rows as one row.

The padded layout runs every response to the length of the longest one in its micro-batch and
repeats the prompt's keys and values to every row. When the response lengths of a group differ,
much of what the decoder runs can be padding, and with grad the repeated cache also costs a
gradient sum per layer. Like verl's removed padding and TRL's padding-free collator,
:func:`packed_response_hidden` lays out the responses of the rows that share a prompt one after
another in a single row over that prompt's cache::

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

import torch

from memalpha.lm.core.attention import MASK_IMPLEMENTATIONS
from memalpha.lm.core.layout import PaddedBatch, additive_mask
from memalpha.lm.core.prefix_cache import SharedPrefix, distinct_prompt_cache, unique_rows


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
