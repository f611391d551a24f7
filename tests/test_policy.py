"""Policy loading (fp32 / bf16 / NF4 + LoRA), reference = adapters off, checkpointing, and generation."""

from __future__ import annotations

import pytest
import torch

from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.core.prompt_sharing import pad_prompt_response, response_mask
from memalpha.lm.logprobs.per_token import token_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import Generation, generate, trim_at_eos

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
RESPONSES = [[100, 200, 300], [400, 500], [600, 700, 800, 900]]


def trainable_parameters(model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _train_step(model, lr: float = 0.05) -> None:
    optimiser = torch.optim.SGD(list(trainable_parameters(model).values()), lr=lr)
    loss = -token_logprobs(model, PROMPTS, RESPONSES).sum()
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()


# ---------------------------------------------------------------- loading and the reference


def test_fp32_lora_settings_and_only_adapter_trainable(tiny_model_dir):
    from peft import PeftModel

    model, tokenizer = load_policy(
        tiny_model_dir, lora=LoraSettings(r=4, alpha=16, dropout=0.1, target_modules=["q_proj", "v_proj"])
    )
    assert isinstance(model, PeftModel) and model.training
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 0
    config = model.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 16, 0.1)
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    names = list(trainable_parameters(model))
    assert names and all("lora_" in n for n in names)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "v_proj"}
    all_linear, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=2))
    adapted = {n.split(".")[-4] for n in trainable_parameters(all_linear)}
    # not lm_head
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_reference_is_the_base_model_and_base_weights_stay(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # LoRA A is drawn at random: make the step size below safe for this draw
    model, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model.eval()
    with torch.no_grad():
        plain = token_logprobs(base, PROMPTS, RESPONSES)
        policy_before = token_logprobs(model, PROMPTS, RESPONSES)
    frozen_before = {n: t for n, t in _snapshot(model).items() if "lora_" not in n}
    _train_step(model, lr=0.01)
    model.eval()
    with torch.no_grad():
        policy_after = token_logprobs(model, PROMPTS, RESPONSES)
        with model.disable_adapter():
            reference = token_logprobs(model, PROMPTS, RESPONSES)
    assert torch.equal(reference, plain)  # adapters off == the unwrapped base model, exactly
    assert torch.equal(policy_before, plain)  # fresh LoRA (B = 0) starts as the base
    assert (policy_after - policy_before).abs().max() > 1e-3  # the step moved the policy...
    assert policy_after.sum() > policy_before.sum()  # ...towards the responses it was trained on
    frozen_after = {n: t for n, t in _snapshot(model).items() if "lora_" not in n}
    assert frozen_after.keys() == frozen_before.keys()
    assert all(torch.equal(frozen_after[n], frozen_before[n]) for n in frozen_before)


def test_continue_from_a_saved_adapter(tiny_model_dir, tmp_path):
    model, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4))
    _train_step(model)
    model.save_pretrained(tmp_path / "adapter")
    model.eval()
    reloaded, _ = load_policy(tiny_model_dir, adapter_path=str(tmp_path / "adapter"))
    assert reloaded.training and trainable_parameters(reloaded)
    reloaded.eval()
    with torch.no_grad():
        assert torch.equal(
            token_logprobs(model, PROMPTS, RESPONSES), token_logprobs(reloaded, PROMPTS, RESPONSES)
        )


def test_bf16_and_bare_model(tiny_model_dir):
    model, _ = load_policy(tiny_model_dir, precision="bf16", lora=LoraSettings(r=2))
    base_dtypes = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    assert base_dtypes == {torch.bfloat16}
    with torch.no_grad():
        logps = token_logprobs(model, PROMPTS, RESPONSES)
    assert logps.dtype == torch.float32 and torch.isfinite(logps).all()
    bare, _ = load_policy(tiny_model_dir, lora=None)
    assert not hasattr(bare, "disable_adapter") and not bare.training
    assert not any(p.requires_grad for p in bare.parameters())
    with pytest.raises(ValueError, match="precision"):
        load_policy(tiny_model_dir, precision="int8")


def _count_recomputes(model):
    """Calls into the first block's attention (checkpointing re-runs the block during backward).

    A pre-hook, because the recompute stops as soon as it has every saved tensor back, which can
    be before a sub-module's forward returns.
    """
    attention = model.get_base_model().get_decoder().layers[0].self_attn
    calls = []
    handle = attention.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("precision", ["fp32", "nf4"])
