"""QLoRA gradients on the CPU: sampling and scoring without grad must leave them right.

bitsandbytes repacks a 4-bit layer for its CPU inference kernel (no backward) the first time the
layer runs in eval mode without grad, on CPUs with AVX-512 BF16 (``memalpha/lm/core/nf4_cpu_packing.py``).
A GRPO step samples before it trains, so the gradients after a ``generate`` are the ones that
matter. On a CPU without that flag nothing is packed and these tests check the same equalities.

The NF4 layers compute in float32 whatever the model's dtype (bitsandbytes has no float64
compute dtype), so the NF4 gradients are compared by relative norm at float32 tolerances; the
dequantised twin runs in float64. ``MEMALPHA_TEST_DEVICE=cuda`` runs them on a GPU
(experiments/gpu/gpu_check.sh), where nothing is packed but the equalities must hold all the same.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TEST_DEVICE, build_tiny_model_dir, randomise_lora_b
from numerics import assert_same_gradients

from memalpha.lm.core.nf4_cpu_packing import keep_nf4_layers_unpacked
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import token_logprobs
from memalpha.lm.sampling.generation import generate

bnb = pytest.importorskip("bitsandbytes")

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13]]
RESPONSES = [[100, 200, 300], [400, 500]]
LORA = LoraSettings(r=4, alpha=8)
SAME_COMPUTATION_REL = 1e-6
"""Two float32 runs of the same NF4 computation: equal up to summation order."""
FLOAT32_VS_FLOAT64_REL = 1e-4
"""float32 NF4 gradients against the float64 dequantised twin: float32 rounding through two blocks."""


@pytest.fixture(scope="module")
def nf4_model_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama of hidden size 64: bitsandbytes' CPU packing needs each layer's input
    to span at least one 64-weight quantisation block (at hidden size 32 it fails outright)."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("nf4-model"), tokenizer, hidden=64)


def _nf4_policy(folder):
    torch.manual_seed(0)
    model, tokenizer = load_policy(
        folder, precision="nf4", compute_dtype="float32", lora=LORA, device=TEST_DEVICE
    )
    randomise_lora_b(model, 0.2)  # a fresh B is zero, which would hide every A gradient
    return model, tokenizer


def _lora_gradients(model) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (-token_logprobs(model, PROMPTS, RESPONSES).sum()).backward()
    return {name: p.grad.detach().double() for name, p in model.named_parameters() if p.requires_grad}


def _dequantised_twin(folder, nf4_model):
    """The same policy in float64 with every NF4 weight dequantised into a plain ``nn.Linear``
    and the NF4 policy's LoRA weights."""
    twin, _ = load_policy(folder, lora=LORA, device=TEST_DEVICE)
    nf4_parameters = dict(nf4_model.named_parameters())
    with torch.no_grad():
        for name, layer in nf4_model.named_modules():
            if isinstance(layer, bnb.nn.Linear4bit):
                weight = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
                twin.get_submodule(name).weight.copy_(weight)
        for name, parameter in twin.named_parameters():
            if "lora_" in name:
                parameter.copy_(nf4_parameters[name])
    return twin.to(torch.float64)


def test_nf4_lora_gradients_survive_sampling_and_scoring(nf4_model_dir):
    model, tokenizer = _nf4_policy(nf4_model_dir)
    twin = _dequantised_twin(nf4_model_dir, model)  # before anything runs: a packed weight reads differently
    expected = _lora_gradients(twin)
    before = _lora_gradients(model)
    assert_same_gradients(before, expected, FLOAT32_VS_FLOAT64_REL)

    generate(model, tokenizer, PROMPTS, max_new_tokens=3, seed=1)  # eval mode, no grad: a rollout
    model.eval()
    with torch.no_grad(), model.disable_adapter():  # the reader's and validation's passes
        token_logprobs(model, PROMPTS, RESPONSES)
    model.train()

    after = _lora_gradients(model)
    assert_same_gradients(after, before, SAME_COMPUTATION_REL)
    assert_same_gradients(after, expected, FLOAT32_VS_FLOAT64_REL)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    packed = [m for m in layers if getattr(m.weight.quant_state, "packing_format_for_cpu", False)]
    assert len(layers) == 14 and not packed, (
        f"{len(packed)} of {len(layers)} NF4 layers packed for CPU inference"
    )


def test_a_layer_already_packed_is_refused(nf4_model_dir):
    model, _ = _nf4_policy(nf4_model_dir)
    layer = next(m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    layer.weight.quant_state.packing_format_for_cpu = True  # what the packing marks
    with pytest.raises(RuntimeError, match="already packed"):
        keep_nf4_layers_unpacked(model)
