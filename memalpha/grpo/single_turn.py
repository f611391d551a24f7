"""The single-turn trainer: prompts and a reward function in, a trained LoRA adapter out.

GRPO without the memory agent, and not the loop ``memalpha fit`` runs: a plain PyTorch loop
over the same pieces the Lightning module uses (policy loading,
batched generation, chunked log-probs, group advantages, the clipped loss), for
single-turn tasks and for comparing against other GRPO trainers::

    from memalpha.grpo.single_turn import SingleTurnSettings, train_single_turn

    def reward(prompts, completions):
        return [float("<tool_call>" in c) for c in completions]

    result = train_single_turn("smollm2-135m-instruct", ["Store: Anna likes tea."], reward,
                               SingleTurnSettings(steps=10), output_dir="runs/single_turn_adapter")
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memalpha.grpo.advantages import group_advantages
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import (
    NonFiniteStreak,
    accumulate_grpo_gradients,
    build_optimizer,
    first_nonfinite,
    optimizer_step,
)
from memalpha.lm.core.adapters import export_adapter
from memalpha.lm.core.chat import chat_prompt_ids
from memalpha.lm.sampling.generation import generate
from memalpha.lm.scoring.logprobs import response_logprobs
from memalpha.lm.core.policy import LMSettings, LoraSettings, load_policy
from memalpha.lm.core.reference import load_reference_adapter, reference_weights

RewardFn = Callable[[list[str], list[str]], Sequence[float]]


@dataclass
class SingleTurnSettings:
    """Knobs of the single-turn trainer; the groups are those of :class:`memalpha.train.module.GRPOModule`.

    Args:
        steps: Optimiser steps (one rollout round each).
        prompts_per_step: Prompts per step; each is sampled ``group_size`` times.
        group_size: Completions per prompt (the GRPO group).
        max_new_tokens: Completion length cap.
        temperature: Sampling temperature (also used for the log-probs).
        top_p: Nucleus sampling threshold.
        lm: How the base model is loaded and run (precision, gradient checkpointing, prefix sharing).
        lora: LoRA adapter shape of a fresh adapter (ignored with ``adapter_path``).
        adapter_path: Start from this PEFT adapter folder (e.g. a ``memalpha sft`` export) instead of
            a fresh adapter; ``update.kl_reference`` says whether the KL term pulls towards it or the base.
        update: Advantages, the clipped loss, KL and micro-batching (one mini-batch per step).
        optimizer: Optimiser, learning rate and clipping (warm-up counts in ``steps``).
        seed: Seed of prompt order, sampling and LoRA init.
        chat_template_kwargs: Extra chat-template arguments (e.g. ``{"enable_thinking": False}``).
    """

    steps: int = 10
    prompts_per_step: int = 2
    group_size: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    lm: LMSettings = field(default_factory=LMSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    adapter_path: str | None = None
    update: UpdateSettings = field(default_factory=lambda: UpdateSettings(kl_coef=0.0, micro_batch_size=8))
    optimizer: OptimizerSettings = field(
        default_factory=lambda: OptimizerSettings(weight_decay=0.0, warmup_ratio=0.0)
    )
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the trainer samples), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        update = self.update
        if update.ppo_epochs > 1 or update.num_mini_batches > 1 or update.mini_batch_size is not None:
            raise ValueError(
                "the single-turn trainer takes one optimiser step per round: "
                "update.ppo_epochs and update.num_mini_batches must be 1 and update.mini_batch_size null"
            )


@dataclass
class SingleTurnResult:
    adapter_dir: Path | None
    history: list[dict[str, float]]


def _prompt_ids(tokenizer, prompt: str | list[dict[str, str]], chat_kwargs: dict[str, Any]) -> list[int]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return chat_prompt_ids(tokenizer, messages, chat_kwargs)


def train_single_turn(
    model: str,
    prompts: Sequence[str | list[dict[str, str]]],
    reward_fn: RewardFn,
    settings: SingleTurnSettings | None = None,
    *,
    output_dir: str | Path | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> SingleTurnResult:
    """Train a LoRA adapter with GRPO on single-turn prompts scored by ``reward_fn(prompts, completions)``.

    As in ``memalpha fit``, a step whose rewards, reference log-probs, loss or gradient norm hold a
    NaN or an infinity is skipped (``skipped_nonfinite`` 1 in its record), and
    ``optimizer.max_consecutive_nonfinite`` such steps in a row stop the loop with
    :class:`~memalpha.grpo.update.NonFiniteTrainingError`.
    """
    s = settings or SingleTurnSettings()
    if not prompts:
        raise ValueError("train_single_turn needs at least one prompt")
    torch.manual_seed(s.seed)
    policy, tokenizer = load_policy(
        model, precision=s.lm.precision, lora=s.lora, compute_dtype=s.lm.compute_dtype,
        gradient_checkpointing=s.lm.gradient_checkpointing, adapter_path=s.adapter_path,
    )
    if s.update.kl_reference == "start" and s.adapter_path:
        load_reference_adapter(policy, s.adapter_path)
    encoded = [_prompt_ids(tokenizer, p, s.chat_template_kwargs) for p in prompts]
    texts = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, s.optimizer, max_steps=s.steps)
    order: list[int] = []
    rng = random.Random(s.seed)
    history: list[dict[str, float]] = []
    streak = NonFiniteStreak(s.optimizer.max_consecutive_nonfinite)
    for step in range(s.steps):
        start = time.perf_counter()
        picked = []
        for _ in range(s.prompts_per_step):
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            picked.append(order.pop())
        group_prompts = [encoded[i] for i in picked for _ in range(s.group_size)]
        generation = generate(
            policy,
            tokenizer,
            group_prompts,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed * 100_003 + step,
            share_prefix=s.lm.share_prefix,
            fold_adapters=s.lm.fold_adapters_for_sampling,
        )
        gen_s = time.perf_counter() - start
        completions = [tokenizer.decode(r, skip_special_tokens=True) for r in generation.response_ids]
        rewards = torch.tensor(
            [
                float(r)
                for r in reward_fn([texts[i] for i in picked for _ in range(s.group_size)], completions)
            ]
        )
        if rewards.numel() != len(completions):
            raise ValueError(
                f"reward_fn returned {rewards.numel()} rewards for {len(completions)} completions"
            )
        group_ids = torch.arange(len(picked)).repeat_interleave(s.group_size)
        problem = first_nonfinite({"rewards": rewards})
        ref_logps = None
        if problem is None and s.update.kl_coef > 0:
            with reference_weights(policy):
                ref_logps = response_logprobs(
                    policy,
                    generation.prompt_ids,
                    generation.response_ids,
                    temperature=s.temperature,
                    micro_batch_size=s.update.micro_batch_size,
                    pad_id=tokenizer.pad_token_id,
                    share_prefix=s.lm.share_prefix,
                )
            problem = first_nonfinite({"reference log-probs": ref_logps})
        metrics = {"loss": math.nan, "kl": math.nan, "entropy": math.nan}
        grad_norm = math.nan
        if problem is None:
            batch = GRPOBatch(
                prompt_ids=generation.prompt_ids,
                response_ids=generation.response_ids,
                advantages=group_advantages(rewards, group_ids, scale=s.update.advantage_scale),
                ref_logps=ref_logps,
            )
            optimizer.zero_grad(set_to_none=True)
            metrics, finite = accumulate_grpo_gradients(
                policy,
                batch,
                s.update,
                temperature=s.temperature,
                max_response_len=s.max_new_tokens,
                share_prefix=s.lm.share_prefix,
                pad_id=tokenizer.pad_token_id,
                token_normaliser=max(float(batch.response_tokens), 1.0),
                seq_normaliser=float(len(batch)),
                backward=lambda loss: loss.backward(),
            )
            grad_norm = optimizer_step(
                optimizer, params, finite=finite, grad_clip=s.optimizer.grad_clip, scheduler=scheduler
            )
            optimizer.zero_grad(set_to_none=True)
            problem = "loss" if not finite else None if math.isfinite(grad_norm) else "grad norm"
        step_s = time.perf_counter() - start
        record = {
            "step": float(step),
            "reward": rewards.mean().item(),
            "reward_std": rewards.std(unbiased=False).item(),
            "loss": metrics["loss"],
            "kl": metrics["kl"],
            "entropy": metrics["entropy"],
            "grad_norm": grad_norm,
            "skipped_nonfinite": float(problem is not None),
            "generated_tokens": float(generation.num_generated_tokens),
            "gen_s": gen_s,
            "step_s": step_s,
            "gen_tokens_per_s": generation.num_generated_tokens / gen_s if gen_s > 0 else math.nan,
        }
        history.append(record)
        if on_step is not None:
            on_step(record)
        warning = streak.update(problem, step)
        if warning is not None:
            warnings.warn(f"train_single_turn: {warning}", RuntimeWarning, stacklevel=2)
    adapter_dir = export_adapter(policy, tokenizer, output_dir) if output_dir is not None else None
    return SingleTurnResult(adapter_dir=adapter_dir, history=history)