def test_checkpointed_training_step_updates_only_lora(tiny_model_dir, precision):
    torch.manual_seed(0)
    model, _ = load_policy(
        tiny_model_dir, precision=precision, lora=LoraSettings(r=4), gradient_checkpointing=True
    )
    if precision == "nf4":
        import bitsandbytes as bnb

        quantised = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert len(quantised) == 14  # 7 linear layers x 2 blocks, all 4-bit
        assert quantised[0].weight.quant_type == "nf4"
    before = _snapshot(model)
    calls, handle = _count_recomputes(model)
    loss = -token_logprobs(model, PROMPTS, RESPONSES).sum()
    assert len(calls) == 1
    loss.backward()
    assert len(calls) == 2  # the layer ran again in backward: checkpointing is really on
    handle.remove()
    grads = {n: p.grad for n, p in trainable_parameters(model).items()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    # LoRA B starts at 0, so every B gets a gradient only if it flows through every checkpointed block
    b_grads = {n: g for n, g in grads.items() if "lora_B" in n}
    assert len(b_grads) == 14 and all(g.abs().sum() > 0 for g in b_grads.values())
    torch.optim.SGD(list(trainable_parameters(model).values()), lr=0.1).step()
    after = _snapshot(model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_B" in n for n in changed)
    assert {n for n in before if "lora_B" in n} == changed


@pytest.mark.parametrize("upcast", [True, False])
def test_nf4_unquantised_weights_follow_upcast_unquantised(tiny_model_dir, upcast):
    """Upcast: embedding, norms and head in float32 (PEFT's preparation), so the residual stream
    is float32; without: they stay in the bfloat16 compute dtype. LoRA weights are float32 and
    take gradients either way."""
    torch.manual_seed(0)
    model, _ = load_policy(tiny_model_dir, precision="nf4", lora=LoraSettings(r=4), compute_dtype="bfloat16",
                           upcast_unquantised=upcast)
    base = model.get_base_model()
    rest = torch.float32 if upcast else torch.bfloat16
    assert base.get_input_embeddings().weight.dtype == rest
    assert base.model.norm.weight.dtype == rest
    lora = trainable_parameters(model)
    assert lora and all(p.dtype == torch.float32 for p in lora.values())
    (-token_logprobs(model, PROMPTS, RESPONSES).sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lora.values())


# ---------------------------------------------------------------- generation


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir):
    return load_policy(tiny_model_dir, lora=LoraSettings(r=4))


def test_generate_shapes_seed_and_training_mode(tiny_policy):
    model, tokenizer = tiny_policy
    torch.manual_seed(123)
    caller_state = torch.random.get_rng_state()
    first = generate(model, tokenizer, PROMPTS, max_new_tokens=5, seed=7)
    assert torch.equal(torch.random.get_rng_state(), caller_state)  # the caller's RNG is untouched
    assert model.training  # train mode restored
    again = generate(model, tokenizer, PROMPTS, max_new_tokens=5, seed=7)
    other = generate(model, tokenizer, PROMPTS, max_new_tokens=5, seed=8)
    assert isinstance(first, Generation) and first == again and first != other
    assert first.prompt_ids == PROMPTS
    assert all(len(r) == 5 for r in first.response_ids) and first.truncated == [True, True, True]
    assert first.num_generated_tokens == 15
    split = generate(model, tokenizer, PROMPTS, max_new_tokens=5, seed=7, batch_size=2)
    assert [len(r) for r in split.response_ids] == [5, 5, 5]


def test_greedy_left_padded_batch_equals_one_by_one(tiny_policy):
    model, tokenizer = tiny_policy
    batched = generate(model, tokenizer, PROMPTS, max_new_tokens=6, do_sample=False)
    single = [
        generate(model, tokenizer, [p], max_new_tokens=6, do_sample=False).response_ids[0] for p in PROMPTS
    ]
    assert batched.response_ids == single
    small = generate(model, tokenizer, PROMPTS, max_new_tokens=6, do_sample=False, batch_size=1)
    assert small.response_ids == single


def test_generate_stops_at_eos_and_trims(tiny_policy):
    model, tokenizer = tiny_policy
    greedy = generate(model, tokenizer, PROMPTS, max_new_tokens=6, do_sample=False)
    stop = greedy.response_ids[0][0]  # make prompt 0's first greedy token the end-of-sequence token
    out = generate(model, tokenizer, PROMPTS, max_new_tokens=6, do_sample=False, eos_token_id=stop)
    assert out.response_ids[0] == [stop] and out.truncated[0] is False
    for full, response, cut in zip(greedy.response_ids, out.response_ids, out.truncated):
        # each row is the greedy continuation cut right after its first eos; later pads are dropped
        assert response == trim_at_eos(full, [stop])[0]
        assert stop not in response[:-1]
        assert cut == (stop not in response) and (not cut or len(response) == 6)


def test_trim_at_eos():
    assert trim_at_eos([4, 2, 0, 0], [2]) == ([4, 2], False)
    assert trim_at_eos([4, 5, 6], [2, 9]) == ([4, 5, 6], True)
    assert trim_at_eos([9, 2], {2, 9}) == ([9], False)


def test_padded_layout():
    padded = pad_prompt_response([[5, 6], [7]], [[8], [9, 10, 2]], 0)
    input_ids, attention_mask, responses = padded
    assert input_ids.tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 2]]
    assert attention_mask.tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert responses.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert padded.prompt_width == 2
    assert padded.position_ids.tolist() == [[0, 1, 2, 0, 0], [0, 0, 1, 2, 3]]


@pytest.mark.embedded
def test_embedded_model_greedy_tokens_are_the_argmax(embedded_model_dir):
    model, tokenizer = load_policy("smollm2-135m-instruct", lora=None)
    messages = [[{"role": "user", "content": text}] for text in ("What is the capital of France?", "Say hi.")]
    prompts = [
        list(
            tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        for m in messages
    ]
    out = generate(model, tokenizer, prompts, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out.response_ids[0])
    with torch.no_grad():
        logps, entropy = token_logprobs(
            model,
            out.prompt_ids,
            out.response_ids,
            LogprobSpec(pad_id=tokenizer.pad_token_id),
            with_entropy=True,
        )
    mask = response_mask(out.response_ids, logps.shape[1], dtype=torch.bool)
    # a greedy token is the mode, so its probability is at least exp(-entropy) of its distribution
    assert torch.all(logps[mask] >= -entropy[mask] - 1e-4)
    assert torch.all(logps[~mask] == 0) and torch.all(logps[mask] < 0)


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_gives_back_the_mode_the_model_had(training):
    """Sampling and scoring run in eval mode (dropout off); the caller's mode comes back, also on an error."""
    from memalpha.lm.core.modes import eval_mode

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train(training)
    with eval_mode(model) as inside:
        assert inside is model and not any(m.training for m in model.modules())
    assert all(m.training is training for m in model.modules())
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        raise RuntimeError("boom")
    assert all(m.training is training for m in model.modules())
