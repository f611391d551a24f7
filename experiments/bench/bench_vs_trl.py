"""The same single-turn GRPO job run by memalpha's single-turn trainer and by TRL's ``GRPOTrainer``, side by side.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_vs_trl.py
      (needs the ``bench`` extra: ``pip install -e '.[bench]' -c constraints.txt``)

The job: the embedded SmolLM2-135M-Instruct (``--model`` to change) with a fresh LoRA adapter
(r 16, alpha 32, dropout 0, all linear layers) learns to write valid memory tool calls. Each
prompt is one memorising turn: one synthetic chunk (``memalpha.data.synthetic``, train split)
wrapped in :func:`memalpha.agent.prompts.memorise_messages` with an empty memory and the ``hermes``
call format. The reward, shared by both sides, is tool-call validity: the share of a reply's
calls (parse errors count as failed calls) that execute on a fresh :class:`memalpha.memory.store.Memory`,
0 for a reply without calls. The memalpha side is :func:`memalpha.train.single_turn.train_single_turn`.

Both sides get the same settings: fp32 on CPU, no gradient checkpointing, ``group_size``
samples for each of ``prompts_per_step`` prompts per optimiser step (one generation round
over all of them, then forward/backward in micro-batches of ``micro_batch_size`` sequences
whose gradients add up to one optimiser step), the same completion cap, temperature
(top-p 1, top-k off), AdamW with a constant learning rate, weight decay 0 and gradient norm
clip 1, PPO clip 0.2 both ways, group-normalised advantages, the k3 KL to the base model
(adapter disabled) weighted by ``--kl-coef`` (TRL ``beta``, with its importance-sampling
correction of the KL term switched off because memalpha has none), and token-mean loss
aggregation over the whole step (TRL ``loss_type="dapo"``: sum over every completion token
of the generation batch / their count, as memalpha's ``token-mean`` with its global
normaliser; ``bnpo`` would divide by each micro-batch's own count). TRL runs without vLLM, logs nowhere (``report_to="none"``) and saves nothing.

Measurement: the runs alternate memalpha, TRL, memalpha, TRL, ... (``--repeats`` pairs) so
drift of the shared machine hits both sides alike. Every run is a fresh Python subprocess
so its peak RSS (``getrusage``, imports and model included) is its own. Per-step wall time
counts generation, reward, reference and policy passes, backward and the optimiser step;
step 0 of every run is dropped as warm-up when a run has more than one step. Generated
tokens/s is completion tokens (up to and including the end-of-turn token) per second of
step time; "gen tok/s" divides by generation time only. Sampling differs between the two
implementations, so the completion lengths differ too: compare tokens/s, not only step time.
The table goes to stdout and the JSON report to ``experiments/results/bench_vs_trl.json``.

``--parity``: the learning-parity check of ``memalpha/lab/parity.py``: the arms ``memalpha``,
``trl`` and ``memalpha-lr0`` (memalpha at learning rate 0, the negative control), ``--repeats``
fresh runs each at seeds ``--seed``, ``--seed + 1``, ..., one JSON per finished run in
``--runs-dir`` (finished runs are not run again; ``--summary-only`` only reads them), and once
all are in, Welch's 95 % interval of each arm's last-``--window``-step mean reward minus TRL's
against ``±--margin``. The report goes to ``experiments/results/bench_vs_trl_parity.json`` and
its plot next to it (docs/results.md, "Learning parity").

``--exact``: no training runs. One identical batch through memalpha's update path and TRL's
``GRPOTrainer`` loss (``memalpha/lab/trl_exact.py``): per loss aggregation (memalpha
``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm`` against TRL ``dapo``,
``grpo``, ``dr_grpo``), KL off and on, the largest differences of the per-token log-probs, the
loss and the LoRA gradient, end to end and on the same float64 log-probs, against their
tolerances. The table goes to stdout, the report to ``experiments/results/bench_vs_trl_exact.json``
(about a minute on a CPU; exits 1 when a setting is outside its tolerance).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memalpha.lab import parity as _parity
from memalpha.lab.common import (
    RESULTS_DIR,
    command_line,
    current_rss_bytes,
    git_commit,
    lifetime_peak_rss_bytes,
    load_average,
    machine_info,
    print_table,
    write_json,
)

SIDES = ("memalpha", "trl")
JOBS = ("validity", "memory")
RESULT_MARKER = "BENCH_VS_TRL_RESULT "
DEFAULT_OUT = RESULTS_DIR / "bench_vs_trl.json"
PARITY_OUT = RESULTS_DIR / "bench_vs_trl_parity.json"
PARITY_RUNS_DIR = RESULTS_DIR / "parity"
EXACT_OUT = RESULTS_DIR / "bench_vs_trl_exact.json"
MIB = 2**20


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
        for name in ("prompts_per_step", "max_new_tokens", "steps", "micro_batch_size", "lora_r", "lora_alpha"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size() % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) must divide prompts_per_step * group_size ({self.batch_size()})"
            )
        if self.num_prompts < 0 or self.threads < 0:
            raise ValueError("num_prompts and threads must be >= 0")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.job not in JOBS:
            raise ValueError(f"job must be one of {JOBS}, got {self.job!r}")
        if check_adapter and self.adapter_path and not (Path(self.adapter_path) / "adapter_config.json").is_file():
            raise ValueError(f"adapter_path {self.adapter_path!r} is not a PEFT adapter folder (no adapter_config.json)")


# ----------------------------------------------------------------------------- the job


def build_prompts(count: int, seed: int, response_token_limit: int | None = None) -> list[list[dict[str, str]]]:
    """``count`` memorising prompts (``[system, user]`` messages), one synthetic chunk each, empty memory."""
    return [messages for messages, _ in build_job(count, seed, response_token_limit, "validity")]


# configs/tiny_cpu.yaml's synthetic shape and prompt profile: the memory job's SFT adapter knows them
MEMORY_JOB_SYNTHETIC = {
    "num_chunks": 2, "facts_per_chunk": 2, "distractors_per_chunk": 0, "questions_per_instance": 2,
    "chunk_words": 60, "families": ("synth_personal", "synth_timeline"),
}


def build_job(count: int, seed: int, response_token_limit: int | None, job: str) -> list[tuple[list[dict[str, str]], list[str]]]:
    """``count`` prompts of ``job`` with the facts each prompt's chunk tells (empty for ``validity``)."""
    from memalpha.agent.prompts import memorise_messages
    from memalpha.data.synthetic import generate_synthetic
    from memalpha.memory.render import render_memorise
    from memalpha.memory.store import Memory
    from memalpha.tools.formats import get_call_format

    call_format = get_call_format("hermes")
    view = render_memorise(Memory())
    if job == "validity":
        instances = generate_synthetic(count, split="train", seed=seed)
        return [(memorise_messages(view, inst.chunks[0], call_format, response_token_limit), []) for inst in instances]
    instances = generate_synthetic(count, split="train", seed=seed, **MEMORY_JOB_SYNTHETIC)
    return [
        (
            memorise_messages(view, inst.chunks[0], call_format, response_token_limit, profile="compact"),
            [note["fact"] for note in inst.metadata["notes"][0]],
        )
        for inst in instances
    ]


