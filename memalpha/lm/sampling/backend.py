"""Which decoding loop samples for a model: one choice, made in one place, said once.

Four in-process backends produce new tokens (the ``vllm`` rollout engine, a server, is chosen by
``model.rollout.engine`` instead):

========================  =============================================================  ==========================
backend                   what runs                                                      takes
========================  =============================================================  ==========================
``cpu-fused``             memalpha's own decoding step over stacked weights with the     float32/float64 Llama,
                          LoRA folded in, prompt keys read once for all their rows       Mistral, Qwen2/3 on the CPU,
                          (:mod:`memalpha.lm.sampling.fused_decode`)                    with ``fold_adapters``
``cuda-graph``            one decoding step of fixed shapes over a static cache,         plain-attention decoders on
                          captured once as a CUDA graph and replayed per token, over a   CUDA (eager on the CPU,
                          dense copy of the weights with the LoRA folded in (4-bit       where it is tested)
                          bases dequantised) (:mod:`memalpha.lm.sampling.graph_decode`)
``growing-cache``         the model's layers over a cache that grows in place, ended     plain-attention decoders
                          rows leaving the batch (:mod:`memalpha.lm.sampling.growing_cache`)
``hf-generate``           ``transformers``' ``model.generate``                           any causal LM
========================  =============================================================  ==========================

``auto`` takes the first in the order of :func:`candidates` that can run; a named backend
that cannot run is an error naming the setting (``model.lm.sampling_backend``) and the reason.
All four sample the same distribution (temperature, then top-k, then top-p:
:mod:`memalpha.lm.sampling.filters`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from memalpha.lm.core.policy import SAMPLING_BACKENDS
from memalpha.lm.core.prefix_cache import full_attention_layers, split_decoder_and_head
from memalpha.lm.sampling import graph_decode
from memalpha.lm.sampling.fused_decode import FusedDecoder

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class BackendChoice:
    """The backend that samples, and why: ``reason`` says what made ``auto`` pick it (or that
    the setting named it) and what the earlier candidates lacked."""

    name: str
    reason: str


def _device(model) -> torch.device:
    return next(model.parameters()).device


def candidates(model, fold_adapters: bool) -> list[str]:
    """The backends ``auto`` tries for ``model``, best first: on CUDA the captured graph, on the
    CPU the fused step (each only with ``fold_adapters``: both sample from a folded copy of the
    weights), then the two general loops."""
    first = {"cuda": ["cuda-graph"], "cpu": ["cpu-fused"]}.get(_device(model).type, []) if fold_adapters else []
    return [*first, "growing-cache", "hf-generate"]


def why_not(backend: str, model, fold_adapters: bool = True) -> str | None:
    """Why ``backend`` cannot sample for ``model`` (None when it can)."""
    decoder, _, config = split_decoder_and_head(model)
    if backend == "hf-generate":
        return None if hasattr(model, "generate") else "the model has no generate method"
    if backend == "growing-cache":
        if full_attention_layers(config) is None:
            return "the decoder has sliding-window, chunked or other non-plain attention layers"
        return None
    if backend == "cpu-fused":
        if not fold_adapters:
            return "it folds the LoRA into the weights, and lm.fold_adapters_for_sampling is off"
        return FusedDecoder.unsupported(decoder, config)
    if backend == "cuda-graph":
        if not fold_adapters:
            return "it samples from a dense copy of the weights, and lm.fold_adapters_for_sampling is off"
        return graph_decode.supports(model)
    raise ValueError(f"unknown sampling backend {backend!r}; choose one of {list(SAMPLING_BACKENDS)}")


def choose_backend(model, requested: str = "auto", fold_adapters: bool = True) -> BackendChoice:
    """The backend that samples for ``model``: ``requested`` itself (an error naming the setting
    when it cannot run here) or, for ``auto``, the first of :func:`candidates` that can."""
    if requested not in SAMPLING_BACKENDS:
        raise ValueError(f"lm.sampling_backend must be one of {list(SAMPLING_BACKENDS)}, got {requested!r}")
    if requested != "auto":
        reason = why_not(requested, model, fold_adapters)
        if reason is not None:
            raise ValueError(f"lm.sampling_backend={requested!r} cannot sample for this model: {reason}")
        return BackendChoice(requested, "named by lm.sampling_backend")
    passed = []
    for name in candidates(model, fold_adapters):
        reason = why_not(name, model, fold_adapters)
        if reason is None:
            skipped = "; ".join(passed)
            return BackendChoice(name, f"auto on {_device(model).type}" + (f" (not {skipped})" if skipped else ""))
        passed.append(f"{name}: {reason}")
    raise AssertionError("hf-generate takes every model")  # pragma: no cover


_said: set[tuple[int, str, str]] = set()


def announce(model, choice: BackendChoice, who: str = "sampling") -> None:
    """Log ``choice`` once per model, caller and backend (a round samples many batches)."""
    key = (id(model), who, choice.name)
    if key not in _said:
        _said.add(key)
        logger.info("%s backend: %s -- %s", who, choice.name, choice.reason)
