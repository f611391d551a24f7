"""The shared GRPO update and the single-turn trainer (no memory agent): prompts + reward function in,
adapter out."""

from __future__ import annotations

import torch
from test_grpo import CHOSEN, _first_token_probability

from memalpha.grpo.advantages import group_advantages
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import accumulate_grpo_gradients
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer, response_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import generate
from memalpha_lab.single_turn import SingleTurnSettings, train_single_turn


def test_shared_update_raises_a_rewarded_token_over_micro_batches_with_kl(small_vocab_model_dir, tokenizer):
    """The sign test through accumulate_grpo_gradients: 2 PPO epochs, micro-batches of 8, KL to the base."""
    torch.manual_seed(0)
    model, _ = load_policy(small_vocab_model_dir, lora=LoraSettings(r=4, alpha=8))
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    prompts, group = [[1, 3, 4], [6, 7]], 16
    settings = UpdateSettings(kl_coef=0.01, micro_batch_size=8)
    before = _first_token_probability(model, prompts)
    for step in range(5):
        out = generate(
            model, tokenizer, [p for p in prompts for _ in range(group)], max_new_tokens=2, seed=100 + step
        )
        rewards = torch.tensor([float(r[0] == CHOSEN) for r in out.response_ids])
        logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=8, pad_id=0)
        with model.disable_adapter():
            ref_logps = response_logprobs(model, out.prompt_ids, out.response_ids, logprob_spec)
        batch = GRPOBatch(
            prompt_ids=out.prompt_ids,
            response_ids=out.response_ids,
            advantages=group_advantages(rewards, [i // group for i in range(len(rewards))]),
            old_logps=response_logprobs(model, out.prompt_ids, out.response_ids, logprob_spec),
            ref_logps=ref_logps,
        )
        for _epoch in range(2):
            optimiser.zero_grad()
            metrics, finite = accumulate_grpo_gradients(
                micro_batch_scorer(model, LogprobSpec(
                    temperature=1.0, micro_batch_size=settings.micro_batch_size, pad_id=0, share_prefix=True,
                )),
                batch,
                settings,
                max_response_len=2,
                token_normaliser=float(sum(map(len, out.response_ids))),
                seq_normaliser=float(len(out.response_ids)),
                backward=lambda loss: loss.backward(),
            )
            assert finite and metrics["tokens"] == sum(map(len, out.response_ids))
            optimiser.step()
    after = _first_token_probability(model, prompts)
    assert after > 2 * before and after > 0.5, (before, after)
    assert metrics["kl"] > 0


def test_loop_trains_logs_and_exports_a_loadable_adapter(tiny_model_dir, tokenizer, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def reward(prompts, completions):  # fewer characters is better: the model must favour short tokens
        return [-len(c) / 10 for c in completions]

    settings = SingleTurnSettings(
        steps=3,
        prompts_per_step=2,
        group_size=6,
        max_new_tokens=6,
        optimizer=OptimizerSettings(learning_rate=5e-2, weight_decay=0.0, warmup_ratio=0.0),
        update=UpdateSettings(kl_coef=0.01, micro_batch_size=8),
        lora=LoraSettings(r=8, alpha=16),
        seed=0,
    )
    history = []
    result = train_single_turn(
        tiny_model_dir,
        ["Remember: Anna likes tea.", "Remember: Bob plays violin."],
        reward,
        settings,
        output_dir=tmp_path / "adapter",
        on_step=history.append,
    )
    assert len(result.history) == 3 and history == result.history
    assert all(h["skipped_nonfinite"] == 0.0 for h in history)
    assert all(h["generated_tokens"] > 0 and h["step_s"] > 0 for h in history)
    assert len({round(h["reward"], 6) for h in history}) > 1  # fresh samples every step
    assert any(h["kl"] > 0 for h in history[1:])

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(result.adapter_dir)).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Remember: Anna likes tea."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        tuned = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
    assert (tuned - plain).abs().max() > 1e-3  # the exported adapter carries what was learned