def tool_call_validity(completions: Sequence[str]) -> list[float]:
    """Per completion: calls that execute ok on a fresh memory / calls attempted (parse errors included); 0 if none."""
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
        out.append((outcome.successes / outcome.attempts if outcome.attempts else 0.0, " ".join(stored.lower().split())))
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


def _lora(settings: BenchSettings):
    from memalpha.lm.core.policy import LoraSettings

    return LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha, dropout=0.0, target_modules="all-linear")


def run_memalpha(settings: BenchSettings, learning_rate: float | None = None) -> dict[str, Any]:
    """Train with :func:`memalpha.train.single_turn.train_single_turn`; per-step records and setup time.

    ``learning_rate``: overrides ``settings.learning_rate``; 0 gives the parity check's
    no-update arm (AdamW at learning rate 0 leaves every weight as it was, all else runs).
    """
    from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
    from memalpha.lm.core.policy import LMSettings
    from memalpha.train.single_turn import SingleTurnSettings, train_single_turn

    start = time.perf_counter()
    job = build_job(settings.pool_size(), settings.seed, settings.max_new_tokens, settings.job)
    prompts = [messages for messages, _ in job]
    loop = SingleTurnSettings(
        steps=settings.steps,
        prompts_per_step=settings.prompts_per_step,
        group_size=settings.group_size,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        lm=LMSettings(precision="fp32"),
        lora=_lora(settings),
        adapter_path=settings.adapter_path or None,
        update=UpdateSettings(
            kl_coef=settings.kl_coef,
            kl_reference="start",  # with a fresh adapter the same as the base; from an adapter TRL's choice
            clip_low=0.2,
            clip_high=0.2,
            loss_agg="token-mean",
            advantage_scale="group",
            micro_batch_size=settings.micro_batch_size,
        ),
        optimizer=OptimizerSettings(
            name="adamw", learning_rate=settings.learning_rate, weight_decay=0.0, warmup_ratio=0.0, grad_clip=1.0
        ),
        seed=settings.seed,
    )
    if learning_rate is not None:
        # OptimizerSettings refuses 0 (a training run at 0 is a mistake); the no-update arm sets it after validation
        loop.optimizer.learning_rate = learning_rate
    first_step_end: list[float] = []

    def on_step(record: dict[str, float]) -> None:
        if not first_step_end:
            first_step_end.append(time.perf_counter())

    result = train_single_turn(settings.model, prompts, job_reward(settings, job), loop, on_step=on_step)
    steps = [
        {
            "step_s": r["step_s"],
            "gen_s": r["gen_s"],
            "generated_tokens": int(r["generated_tokens"]),
            "reward": r["reward"],
            "kl": r["kl"],
        }
        for r in result.history
    ]
    setup_s = first_step_end[0] - start - steps[0]["step_s"] if steps else time.perf_counter() - start
    return {"steps": steps, "setup_s": setup_s, "learning_rate": loop.optimizer.learning_rate}


