"""The single-turn trainer: prompts and a reward function in, a trained LoRA adapter out.

GRPO without the memory agent: a plain PyTorch loop over the step the Lightning module takes
(:mod:`memalpha.train.step`: group advantages and reference log-probs, then the clipped loss
and the optimiser step), on one process, for single-turn tasks and for comparing against other
GRPO trainers::

    from memalpha_lab.single_turn import SingleTurnSettings, train_single_turn

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memalpha.agent.memorise_prompts import chat_prompt_ids
from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import ONE_PROCESS, NonFiniteStreak, Optimisation, train_minibatch
from memalpha.lm.core.adapters import export_adapter, load_reference_adapter
from memalpha.lm.core.policy import LMSettings, LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.backend import check_backend
from memalpha.lm.sampling.generation import sampler_for
from memalpha.seeding import stable_seed
from memalpha.train.step import Samples, score_samples

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
        backend: How completions are sampled (``rollout.backend``'s in-process values:
            ``memalpha/lm/sampling/backend.py``).
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
    backend: str = "auto"
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
        check_backend(self.backend)
        if self.backend == "vllm":
            raise ValueError("backend: the single-turn trainer samples in this process; vllm is the agent's")
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


@dataclass
class _Setup:
    """What the loop trains with: the policy, its prompts as ids and texts, the optimiser, how
    log-probs are computed."""

    policy: Any
    tokenizer: Any
    encoded: list[list[int]]
    texts: list[str]
    params: list[torch.nn.Parameter]
    optimizer: Any
    scheduler: Any
    logprob_spec: LogprobSpec


def _setup(model: str, prompts: Sequence[str | list[dict[str, str]]], s: SingleTurnSettings) -> _Setup:
    torch.manual_seed(s.seed)
    policy, tokenizer = load_policy(
        model, precision=s.lm.precision, lora=s.lora, compute_dtype=s.lm.compute_dtype,
        gradient_checkpointing=s.lm.gradient_checkpointing, adapter_path=s.adapter_path,
        attention_score_mib=s.lm.attention_score_mib, upcast_unquantised=s.lm.upcast_unquantised,
    )
    if s.update.kl_reference == "start" and s.adapter_path:
        load_reference_adapter(policy, s.adapter_path)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, s.optimizer, max_steps=s.steps)
    return _Setup(
        policy, tokenizer, [_prompt_ids(tokenizer, p, s.chat_template_kwargs) for p in prompts],
        [p if isinstance(p, str) else p[-1]["content"] for p in prompts], params, optimizer, scheduler,
        LogprobSpec(temperature=s.temperature, micro_batch_size=s.update.micro_batch_size,
                    pad_id=tokenizer.pad_token_id, share_prefix=s.lm.share_prefix),
    )


def _prompt_batches(count: int, s: SingleTurnSettings) -> Iterator[list[int]]:
    """Endless batches of ``s.prompts_per_step`` prompt indices: seeded passes over all prompts."""
    rng = random.Random(s.seed)
    order: list[int] = []
    while True:
        picked = []
        for _ in range(s.prompts_per_step):
            if not order:
                order = list(range(count))
                rng.shuffle(order)
            picked.append(order.pop())
        yield picked


def _sample(run: _Setup, picked: list[int], step: int, s: SingleTurnSettings, reward_fn: RewardFn):
    """``s.group_size`` completions of every picked prompt and their rewards."""
    generation = sampler_for(run.policy, run.tokenizer, s.backend)(
        [run.encoded[i] for i in picked for _ in range(s.group_size)],
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed * 100_003 + step,
        share_prefix=s.lm.share_prefix,
    )
    completions = [run.tokenizer.decode(r, skip_special_tokens=True) for r in generation.response_ids]
    texts = [run.texts[i] for i in picked for _ in range(s.group_size)]
    rewards = torch.tensor([float(r) for r in reward_fn(texts, completions)])
    if rewards.numel() != len(completions):
        raise ValueError(f"reward_fn returned {rewards.numel()} rewards for {len(completions)} completions")
    return generation, rewards


def _update(run: _Setup, generation, rewards: torch.Tensor, groups: int, step: int, s: SingleTurnSettings):
    """The round's advantages and reference log-probs (:func:`~memalpha.train.step.score_samples`),
    then one optimiser step on it (:func:`~memalpha.grpo.update.train_minibatch`): the step the
    Lightning module takes, in one process. Returns the metrics, the gradient norm and what was
    non-finite (None: nothing)."""
    samples = Samples(generation.prompt_ids, generation.response_ids, rewards,
                      torch.arange(groups).repeat_interleave(s.group_size))
    scored = score_samples(run.policy, samples, s.update, run.logprob_spec, round_samples=len(samples),
                           seed=stable_seed(s.seed, "round", step))
    if scored.nonfinite is not None:
        return {"loss": math.nan, "kl": math.nan, "entropy": math.nan}, math.nan, scored.nonfinite
    (batch,) = scored.batches  # one mini-batch per round (SingleTurnSettings checks it)
    result = train_minibatch(
        micro_batch_scorer(run.policy, run.logprob_spec),
        batch,
        s.update,
        ONE_PROCESS,
        Optimisation(run.optimizer, run.params, s.optimizer.grad_clip, scheduler=run.scheduler),
        max_response_len=s.max_new_tokens,
    )
    run.optimizer.zero_grad(set_to_none=True)
    return result.metrics, result.grad_norm, result.problem


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
    run = _setup(model, prompts, s)
    batches = _prompt_batches(len(run.encoded), s)
    history: list[dict[str, float]] = []
    streak = NonFiniteStreak(s.optimizer.max_consecutive_nonfinite)
    for step, picked in zip(range(s.steps), batches):
        start = time.perf_counter()
        generation, rewards = _sample(run, picked, step, s, reward_fn)
        gen_s = time.perf_counter() - start
        metrics, grad_norm, problem = _update(run, generation, rewards, len(picked), step, s)
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
    adapter_dir = export_adapter(run.policy, run.tokenizer, output_dir) if output_dir is not None else None
    return SingleTurnResult(adapter_dir=adapter_dir, history=history)
