"""One visible choice of decoding loop (memalpha/lm/sampling/backend.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.sampling.backend import (
    BACKENDS,
    SAMPLING_BACKENDS,
    announce,
    candidates,
    choose_backend,
    in_process,
    why_not,
)
from memalpha.lm.sampling.generation import generate, sampler_for

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    torch.manual_seed(0)
    return load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))


def test_auto_on_the_cpu_takes_the_fused_step(policy):
    model, _ = policy
    assert candidates(model) == ["cpu-fused", "hf-generate"]
    choice = choose_backend(model, "auto")
    assert choice.name == "cpu-fused" and choice.reason == "auto on cpu"


def test_auto_says_what_the_better_backends_lacked(policy):
    model, _ = policy
    model.to(torch.bfloat16)
    try:
        choice = choose_backend(model, "auto")
    finally:
        model.to(torch.float32)
    assert choice.name == "hf-generate"
    assert "cpu-fused: the weights are torch.bfloat16" in choice.reason


def test_a_named_backend_that_cannot_run_is_an_error_naming_the_setting(policy):
    model, _ = policy
    model.to(torch.bfloat16)
    try:
        with pytest.raises(ValueError, match=r"rollout.backend='cpu-fused' cannot sample .*torch.bfloat16"):
            choose_backend(model, "cpu-fused")
    finally:
        model.to(torch.float32)
    with pytest.raises(ValueError, match="rollout.backend must be one of"):
        choose_backend(model, "fastest")
    assert choose_backend(model, "hf-generate").reason == "named by rollout.backend"


def test_one_setting_names_the_backend():
    assert RolloutSettings(backend="hf-generate").backend == "hf-generate"
    with pytest.raises(ValueError, match=r"rollout.backend must be one of \['auto'"):
        RolloutSettings(backend="growing-cache")  # retired (docs/results.md, bench_cpu_decoders)
    with pytest.raises(ValueError, match=r"rollout.backend must be one of \['auto'"):
        RolloutSettings(backend="hf")
    assert SAMPLING_BACKENDS[0] == "auto" and "vllm" in BACKENDS and "vllm" not in SAMPLING_BACKENDS
    assert in_process("vllm") == "auto" and in_process("cpu-fused") == "cpu-fused"
    with pytest.raises(ValueError, match="rollout.backend: vllm samples on its server"):
        sampler_for(None, None, "vllm")


def test_a_named_fused_step_that_declines_the_weights_is_an_error_and_auto_chooses_again(
    policy, monkeypatch, caplog
):
    """FusedDecoder.build returning None at run time: named, the run stops naming the setting; under
    auto the next backend samples and the new choice is logged (never a silent swap)."""
    from memalpha.lm.sampling import backend as backends
    from memalpha.lm.sampling import generation

    model, tokenizer = policy
    monkeypatch.setattr(generation.FusedDecoder, "build", staticmethod(lambda *args, **kwargs: None))
    with pytest.raises(ValueError, match=r"rollout.backend='cpu-fused' cannot sample .*declined the weights"):
        sampler_for(model, tokenizer, "cpu-fused")(PROMPTS, max_new_tokens=2, do_sample=False)
    monkeypatch.setattr(backends, "_said", set())
    with caplog.at_level(logging.INFO, logger="memalpha.lm.sampling.backend"):
        out = sampler_for(model, tokenizer, "auto")(PROMPTS, max_new_tokens=2, do_sample=False)
    assert len(out.response_ids) == len(PROMPTS)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("sampling backend: cpu-fused -- auto on cpu"), said
    assert said[1].startswith(
        "sampling backend: hf-generate -- auto on cpu (not cpu-fused: the fused step declined"
    )


def test_sliding_window_decoders_go_to_model_generate(tmp_path, tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load_policy(str(tmp_path), lora=LoraSettings(r=2, alpha=4))
    assert why_not("cpu-fused", model) is not None
    assert choose_backend(model, "auto").name == "hf-generate"
    with pytest.raises(ValueError, match="rollout.backend='cpu-fused' cannot sample"):
        choose_backend(model, "cpu-fused")


def test_every_backend_gives_the_same_greedy_tokens(policy):
    model, tokenizer = policy
    runs = {
        backend: generate(model, tokenizer, PROMPTS, max_new_tokens=6, do_sample=False,
                          backend=backend, eos_token_id=10_000).response_ids
        for backend in ("cpu-fused", "hf-generate")
    }
    assert runs["cpu-fused"] == runs["hf-generate"]


def test_hf_generate_starts_from_the_shared_prefix_computed_once(policy, monkeypatch):
    """``hf-generate`` is given the batch's prompt cache (the shared prefix computed once, repeated
    prompts once) and samples what it samples from scratch."""
    model, tokenizer = policy
    prompts = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 11], [5, 6, 7, 8, 9, 10]]
    given = []
    plain_generate = model.generate

    def spy(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        given.append(None if cache is None else (cache.get_seq_length(), kwargs["input_ids"].shape[1]))
        return plain_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "backend": "hf-generate", "eos_token_id": 10_000}
    shared = generate(model, tokenizer, prompts, **kwargs).response_ids
    alone = generate(model, tokenizer, prompts, share_prefix=False, **kwargs).response_ids
    assert given == [(5, 6), None]  # every prompt column but the last came pre-filled
    assert shared == alone


def test_the_graph_needs_a_cuda_model(policy):
    """Named, ``cuda-graph`` runs captured or not at all: a model on the CPU is refused with the
    setting's name (its eager form is tests/test_graph_decode.py's, called directly)."""
    model, _ = policy
    with pytest.raises(ValueError, match="rollout.backend='cuda-graph' cannot sample.*model is on cpu"):
        choose_backend(model, "cuda-graph")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA may name cuda-graph")
def test_naming_cuda_graph_without_cuda_stops_when_the_setting_is_read():
    with pytest.raises(ValueError, match="rollout.backend=cuda-graph captures CUDA graphs, and this machine"):
        RolloutSettings(backend="cuda-graph")


def test_the_choice_is_logged_once_per_model(policy, caplog):
    model, _ = policy
    choice = choose_backend(model, "hf-generate")
    with caplog.at_level(logging.INFO, logger="memalpha.lm.sampling.backend"):
        announce(model, choice, who="a test")
        announce(model, choice, who="a test")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["a test backend: hf-generate -- named by rollout.backend"]