def run_trl(settings: BenchSettings) -> dict[str, Any]:
    """Train with ``trl.GRPOTrainer`` on the same job; per-step records and setup time."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path

    start = time.perf_counter()
    path = str(resolve_model_path(settings.model))
    tokenizer = load_tokenizer(path)
    job = build_job(settings.pool_size(), settings.seed, settings.max_new_tokens, settings.job)
    dataset = Dataset.from_list([{"prompt": messages} for messages, _ in job])
    job_reward_fn = job_reward(settings, job)
    generations: list[tuple[float, int]] = []

    class TimedGRPOTrainer(GRPOTrainer):
        """Records the wall time and token count of every generation round."""

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            begin = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            generations.append((time.perf_counter() - begin, sum(len(c) for c in completion_ids)))
            return completion_ids, logprobs

    if not hasattr(GRPOTrainer, "_generate_single_turn"):
        raise RuntimeError("this TRL has no GRPOTrainer._generate_single_turn; install the version in constraints.txt")

    def reward(prompts, completions, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return job_reward_fn([p[-1]["content"] if isinstance(p, list) else p for p in prompts], texts)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.began = 0.0
            self.train_began: float | None = None
            self.step_s: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.train_began = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self.began)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs))

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl_") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            max_steps=settings.steps,
            per_device_train_batch_size=settings.micro_batch_size,
            gradient_accumulation_steps=settings.batch_size() // settings.micro_batch_size,
            num_generations=settings.group_size,
            max_completion_length=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=1.0,
            top_k=0,
            learning_rate=settings.learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            beta=settings.kl_coef,
            use_bias_correction_kl=False,
            epsilon=0.2,
            epsilon_high=0.2,
            num_iterations=1,
            loss_type="dapo",
            scale_rewards="group",
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            model_init_kwargs={"dtype": "float32"},
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
            push_to_hub=False,
            seed=settings.seed,
            data_seed=settings.seed,
        )
        model: Any = path
        peft_config = _lora(settings).to_peft()
        if settings.adapter_path:
            import torch
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            model, peft_config = PeftModel.from_pretrained(base, settings.adapter_path, is_trainable=True), None
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[timer],
        )
        trainer.train()
    if len(timer.step_s) != settings.steps or len(generations) != settings.steps:
        raise RuntimeError(
            f"TRL ran {len(timer.step_s)} steps and {len(generations)} generation rounds, expected {settings.steps} of each"
        )
    steps = []
    for index, step_s in enumerate(timer.step_s):
        log = timer.logs[index] if index < len(timer.logs) else {}
        steps.append(
            {
                "step_s": step_s,
                "gen_s": generations[index][0],
                "generated_tokens": generations[index][1],
                "reward": float(log.get("reward", float("nan"))),
                "kl": float(log.get("kl", float("nan"))),
            }
        )
    setup_s = (timer.train_began or start) - start
    return {"steps": steps, "setup_s": setup_s}


RUNNERS: dict[str, Callable[[BenchSettings], dict[str, Any]]] = {
    "memalpha": run_memalpha,
    "trl": run_trl,
    "memalpha-lr0": lambda settings: run_memalpha(settings, learning_rate=0.0),
}


def child_main(side: str, settings: BenchSettings) -> None:
    """Run one side in this process and print its result as one marked JSON line on stdout."""
    import torch

    if settings.threads:
        torch.set_num_threads(settings.threads)
    rss_after_import = current_rss_bytes()
    load_before = load_average()
    began = time.perf_counter()
    result = RUNNERS[side](settings)
    result.update(
        side=side,
        wall_s=time.perf_counter() - began,
        rss_after_import_mib=rss_after_import / MIB,
        peak_rss_mib=lifetime_peak_rss_bytes() / MIB,
        torch_threads=torch.get_num_threads(),
        load_before=load_before,
        load_after=load_average(),
    )
    print(RESULT_MARKER + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- the driver


def run_child(side: str, settings: BenchSettings, timeout_s: float) -> dict[str, Any]:
    """One run of ``side`` in a fresh interpreter; returns its parsed result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--settings", json.dumps(asdict(settings))]
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-4000:]
        raise RuntimeError(f"{side} run failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len(RESULT_MARKER) :])
    result["process_s"] = time.perf_counter() - began
    return result


def kept_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of a run that count: all but step 0 (warm-up) when the run has more than one."""
    steps = run["steps"]
    return steps[1:] if len(steps) > 1 else steps


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled statistics over the kept steps of one side's runs."""
    steps = [s for run in runs for s in kept_steps(run)]
    step_s = [s["step_s"] for s in steps]
    gen_s = [s["gen_s"] for s in steps]
    tokens = sum(s["generated_tokens"] for s in steps)
    return {
        "runs": len(runs),
        "steps_kept": len(steps),
        "step_s_median": statistics.median(step_s),
        "step_s_min": min(step_s),
        "step_s_max": max(step_s),
        "gen_s_median": statistics.median(gen_s),
        "train_s_median": statistics.median(s["step_s"] - s["gen_s"] for s in steps),
        "tokens_per_step_mean": tokens / len(steps),
        "tokens_per_s": tokens / sum(step_s),
        "gen_tokens_per_s": tokens / sum(gen_s),
        "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        "rss_after_import_mib": max(run["rss_after_import_mib"] for run in runs),
        "setup_s_median": statistics.median(run["setup_s"] for run in runs),
        "reward_mean": statistics.fmean(s["reward"] for s in steps),
    }


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """memalpha / TRL for the headline figures (below 1 is better for times and memory, above 1 for tokens/s)."""
    keys = ("step_s_median", "gen_s_median", "train_s_median", "tokens_per_s", "gen_tokens_per_s", "peak_rss_mib")
    return {key: ours[key] / theirs[key] if theirs[key] else float("nan") for key in keys}


TABLE_HEADERS = (
    "side", "runs", "steps", "step s med", "min", "max", "gen s", "train s", "tok/step",
    "tok/s", "gen tok/s", "peak RSS MiB", "reward",
)


def table_rows(summary: dict[str, dict[str, Any]], ratio: dict[str, float] | None) -> list[list[Any]]:
    rows = []
    for side, s in summary.items():
        rows.append([
            side, s["runs"], s["steps_kept"], s["step_s_median"], s["step_s_min"], s["step_s_max"],
            s["gen_s_median"], s["train_s_median"], s["tokens_per_step_mean"], s["tokens_per_s"],
            s["gen_tokens_per_s"], s["peak_rss_mib"], s["reward_mean"],
        ])
    if ratio is not None:
        rows.append([
            "memalpha/trl", None, None, ratio["step_s_median"], None, None, ratio["gen_s_median"],
            ratio["train_s_median"], None, ratio["tokens_per_s"], ratio["gen_tokens_per_s"], ratio["peak_rss_mib"], None,
        ])
    return rows


def build_report(settings: BenchSettings, repeats: int, sides: Sequence[str], runs: dict[str, list[dict[str, Any]]],
                 order: list[str]) -> dict[str, Any]:
    """The report over the runs so far; ``complete`` is False until every planned run is in."""
    summary = {side: summarise(done) for side, done in runs.items() if done}
    ratio = ratios(summary["memalpha"], summary["trl"]) if set(SIDES) <= set(summary) else None
    learning = learning_summary(runs, settings.steps) if any(runs.values()) else None
    return {"settings": asdict(settings), "repeats": repeats, "complete": len(order) == repeats * len(sides),
            "order": order, "summary": summary, "ratio_memalpha_over_trl": ratio, "learning": learning, "runs": runs}


def learning_summary(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """Mean reward per step of each side (mean, min and max over its runs) and each run's mean
    reward over the last half of its steps. A description only: the learning comparison is the
    parity mode's (``memalpha/lab/parity.py``)."""
    window = max(1, steps // 2)
    per_side: dict[str, Any] = {}
    for side in [side for side in runs if runs.get(side)]:
        curves = [[s["reward"] for s in run["steps"]] for run in runs[side]]
        per_side[side] = {
            "reward_per_step_mean": [statistics.fmean(c[i] for c in curves) for i in range(steps)],
            "reward_per_step_min": [min(c[i] for c in curves) for i in range(steps)],
            "reward_per_step_max": [max(c[i] for c in curves) for i in range(steps)],
            "final_window_per_run": [statistics.fmean(c[-window:]) for c in curves],
        }
        per_side[side]["final_window_mean"] = statistics.fmean(per_side[side]["final_window_per_run"])
    return {"final_window_steps": window, "sides": per_side}


def benchmark(
    settings: BenchSettings,
    repeats: int,
    sides: Sequence[str],
    timeout_s: float,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Alternate the sides ``repeats`` times (A B A B ...) at ``settings.seed`` and summarise;
    returns the report.

    ``on_run`` gets the report so far after every run (the driver writes it, so a run killed
    from outside still leaves the finished runs on disk).
    """
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    order: list[str] = []
    for repeat in range(repeats):
        for side in sides:
            print(f"[bench_vs_trl] repeat {repeat + 1}/{repeats}: {side} ...", file=sys.stderr, flush=True)
            result = run_child(side, settings, timeout_s)
            result["repeat"] = repeat
            result["seed"] = settings.seed
            runs[side].append(result)
            order.append(side)
            steps = ", ".join(f"{s['step_s']:.1f}" for s in result["steps"])
            print(f"[bench_vs_trl]   steps (s): {steps}; peak RSS {result['peak_rss_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
            if on_run is not None:
                on_run(build_report(settings, repeats, sides, runs, order))
    return build_report(settings, repeats, sides, runs, order)


# ----------------------------------------------------------------------------- the parity check


def parity_report(settings: BenchSettings, arms: Sequence[str], seeds: Sequence[int],
                  found: dict[tuple[int, str], dict[str, Any]], margin: float, window: int) -> dict[str, Any]:
    """The parity report over complete runs: timing per arm (step time as in the timing mode,
    step 0 dropped) with memalpha / TRL, the reward curves and the verdicts."""
    runs = {arm: [found[(seed, arm)] for seed in seeds] for arm in arms}
    summary = {arm: summarise(done) for arm, done in runs.items()}
    ratio = ratios(summary["memalpha"], summary["trl"]) if {"memalpha", "trl"} <= set(summary) else None
    return {
        "settings": asdict(settings), "arms": list(arms), "seeds": list(seeds),
        "run_ids": {arm: [run["run_id"] for run in done] for arm, done in runs.items()},
        "summary": summary, "ratio_memalpha_over_trl": ratio,
        "learning": _parity.summarise_learning(runs, margin, settings.steps, window), "runs": runs,
    }


def parity(args: argparse.Namespace, settings: BenchSettings, extra: dict[str, Any]) -> dict[str, Any] | None:
    """Run (or, with ``--summary-only``, only read) the parity check's runs; with all of them on
    disk, print and write the report. Returns it, or None while runs are missing."""
    arms = _names(args.arms, _parity.ARMS, "--arms")
    seeds = [settings.seed + i for i in range(args.repeats)]
    digest = args.settings_digest or _parity.settings_digest(asdict(settings))
    runs_dir = Path(args.runs_dir)
    todo = _parity.plan(arms, seeds)
    if not args.summary_only and "trl" in arms:  # reading stored runs needs no TRL
        _require_trl()

    def log(line: str) -> None:
        print(f"[parity] {line}", file=sys.stderr, flush=True)

    def run_one(arm: str, seed: int) -> dict[str, Any]:
        seeded = replace(settings, seed=seed)
        run = run_child(arm, seeded, args.timeout)
        run.update(settings=asdict(seeded), code=git_commit())
        return run

    log(f"settings digest {digest}, runs in {runs_dir}")
    if args.summary_only:
        found = _parity.load_runs(runs_dir, todo, digest)
    else:
        found = _parity.execute(todo, runs_dir, digest, run_one, log)
    missing = [_parity.run_id(arm, seed, digest) for seed, arm in todo if (seed, arm) not in found]
    if missing:
        for (seed, arm), run in sorted(found.items()):
            log(f"finished {arm} seed {seed}: last-{args.window} mean {_parity.final_mean(run, args.window):.3f}")
        log(f"{len(missing)} of {len(todo)} runs missing, no summary: {', '.join(missing)}")
        return None
    report = parity_report(settings, arms, seeds, found, args.margin, args.window)
    report.update(extra, runs_dir=str(runs_dir), settings_digest=digest)
    print_table(TABLE_HEADERS, table_rows(report["summary"], report["ratio_memalpha_over_trl"]))
    learning = report["learning"]
    rows = [[arm, *data["final_window_per_run"], data["final_window_mean"]] for arm, data in learning["arms"].items()]
    print_table(["arm", *[f"seed {s}" for s in seeds], f"mean of last {args.window}"], rows, floats=3)
    print("\n".join(_parity.verdict_lines(learning)))
    out = Path(args.out) if args.out else PARITY_OUT
    path = write_json(report, out)
    title = f"{settings.job} job, {len(seeds)} seeds a side, {settings.steps} steps"
    _parity.plot(learning, title, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return report


# ----------------------------------------------------------------------------- the exact check


EXACT_HEADERS = (
    "memalpha agg / TRL loss_type, kl", "logp diff", "ours vs fp64", "TRL vs fp64", "loss memalpha",
    "loss diff", "grad norm", "grad diff (rel)", "same-logp loss diff", "same-logp grad diff", "ok",
)


def _sci(value: float) -> str:
    return f"{value:.1e}"


def exact_rows(report: dict[str, Any]) -> list[list[Any]]:
    """One table row per setting of the ``--exact`` report (differences in scientific notation)."""
    return [
        [
            row["setting"], _sci(row["logprob_max_abs_diff"]), _sci(row["logprob_memalpha_vs_fp64"]),
            _sci(row["logprob_trl_vs_fp64_own_positions"]), f"{row['loss_memalpha']:.6f}",
            _sci(row["loss_abs_diff"]), f"{row['grad_norm_memalpha']:.4f}", _sci(row["grad_max_abs_rel"]),
            _sci(row["same_logps_loss_abs_diff"]), _sci(row["same_logps_grad_max_abs_diff"]),
            "yes" if row["passed"] else "NO",
        ]
        for row in report["settings"]
    ]


def exact(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """Run the exact check of ``_trl_exact.py``, print its table, write its report; returns it."""
    _require_trl()
    from memalpha.lab import trl_exact as _trl_exact

    machine = machine_info()
    report = _trl_exact.run_all()
    report.update(extra, notes=(
        "one batch, no training: memalpha's update path and TRL's GRPOTrainer loss on the same prompts, "
        "responses, advantages, old and reference log-probs and LoRA weights (float64 model); "
        "'vs fp64': against a float64 log-softmax of the full logits (TRL's at its own position numbering); "
        "'same-logp': both losses on memalpha's float64 log-probs; see memalpha/lab/trl_exact.py"
    ))
    print_table(EXACT_HEADERS, exact_rows(report))
    tolerances = ", ".join(f"{key} {value:g}" for key, value in report["tolerances"].items())
    print(f"tolerances: {tolerances}")
    print("all settings within tolerance" if report["passed"] else "SOME SETTINGS OUTSIDE TOLERANCE")
    path = write_json(report, Path(args.out) if args.out else EXACT_OUT, machine=machine)
    print(f"wrote {path}")
    return report


# ----------------------------------------------------------------------------- the command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=defaults.model, help="embedded model name or local HF folder")
    parser.add_argument("--prompts-per-step", type=int, default=defaults.prompts_per_step)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimiser steps per run")
    parser.add_argument("--micro-batch-size", type=int, default=defaults.micro_batch_size,
                        help="sequences per forward/backward; must divide prompts-per-step * group-size")
    parser.add_argument("--num-prompts", type=int, default=defaults.num_prompts,
                        help="prompt pool size (0: prompts-per-step * steps)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef)
    parser.add_argument("--lora-r", type=int, default=defaults.lora_r)
    parser.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha)
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="the seed (timing); with --parity run i of every arm uses seed + i")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch threads per run (0: default)")
    parser.add_argument("--job", choices=JOBS, default=defaults.job,
                        help="validity: tool-call validity; memory: validity plus the chunk's facts stored")
    parser.add_argument("--adapter-path", default=defaults.adapter_path,
                        help="start both sides from this PEFT adapter (a memalpha sft export)")
    parser.add_argument("--parity", action="store_true",
                        help="the learning-parity check (memalpha/lab/parity.py): --repeats fresh runs of each "
                             f"of --arms, one JSON each in --runs-dir, the report in {PARITY_OUT.name} unless --out")
    parser.add_argument("--exact", action="store_true",
                        help="no training: memalpha's and TRL's log-probs, loss and LoRA gradient on one "
                             "identical batch (memalpha/lab/trl_exact.py), the report in "
                             f"{EXACT_OUT.name} unless --out")
    parser.add_argument("--arms", default=",".join(_parity.ARMS),
                        help=f"with --parity: comma-separated subset of {','.join(_parity.ARMS)}")
    parser.add_argument("--margin", type=float, default=_parity.DEFAULT_MARGIN,
                        help="with --parity: the equivalence margin on the mean reward (0-2 scale)")
    parser.add_argument("--window", type=int, default=_parity.DEFAULT_WINDOW,
                        help="with --parity: the last steps whose mean reward is each run's result")
    parser.add_argument("--runs-dir", default=str(PARITY_RUNS_DIR),
                        help="with --parity: one JSON per finished run; finished runs are not run again")
    parser.add_argument("--summary-only", action="store_true",
                        help="with --parity: run nothing, rebuild the report from --runs-dir")
    parser.add_argument("--settings-digest", default=None,
                        help="with --summary-only: the runs' settings digest (their file names' last part), "
                             "for a checkout without the adapter folder they started from")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each side, alternating (with --parity: fresh runs of each arm, seed + i)")
    parser.add_argument("--sides", default="memalpha,trl", help="comma-separated subset of memalpha,trl")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--out", default=None, help=f"JSON report path (default {DEFAULT_OUT.name})")
    parser.add_argument("--child", choices=tuple(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    names = {f.name for f in fields(BenchSettings)}
    settings = BenchSettings(**{name: getattr(args, name) for name in names})
    # a summary of stored runs named by their digest needs no adapter folder
    settings.validate(check_adapter=not (args.summary_only and args.settings_digest))
    return settings


def _names(text: str, known: Sequence[str], flag: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise SystemExit(f"{flag} must name some of {tuple(known)}, got {text!r}")
    return names


def _require_trl() -> None:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install -e '.[bench]' -c constraints.txt (or leave trl out)")


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, BenchSettings(**json.loads(args.settings)))
        return None
    settings = settings_from_args(args)
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    try:
        trl_version = importlib.metadata.version("trl")  # without importing it (seconds of transformers)
    except importlib.metadata.PackageNotFoundError:
        trl_version = None
    extra = {
        "command": command_line(),
        "trl_version": trl_version,
        "notes": (
            "step 0 of each run dropped as warm-up when a run has more than one step; "
            "runs alternate the sides, each in a fresh subprocess; peak RSS is the run's lifetime peak "
            "(imports and model included); the machine is shared, see machine.load_average and runs[*].load_*"
        ),
    }
    if args.exact:
        report = exact(args, extra)
        if not report["passed"]:
            raise SystemExit(1)
        return report
    if args.parity:
        return parity(args, settings, extra)
    sides = _names(args.sides, SIDES, "--sides")
    if "trl" in sides:
        _require_trl()
    machine = machine_info()
    out = Path(args.out) if args.out else DEFAULT_OUT
    report = benchmark(
        settings, args.repeats, sides, args.timeout,
        on_run=lambda partial: write_json({**partial, **extra}, out, machine=machine),
    )
    report.update(extra)
    print_table(TABLE_HEADERS, table_rows(report["summary"], report["ratio_memalpha_over_trl"]))
    learning = report["learning"]
    if learning is not None:
        rows = [[side, *data["reward_per_step_mean"], data["final_window_mean"]] for side, data in learning["sides"].items()]
        print_table(["side", *[f"step {i}" for i in range(settings.steps)], "final"], rows, floats=3)
    path = write_json(report, out, machine=machine)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
