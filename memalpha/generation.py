"""Batched sampling from a causal LM and the padded prompt+response layout shared with the log-prob code.

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
lets :mod:`memalpha.prefix_cache` compute the shared tokens once for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from memalpha.prefix_cache import (
    can_share_cache,
    preallocated_cache,
    prompt_cache,
    shared_prefix,
    split_decoder_and_head,
)


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
        """Positions that ignore left padding (0 on padding), as ``transformers.generate`` uses."""
        return position_ids_from_mask(self.attention_mask)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` with padded positions set to 0 (the rule ``generate`` applies)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def _check_pairs(prompt_ids: list[list[int]], response_ids: list[list[int]] | None) -> None:
    if response_ids is not None and len(prompt_ids) != len(response_ids):
        raise ValueError(
            f"prompt_ids has {len(prompt_ids)} rows but response_ids has {len(response_ids)}; they must pair up"
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
    _check_pairs(prompt_ids, response_ids)
    if shared_prefix < 0:
        raise ValueError(f"shared_prefix must be >= 0, got {shared_prefix}")
    if shared_prefix > 0:
        head = list(prompt_ids[0][:shared_prefix])
        for index, prompt in enumerate(prompt_ids):
            if len(prompt) <= shared_prefix or list(prompt[:shared_prefix]) != head:
                raise ValueError(
                    f"prompt_ids[{index}] does not extend the {shared_prefix}-token prefix shared by the batch"
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
            input_ids[row, prompt_width : prompt_width + len(response)] = torch.as_tensor(response, dtype=torch.long)
            response_mask[row, : len(response)] = 1
    return PaddedBatch(input_ids.to(device), attention_mask.to(device), response_mask.to(device))


@dataclass
class Generation:
    """Result of :func:`generate`.

    ``response_ids[i]`` holds the sampled tokens of prompt ``i`` up to and including the first
    end-of-sequence token; anything the batch produced after it is dropped. ``truncated[i]``
    is True when the response hit ``max_new_tokens`` without an end-of-sequence token.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_generated_tokens(self) -> int:
        """Total response tokens kept (end-of-sequence tokens included)."""
        return sum(len(response) for response in self.response_ids)

    @property
    def response_lengths(self) -> list[int]:
        return [len(response) for response in self.response_ids]

    def response_mask(self) -> torch.Tensor:
        """``[B, R]`` long tensor, 1 on kept response tokens (tokens after an eos are not kept)."""
        width = max(self.response_lengths, default=0)
        mask = torch.zeros((len(self), width), dtype=torch.long)
        for row, length in enumerate(self.response_lengths):
            mask[row, :length] = 1
        return mask

    def padded(self, pad_id: int, device: str | torch.device = "cpu") -> PaddedBatch:
        """``(input_ids, attention_mask, response_mask)`` in the layout of the module docstring."""
        return pad_prompt_response(self.prompt_ids, self.response_ids, pad_id, device)


def _eos_ids(model, tokenizer, eos_token_id: int | list[int] | None) -> list[int]:
    candidate = eos_token_id
    if candidate is None:
        generation_config = getattr(model, "generation_config", None)
        candidate = getattr(generation_config, "eos_token_id", None)
    if candidate is None:
        candidate = tokenizer.eos_token_id
    if candidate is None:
        raise ValueError("no end-of-sequence token: pass eos_token_id or use a tokenizer that defines one")
    ids = [candidate] if isinstance(candidate, int) else list(candidate)
    return [int(i) for i in ids]


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def trim_at_eos(tokens: list[int], eos_ids: list[int] | set[int]) -> tuple[list[int], bool]:
    """Cut ``tokens`` after the first eos (kept). Returns the kept tokens and whether no eos was found."""
    eos = set(eos_ids)
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1], False
    return tokens, True


def generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    do_sample: bool = True,
    seed: int | None = None,
    batch_size: int | None = None,
    eos_token_id: int | list[int] | None = None,
    share_prefix: bool = True,
) -> Generation:
    """Sample responses for token-id prompts, batched and left-padded, with the KV cache.

    One ``model.generate`` call per batch of ``batch_size`` prompts (all prompts in one batch when
    None), under ``torch.no_grad()`` and in eval mode (the training mode is restored afterwards,
    so dropout and gradient checkpointing are off while sampling). Sampling applies temperature,
    then top-k (0 = off), then top-p (1.0 = off), as ``transformers`` does; ``do_sample=False`` is
    greedy. Generation stops at the end-of-sequence token(s): ``eos_token_id`` if given, else the
    model's generation config, else the tokenizer's. With ``seed`` the global RNG is forked and
    seeded, so the same call returns the same samples and the caller's RNG is left untouched.

    With ``share_prefix`` (the default) the tokens that the prompts of a batch share -- their
    common prefix, and whole prompts repeated by a group -- are pre-filled once and their
    key/value cache is repeated to every row (:mod:`memalpha.prefix_cache`); the samples are
    those of the plain batch up to float rounding. The cache is preallocated for the prompt
    plus ``max_new_tokens`` and filled in place, instead of growing by concatenation.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    _check_pairs(prompt_ids, None)
    from transformers import GenerationConfig

    eos_ids = _eos_ids(model, tokenizer, eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    sampling = (
        {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)}
        if do_sample
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        use_cache=True,
        num_beams=1,
        **sampling,
    )
    device = _model_device(model)
    decoder = split_decoder_and_head(model)[0]
    step = batch_size or max(len(prompt_ids), 1)
    responses: list[list[int]] = []
    truncated: list[bool] = []
    was_training = model.training
    model.eval()
    fork_devices = [device] if device.type == "cuda" else []
    try:
        share_prefix = share_prefix and can_share_cache(decoder)  # asked in eval mode, as generation runs
        with torch.no_grad(), torch.random.fork_rng(devices=fork_devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), step):
                chunk = prompt_ids[start : start + step]
                prefix = shared_prefix(decoder, chunk) if share_prefix else None
                padded = pad_prompt_response(
                    chunk, [[] for _ in chunk], pad_id, device, shared_prefix=prefix.length if prefix else 0
                )
                cache = prompt_cache(decoder, padded, chunk, prefix) if share_prefix else None
                room = preallocated_cache(decoder, padded.input_ids.shape[1] + max_new_tokens, cache)
                sequences = model.generate(
                    input_ids=padded.input_ids,
                    attention_mask=padded.attention_mask,
                    past_key_values=room if room is not None else cache,
                    generation_config=config,
                )
                del cache, room
                new_tokens = sequences[:, padded.input_ids.shape[1] :].tolist()
                for tokens in new_tokens:
                    kept, cut = trim_at_eos(tokens, eos_ids)
                    responses.append(kept)
                    truncated.append(cut)
    finally:
        model.train(was_training)
    return Generation(prompt_ids=[list(p) for p in prompt_ids], response_ids=responses, truncated=truncated)
