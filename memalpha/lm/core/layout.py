"""The padded prompt+response layout that generation, log-probs and the prefix cache share.

Layout used everywhere in memalpha for a batch of (prompt, response) pairs::

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
lets :mod:`memalpha.lm.core.prefix_cache` compute the shared tokens once for the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


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
