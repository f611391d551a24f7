"""GRPO must learn a learnable reward: the test that a sign error or a detached loss cannot pass.

A tiny random model with an 8-token vocabulary is rewarded for the share of one token in its
3-token replies. 20 steps through the real update path (sampling, group advantages, reference
log-probs with the adapter off, the typed batch, the micro-batched clipped loss with KL, the
optimiser step) must raise the mean reward well beyond its start, with a non-zero gradient at
every step.
"""

from __future__ import annotations

import torch
from conftest import SMALL_VOCAB_CHOSEN as CHOSEN

from memalpha.grpo.advantages import group_advantages
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import accumulate_grpo_gradients, optimizer_step
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer, response_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import generate

STEPS, GROUP, NEW_TOKENS = 20, 8, 3
PROMPTS = [[1, 3, 4], [6, 7], [4, 4, 1, 6]]


def test_grpo_raises_a_learnable_reward_over_20_steps(small_vocab_model_dir, tokenizer):
    torch.manual_seed(0)
    model, _ = load_policy(small_vocab_model_dir, lora=LoraSettings(r=4, alpha=8))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(
        params, OptimizerSettings(learning_rate=3e-3, weight_decay=0.0, warmup_ratio=0.0), STEPS
    )
    update = UpdateSettings(kl_coef=0.01, micro_batch_size=8)
    rewards_per_step, grad_norms = [], []
    for step in range(STEPS):
        prompts = [p for p in PROMPTS for _ in range(GROUP)]
        out = generate(model, tokenizer, prompts, max_new_tokens=NEW_TOKENS, seed=1000 + step, eos_token_id=2)
        rewards = torch.tensor([sum(t == CHOSEN for t in r) / NEW_TOKENS for r in out.response_ids])
        logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=8, pad_id=0)
        with model.disable_adapter():
            ref = response_logprobs(model, out.prompt_ids, out.response_ids, logprob_spec)
        batch = GRPOBatch(
            prompt_ids=out.prompt_ids,
            response_ids=out.response_ids,
            advantages=group_advantages(rewards, [i // GROUP for i in range(len(prompts))]),
            ref_logps=ref,
        )
        optimizer.zero_grad(set_to_none=True)
        _, finite = accumulate_grpo_gradients(
            micro_batch_scorer(model, LogprobSpec(
                temperature=1.0, micro_batch_size=update.micro_batch_size, pad_id=0, share_prefix=True,
            )),
            batch,
            update,
            max_response_len=NEW_TOKENS,
            token_normaliser=float(batch.response_tokens),
            seq_normaliser=float(len(batch)),
            backward=lambda loss: loss.backward(),
        )
        assert finite
        grad_norms.append(
            optimizer_step(optimizer, params, finite=finite, grad_clip=1.0, scheduler=scheduler)
        )
        rewards_per_step.append(float(rewards.mean()))
    first, last = sum(rewards_per_step[:5]) / 5, sum(rewards_per_step[-5:]) / 5
    assert all(norm > 0 for norm in grad_norms), grad_norms
    assert last > first + 0.25 and last > 0.6, rewards_per_step
