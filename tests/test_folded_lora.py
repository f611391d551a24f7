"""Folding LoRA into temporary weights for sampling: the same outputs in float64, the base weights
untouched, the layers' own forwards back afterwards, and nothing folded where it would be wrong."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model_dir, loop_generate, randomise_lora_b

from memalpha.lm.core.modes import folded_adapters

PROMPTS = [[11, 12, 13, 14, 20, 21], [11, 12, 13, 14, 30], [11, 12, 13, 14, 40, 41, 42]]


def lora_layers(model) -> list[torch.nn.Module]:
    from peft.tuners.lora.layer import Linear as LoraLinear

    return [module for module in model.modules() if type(module) is LoraLinear]


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_folded_layers_give_the_adapted_outputs_and_leave_the_base_alone(peaked_policy):
    model, _ = peaked_policy
    ids = torch.tensor([PROMPTS[0]])
    base_before = {name: p.detach().clone() for name, p in model.named_parameters() if "base_layer" in name}
    adapted = logits_of(model, ids)
    with model.disable_adapter():
        plain = logits_of(model, ids)
    assert (adapted - plain).norm() > 1e-2 * plain.norm(), "the adapter should change the outputs"
    with folded_adapters(model) as count:
        assert count == len(lora_layers(model)) > 0
        folded = logits_of(model, ids)
    assert torch.allclose(folded, adapted, rtol=0, atol=1e-10)
    for module in lora_layers(model):
        assert "forward" not in vars(module)  # the class's forward is back
    for name, parameter in model.named_parameters():
        if "base_layer" in name:
            assert torch.equal(parameter, base_before[name]), name
    assert torch.equal(logits_of(model, ids), adapted)


def test_nothing_is_folded_when_disabled_or_with_the_adapter_off(peaked_policy):
    model, _ = peaked_policy
    with folded_adapters(model, enabled=False) as count:
        assert count == 0
    with model.disable_adapter(), folded_adapters(model) as count:
        assert count == 0


def test_an_exception_inside_the_block_restores_the_layers(peaked_policy):
    model, _ = peaked_policy
    with pytest.raises(RuntimeError, match="boom"), folded_adapters(model):
        raise RuntimeError("boom")
    assert all("forward" not in vars(module) for module in lora_layers(model))


def test_folded_sampling_gives_the_same_tokens(peaked_policy):
    """The reference loop over the model as loaded and over folded weights (what cuda-graph samples from)."""
    model, tokenizer = peaked_policy
    kwargs = {"max_new_tokens": 8, "eos_token_id": 10_000}

    def both(**options):
        plain = loop_generate(model, tokenizer, PROMPTS, **options, **kwargs)
        with folded_adapters(model):
            folded = loop_generate(model, tokenizer, PROMPTS, **options, **kwargs)
        return plain.response_ids, folded.response_ids

    plain, folded = both(do_sample=False)
    assert plain == folded
    plain, folded = both(seed=3)
    assert plain == folded
    assert all("forward" not in vars(module) for module in lora_layers(model))


def test_dora_layers_keep_their_own_forward(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model_dir(tmp_path / "dora", tokenizer)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True)
    model = get_peft_model(base, config).eval()
    randomise_lora_b(model, 0.2)
    ids = torch.tensor([PROMPTS[1]])
    expected = logits_of(model, ids)
    with folded_adapters(model) as count:
        assert count == 0
        assert torch.equal(logits_of(model, ids), expected)
