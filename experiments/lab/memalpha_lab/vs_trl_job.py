"""The job ``experiments/bench/bench_vs_trl.py`` runs on both sides, memalpha's single-turn
trainer and TRL's ``GRPOTrainer``: its settings (:class:`BenchSettings`), its prompts (one
memorising turn each, :func:`build_job`) and its rewards (:func:`tool_call_validity`,
:func:`memory_job_reward`). ``bench_update.py`` (through :mod:`memalpha_lab.parity_job`) and
``profile_grpo_step.py`` time parts of the same job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SIDES = ("memalpha", "trl")
JOBS = ("validity", "memory")


@dataclass
class BenchSettings:
    """One benchmark job; every field is shared by both sides.

    Args:
        model: embedded model name or a local HF folder.
        prompts_per_step: distinct prompts per optimiser step.
        group_size: samples per prompt (TRL ``num_generations``).
        max_new_tokens: completion length cap (TRL ``max_completion_length``).
        steps: optimiser steps per run.
        micro_batch_size: sequences per forward/backward (memalpha ``micro_batch_size``, TRL
            ``per_device_train_batch_size`` with ``gradient_accumulation_steps`` making up the step);
            gradients of the step's micro-batches are accumulated before the one optimiser step.
        num_prompts: size of the prompt pool (0: ``prompts_per_step * steps``, so each run
            sees every prompt once).
        temperature: sampling temperature (also scales the scored distribution).
        learning_rate: AdamW learning rate (constant).
        kl_coef: k3 KL weight (memalpha ``kl_coef``, TRL ``beta``); 0 skips the reference pass.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        seed: seed of prompts, sampling and adapter init.
        threads: torch intra-op threads in each run (0: torch's default).
        job: ``validity`` (the reward is tool-call validity; full prompts, the synthetic default
            shape) or ``memory`` (validity plus the share of the chunk's facts the reply stores;
            the compact prompts and synthetic shape of ``configs/tiny_cpu.yaml``, the job its
            SFT adapter was trained for).
        adapter_path: start both sides from this PEFT adapter (a ``memalpha sft`` export) instead
            of a fresh one; ``lora_r`` and ``lora_alpha`` are then ignored. The KL reference is
            then that starting adapter on both sides (TRL copies it; memalpha runs with
            ``update.kl_reference: start``).
    """

    model: str = "smollm2-135m-instruct"
    prompts_per_step: int = 2
    group_size: int = 4
    max_new_tokens: int = 48
    steps: int = 4
    micro_batch_size: int = 2
    num_prompts: int = 0
    temperature: float = 1.0
    learning_rate: float = 1e-5
    kl_coef: float = 0.04
    lora_r: int = 16
    lora_alpha: int = 32
    seed: int = 0
    threads: int = 0
    job: str = "validity"
    adapter_path: str = ""

    def batch_size(self) -> int:
        """Completions per optimiser step."""
        return self.prompts_per_step * self.group_size

    def pool_size(self) -> int:
        return self.num_prompts or self.prompts_per_step * self.steps

    def validate(self, check_adapter: bool = True) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (TRL refuses smaller groups), got {self.group_size}")
        counts = ("prompts_per_step", "max_new_tokens", "steps", "micro_batch_size", "lora_r", "lora_alpha")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size() % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) must divide prompts_per_step * group_size "
                f"({self.batch_size()})"
            )
        if self.num_prompts < 0 or self.threads < 0:
            raise ValueError("num_prompts and threads must be >= 0")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.job not in JOBS:
            raise ValueError(f"job must be one of {JOBS}, got {self.job!r}")
        folder = Path(self.adapter_path)
        if check_adapter and self.adapter_path and not (folder / "adapter_config.json").is_file():
            raise ValueError(
                f"adapter_path {self.adapter_path!r} is not a PEFT adapter folder (no adapter_config.json)"
            )


def build_prompts(
    count: int, seed: int, response_token_limit: int | None = None
) -> list[list[dict[str, str]]]:
    """``count`` memorising prompts (``[system, user]`` messages), one synthetic chunk each, empty memory."""
    return [messages for messages, _ in build_job(count, seed, response_token_limit, "validity")]


# configs/tiny_cpu.yaml's synthetic shape and prompt profile: the memory job's SFT adapter knows them
MEMORY_JOB_SYNTHETIC = {
    "num_chunks": 2, "facts_per_chunk": 2, "distractors_per_chunk": 0, "questions_per_instance": 2,
    "chunk_words": 60, "families": ("synth_personal", "synth_timeline"),
}


def build_job(
    count: int, seed: int, response_token_limit: int | None, job: str
) -> list[tuple[list[dict[str, str]], list[str]]]:
    """``count`` prompts of ``job`` with the facts each prompt's chunk tells (empty for ``validity``)."""
    from memalpha.agent.memorise_prompts import memorise_messages, render_memorise
    from memalpha.data.synthetic import generate_synthetic
    from memalpha.memory.store import Memory
    from memalpha.tools.formats import get_call_format

    call_format = get_call_format("hermes")
    view = render_memorise(Memory())
    if job == "validity":
        instances = generate_synthetic(count, split="train", seed=seed)
        return [
            (memorise_messages(view, inst.chunks[0], call_format, response_token_limit), [])
            for inst in instances
        ]
    instances = generate_synthetic(count, split="train", seed=seed, **MEMORY_JOB_SYNTHETIC)
    return [
        (
            memorise_messages(view, inst.chunks[0], call_format, response_token_limit, detail="compact"),
            [note["fact"] for note in inst.metadata["notes"][0]],
        )
        for inst in instances
    ]


def tool_call_validity(completions: Sequence[str]) -> list[float]:
    """Per completion: calls that execute ok on a fresh memory / calls attempted (parse errors
    included); 0 if none."""
    return [validity for validity, _ in _executed(completions)]


def _executed(completions: Sequence[str]) -> list[tuple[float, str]]:
    """Per completion: its tool-call validity and the text its calls stored (lower-cased)."""
    from memalpha.memory.store import Memory
    from memalpha.tools.executor import execute_response
    from memalpha.tools.formats import get_call_format

    call_format = get_call_format("hermes")
    out = []
    for text in completions:
        memory = Memory()
        outcome = execute_response(memory, text, call_format)
        stored = " ".join(e.content for e in memory.semantic + memory.episodic) + " " + memory.core
        validity = outcome.successes / outcome.attempts if outcome.attempts else 0.0
        out.append((validity, " ".join(stored.lower().split())))
    return out


def _normalised(fact: str) -> str:
    return " ".join(fact.lower().rstrip(".").split())


def memory_job_reward(completions: Sequence[str], facts: Sequence[Sequence[str]]) -> list[float]:
    """Per completion: tool-call validity plus the share of its chunk's facts the calls stored (0 to 2)."""
    rewards = []
    for (validity, stored), chunk_facts in zip(_executed(completions), facts, strict=True):
        share = sum(_normalised(f) in stored for f in chunk_facts) / len(chunk_facts) if chunk_facts else 0.0
        rewards.append(validity + share)
    return rewards


def job_reward(settings: BenchSettings, prompts: list[tuple[list[dict[str, str]], list[str]]]):
    """``reward(user_texts, completions)`` of the job; the facts are looked up by the prompt's chunk turn."""
    facts_of = {messages[-1]["content"]: facts for messages, facts in prompts}

    def reward(user_texts: Sequence[str], completions: Sequence[str]) -> list[float]:
        if settings.job == "validity":
            return tool_call_validity(completions)
        return memory_job_reward(completions, [facts_of[text] for text in user_texts])

    return reward
