"""The parity job's policy and sampled rows, for the benchmarks that time one part of it.

``bench_update.py`` (its update; ``bench_decode.py``, retired, timed its generation) takes the
model, the adapter, the prompts and the group shape of ``bench_vs_trl.py --parity`` through these
options and loads them this way: the embedded model with the parity job's LoRA shape (an
adapter folder when given, else a fresh adapter with drawn B matrices, which costs the same),
and ``--prompts`` memorising prompts of the memory job (~560 tokens) repeated
``--group-size`` times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from memalpha.agent.memorise_prompts import chat_prompt_ids
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha_lab.vs_trl_job import build_job

PARITY_LORA = LoraSettings(r=16, alpha=32, dropout=0.0, target_modules="all-linear")
"""The LoRA shape of ``bench_vs_trl.py``'s jobs."""


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--adapter-path``, ``--prompts``, ``--group-size`` and ``--max-new-tokens``."""
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="embedded model name or local HF folder"
    )
    parser.add_argument(
        "--adapter-path", default=None, help="PEFT adapter folder (default: a fresh drawn adapter)"
    )
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts")
    parser.add_argument("--group-size", type=int, default=4, help="rows per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=112)


def check_job_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, *positive: str) -> None:
    """Exit with the parser's error when a count is below 1 or the adapter folder is not one."""
    for name in ("prompts", "group_size", "max_new_tokens", *positive):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.adapter_path and not (Path(args.adapter_path) / "adapter_config.json").is_file():
        parser.error(
            f"--adapter-path {args.adapter_path!r} is not a PEFT adapter folder (no adapter_config.json)"
        )


def load_job(args: argparse.Namespace, job_seed: int):
    """``(model, tokenizer, prompts, rows)``: the policy, the distinct prompts' token ids and the
    rows to sample (each prompt ``--group-size`` times in a row)."""
    model, tokenizer = load_policy(args.model, lora=PARITY_LORA, adapter_path=args.adapter_path)
    if not args.adapter_path:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 0.01)
    job = build_job(args.prompts, job_seed, args.max_new_tokens, "memory")
    prompts = [chat_prompt_ids(tokenizer, messages, {}) for messages, _ in job]
    return model, tokenizer, prompts, [prompt for prompt in prompts for _ in range(args.group_size)]


def job_settings(args: argparse.Namespace, prompts: list[list[int]], **more) -> dict:
    """The ``settings`` block of a report: the job's options, the prompts' lengths and ``more``."""
    return {
        "model": args.model, "adapter_path": args.adapter_path, "prompts": args.prompts,
        "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "seed": args.seed, "prompt_tokens": [len(p) for p in prompts], **more,
    }
