"""Shared-prefix caching: the layout by hand, and equality with the plain padded paths."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import build_tiny_model_dir, randomise_lora_b
from numerics import VALUE_REL, assert_close, assert_same_gradients, relative_difference

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import accumulate_grpo_gradients
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.core.prompt_sharing import (
    SharedPrefix,
    cache_is_kept,
    pad_prompt_response,
    prompt_order,
    shared_prefix_length,
    split_decoder_and_head,
    unique_rows,
)
from memalpha.lm.logprobs.per_token import micro_batch_scorer, response_logprobs, token_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import generate

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]
# Two groups of two identical prompts after a shared "system prompt", plus one shorter prompt.
PROMPTS = [SYSTEM + [20, 21, 22], SYSTEM + [20, 21, 22], SYSTEM + [30], SYSTEM + [30], SYSTEM + [40, 41]]
RESPONSES = [[100, 200, 2], [101], [300, 301, 302, 303], [], [400, 401]]


def test_shared_prefix_length_leaves_the_last_token_of_every_row():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2]]) == 1
    assert shared_prefix_length([[1], [1, 2]]) == 0
    assert shared_prefix_length([[7, 2], [8, 2]]) == 0
    assert shared_prefix_length([[1, 2, 3]]) == 0  # nothing to share with a single row
    assert shared_prefix_length([]) == 0
    assert shared_prefix_length(PROMPTS) == len(SYSTEM)


def test_unique_rows():
    assert unique_rows([[1], [2], [1], [2, 3], [2]]) == ([0, 1, 3], [0, 1, 0, 2, 1])


def test_prompt_order_puts_identical_prompts_together_stably():
    assert prompt_order([[2, 1], [1, 5], [2, 1], [1], [1, 5]]) == [3, 1, 4, 0, 2]


def test_layout_with_a_shared_prefix():
    batch = pad_prompt_response([[1, 2, 3, 4], [1, 2, 5]], [[7], [8, 9]], pad_id=0, shared_prefix=2)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 7, 0], [1, 2, 0, 5, 8, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[1, 0], [1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 0, 2, 3, 4]]
    assert batch.prompt_width == 4


def test_layout_refuses_a_prefix_that_is_not_shared():
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] does not extend the 2-token prefix"):
        pad_prompt_response([[1, 2, 3], [1, 9, 3]], [[], []], pad_id=0, shared_prefix=2)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]"):
        pad_prompt_response([[1, 2, 3], [1, 2]], [[], []], pad_id=0, shared_prefix=2)


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory, tokenizer):
    """Peaked logits, so greedy tokens depend on the context and a wrong cache row shows."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("peaked"), tokenizer, initializer_range=0.3)


# The shared-prefix paths must equal the plain paths up to float rounding: the policy runs in
# float64 and tensors are compared by norm (tests/numerics.py says why and how tight).


@pytest.fixture(scope="module")
def policy(peaked_model_dir):
    torch.manual_seed(0)
    model, tokenizer = load_policy(peaked_model_dir, lora=LoraSettings(r=4, alpha=8))
    model.to(torch.float64)
    randomise_lora_b(model, 0.2)
    return model, tokenizer


@pytest.mark.parametrize("micro_batch_size", [1, 2, 5])
def test_logprobs_with_shared_prefix_equal_the_plain_path(policy, micro_batch_size):
    model, _ = policy
    model.eval()
    with torch.no_grad():
        plain, plain_entropy = token_logprobs(
            model,
            PROMPTS,
            RESPONSES,
            LogprobSpec(micro_batch_size=micro_batch_size, share_prefix=False),
            with_entropy=True,
        )
        shared, shared_entropy = token_logprobs(
            model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=micro_batch_size), with_entropy=True,
        )
        with model.disable_adapter():
            reference = token_logprobs(
                model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=micro_batch_size),
            )
            reference_plain = token_logprobs(
                model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=micro_batch_size, share_prefix=False),
            )
    assert shared.dtype == torch.float64
    assert_close(shared, plain, VALUE_REL, "log-probs")
    assert_close(shared_entropy, plain_entropy, VALUE_REL, "entropy")
    assert_close(reference, reference_plain, VALUE_REL, "reference log-probs")
    assert not torch.allclose(reference, plain, atol=1e-3)  # the adapter matters, so the test can fail


