"""The fused decoding step: its pieces by hand, and its tokens against ``model.generate`` (float64
greedy) and against the unfolded path (seeded samples), for Llama with LoRA, Qwen2 and Qwen3."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model_dir, early_end_token, loop_generate, model_generate_path

from memalpha.lm.core.modes import folded_adapters
from memalpha.lm.core.prompt_sharing import additive_mask, split_decoder_and_head
from memalpha.lm.sampling.fused_decode import (
    FusedDecoder,
    PromptGroups,
    combine,
    cpu_flash_attention,
    rotate,
)
from memalpha.lm.sampling.generation import generate

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]
# two groups of two, a single prompt, and a prompt shorter than the rest (left padding)
PROMPTS = [
    SYSTEM + [20, 21, 22],
    SYSTEM + [20, 21, 22],
    SYSTEM + [30],
    SYSTEM + [30],
    SYSTEM + [40, 41],
    [19, 23],
]
NEVER = 10_000  # an end token no row emits


def test_combine_equals_one_softmax_over_both_parts():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 8, dtype=torch.float64, generator=generator)
    keys = torch.randn(3, 4, 10, 8, dtype=torch.float64, generator=generator)
    values = torch.randn(3, 4, 10, 8, dtype=torch.float64, generator=generator)
    valid = torch.ones(3, 10, dtype=torch.bool)
    valid[0, :3] = False
    valid[2, :6] = False  # row 2 sees nothing in the first part
    scores = torch.einsum("bhd,bhkd->bhk", q, keys).masked_fill(~valid[:, None], float("-inf"))
    expected = torch.einsum("bhk,bhkd->bhd", scores.softmax(-1), values)

    def part(columns: slice):
        """The kernel's (output, log-sum-exp) for one part, each row of ``q`` a query of its own."""
        mask = additive_mask(~valid[:, None, None, columns], q.dtype)
        out, lse = cpu_flash_attention(q[:, :, None], keys[:, :, columns], values[:, :, columns], 0.0, False,
                              attn_mask=mask, scale=1.0)
        return out[:, :, 0], lse[:, :, 0]

    got = combine(part(slice(6, 10)), part(slice(0, 6)))
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_rotate_equals_the_llama_rotary_embedding():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 8, dtype=torch.float64, generator=generator)
    cos = torch.randn(2, 8, dtype=torch.float64, generator=generator)
    sin = torch.randn(2, 8, dtype=torch.float64, generator=generator)
    expected, _ = apply_rotary_pos_emb(q[:, :, None], q[:, :, None], cos[:, None], sin[:, None])
    signed_sin = torch.cat((-sin[:, :4], sin[:, 4:]), dim=-1)
    assert torch.allclose(rotate(q, cos, signed_sin), expected[:, :, 0], rtol=0, atol=1e-14)


def test_prompt_groups_index_the_rows_of_each_prompt():
    groups = PromptGroups([0, 0, 1, 0, 2])
    assert groups.width == 3
    assert groups.gather.tolist() == [[0, 1, 3], [2, 0, 0], [4, 0, 0]]
    assert groups.slot_of_row.tolist() == [0, 1, 3, 2, 6]
    groups.update([1, 0])
    assert groups.gather.tolist() == [[1], [0]] and groups.slot_of_row.tolist() == [1, 0]


@pytest.mark.parametrize("share_prefix", [True, False])
def test_greedy_tokens_equal_model_generate_while_groups_end_apart(peaked_policy, monkeypatch, share_prefix):
    model, tokenizer = peaked_policy
    model.eval()
    assert FusedDecoder.build(*split_decoder_and_head(model)) is not None
    end = early_end_token(model, tokenizer, PROMPTS, others_from=2, all_others=True)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": end, "share_prefix": share_prefix}
    ours = generate(model, tokenizer, PROMPTS, backend="cpu-fused", **kwargs)
    theirs = model_generate_path(model, tokenizer, PROMPTS, **kwargs)
    assert ours.response_ids == theirs.response_ids
    assert ours.truncated == theirs.truncated
    assert ours.response_ids[0][-1] == end and len(ours.response_ids[0]) < max(ours.response_lengths)


def test_seeded_samples_equal_the_unfolded_paths(peaked_policy, monkeypatch):
    model, tokenizer = peaked_policy
    kwargs = {
        "max_new_tokens": 12,
        "eos_token_id": NEVER,
        "seed": 5,
        "temperature": 1.3,
        "top_k": 40,
        "top_p": 0.95,
    }
    fused = generate(model, tokenizer, PROMPTS, backend="cpu-fused", **kwargs)
    own_loop = loop_generate(model, tokenizer, PROMPTS, **kwargs)
    with folded_adapters(model):  # the loop over single linear layers of folded weights, as cuda-graph runs
        folded_layers = loop_generate(model, tokenizer, PROMPTS, **kwargs)
    assert fused.response_ids == own_loop.response_ids == folded_layers.response_ids


def tiny_qwen(kind: str, path, tokenizer) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        initializer_range=0.3, tie_word_embeddings=True, use_sliding_window=False,
    )
    model = model_class(config)
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero; draw them so they count
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(1.0 if "norm" in name else 0.0, 0.3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_decoders_give_model_generates_greedy_tokens(kind, tmp_path, tokenizer, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_qwen(kind, tmp_path, tokenizer), dtype=torch.float64
    ).eval()
    assert FusedDecoder.build(*split_decoder_and_head(model)) is not None
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    else:
        assert hasattr(model.model.layers[0].self_attn, "q_norm")
    kwargs = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": NEVER}
    ours = generate(model, tokenizer, PROMPTS, backend="cpu-fused", **kwargs)
    theirs = model_generate_path(model, tokenizer, PROMPTS, **kwargs)
    assert ours.response_ids == theirs.response_ids


def test_half_precision_and_dora_decoders_are_not_fused(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model_dir(tmp_path / "plain", tokenizer)
    half = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    assert FusedDecoder.build(*split_decoder_and_head(half)) is None
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    dora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True))
    assert FusedDecoder.build(*split_decoder_and_head(dora)) is None
    out = generate(dora, tokenizer, PROMPTS[:2], max_new_tokens=3, do_sample=False)  # auto: not cpu-fused
    assert len(out.response_ids) == 2


def test_packed_float32_step_gives_model_generates_greedy_tokens(peaked_policy, monkeypatch):
    """In float32 the fused step's products run packed for the batch's rows (MKL), padded while
    rows end and plain once few are left; the greedy tokens stay those of ``model.generate``."""
    import copy

    from memalpha.lm.sampling import packed_linear

    if not packed_linear.packing_available():
        pytest.skip("this PyTorch build has no MKL packed product")
    model = copy.deepcopy(peaked_policy[0]).to(torch.float32).eval()
    tokenizer = peaked_policy[1]
    rows_seen: list[int] = []
    packed = torch.ops.mkl._mkl_linear
    monkeypatch.setattr(
        torch.ops.mkl, "_mkl_linear", lambda x, *args: rows_seen.append(x.shape[0]) or packed(x, *args)
    )
    end = early_end_token(model, tokenizer, PROMPTS, others_from=2, all_others=True)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": end}
    ours = generate(model, tokenizer, PROMPTS, backend="cpu-fused", **kwargs)
    assert rows_seen and set(rows_seen) == {len(PROMPTS)}  # every packed call at the rows it was packed for
    theirs = model_generate_path(model, tokenizer, PROMPTS, **kwargs)
    assert ours.response_ids == theirs.response_ids
    assert len(ours.response_ids[0]) < max(ours.response_lengths)
