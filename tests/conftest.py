"""Shared fixtures: the embedded model (materialised once per machine) and tiny random models."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch


@pytest.fixture(scope="session")
def embedded_model_dir():
    """The embedded SmolLM2-135M-Instruct as a plain HF folder (default memalpha cache)."""
    from memalpha.lm.core.embedded import materialise_embedded_model

    return materialise_embedded_model()


TEST_DEVICE = os.environ.get("MEMALPHA_TEST_DEVICE", "cpu")
"""Where the tests that honour it put their models (experiments/gpu/gpu_check.sh runs them on cuda)."""


@pytest.fixture(scope="session")
def tokenizer(request):
    """The embedded model's tokenizer (vocab 49152, ChatML template), left padding; or the
    tokenizer folder ``MEMALPHA_TEST_TOKENIZER`` names (a GPU machine without the embedded model)."""
    from memalpha.lm.core.embedded import load_tokenizer

    folder = os.environ.get("MEMALPHA_TEST_TOKENIZER") or str(request.getfixturevalue("embedded_model_dir"))
    return load_tokenizer(folder)


def build_tiny_model_dir(
    path, tokenizer, *, hidden: int = 32, layers: int = 2, seed: int = 0, initializer_range: float = 0.02
) -> str:
    """A random Llama with the embedded tokenizer, small enough for fast CPU tests
    (:func:`memalpha_lab.common.tiny_model_folder`, which the experiments share)."""
    from memalpha_lab.common import tiny_model_folder

    return tiny_model_folder(
        path,
        tokenizer=tokenizer,
        hidden=hidden,
        layers=layers,
        seed=seed,
        initializer_range=initializer_range,
    )


def randomise_lora_b(model, std: float) -> None:
    """Draw every LoRA B matrix from N(0, std), so the adapter changes the model (fresh B is zero)."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, std)


@pytest.fixture(scope="module")
def peaked_policy(tmp_path_factory, tokenizer):
    """A float64 LoRA policy with peaked logits, so greedy tokens depend on the context, and a drawn
    adapter (B not zero), so the adapter changes them."""
    import torch

    from memalpha.lm.core.policy import LoraSettings, load_policy

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("peaked-policy"), tokenizer, initializer_range=0.3)
    torch.manual_seed(0)
    model, tokenizer = load_policy(folder, lora=LoraSettings(r=4, alpha=8))
    model.to(torch.float64)
    randomise_lora_b(model, 0.2)
    return model, tokenizer


def model_generate_path(model, tokenizer, prompts, **kwargs):
    """memalpha's ``generate`` through ``model.generate``: neither its own loop nor its fused step."""
    from memalpha.lm.sampling import generation

    return generation.generate(
        model, tokenizer, prompts, backend="hf-generate", **kwargs
    )


def early_end_token(
    model, tokenizer, prompts, *, others_from: int, all_others: bool, never: int = 10_000
) -> int:
    """A token that row 0 emits greedily among its first six tokens (not before that step) and the
    rows from ``others_from`` on emit later or never (all of them with ``all_others``, at least one
    otherwise): as the end token, it makes rows end at different steps."""
    from memalpha.lm.sampling.generation import generate

    free = generate(
        model, tokenizer, prompts, max_new_tokens=10, do_sample=False, eos_token_id=never
    ).response_ids
    test = all if all_others else any
    for step in range(1, 6):
        token = free[0][step]
        if token in free[0][:step]:
            continue
        ends = [row.index(token) if token in row else None for row in free]
        if test(end is None or end > step for end in ends[others_from:]):
            return token
    pytest.fail("the random model's greedy rows do not end apart: pick another prompt set")


SAMPLING_PROMPT = [1, 3, 4, 6]
SAMPLING_ROWS = 6_000
SAMPLING_FILTERS = {"temperature": 0.8, "top_k": 6}


