"""memalpha's attention (memalpha/lm/core/attention.py): SDPA's values, never a full score tensor.

The GPU run of configs/qlora_4090.yaml ran out of memory on one [8, 32, 6144, 6144] float32
score tensor: every fused SDPA kernel refused its inputs (float32 grouped-query attention) and
SDPA fell back to the math kernel. On the CPU the flash kernel takes every input, so these tests
recreate that device by allowing SDPA the math kernel only (``sdpa_kernel(MATH)``) and record
the shape of every tensor an operator returns (a ``TorchDispatchMode``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from memalpha.lm.core.attention import (
    IMPLEMENTATION,
    blocked_attention,
    bounded_attention,
    causal_block_mask,
    query_block_rows,
    repeat_heads,
    use_bounded_attention,
)


class ScoreShapes(TorchDispatchMode):
    """Records every tensor an operator returns that is shaped like attention scores, ``[B, H,
    T, S]`` with more than one head and more than ``side`` queries and keys, and holds more than
    ``elements`` values (a ``[B, 1, T, S]`` padding mask has one head and passes; keys and values
    ``[B, H, S, D]`` have a narrow last dim)."""

    def __init__(self, elements: int, side: int = 16):
        super().__init__()
        self.elements, self.side = elements, side
        self.seen: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
                _, heads, queries, keys = tensor.shape
                if heads > 1 and min(queries, keys) > self.side and tensor.numel() > self.elements:
                    self.seen.append((str(func), tuple(tensor.shape)))
        return out


def _inputs(rows=2, heads=4, kv_heads=2, queries=12, keys=12, width=8, dtype=torch.float64, grad=False):
    generator = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_(grad)
    return (
        make(rows, heads, queries, width),
        make(rows, kv_heads, keys, width),
        make(rows, kv_heads, keys, width),
    )


def _reference(query, key, value, mask=None, is_causal=False):
    groups = query.shape[1] // key.shape[1]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            query, repeat_heads(key, groups), repeat_heads(value, groups), attn_mask=mask, is_causal=is_causal
        )


def test_query_block_rows_fits_the_budget():
    assert query_block_rows(rows=8, heads=32, keys=6144, budget=256 * 2**20) == 42  # 8*32*6144*4 B per query
    assert query_block_rows(rows=1, heads=1, keys=10, budget=1) == 1
    assert query_block_rows(rows=2, heads=2, keys=4, budget=2 * 2 * 4 * 4 * 3) == 3


def test_causal_block_mask_is_top_left_aligned():
    expected = torch.tensor([[True, True, True, False, False], [True, True, True, True, False]])
    assert torch.equal(causal_block_mask(2, 4, 5, torch.device("cpu")), expected)


def test_repeat_heads_gives_each_query_head_its_group():
    states = torch.arange(2 * 3).reshape(1, 2, 3, 1).float()
    repeated = repeat_heads(states, 2)
    assert repeated.shape == (1, 4, 3, 1)
    assert torch.equal(repeated[0, 1], states[0, 0]) and torch.equal(repeated[0, 2], states[0, 1])


@pytest.mark.parametrize("case", ["causal", "bool-mask", "float-mask", "decode"])
@pytest.mark.parametrize("backends", [[SDPBackend.MATH], None], ids=["math-only", "any-kernel"])
def test_values_and_gradients_equal_sdpa_in_float64(case, backends):
    keys = 12
    queries = 1 if case == "decode" else keys
    query, key, value = _inputs(queries=queries, keys=keys, grad=True)
    mask, causal = None, case == "causal"
    if case == "bool-mask":
        mask = torch.ones(2, 1, queries, keys, dtype=torch.bool).tril()
        mask[0, :, :, :3] = False  # row 0 left-padded by 3
        mask[0, :, :3, 0] = True   # its padding queries see one column, as transformers' masks do
    elif case == "float-mask":
        mask = torch.randn(2, 1, queries, keys, dtype=torch.float64)
    elif case == "decode":
        mask = torch.rand(2, 1, 1, keys) > 0.3
        mask[..., 0] = True
    expected = _reference(query, key, value, mask, causal)
    expected_grads = torch.autograd.grad(expected.square().sum(), (query, key, value))
    context = sdpa_kernel(backends) if backends else torch.enable_grad()
    with context:  # a budget of three query rows' scores: blocks of 3 when only math runs
        got = bounded_attention(query, key, value, mask, is_causal=causal, score_budget=2 * 4 * keys * 4 * 3)
        grads = torch.autograd.grad(got.square().sum(), (query, key, value))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for grad, want in zip(grads, expected_grads):
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


def test_math_only_attention_runs_in_query_blocks():
    query, key, value = _inputs(queries=64, keys=64, dtype=torch.float32)
    budget = 2 * 4 * 64 * 4 * 16  # 16 query rows
    with sdpa_kernel(SDPBackend.MATH), ScoreShapes(elements=budget // 4) as shapes:
        bounded_attention(query, key, value, is_causal=True, score_budget=budget)
    assert shapes.seen == []
    with sdpa_kernel(SDPBackend.MATH), ScoreShapes(elements=budget // 4) as shapes:
        F.scaled_dot_product_attention(query, repeat_heads(key, 2), repeat_heads(value, 2), is_causal=True)
    assert shapes.seen, "the detector must see plain math SDPA's scores"


def test_a_decoding_step_repeats_no_key_or_value():
    """One query per head: the query heads of a group become that key/value head's queries, so the
    cache is read as it is (no ``[B, H, S, D]`` copy), with the values of grouped SDPA."""
    query, key, value = _inputs(queries=1, keys=40, kv_heads=2)
    mask = torch.rand(2, 1, 1, 40) > 0.3
    mask[..., 0] = True
    expected = _reference(query, key, value, mask)
    copies = []

    class Repeats(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dim() == 4 and tuple(out.shape[1:3]) == (4, 40):
                copies.append(str(func))
            return out

    for backends in ([SDPBackend.MATH], None):
        with sdpa_kernel(backends) if backends else torch.enable_grad(), Repeats():
            got = bounded_attention(query, key, value, mask)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert copies == []


def test_blocked_attention_checkpoints_each_block_under_autograd():
    query, key, value = _inputs(queries=32, keys=32, kv_heads=4, dtype=torch.float32, grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = blocked_attention(query, key, value, None, True, None, block=8)
    out.sum().backward()
    assert not any(len(shape) == 4 and shape[-2] == 8 and shape[-1] == 32 for shape in saved), saved


SCORE_BUDGET = 4 * 16 * 60 * 4  # bytes: 16 query rows over 60 keys of one row, in the model tests


@pytest.fixture(scope="module")
def gqa_policy(tmp_path_factory, tokenizer):
    """The tiny GQA Llama (4 query heads over 2 key/value heads) with a drawn LoRA adapter, on
    memalpha's attention."""
    from conftest import build_tiny_model_dir, randomise_lora_b

    from memalpha.lm.core.policy import LoraSettings, load_policy

    folder = build_tiny_model_dir(tmp_path_factory.mktemp("gqa"), tokenizer)
    torch.manual_seed(0)
    model, tokenizer = load_policy(folder, lora=LoraSettings(r=4, alpha=8))
    randomise_lora_b(model, 0.05)
    return model, tokenizer


