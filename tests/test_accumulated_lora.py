"""LoRA products added into the base outputs in place: PEFT's outputs and gradients in float64,
the layers' own forwards back afterwards, and PEFT's forward wherever the in-place one would differ."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model_dir, randomise_lora_b
from numerics import VALUE_REL, assert_close, assert_same_gradients

from memalpha.lm.core.modes import accumulated_adapters, folded_adapters
from memalpha.lm.core.policy import LoraSettings, load_policy

IDS = torch.tensor([[11, 12, 13, 14, 20, 21], [11, 12, 13, 30, 31, 32]])


def lora_layers(model) -> list[torch.nn.Module]:
    from peft.tuners.lora.layer import Linear as LoraLinear

    return [module for module in model.modules() if type(module) is LoraLinear]


def outputs_and_gradients(model, seed: int = 0):
    torch.manual_seed(seed)  # the same dropout masks on both paths
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=IDS).logits
    (logits * torch.linspace(-1.0, 1.0, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


@pytest.fixture(scope="module")
def dropout_policy(tmp_path_factory, tokenizer):
    """A float64 LoRA policy with dropout on the adapters' input, in training mode."""
    folder = build_tiny_model_dir(tmp_path_factory.mktemp("dropout-policy"), tokenizer, initializer_range=0.3)
    torch.manual_seed(0)
    model, _ = load_policy(folder, lora=LoraSettings(r=4, alpha=8, dropout=0.3))
    model.to(torch.float64)
    randomise_lora_b(model, 0.2)
    model.train()
    return model


@pytest.mark.parametrize("policy_name", ["peaked_policy", "dropout_policy"])
def test_outputs_and_gradients_equal_peft(request, policy_name):
    model = request.getfixturevalue(policy_name)
    model = model[0] if isinstance(model, tuple) else model
    base_before = {name: p.detach().clone() for name, p in model.named_parameters() if "base_layer" in name}
    expected_logits, expected_grads = outputs_and_gradients(model)
    with accumulated_adapters(model) as count:
        assert count == len(lora_layers(model)) > 0
        logits, grads = outputs_and_gradients(model)
    assert_close(logits, expected_logits, VALUE_REL, "logits")
    assert_same_gradients(grads, expected_grads)
    assert any("lora_A" in name and g.norm() > 0 for name, g in grads.items())
    assert all("forward" not in vars(module) for module in lora_layers(model))  # the class's forward is back
    for name, parameter in model.named_parameters():
        if "base_layer" in name:
            assert torch.equal(parameter, base_before[name]), name


def test_nothing_is_switched_with_the_adapter_off_folded_or_checkpointed(peaked_policy):
    model, _ = peaked_policy
    with model.disable_adapter(), accumulated_adapters(model) as count:
        assert count == 0
    with folded_adapters(model), accumulated_adapters(model) as count:
        assert count == 0  # the folded forwards stay
    model.gradient_checkpointing_enable()
    try:
        with accumulated_adapters(model) as count:
            assert count == 0
    finally:
        model.gradient_checkpointing_disable()


def test_adapters_in_another_dtype_run_peft_forward(peaked_policy):
    model, _ = peaked_policy
    layer = lora_layers(model)[0]
    x = torch.randn(3, layer.in_features, dtype=torch.float32)
    try:
        layer.to(torch.float32)
        for module in (layer.lora_A, layer.lora_B):
            module.to(torch.float64)
        expected = layer(x)
        with accumulated_adapters(model):
            assert "forward" in vars(layer)
            got = layer(x)
    finally:
        layer.to(torch.float64)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


def test_an_exception_inside_the_block_restores_the_layers(peaked_policy):
    model, _ = peaked_policy
    with pytest.raises(RuntimeError, match="boom"), accumulated_adapters(model):
        raise RuntimeError("boom")
    assert all("forward" not in vars(module) for module in lora_layers(model))
