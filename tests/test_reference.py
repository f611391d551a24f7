"""The KL reference: the base model, or the frozen adapter a run started from (``update.kl_reference``)."""

from __future__ import annotations

import pytest
import torch
from conftest import randomise_lora_b
from numerics import VALUE_REL, assert_close

from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.lm.core.adapters import export_adapter, load_reference_adapter
from memalpha.lm.core.modes import REFERENCE_ADAPTER, reference_weights
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import response_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha_lab.single_turn import SingleTurnSettings, train_single_turn

LORA = LoraSettings(r=4, alpha=8, dropout=0.0, target_modules="all-linear")
PROMPTS = [[5, 6, 7, 8], [5, 6, 9]]
RESPONSES = [[10, 11, 12], [13, 14]]


def _logps(policy, pad_id):
    out = response_logprobs(
        policy, PROMPTS, RESPONSES, LogprobSpec(temperature=1.0, micro_batch_size=2, pad_id=pad_id),
    )
    return torch.cat(out).double()


@pytest.fixture
def start_adapter(tmp_path, tiny_model_dir):
    """A saved adapter that changes the model (random B), as an SFT export would be."""
    torch.manual_seed(0)
    policy, tokenizer = load_policy(tiny_model_dir, lora=LORA)
    randomise_lora_b(policy, 0.5)
    export_adapter(policy, tokenizer, tmp_path / "start")
    return tmp_path / "start"


def test_the_reference_is_the_starting_adapter_frozen_while_the_policy_moves(tiny_model_dir, start_adapter):
    policy, tokenizer = load_policy(tiny_model_dir, adapter_path=str(start_adapter))
    policy.double()
    pad = tokenizer.pad_token_id
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    start = _logps(policy, pad)
    with policy.disable_adapter():
        base = _logps(policy, pad)
    with reference_weights(policy):  # no reference adapter yet: the base model
        assert_close(_logps(policy, pad), base, VALUE_REL, "base reference")

    load_reference_adapter(policy, start_adapter)
    assert policy.active_adapter == "default"
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trainable
    assert (start - base).abs().max() > 1e-3  # the starting adapter is not the base model
    with torch.no_grad():  # the policy moves away from where it started
        for name, p in policy.named_parameters():
            if p.requires_grad and "lora_B" in name:
                p.add_(0.3)
    moved = _logps(policy, pad)
    assert (moved - start).abs().max() > 1e-3
    with reference_weights(policy):
        assert_close(_logps(policy, pad), start, VALUE_REL, "starting-adapter reference")
    assert_close(_logps(policy, pad), moved, VALUE_REL, "policy after the reference pass")
    assert policy.active_adapter == "default"
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == trainable
    with pytest.raises(ValueError, match="already holds"):
        load_reference_adapter(policy, start_adapter)


def test_an_exported_adapter_leaves_the_reference_out(tiny_model_dir, start_adapter, tmp_path):
    policy, tokenizer = load_policy(tiny_model_dir, adapter_path=str(start_adapter))
    load_reference_adapter(policy, start_adapter)
    out = export_adapter(policy, tokenizer, tmp_path / "exported")
    assert (out / "adapter_config.json").is_file()
    assert not (out / REFERENCE_ADAPTER).exists()


@pytest.mark.parametrize("kl_reference", ["base", "start"])
def test_single_turn_kl_at_the_first_step_is_zero_only_against_the_start(
    tiny_model_dir, start_adapter, kl_reference
):
    settings = SingleTurnSettings(
        steps=1, prompts_per_step=1, group_size=2, max_new_tokens=4, adapter_path=str(start_adapter),
        update=UpdateSettings(kl_coef=0.1, kl_reference=kl_reference, micro_batch_size=2),
        optimizer=OptimizerSettings(learning_rate=1e-3, weight_decay=0.0, warmup_ratio=0.0),
    )
    result = train_single_turn(
        tiny_model_dir, ["Remember: Ada likes tea."], lambda p, c: [0.0, 1.0], settings
    )
    kl = result.history[0]["kl"]
    assert kl == 0.0 if kl_reference == "start" else kl > 1e-4


def test_kl_reference_is_checked():
    with pytest.raises(ValueError, match="kl_reference"):
        UpdateSettings(kl_reference="sft")