def _adapter_gradients(model, share_prefix: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    weights = torch.linspace(-1.0, 1.0, 4, dtype=torch.float64)
    logps = token_logprobs(
        model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=2, share_prefix=share_prefix),
    )
    (logps * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradients_through_the_shared_prefix_equal_the_plain_path(policy):
    model, _ = policy
    model.train()
    try:
        plain = _adapter_gradients(model, share_prefix=False)
        shared = _adapter_gradients(model, share_prefix=True)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    assert_same_gradients(shared, plain)
    # the prefix's keys carry gradient
    assert any(g.abs().sum() > 0 for n, g in plain.items() if "q_proj" in n)


def test_gradient_checkpointing_takes_the_plain_path(tiny_model_dir):
    torch.manual_seed(0)
    model, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8), gradient_checkpointing=True)
    model.to(torch.float64)
    decoder = split_decoder_and_head(model)[0]
    model.train()
    assert not cache_is_kept(decoder)  # a checkpointed layer would silently drop the cache
    model.eval()
    assert cache_is_kept(decoder)
    model.train()
    randomise_lora_b(model, 0.2)
    # PROMPTS repeats prompts within a micro-batch: sharing them would need a cache too
    checkpointed = _adapter_gradients(model, share_prefix=True)
    plain = _adapter_gradients(model, share_prefix=False)
    assert_same_gradients(checkpointed, plain)
    decoder = split_decoder_and_head(model)[0]
    with torch.no_grad():
        model.eval()
        prefix = SharedPrefix.compute(decoder, SYSTEM)
        model.train()
    with pytest.raises(ValueError, match="drops caches"):
        token_logprobs(model, PROMPTS, RESPONSES, prefix=prefix)


def test_generation_with_shared_prefix_equals_the_plain_batch(policy):
    model, tokenizer = policy
    kwargs = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": 10_000}
    plain = generate(model, tokenizer, PROMPTS, share_prefix=False, **kwargs)
    shared = generate(model, tokenizer, PROMPTS, **kwargs)
    chunked = generate(model, tokenizer, PROMPTS, batch_size=2, **kwargs)
    assert shared.response_ids == plain.response_ids == chunked.response_ids
    assert shared.prompt_ids == [list(p) for p in PROMPTS]
    sampled = generate(model, tokenizer, PROMPTS, max_new_tokens=6, seed=3, eos_token_id=10_000)
    again = generate(model, tokenizer, PROMPTS, max_new_tokens=6, seed=3, eos_token_id=10_000)
    assert sampled.response_ids == again.response_ids
    assert (
        sampled.response_ids[0] != sampled.response_ids[1]
        or sampled.response_ids[2] != sampled.response_ids[3]
    )


def test_a_handed_in_prefix_must_start_every_prompt(policy):
    model, _ = policy
    decoder = split_decoder_and_head(model)[0]
    with torch.no_grad():
        prefix = SharedPrefix.compute(decoder, SYSTEM)
        assert prefix.length == len(SYSTEM) and len(prefix.layers) == 2
        assert prefix.layers[0][0].shape[:3] == (1, 2, len(SYSTEM))  # [batch, kv heads, tokens]
        handed = token_logprobs(model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=2), prefix=prefix)
        own = token_logprobs(model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=2))
        assert_close(handed, own, VALUE_REL, "log-probs")
        with pytest.raises(ValueError, match=r"prompt_ids\[0\] does not extend the 8-token shared prefix"):
            token_logprobs(model, [[99] + SYSTEM], [[1]], prefix=prefix)
        with pytest.raises(ValueError, match=r"prompt_ids\[1\]"):
            # nothing after the prefix
            token_logprobs(model, [SYSTEM + [1], SYSTEM], [[1], [2]], prefix=prefix)


