"""Per-token log-probs: exact against a naive full log_softmax, temperature as in sampling, bounded memory."""

from __future__ import annotations

import pytest
import torch
from conftest import randomise_lora_b
from numerics import VALUE_REL, assert_close, assert_same_gradients
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.core.prompt_sharing import pad_prompt_response
from memalpha.lm.logprobs.per_token import HeadLogprob, streams_head, token_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16]]
RESPONSES = [[100, 200, 300, 2], [400], [500, 600, 700, 800, 900, 1000, 1100], []]


def naive_logprobs(model, prompts, responses, temperature=1.0, pad_id=0):
    """Full logits of the whole batch, log_softmax, gather -- the reference the chunked code must equal."""
    batch = pad_prompt_response(prompts, responses, pad_id)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    width = batch.response_mask.shape[1]
    start = batch.prompt_width - 1
    logp = torch.log_softmax(logits[:, start : start + width] / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1) * batch.response_mask
    picked = logp.gather(-1, batch.input_ids[:, batch.prompt_width :, None]).squeeze(-1) * batch.response_mask
    return picked, entropy


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    """Tiny LoRA policy whose adapters are nonzero, so the adapter path is really exercised."""
    torch.manual_seed(0)
    model, tokenizer = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    randomise_lora_b(model, 0.2)
    model.eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def policy64(policy):
    """The same policy in float64, for comparisons that must hold up to rounding on any machine."""
    import copy

    model, tokenizer = policy
    return copy.deepcopy(model).to(torch.float64), tokenizer


def test_logprobs_come_in_float32_or_float64_for_a_float64_model(policy, policy64):
    with torch.no_grad():
        assert token_logprobs(policy[0], PROMPTS, RESPONSES).dtype == torch.float32
        assert token_logprobs(policy64[0], PROMPTS, RESPONSES).dtype == torch.float64


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(
    ("token_chunk", "vocab_chunk", "micro_batch_size"), [(512, None, 4), (3, None, 3), (2, 1000, 1)]
)
def test_logprobs_equal_naive_log_softmax(policy64, temperature, token_chunk, vocab_chunk, micro_batch_size):
    model, _ = policy64
    with torch.no_grad():
        expected, expected_entropy = naive_logprobs(model, PROMPTS, RESPONSES, temperature)
        got, entropy = token_logprobs(
            model,
            PROMPTS,
            RESPONSES,
            LogprobSpec(
                temperature=temperature,
                micro_batch_size=micro_batch_size,
                token_chunk=token_chunk,
                vocab_chunk=vocab_chunk,
            ),
            with_entropy=True,
        )
        plain = token_logprobs(
            model,
            PROMPTS,
            RESPONSES,
            LogprobSpec(
                temperature=temperature,
                token_chunk=token_chunk,
                vocab_chunk=vocab_chunk,
                micro_batch_size=micro_batch_size,
            ),
        )
    assert got.shape == (4, 7) and got.dtype == torch.float64
    assert_close(got, expected, VALUE_REL, "log-probs")
    assert_close(entropy, expected_entropy, VALUE_REL, "entropy")
    assert_close(plain, got, VALUE_REL, "log-probs without entropy")  # the no-entropy path agrees
    assert torch.all(got[1, 1:] == 0) and torch.all(got[3] == 0)  # masked columns are exactly 0
    assert torch.all(got[0, :4] < 0)


@pytest.mark.parametrize(
    ("temperature", "vocab_chunk", "bias"), [(1.0, None, False), (0.7, 7, True), (1.3, 3, True)]
)
def test_head_logprob_gradients_equal_finite_differences(temperature, vocab_chunk, bias):
    """The streamed head's hand-written backward against float64 finite differences, for the
    hidden rows, the head's weight and its bias; targets fall in every vocabulary slice."""
    torch.manual_seed(0)
    head = torch.nn.Linear(5, 20, bias=bias).double()
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, 6, 7, 13, 19, 19])

    def logprob(h, weight, b=head.bias):  # gradcheck nudges these very tensors, which the head holds
        return HeadLogprob.apply(h, weight, b, targets, head, None, temperature, vocab_chunk, True, True)[0]

    inputs = (hidden, head.weight, head.bias) if bias else (hidden, head.weight)
    assert torch.autograd.gradcheck(logprob, inputs)
    value, entropy, hits = HeadLogprob.apply(hidden, head.weight, head.bias, targets, head, None, temperature,
                                             vocab_chunk, True, True)
    expected = torch.log_softmax(head(hidden) / temperature, dim=-1)
    assert_close(value, expected.gather(1, targets[:, None]).squeeze(1), VALUE_REL, "log-probs")
    assert_close(entropy, -(expected.exp() * expected).sum(-1), VALUE_REL, "entropy")
    assert not entropy.requires_grad and not hits.requires_grad


