"""memalpha's decoding loop and sampler against ``transformers``: the same filters, the same
greedy tokens, the model's own distribution when sampling, and the growing cache by hand."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    SAMPLING_FILTERS,
    SAMPLING_PROMPT,
    SAMPLING_ROWS,
    assert_follows_the_models_distribution,
    early_end_token,
    model_generate_path,
)

from memalpha.lm.core.prompt_sharing import SharedPrefix, full_attention_layers, split_decoder_and_head
from memalpha.lm.sampling.filters import draw, filter_logits, next_tokens
from memalpha.lm.sampling.generation import generate
from memalpha_lab.growing_cache import GrowingLayer, growing_cache

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]
PROMPTS = [SYSTEM + [20, 21, 22], SYSTEM + [20, 21, 22], SYSTEM + [30], SYSTEM + [30], SYSTEM + [40, 41]]
NEVER = 10_000  # an end token no row emits


# ----------------------------------------------------------------------------- the sampler


def hf_filtered(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (1.0, 5, 1.0),
        (1.0, 0, 0.8),
        (0.6, 12, 0.9),
        (1.3, 3, 0.05),
        (1.0, 500, 0.99),
    ],
)
def test_filters_drop_exactly_the_tokens_transformers_drops(temperature, top_k, top_p):
    logits = torch.randn(6, 200, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    logits[0, :4] = 2.5  # ties at the top
    ours = filter_logits(logits, temperature, top_k, top_p)
    theirs = hf_filtered(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    assert torch.allclose(ours[kept], theirs[kept], rtol=0, atol=1e-12)
    assert kept.any(dim=-1).all()


def test_filters_refuse_bad_settings():
    logits = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(logits, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(logits, top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(logits, top_p=0.0)


def test_draw_follows_the_probabilities_and_never_picks_a_zero():
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0]], dtype=torch.float64).expand(20_000, -1)
    torch.manual_seed(0)
    counts = torch.bincount(draw(probs), minlength=6).double() / 20_000
    assert counts[[0, 2, 5]].sum() == 0
    # 20k draws: the standard error of a share is <= 0.0035; allow 5 of them
    assert (counts - probs[0]).abs().max() < 0.018
    unnormalised = torch.tensor([[0.0, 2.0, 0.0, 0.0]])  # rows need not sum to 1; the only token is certain
    assert draw(unnormalised.expand(50, -1)).eq(1).all()
    broken = torch.tensor([[0.2, float("nan"), 0.3]])  # a broken model still yields a valid token id
    assert draw(broken).item() in range(3)


def test_greedy_picks_the_argmax_and_top_k_one_samples_it():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(2))
    assert torch.equal(next_tokens(logits, do_sample=False), logits.argmax(-1))
    assert torch.equal(next_tokens(logits, do_sample=True, top_k=1), logits.argmax(-1))


# ----------------------------------------------------------------------------- the loop


@pytest.mark.parametrize("share_prefix", [True, False])
def test_greedy_tokens_equal_model_generate_while_rows_end_apart(peaked_policy, monkeypatch, share_prefix):
    model, tokenizer = peaked_policy
    end = early_end_token(model, tokenizer, PROMPTS, others_from=1, all_others=False)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": end, "share_prefix": share_prefix}
    ours = generate(model, tokenizer, PROMPTS, **kwargs)
    theirs = model_generate_path(model, tokenizer, PROMPTS, **kwargs)
    assert ours.response_ids == theirs.response_ids
    assert ours.truncated == theirs.truncated
    lengths = ours.response_lengths
    assert min(lengths) < max(lengths), "the rows should end at different steps"
    assert ours.response_ids[0][-1] == end and not ours.truncated[0]


def test_sampled_tokens_follow_the_models_distribution(small_vocab_model_dir):
    """Many rows of one prompt, two sampled tokens each: the shares of the first token, and of the
    second after a given first, match the model's filtered softmax (conftest's check)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_dir, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(small_vocab_model_dir)
    out = generate(
        model,
        tokenizer,
        [SAMPLING_PROMPT] * SAMPLING_ROWS,
        max_new_tokens=2,
        seed=0,
        eos_token_id=NEVER,
        **SAMPLING_FILTERS,
    )
    assert_follows_the_models_distribution(model, torch.tensor(out.response_ids))


def test_growing_cache_holds_the_filled_columns_and_refuses_sliding_windows(peaked_policy):
    from transformers import MistralConfig

    model, _ = peaked_policy
    decoder = split_decoder_and_head(model)[0]
    with torch.no_grad():
        prefix = SharedPrefix.compute(decoder, SYSTEM)
        room = growing_cache(decoder, 20, prefix.cache(decoder, rows=3))
    assert room.get_seq_length() == len(SYSTEM)
    layer = room.layers[1]
    assert isinstance(layer, GrowingLayer) and layer.key_buffer.shape[2] == 20
    assert torch.equal(layer.keys, prefix.layers[1][0].expand(3, -1, -1, -1))
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert layer.keys.shape[0] == 2 and layer.keys.shape[2] == len(SYSTEM)
    with pytest.raises(ValueError, match="holds 20 columns, 21 were asked for"):
        layer.update(
            *(torch.zeros(2, layer.keys.shape[1], 13, layer.keys.shape[3], dtype=layer.keys.dtype),) * 2
        )

    windowed = MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=16, vocab_size=100,
    )
    assert full_attention_layers(windowed) is None
    assert full_attention_layers(decoder.config) == 2


def test_a_sliding_window_decoder_samples_through_model_generate(tokenizer):
    """A decoder with sliding-window layers is not the loop's: ``generate`` hands it to
    ``model.generate`` and returns what that gives, trimmed at the end token."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
        vocab_size=128,
        max_position_embeddings=64,
        initializer_range=0.3,
    )
    model = MistralForCausalLM(config).to(torch.float64).eval()
    assert full_attention_layers(config) is None
    prompts = [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11]]
    ours = generate(model, tokenizer, prompts, max_new_tokens=6, do_sample=False, eos_token_id=NEVER)
    for prompt, response in zip(prompts, ours.response_ids):
        ids = torch.tensor([prompt])
        alone = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                               do_sample=False, eos_token_id=NEVER, pad_token_id=0)
        assert response == alone[0, len(prompt):].tolist()


def test_growing_layer_crops_and_repeats_its_rows(peaked_policy):
    model, _ = peaked_policy
    decoder = split_decoder_and_head(model)[0]
    with torch.no_grad():
        prefix = SharedPrefix.compute(decoder, SYSTEM)
    keys, values = prefix.layers[0]
    layer = GrowingLayer(12)
    layer.update(keys, values)
    layer.batch_repeat_interleave(3)
    assert torch.equal(layer.keys, keys.expand(3, -1, -1, -1))
    layer.crop(-3)
    assert layer.get_seq_length() == len(SYSTEM) - 3
    assert torch.equal(layer.values, values[:, :, :-3].expand(3, -1, -1, -1))
    with pytest.raises(ValueError, match="negative number"):
        layer.crop(2)
