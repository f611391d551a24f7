"""Batched sampling from a causal LM: left-padded prompts, shared prefixes, the chosen decoding loop.

Prompts are laid out as in :mod:`memalpha.lm.core.prompt_sharing`; with ``share_prefix`` the tokens the
prompts of a batch share are computed once (:class:`~memalpha.lm.core.prompt_sharing.PromptSharing`);
the new tokens come from the backend :mod:`memalpha.lm.sampling.backend` chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from memalpha.lm.core.freed_memory import release_freed_memory
from memalpha.lm.core.modes import eval_mode, folded_adapters
from memalpha.lm.core.prompt_sharing import (
    PaddedBatch,
    PromptSharing,
    can_share_cache,
    check_pairs,
    split_decoder_and_head,
)
from memalpha.lm.sampling import graph_decode
from memalpha.lm.sampling.backend import SETTING, announce, choose_backend, declined
from memalpha.lm.sampling.filters import next_tokens
from memalpha.lm.sampling.fused_decode import FusedDecoder, decode_fused


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

    @property
    def num_generated_tokens(self) -> int:
        """Total response tokens kept (end-of-sequence tokens included)."""
        return sum(len(response) for response in self.response_ids)

    @property
    def response_lengths(self) -> list[int]:
        return [len(response) for response in self.response_ids]


def resolve_eos_ids(model, tokenizer, eos_token_id: int | list[int] | None) -> list[int]:
    """The end-of-sequence ids generation stops at: ``eos_token_id`` if given, else the model's
    generation config's, else the tokenizer's."""
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


def check_sampling(max_new_tokens: int, do_sample: bool, temperature: float) -> None:
    """Raise ValueError unless ``max_new_tokens`` is >= 1 and, when sampling, ``temperature`` > 0."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")


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
    backend: str = "auto",
    announce_as: str = "sampling",
) -> Generation:
    """Sample responses for token-id prompts, batched and left-padded, with the KV cache.

    One decoding loop per batch of ``batch_size`` prompts (all prompts in one batch when None),
    under ``torch.no_grad()`` and in eval mode (the training mode is restored afterwards, so
    dropout and gradient checkpointing are off while sampling). Sampling applies temperature,
    then top-k (0 = off), then top-p (1.0 = off), as ``transformers`` does
    (:mod:`memalpha.lm.sampling.filters`); ``do_sample=False`` is greedy. A row stops at the
    end-of-sequence token(s): ``eos_token_id`` if given, else the model's generation config,
    else the tokenizer's. With ``seed`` the global RNG is forked and seeded, so the same call
    returns the same samples and the caller's RNG is left untouched.

    With ``share_prefix`` (the default) the tokens that the prompts of a batch share -- their
    common prefix, and whole prompts repeated by a group -- are pre-filled once and their
    key/value cache is repeated to every row (:mod:`memalpha.lm.core.prompt_sharing`); the samples are
    those of the plain batch up to float rounding. Decoders with sliding-window or other non-plain
    attention layers share nothing.

    ``backend`` picks the decoding loop as :mod:`memalpha.lm.sampling.backend` describes; ``auto``
    logs its choice once, as ``announce_as`` (``sampling`` for the policy, ``reader`` for the local
    reader).
    """
    check_sampling(max_new_tokens, do_sample, temperature)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    check_pairs(prompt_ids, None)
    eos_ids = resolve_eos_ids(model, tokenizer, eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    device = next(model.parameters()).device
    decoder, head, model_config = split_decoder_and_head(model)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return next_tokens(logits, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)

    def new_tokens(chunk: list[list[int]], choice: str, fused: FusedDecoder | None):
        """One batch's responses; its caches go when it returns."""
        sharing = PromptSharing.of(decoder, chunk, share_prefix)
        padded = sharing.layout(chunk, [[] for _ in chunk], pad_id, device)
        if choice == "cpu-fused":
            cache, prompt_of_row = sharing.distinct_cache(padded, chunk)
            return decode_fused(fused, padded, cache, prompt_of_row, max_new_tokens=max_new_tokens,
                                eos_ids=eos_ids, pick=pick)  # fmt: skip
        if choice == "cuda-graph":  # each distinct prompt prefilled once; the step draws in the graph
            in_graph = graph_decode.GraphSampling(do_sample, temperature, top_k, top_p)
            return graph_decode.decode_in_graph(
                decoder, head, model_config, padded, prefix=sharing.prefix,
                prompt_of_row=sharing.prompt_of_row(chunk), max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                sampling=in_graph,
            )
        cache = sharing.row_cache(padded, chunk)
        return _hf_generate(
            model, padded, cache, eos_ids, pad_id, max_new_tokens, do_sample, temperature, top_k, top_p
        )

    step = batch_size or max(len(prompt_ids), 1)
    responses: list[list[int]] = []
    truncated: list[bool] = []
    fork_devices = [device] if device.type == "cuda" else []
    with eval_mode(model):
        share_prefix = share_prefix and can_share_cache(decoder)  # asked in eval mode, as generation runs
        choice = choose_backend(model, backend)
        announce(model, choice, announce_as)
        # the rows of a batch: what the fused step's products are packed for
        rows = min(step, len(prompt_ids))
        fused = FusedDecoder.build(decoder, head, model_config, rows) if choice.name == "cpu-fused" else None
        if choice.name == "cpu-fused" and fused is None:  # unsupported() passed, the weights did not stack
            reason = "the fused step declined the weights (they did not stack)"
            choice = declined(model, choice, backend, reason)
            announce(model, choice, announce_as)
        graph = choice.name == "cuda-graph"  # dense weights, 4-bit bases dequantised, the LoRA folded in
        with (
            torch.no_grad(),
            torch.random.fork_rng(devices=fork_devices, enabled=seed is not None),
            folded_adapters(model, enabled=graph, quantised=graph),
        ):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(prompt_ids), step):
                kept, cut = new_tokens(prompt_ids[start : start + step], choice.name, fused)
                responses.extend(kept)
                truncated.extend(cut)
    del fused  # the folded weight copies go with the call; their pages go back to the system
    release_freed_memory()
    return Generation(prompt_ids=[list(p) for p in prompt_ids], response_ids=responses, truncated=truncated)