def _prompts(tokenizer, lengths=(90, 61, 75)):
    words = [
        "memory", "agent", "reads", "each", "chunk", "and", "stores", "the", "facts", "it", "needs", "later",
        "for", "the", "questions",
    ]
    return [
        tokenizer((" ".join(words) + " ") * 8, add_special_tokens=False)["input_ids"][:length]
        for length in lengths
    ]


def test_loaded_policy_runs_memalphas_attention(gqa_policy):
    model, _ = gqa_policy
    assert model.get_base_model().config._attn_implementation == IMPLEMENTATION


@pytest.mark.parametrize("share_prefix", [False, True], ids=["rows-alone", "shared-prefix"])
def test_no_pass_builds_a_full_score_tensor_when_only_math_runs(gqa_policy, share_prefix):
    """Prefill and decoding (the policy sampling, the reader with the adapter off), the policy's
    log-probs with their backward and the reference's, at prompts of different lengths (61-96
    tokens), each row alone or through the prefix caches and packed responses: no score tensor
    over SCORE_BUDGET bytes, where a full one takes 3 * 4 * 96 * 96 * 4."""
    from memalpha.lm.logprobs.per_token import token_scores
    from memalpha.lm.logprobs.spec import LogprobSpec
    from memalpha.lm.sampling.generation import generate
    from memalpha.reader.local import base_weights

    model, tokenizer = gqa_policy
    prompts = _prompts(tokenizer)
    assert use_bounded_attention(model, score_budget=SCORE_BUDGET)
    try:
        with sdpa_kernel(SDPBackend.MATH), ScoreShapes(elements=SCORE_BUDGET // 4) as shapes:
            sampled = generate(model, tokenizer, prompts, max_new_tokens=6, seed=0, share_prefix=share_prefix)
            with base_weights(model):  # the reader: the base, adapters off
                generate(
                    model, tokenizer, prompts, max_new_tokens=4, do_sample=False, share_prefix=share_prefix
                )
            with torch.no_grad(), model.disable_adapter():  # the reference
                token_scores(
                    model,
                    prompts,
                    sampled.response_ids,
                    LogprobSpec(micro_batch_size=3, share_prefix=share_prefix),
                )
            model.train()
            scores = token_scores(
                model,
                prompts,
                sampled.response_ids,
                LogprobSpec(micro_batch_size=3, share_prefix=share_prefix),
            )
            scores.logprobs.sum().backward()
    finally:
        use_bounded_attention(model)
        model.zero_grad(set_to_none=True)
    assert shapes.seen == [], shapes.seen[:3]


def test_detector_sees_the_score_tensor_of_plain_sdpa(gqa_policy):
    """The same prefill through transformers' own ``sdpa`` builds the full scores: the test above
    would fail if the model ran it."""
    from memalpha.lm.sampling.generation import generate

    model, tokenizer = gqa_policy
    base = model.get_base_model()
    base.set_attn_implementation("sdpa")
    try:
        with sdpa_kernel(SDPBackend.MATH), ScoreShapes(elements=SCORE_BUDGET // 4) as shapes:
            generate(
                model, tokenizer, _prompts(tokenizer), max_new_tokens=2, do_sample=False, share_prefix=False
            )
    finally:
        use_bounded_attention(model)
    assert shapes.seen


def test_bounded_attention_keeps_the_models_outputs(gqa_policy):
    """Logits through memalpha's attention equal transformers' sdpa's (float64, padded rows)."""
    from memalpha.lm.core.prompt_sharing import pad_prompt_response

    model, tokenizer = gqa_policy
    base = model.get_base_model()
    prompts = _prompts(tokenizer)
    batch = pad_prompt_response(prompts, [[] for _ in prompts], tokenizer.pad_token_id, "cpu")
    model.to(torch.float64)
    try:
        with torch.no_grad():
            ours = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            base.set_attn_implementation("sdpa")
            theirs = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    finally:
        use_bounded_attention(model)
        model.to(torch.float32)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-10, atol=1e-10)