def test_only_plain_linear_heads_are_streamed():
    class Config:
        logit_scale = None
        final_logit_softcapping = None

    head = torch.nn.Linear(4, 6)
    assert streams_head(head, Config())
    Config.logit_scale = 0.5  # Cohere: the checkpointed path applies it
    assert not streams_head(head, Config())
    Config.logit_scale, Config.final_logit_softcapping = None, 30.0  # Gemma 2
    assert not streams_head(head, Config())
    assert not streams_head(torch.nn.Sequential(head), object())
    Config.final_logit_softcapping = None
    hook = head.register_forward_hook(lambda module, inputs, output: output * 2)  # e.g. a fault injector
    assert not streams_head(head, Config())
    hook.remove()
    assert streams_head(head, Config())


@pytest.mark.parametrize("streamed", [True, False])
def test_logprob_gradients_equal_naive_on_both_head_paths(policy64, streamed, monkeypatch):
    """The whole model's gradients through the streamed head and through the checkpointed one."""
    from memalpha.lm.logprobs import per_token

    monkeypatch.setattr(per_token, "streams_head", lambda head, config: streamed)
    model, _ = policy64
    weights = torch.linspace(0.5, 2.0, 7, dtype=torch.float64)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        (fn() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    ours = grads(lambda: token_logprobs(
        model,
        PROMPTS,
        RESPONSES,
        LogprobSpec(temperature=0.8, token_chunk=3, vocab_chunk=5000, micro_batch_size=2),
    ))
    naive = grads(lambda: naive_logprobs(model, PROMPTS, RESPONSES, temperature=0.8)[0])
    model.zero_grad(set_to_none=True)
    assert_same_gradients(ours, naive)
    assert any(g.abs().sum() > 0 for g in ours.values())


def test_temperature_is_the_sampling_temperature(policy):
    """The scored distribution is the one generate samples from: log_softmax(logits / T)."""
    model, _ = policy
    temperature = 0.6
    prompt = torch.tensor([[21, 22, 23, 24]])
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=temperature,
            top_k=0, top_p=1.0, max_new_tokens=5, eos_token_id=None, pad_token_id=0,
            output_scores=True, return_dict_in_generate=True,
        )
        response = out.sequences[0, 4:].tolist()
        sampled = torch.stack([torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(out.scores, response)])
        ours = token_logprobs(
            model, [prompt[0].tolist()], [response], LogprobSpec(temperature=temperature),
        )[0]
        wrong = token_logprobs(model, [prompt[0].tolist()], [response], LogprobSpec(temperature=1.0))[0]
    assert len(response) == 5
    assert torch.allclose(ours, sampled, atol=1e-4)
    assert not torch.allclose(wrong, sampled, atol=1e-3)


def _peak_allocated(fn) -> int:
    """Peak bytes held by the CPU allocator while ``fn`` runs (profiler allocation events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack, peak = list(prof.profiler.kineto_results.experimental_event_tree()), 0
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.typed[0] == _EventType.Allocation:
            peak = max(peak, event.typed[1].total_allocated)
    return peak


def test_peak_memory_is_one_logit_chunk_with_32k_vocab():
    """Measured here: 15.8 MiB = 1.01x the 15.6 MiB chunk (vocab_chunk=4000: 1.08x its 2 MiB chunk);
    the naive full log_softmax on the same input peaks at 252 MiB = 16x the chunk."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab, token_chunk = 32000, 128
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (2, 8), generator=generator).tolist()
    responses = torch.randint(3, vocab, (2, 256), generator=generator).tolist()
    chunk_bytes = token_chunk * vocab * 4
    with torch.no_grad():
        ours = _peak_allocated(
            lambda: token_logprobs(
                model, prompts, responses, LogprobSpec(micro_batch_size=2, token_chunk=token_chunk),
            )
        )
        vocab_chunked = _peak_allocated(
            lambda: token_logprobs(
                model,
                prompts,
                responses,
                LogprobSpec(micro_batch_size=2, token_chunk=token_chunk, vocab_chunk=4000),
            )
        )
        naive = _peak_allocated(lambda: naive_logprobs(model, prompts, responses))
    assert ours <= 1.5 * chunk_bytes, (ours, chunk_bytes)
    assert vocab_chunked <= 1.5 * token_chunk * 4000 * 4, vocab_chunked
    assert naive > 4 * ours, (naive, ours)


def test_rejects_mismatched_rows(policy):
    model, _ = policy
    with pytest.raises(ValueError, match="pair up"):
        token_logprobs(model, PROMPTS, RESPONSES[:2])
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        token_logprobs(model, [[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, PROMPTS, RESPONSES, LogprobSpec(temperature=0.0))
