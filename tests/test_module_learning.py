"""GRPOModule.training_step must raise a learnable reward: the whole Lightning step, not only the loss.

A random 2-layer model with an 8-token vocabulary stands in for the policy; its "rollout" is
three fixed prompts sampled ``group_size`` times for 3 tokens, rewarded with the share of one
chosen token (1/8 at the start). Everything after the rollout is the module's own: the round's
advantages, reference log-probs with the adapter off, the mini-batch, the micro-batched clipped
loss with its KL term, gradient clipping, the optimiser and scheduler steps, under a Lightning
Trainer. 10 steps must raise the mean reward of the last 3 rounds well above that of the first 3
(each mean over 3 rounds x 24 samples x 3 tokens: 216 sampled tokens). With a learning rate of
1e-12 (the optimiser refuses 0) the same test fails, so it measures the update, not the sampling.
"""

from __future__ import annotations

import torch
from conftest import SMALL_VOCAB_CHOSEN as CHOSEN
from lightning.pytorch import Callback, Trainer

from memalpha.agent.rollout import RolloutOutput, RolloutRecord, TurnSample
from memalpha.data.synthetic import SyntheticSettings
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.lm.core.policy import LoraSettings
from memalpha.lm.sampling.generation import generate

STEPS, GROUP, NEW_TOKENS, WINDOW = 10, 8, 3, 3
PROMPTS = [[1, 3, 4], [6, 7], [4, 4, 1, 6]]


class ToyAgent:
    """The module's agent for the toy task: sample the prompts, reward the chosen token."""

    def __init__(self, module, rewards_per_round: list[float]) -> None:
        self.policy, self.tokenizer, self.rollout = module.policy, module.tokenizer, module.rollout_settings
        self.reward = module.reward_settings  # the step splits the advantages by its terms
        self.rewards_per_round = rewards_per_round

    def rollouts(self, instances, *, seed: int, on_phase, credit) -> RolloutOutput:
        prompts = [p for p in PROMPTS for _ in range(GROUP)]
        out = generate(
            self.policy, self.tokenizer, prompts, max_new_tokens=NEW_TOKENS, seed=seed, eos_token_id=2
        )
        samples, records = [], []
        for i, (prompt, response) in enumerate(zip(out.prompt_ids, out.response_ids)):
            reward = sum(t == CHOSEN for t in response) / NEW_TOKENS
            samples.append(TurnSample(group_id=i // GROUP, rollout_id=i, chunk_index=0, prompt_ids=prompt,
                                      response_ids=response, truncated=out.truncated[i], num_calls=0,
                                      num_successful_calls=0, reward=reward))
            records.append(RolloutRecord(f"toy-{i // GROUP}", "toy", i % GROUP, [], {}, 0, 1, [], r1=reward))
        self.rewards_per_round.append(sum(s.reward for s in samples) / len(samples))
        return RolloutOutput(
            samples, records, rollout_s=0.0, reader_s=0.0, generated_tokens=out.num_generated_tokens
        )


def train_toy(model_dir: str, tmp_path, learning_rate: float) -> list[float]:
    """The mean reward of each round of a ``STEPS``-step run of GRPOModule on the toy task."""
    from memalpha.train.datamodule import RolloutDataModule
    from memalpha.train.module import GRPOModule

    torch.manual_seed(0)
    module = GRPOModule(
        model=model_dir,
        lora=LoraSettings(r=4, alpha=8, dropout=0.0),
        rollout={"group_size": GROUP, "max_new_tokens": NEW_TOKENS, "temperature": 1.0},
        reader={"max_new_tokens": 1},
        update=UpdateSettings(kl_coef=0.01, micro_batch_size=8),
        optimizer=OptimizerSettings(learning_rate=learning_rate, weight_decay=0.0, warmup_ratio=0.0),
        log_text_every_n_steps=0,
        export_adapter_dir=str(tmp_path / "adapter"),
    )
    rewards: list[float] = []

    class ToyTask(Callback):
        """The module's step rolls the toy agent out once the policy exists."""

        def on_fit_start(self, trainer, pl_module) -> None:
            pl_module.grpo_step.agent = ToyAgent(pl_module, rewards)

    synthetic = SyntheticSettings(train=4, val=1, chunks=1, questions=1, chunk_words=10)
    data = RolloutDataModule(synthetic=synthetic, instances_per_step=1, tokenizer_name=model_dir)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      num_sanity_val_steps=0, default_root_dir=str(tmp_path), callbacks=[ToyTask()])
    trainer.fit(module, datamodule=data, weights_only=False)
    assert trainer.global_step == STEPS and len(rewards) == STEPS
    return rewards


def test_training_step_raises_the_reward_of_a_learnable_toy_task(small_vocab_model_dir, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 32-wide model: one thread is faster, and far faster on a busy machine
    try:
        rewards = train_toy(small_vocab_model_dir, tmp_path, learning_rate=3e-3)
    finally:
        torch.set_num_threads(threads)
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.2 and last > 0.4, [round(r, 3) for r in rewards]
