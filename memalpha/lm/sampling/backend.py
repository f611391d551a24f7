"""Which decoding loop samples for a model: one setting, one choice made in one place, said once.

``model.rollout.backend`` names how every token of a run is sampled, the policy's and the local
reader's: ``auto``, one of three in-process backends, or ``vllm`` (the agent's turns from a vLLM
server, :mod:`memalpha.train.engine_sync`; the local reader then samples in-process as ``auto``
chooses). The in-process backends (docs/configuration.md, ``model.rollout.backend``):
``cpu-fused``, memalpha's own decoding step over stacked weights for float Llama-family decoders
on the CPU (:mod:`memalpha.lm.sampling.fused_decode`); ``cuda-graph``, a fixed-shape step over a
static cache captured as a CUDA graph (:mod:`memalpha.lm.sampling.graph_decode`); ``hf-generate``,
``transformers``' ``model.generate`` from the prompts' shared prefix, for any causal LM.

One name is one path. ``cpu-fused`` and ``cuda-graph`` sample from a copy of the weights with the
LoRA update folded in; ``hf-generate`` runs the model as loaded (no copy of its weights: the choice
when that copy does not fit, or when the weights are sharded, as under FSDP), whether named or
chosen by ``auto``. ``auto`` takes the first in the order of :func:`candidates` that can run and
logs why; a named backend that cannot run, at setup or when its step declines the weights at run
time, is an error naming the setting and the reason, while ``auto`` chooses again and logs it.
All three sample the same distribution (temperature, then top-k, then top-p:
:mod:`memalpha.lm.sampling.filters`, or ``model.generate``'s own processors in that order).
A decoder of memalpha's own stays only while a committed benchmark shows it beating
``hf-generate`` by more than 10 % in the product's phases (docs/results.md, bench_cpu_decoders).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from memalpha.lm.core.prompt_sharing import split_decoder_and_head
from memalpha.lm.sampling import graph_decode
from memalpha.lm.sampling.fused_decode import FusedDecoder

logger = logging.getLogger(__name__)

Backend = Literal["auto", "cuda-graph", "cpu-fused", "hf-generate", "vllm"]
BACKENDS: tuple[str, ...] = get_args(Backend)
SAMPLING_BACKENDS: tuple[str, ...] = tuple(name for name in BACKENDS if name != "vllm")
"""The values that sample in this process (``auto`` and the three loops)."""
SETTING = "rollout.backend"
"""The setting every message about the choice names."""


def check_backend(value: str) -> None:
    """Raise ValueError naming :data:`SETTING` when ``value`` is not one of :data:`BACKENDS`."""
    if value not in BACKENDS:
        raise ValueError(f"{SETTING} must be one of {list(BACKENDS)}, got {value!r}")


def check_machine(value: str) -> None:
    """Raise ValueError naming :data:`SETTING` when ``value`` cannot run on this machine whatever
    the model: ``cuda-graph`` without CUDA (said when the setting is read, before any model loads)."""
    if value == "cuda-graph" and not torch.cuda.is_available():
        raise ValueError(f"{SETTING}=cuda-graph captures CUDA graphs, and this machine has no CUDA device")


def in_process(backend: str) -> str:
    """The in-process backend of a setting: ``vllm`` samples the agent's turns on its server, and
    what samples here (the local reader) is chosen as ``auto`` chooses."""
    check_backend(backend)
    return "auto" if backend == "vllm" else backend


@dataclass(frozen=True)
class BackendChoice:
    """The backend that samples, and why: ``reason`` says what made ``auto`` pick it (or that
    the setting named it) and what the earlier candidates lacked."""

    name: str
    reason: str


def _device(model) -> torch.device:
    return next(model.parameters()).device


def candidates(model) -> list[str]:
    """The backends ``auto`` tries for ``model``, best first: on CUDA the captured graph, on the
    CPU the fused step, then ``model.generate``."""
    first = {"cuda": ["cuda-graph"], "cpu": ["cpu-fused"]}.get(_device(model).type, [])
    return [*first, "hf-generate"]


def why_not(backend: str, model) -> str | None:
    """Why ``backend`` cannot sample for ``model`` (None when it can)."""
    decoder, _, config = split_decoder_and_head(model)
    if backend == "hf-generate":
        return None if hasattr(model, "generate") else "the model has no generate method"
    if backend == "cpu-fused":
        return FusedDecoder.unsupported(decoder, config)
    if backend == "cuda-graph":
        if _device(model).type != "cuda":
            return f"it captures CUDA graphs, and the model is on {_device(model).type}"
        return graph_decode.supports(model)
    raise ValueError(f"unknown sampling backend {backend!r}; choose one of {list(SAMPLING_BACKENDS)}")


def choose_backend(model, requested: str = "auto") -> BackendChoice:
    """The backend that samples for ``model``: ``requested`` itself (an error naming the setting
    when it cannot run here) or, for ``auto``, the first of :func:`candidates` that can."""
    if requested not in SAMPLING_BACKENDS:
        raise ValueError(f"{SETTING} must be one of {list(SAMPLING_BACKENDS)} here, got {requested!r}")
    if requested != "auto":
        reason = why_not(requested, model)
        if reason is not None:
            raise ValueError(f"{SETTING}={requested!r} cannot sample for this model: {reason}")
        return BackendChoice(requested, f"named by {SETTING}")
    passed = []
    for name in candidates(model):
        reason = why_not(name, model)
        if reason is None:
            skipped = "; ".join(passed)
            return BackendChoice(
                name, f"auto on {_device(model).type}" + (f" (not {skipped})" if skipped else "")
            )
        passed.append(f"{name}: {reason}")
    raise AssertionError("hf-generate takes every model")  # pragma: no cover


_said: set[tuple[int, str, str]] = set()


def declined(model, choice: BackendChoice, requested: str, reason: str) -> BackendChoice:
    """The backend after ``choice`` declined the model at run time (``reason``): an error naming the
    setting when ``requested`` named it, else (``auto``) the next candidate, ``hf-generate``."""
    if requested != "auto":
        raise ValueError(f"{SETTING}={requested!r} cannot sample for this model: {reason}")
    return BackendChoice("hf-generate", f"auto on {_device(model).type} (not {choice.name}: {reason})")


def announce(model, choice: BackendChoice, who: str = "sampling") -> None:
    """Log ``choice`` once per model, caller and backend (a round samples many batches)."""
    key = (id(model), who, choice.name)
    if key not in _said:
        _said.add(key)
        logger.info("%s backend: %s -- %s", who, choice.name, choice.reason)


def announce_backends(model, backend: str, *, reader_samples_here: bool) -> dict[str, str]:
    """Choose and log, once at setup, how the policy (unless ``vllm`` samples it on its server)
    and the local reader (``reader_samples_here``; adapters off, as ``auto`` chooses under
    ``vllm``) sample; a named backend that cannot run for the model stops the run here. Returns
    the backend of each (``sampling``, and ``reader`` when it samples here), for the run's records."""
    check_backend(backend)
    if backend == "vllm":
        logger.info("sampling backend: vllm -- named by %s", SETTING)
        chosen = {"sampling": "vllm"}
    else:
        choice = choose_backend(model, backend)
        announce(model, choice, "sampling")
        chosen = {"sampling": choice.name}
    if reader_samples_here:
        choice = choose_backend(model, in_process(backend))
        announce(model, choice, "reader")
        chosen["reader"] = choice.name
    return chosen