def sampler_for(
    model, tokenizer, backend: str = "auto", announce_as: str = "sampling"
) -> Callable[..., Generation]:
    """:func:`generate` for ``model`` as the setting ``rollout.backend`` says: takes the prompts and
    the sampling options. ``vllm`` samples on a server, not here: an error."""
    if backend == "vllm":
        raise ValueError(f"{SETTING}: vllm samples on its server; this process has no sampler for it")
    return partial(generate, model, tokenizer, backend=backend, announce_as=announce_as)


def _hf_generate(
    model, padded: PaddedBatch, cache, eos_ids: list[int], pad_id: int, max_new_tokens: int,
    do_sample: bool, temperature: float, top_k: int, top_p: float,
) -> tuple[list[list[int]], list[bool]]:
    """``model.generate`` on one laid-out batch (the ``hf-generate`` backend), given ``cache``: the
    batch's prompt columns but the last, pre-filled with the shared prefix computed once
    (:func:`~memalpha.lm.core.prompt_sharing.prompt_cache`), or None, where nothing is shared or the
    decoder cannot share (:func:`~memalpha.lm.core.prompt_sharing.can_share_cache`)."""
    from transformers import GenerationConfig

    sampling = (
        {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)}
        if do_sample
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id, use_cache=True, num_beams=1,
        **sampling,
    )
    sequences = model.generate(
        input_ids=padded.input_ids, attention_mask=padded.attention_mask, generation_config=config,
        **({} if cache is None else {"past_key_values": cache}),
    )
    kept, cut = [], []
    for tokens in sequences[:, padded.input_ids.shape[1] :].tolist():
        response, ran_out = trim_at_eos(tokens, eos_ids)
        kept.append(response)
        cut.append(ran_out)
    return kept, cut
