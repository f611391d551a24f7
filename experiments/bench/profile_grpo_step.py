"""Where one single-turn GRPO step spends its time: phases and the busiest operators.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/profile_grpo_step.py [--no-share-prefix]

The job is the memalpha side of ``bench_vs_trl.py`` (embedded SmolLM2-135M-Instruct, fp32,
LoRA r 16 on all linear layers, 2 memorising prompts x group 4, 48 new tokens, k3 KL 0.04,
micro-batch 2). One warm-up step runs unprofiled; the next runs under ``torch.profiler`` with
a ``record_function`` label on each phase: generation, reference log-probs (the fresh adapter's
reference is the base; :func:`memalpha.train.step.score_samples`), the policy pass (log-probs,
loss and backward, micro-batch by micro-batch) and the optimiser step (no clipping), the last two
:func:`memalpha.grpo.update.train_minibatch`, the step ``memalpha fit`` takes. Prints the
phase table and the ten operators with the most self CPU time; writes
``experiments/results/profile_grpo_step[_no_share].json``. ``--no-share-prefix`` turns the
shared-prefix cache off in every phase, for the before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import ONE_PROCESS, Optimisation, train_minibatch
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.logprobs.per_token import micro_batch_scorer
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import sampler_for
from memalpha.train.step import Samples, score_samples
from memalpha_lab.common import (
    RESULTS_DIR,
    command_line,
    lifetime_peak_rss_bytes,
    machine_info,
    print_table,
    write_json,
)
from memalpha_lab.vs_trl_job import build_prompts, tool_call_validity

PHASES = ("generate", "reference_logprobs", "policy_loss_backward", "optimizer_step")
MAX_NEW_TOKENS = 48
UPDATE = UpdateSettings(kl_coef=0.04, micro_batch_size=2)  # PPO clip 0.2 both ways, token-mean
# no clipping
OPTIMIZER = OptimizerSettings(learning_rate=1e-5, weight_decay=0.0, warmup_ratio=0.0, grad_clip=0.0)


def one_step(
    policy, tokenizer, prompts: list[list[int]], group_size: int, seed: int, optimizer, share: bool
) -> int:
    """Generation, reward, reference pass, policy pass with backward, optimiser step; returns
    tokens generated."""
    pad_id = tokenizer.pad_token_id
    group_prompts = [p for p in prompts for _ in range(group_size)]
    with torch.profiler.record_function("generate"):
        out = sampler_for(policy, tokenizer, "auto")(
            group_prompts, max_new_tokens=MAX_NEW_TOKENS, seed=seed, share_prefix=share
        )
    completions = [tokenizer.decode(r, skip_special_tokens=True) for r in out.response_ids]
    rewards = torch.tensor(tool_call_validity(completions))
    groups = torch.arange(len(prompts)).repeat_interleave(group_size)
    samples = Samples(out.prompt_ids, out.response_ids, rewards, groups)
    logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=UPDATE.micro_batch_size, pad_id=pad_id,
                          share_prefix=share)
    labels = {"logprobs": "reference_logprobs", "gradients": "policy_loss_backward",
              "optimizer": "optimizer_step"}

    def clock(stage: str):
        return torch.profiler.record_function(labels[stage])

    scored = score_samples(policy, samples, UPDATE, logprob_spec, round_samples=len(samples), seed=seed,
                           clock=clock)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimisation = Optimisation(optimizer, params, OPTIMIZER.grad_clip)
    for batch in scored.batches:
        train_minibatch(micro_batch_scorer(policy, logprob_spec), batch, UPDATE, ONE_PROCESS, optimisation,
                        max_response_len=MAX_NEW_TOKENS, clock=clock)
    return out.num_generated_tokens


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--no-share-prefix", action="store_true", help="compute every row's prompt in full")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default under experiments/results/)"
    )
    args = parser.parse_args(argv)
    share = not args.no_share_prefix
    out_path = args.out or RESULTS_DIR / (
        "profile_grpo_step.json" if share else "profile_grpo_step_no_share.json"
    )
    machine = machine_info()
    torch.manual_seed(0)
    policy, tokenizer = load_policy(args.model, lora=LoraSettings(r=16, alpha=32, dropout=0.0))
    optimizer, _ = build_optimizer([p for p in policy.parameters() if p.requires_grad], OPTIMIZER)
    prompts = [
        list(
            tokenizer.apply_chat_template(
                m, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for m in build_prompts(4, seed=0, response_token_limit=MAX_NEW_TOKENS)
    ]
    one_step(policy, tokenizer, prompts[:2], 4, seed=1, optimizer=optimizer, share=share)  # warm-up
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tokens = one_step(policy, tokenizer, prompts[2:], 4, seed=2, optimizer=optimizer, share=share)
    step_s = time.perf_counter() - start
    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    phases = [(name, by_name[name].cpu_time_total / 1e6) for name in PHASES if name in by_name]
    ops = sorted(
        (e for e in events if e.key not in PHASES), key=lambda e: e.self_cpu_time_total, reverse=True
    )[:10]
    total_self = sum(e.self_cpu_time_total for e in events) or 1.0
    print(f"share_prefix={share}: step {step_s:.1f} s (profiled), {tokens} tokens generated, "
          f"mean prompt {sum(map(len, prompts[2:])) / 2:.0f} tokens")
    print_table(("phase", "s", "% of step"), [(n, s, 100 * s / step_s) for n, s in phases])
    print()
    print_table(
        ("operator", "self CPU s", "% of self CPU", "calls"),
        [
            (e.key, e.self_cpu_time_total / 1e6, 100 * e.self_cpu_time_total / total_self, e.count)
            for e in ops
        ],
    )
    report = {
        "benchmark": "profile_grpo_step",
        "command": command_line(),
        "share_prefix": share,
        "step_s": step_s,
        "generated_tokens": tokens,
        "phases_s": dict(phases),
        "top_ops_self_cpu_s": {e.key: e.self_cpu_time_total / 1e6 for e in ops},
        "peak_rss_gib": lifetime_peak_rss_bytes() / 2**30,
    }
    write_json(report, out_path, machine=machine)
    print(f"wrote {out_path}")
    return report


if __name__ == "__main__":
    main()
