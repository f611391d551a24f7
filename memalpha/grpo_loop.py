"""GRPO without the memory agent: prompts and a reward function in, a trained LoRA adapter out.

A plain PyTorch loop over the same pieces the Lightning module uses (policy loading,
batched generation, chunked log-probs, group advantages, the clipped loss), for
single-turn tasks and for comparing against other GRPO trainers::

    from memalpha.grpo_loop import GRPOLoopSettings, train_grpo

    def reward(prompts, completions):
        return [float("<tool_call>" in c) for c in completions]

    result = train_grpo("smollm2-135m-instruct", ["Store: Anna likes tea."], reward,
                        GRPOLoopSettings(steps=10), output_dir="runs/single_turn_adapter")
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memalpha.adapters import export_adapter
from memalpha.grpo import group_advantages
from memalpha.grpo_step import LossSettings, accumulate_grpo_gradients, response_logprobs
from memalpha.policy import LoraSettings, generate, load_policy

RewardFn = Callable[[list[str], list[str]], Sequence[float]]


@dataclass
class GRPOLoopSettings:
    """Knobs of the plain GRPO loop (names as in :class:`memalpha.module.GRPOModule`).

    Args:
        steps: Optimiser steps (one rollout round each).
        prompts_per_step: Prompts per step; each is sampled ``group_size`` times.
        group_size: Completions per prompt (the GRPO group).
        max_new_tokens: Completion length cap.
        temperature: Sampling temperature (also used for the log-probs).
        top_p: Nucleus sampling threshold.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        grad_clip: Max global gradient norm (0 disables).
        kl_coef: k3 KL weight to the reference (adapters disabled); 0 skips the reference pass.
        clip_low: Lower PPO clip.
        clip_high: Upper PPO clip.
        loss_agg: Loss aggregation (``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``).
        advantage_scale: ``group``, ``batch`` or ``none``.
        micro_batch_size: Sequences per forward/backward.
        precision: ``fp32``, ``bf16`` or ``nf4``.
        gradient_checkpointing: Recompute decoder activations in backward: far less activation
            memory for long prompts, about one more forward pass of time, and the policy pass
            then reruns the shared prompt prefix for every sequence instead of once per step.
        share_prefix: Compute the prompt tokens that rows share (a common system prompt, a group's
            repeated prompt) once and reuse their key/value cache, in generation and in the
            reference and policy passes; off runs every row in full (same results up to rounding).
        lora: LoRA adapter shape.
        seed: Seed of prompt order, sampling and LoRA init.
        chat_template_kwargs: Extra chat-template arguments (e.g. ``{"enable_thinking": False}``).
    """

    steps: int = 10
    prompts_per_step: int = 2
    group_size: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    kl_coef: float = 0.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token-mean"
    advantage_scale: str = "group"
    micro_batch_size: int = 8
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    share_prefix: bool = True
    lora: LoraSettings = field(default_factory=LoraSettings)
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GRPOLoopResult:
    adapter_dir: Path | None
    history: list[dict[str, float]]


def _prompt_ids(tokenizer, prompt: str | list[dict[str, str]], chat_kwargs: dict[str, Any]) -> list[int]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **chat_kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def train_grpo(
    model: str,
    prompts: Sequence[str | list[dict[str, str]]],
    reward_fn: RewardFn,
    settings: GRPOLoopSettings | None = None,
    *,
    output_dir: str | Path | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> GRPOLoopResult:
    """Train a LoRA adapter with GRPO on single-turn prompts scored by ``reward_fn(prompts, completions)``."""
    s = settings or GRPOLoopSettings()
    if not prompts:
        raise ValueError("train_grpo needs at least one prompt")
    torch.manual_seed(s.seed)
    policy, tokenizer = load_policy(
        model, precision=s.precision, lora=s.lora, gradient_checkpointing=s.gradient_checkpointing
    )
    encoded = [_prompt_ids(tokenizer, p, s.chat_template_kwargs) for p in prompts]
    texts = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.learning_rate, weight_decay=s.weight_decay)
    loss_settings = LossSettings(
        clip_low=s.clip_low,
        clip_high=s.clip_high,
        kl_coef=s.kl_coef,
        loss_agg=s.loss_agg,
        micro_batch_size=s.micro_batch_size,
        temperature=s.temperature,
        max_len=s.max_new_tokens,
        share_prefix=s.share_prefix,
    )
    order: list[int] = []
    rng = random.Random(s.seed)
    history: list[dict[str, float]] = []
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
            share_prefix=s.share_prefix,
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
        batch: dict[str, Any] = {
            "prompt_ids": generation.prompt_ids,
            "response_ids": generation.response_ids,
            "advantages": group_advantages(rewards, group_ids, scale=s.advantage_scale),
            "old_logps": None,
            "ref_logps": None,
        }
        if s.kl_coef > 0:
            with policy.disable_adapter():
                batch["ref_logps"] = response_logprobs(
                    policy,
                    generation.prompt_ids,
                    generation.response_ids,
                    temperature=s.temperature,
                    micro_batch_size=s.micro_batch_size,
                    pad_id=tokenizer.pad_token_id,
                    share_prefix=s.share_prefix,
                )
        optimizer.zero_grad(set_to_none=True)
        metrics, finite = accumulate_grpo_gradients(
            policy,
            batch,
            loss_settings,
            pad_id=tokenizer.pad_token_id,
            token_normaliser=max(float(sum(len(r) for r in generation.response_ids)), 1.0),
            seq_normaliser=float(len(generation.response_ids)),
            backward=lambda loss: loss.backward(),
        )
        grad_norm = float("nan")
        if finite:
            if s.grad_clip > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.grad_clip))
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - start
        record = {
            "step": float(step),
            "reward": rewards.mean().item(),
            "reward_std": rewards.std(unbiased=False).item(),
            "loss": metrics["loss"],
            "kl": metrics["kl"],
            "entropy": metrics["entropy"],
            "grad_norm": grad_norm,
            "skipped_nonfinite": float(not finite),
            "generated_tokens": float(generation.num_generated_tokens),
            "gen_s": gen_s,
            "step_s": step_s,
            "gen_tokens_per_s": generation.num_generated_tokens / gen_s if gen_s > 0 else math.nan,
        }
        history.append(record)
        if on_step is not None:
            on_step(record)
    adapter_dir = export_adapter(policy, tokenizer, output_dir) if output_dir is not None else None
    return GRPOLoopResult(adapter_dir=adapter_dir, history=history)