# Rows in no particular order: the update sorts them so that equal prompts share a micro-batch.
UPDATE_ORDER = [4, 0, 2, 1, 3]


def _update_batch(model, order=UPDATE_ORDER):
    prompts = [PROMPTS[i] for i in order]
    responses = [RESPONSES[i] if RESPONSES[i] else [7] for i in order]
    with torch.no_grad(), model.disable_adapter():
        ref = response_logprobs(
            model, prompts, responses, LogprobSpec(temperature=1.0, micro_batch_size=2, pad_id=0),
        )
    return GRPOBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5]),
        old_logps=[r - 0.05 for r in ref],  # off-policy ratios, so clipping and the ratio matter
        ref_logps=ref,
    )


def _update_gradients(model, batch, share: bool, micro_batch_size: int, scale: float = 1.0, grad_scale=None):
    model.zero_grad(set_to_none=True)
    settings = UpdateSettings(kl_coef=0.1, micro_batch_size=micro_batch_size)
    metrics, finite = accumulate_grpo_gradients(
        micro_batch_scorer(model, LogprobSpec(
            temperature=1.0, micro_batch_size=settings.micro_batch_size, pad_id=0, share_prefix=share,
        )),
        batch,
        settings,
        max_response_len=8,
        token_normaliser=float(batch.response_tokens),
        seq_normaliser=5.0,
        backward=lambda loss: (loss * scale).backward(),
        grad_scale=scale if grad_scale is None else grad_scale,
    )
    assert finite
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return metrics, grads


@pytest.mark.parametrize("micro_batch_size", [1, 2, 5])
def test_update_with_one_prefix_per_mini_batch_equals_the_plain_update(policy, micro_batch_size):
    model, _ = policy
    model.train()
    try:
        batch = _update_batch(model)
        plain_metrics, plain = _update_gradients(model, batch, share=False, micro_batch_size=micro_batch_size)
        shared_metrics, shared = _update_gradients(
            model, batch, share=True, micro_batch_size=micro_batch_size
        )
    finally:
        model.eval()
    assert_same_gradients(shared, plain)
    for key in ("loss", "tokens", "kl", "ratio_mean", "entropy"):
        assert shared_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-9, abs=1e-12), key
    # the first layer's key projection is reached only through the prefix's keys and the rows' own tokens
    assert any(g.abs().sum() > 0 for n, g in shared.items() if "layers.0.self_attn.k_proj" in n)


def test_prefix_gradient_is_unscaled_by_the_grad_scale(policy):
    """A backward that multiplies losses (a mixed-precision grad scaler) gives exactly scaled grads."""
    model, _ = policy
    model.train()
    try:
        batch = _update_batch(model)
        _, plain = _update_gradients(model, batch, share=False, micro_batch_size=2)
        _, scaled = _update_gradients(model, batch, share=True, micro_batch_size=2, scale=8.0)
        _, unaware = _update_gradients(
            model, batch, share=True, micro_batch_size=2, scale=8.0, grad_scale=1.0
        )
    finally:
        model.eval()
    assert_same_gradients(scaled, {name: 8.0 * grad for name, grad in plain.items()})
    assert any(relative_difference(unaware[n], 8.0 * g) > 1e-3 for n, g in plain.items())


def test_reference_pass_keeps_the_callers_row_order(policy):
    model, _ = policy
    prompts = [PROMPTS[i] for i in UPDATE_ORDER]
    responses = [RESPONSES[i] for i in UPDATE_ORDER]
    spec = LogprobSpec(temperature=1.0, micro_batch_size=2, pad_id=0)
    shared = response_logprobs(model, prompts, responses, spec)
    plain = response_logprobs(model, prompts, responses, replace(spec, share_prefix=False))
    assert [len(r) for r in shared] == [len(r) for r in responses]
    for a, b in zip(shared, plain):
        assert a.dtype == torch.float64
        assert_close(a, b, VALUE_REL, "reference log-probs")