def assert_follows_the_models_distribution(model, tokens) -> None:
    """``tokens`` ``[SAMPLING_ROWS, 2]``: two tokens sampled with ``SAMPLING_FILTERS`` after
    ``SAMPLING_PROMPT`` by the small-vocabulary model. The first token's share and the second
    token's share after the most common first token must match the model's filtered softmax
    within five standard errors, and tokens the filters drop must never appear."""
    import torch

    from memalpha.lm.sampling.filters import filter_logits

    temperature, top_k = SAMPLING_FILTERS["temperature"], SAMPLING_FILTERS["top_k"]
    rows = tokens.shape[0]
    with torch.no_grad():
        first = model(torch.tensor([SAMPLING_PROMPT])).logits[0, -1]
        expected_first = filter_logits(first[None], temperature, top_k).softmax(-1)[0]
        seen_first = torch.bincount(tokens[:, 0], minlength=SMALL_VOCAB).double() / rows
        common = int(seen_first.argmax())
        second = model(torch.tensor([SAMPLING_PROMPT + [common]])).logits[0, -1]
        expected_second = filter_logits(second[None], temperature, top_k).softmax(-1)[0]
    after = tokens[tokens[:, 0] == common, 1]
    seen_second = torch.bincount(after, minlength=SMALL_VOCAB).double() / after.numel()
    assert (seen_first[expected_first == 0] == 0).all() and (seen_second[expected_second == 0] == 0).all()
    # standard errors <= 0.0065 (first) and <= 0.5 / sqrt(len(after)) (second); allow 5 of them
    assert (seen_first - expected_first).abs().max() < 0.033
    assert (seen_second - expected_second).abs().max() < 2.5 / after.numel() ** 0.5


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """Folder of a tiny random causal LM sharing the embedded tokenizer."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), tokenizer)


@pytest.fixture(scope="session")
def tiny_fit_run(tmp_path_factory, tiny_model_dir) -> dict:
    """A one-step ``memalpha fit`` of the tiny model (tests/test_training.py's config: LoRA r 8,
    ``rollout.call_format`` hermes, ``rollout.max_new_tokens`` 12, ``reader.max_new_tokens`` 6): its
    folder (``root``), config file (``config``) and last checkpoint (``ckpt``)."""
    import yaml
    from test_training import write_config

    from memalpha.cli import main

    root = tmp_path_factory.mktemp("tiny-fit")
    config = write_config(root, tiny_model_dir, max_steps=1, instances_per_step=1)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"].update(enable_progress_bar=False, limit_val_batches=0)
    config.write_text(yaml.safe_dump(settings))
    main(["fit", "--config", str(config)])
    return {"root": root, "config": config, "ckpt": root / "run" / "checkpoints" / "last.ckpt"}


SMALL_VOCAB, SMALL_VOCAB_CHOSEN = 8, 5  # the sign tests reward sampling token 5 of 8


@pytest.fixture(scope="session")
def small_vocab_model_dir(tmp_path_factory, tokenizer):
    """A random 2-layer Llama with an 8-token vocabulary, so the chosen token is sampled from the start."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=SMALL_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=0,
        initializer_range=0.2,  # wide enough logits that one token can approach probability 1
    )
    path = tmp_path_factory.mktemp("vocab8")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)  # only its eos/pad ids (2, 0) are used; prompts are raw ids < 8
    return str(path)


def loop_generate(model, tokenizer, prompts, *, max_new_tokens, eos_token_id, seed=None, do_sample=True,
                  temperature=1.0, top_k=0, top_p=1.0):
    """The reference loop's responses (:mod:`memalpha_lab.growing_cache`, the model as loaded, the
    plain left-padded batch): its draws are ``next_tokens``' one per live row per step, as the
    fused and the graph steps draw them, so seeded samples compare token for token."""
    from types import SimpleNamespace

    from memalpha.lm.core.modes import eval_mode
    from memalpha.lm.core.prompt_sharing import pad_prompt_response, split_decoder_and_head
    from memalpha.lm.sampling.filters import next_tokens
    from memalpha_lab.growing_cache import decode, growing_cache

    decoder, head, config = split_decoder_and_head(model)
    batch = pad_prompt_response(prompts, [[] for _ in prompts], tokenizer.pad_token_id)
    with eval_mode(model), torch.no_grad(), torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        room = growing_cache(decoder, batch.input_ids.shape[1] + max_new_tokens)
        tokens, cut = decode(
            decoder, head, config, batch, room, max_new_tokens=max_new_tokens, eos_ids=[eos_token_id],
            pick=lambda logits: next_tokens(logits, do_sample=do_sample, temperature=temperature,
                                            top_k=top_k, top_p=top_p),
        )  # fmt: skip
    return SimpleNamespace(response_ids=tokens, truncated=cut)


def script_module(path: Path):
    """A script of ``experiments/`` imported as a module under its file's name, so a test calls its
    functions (a script is not a package module)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
