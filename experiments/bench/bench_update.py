"""Time of one GRPO update on the parity job's batch, through the update's successive paths.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_update.py
          [--adapter-path runs/learning_curve/sft/adapter]

The batch is ``bench_vs_trl.py --parity``'s: the embedded model with an adapter samples
``--prompts`` memorising prompts of the memory job (~560 tokens) ``--group-size`` times each, up
to ``--max-new-tokens`` tokens, once, with a fixed seed; the rewards are drawn and become the
round's mini-batch as in training (:func:`memalpha.train.step.score_samples`). Then
:func:`memalpha.grpo.update.train_minibatch` (the loss's forward and backward, in micro-batches of
``--micro-batch-size`` with the prompt prefix shared, and an optimiser step at learning rate 0 so
every path starts from the same weights) runs on that batch along
four paths, each adding one change to the one before, alternating ``--repeats`` times in one
process:

* ``padded``   -- every response padded to the longest of its micro-batch, the prompt's cache
                  repeated to each row; the head's log-probs under activation checkpointing;
                  PEFT's LoRA forward (the update before fix 5);
* ``packed``   -- the responses of each distinct prompt one after another in one row, without
                  padding (:func:`memalpha.lm.core.prompt_sharing.packed_response_hidden`; fix 5);
* ``streamed`` -- the head's log-probs through its hand-written backward
                  (:class:`memalpha.lm.logprobs.per_token.HeadLogprob`; fix 6);
* ``accumulated`` -- each LoRA product added into its base output in place
                  (:mod:`memalpha.lm.core.modes`; fix 6): the default.

All must give the same loss and gradients up to float32 rounding; the report holds the
relative difference of each path's gradients from ``padded``'s. Without ``--adapter-path`` a
fresh adapter with drawn B matrices stands in. Writes ``experiments/results/bench_update.json``
(``--out`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import ONE_PROCESS, Optimisation, train_minibatch
from memalpha.lm.core import prompt_sharing
from memalpha.lm.logprobs import per_token
from memalpha.lm.logprobs.per_token import micro_batch_scorer
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.generation import sampler_for
from memalpha.train.step import Samples, score_samples
from memalpha_lab.common import command_line, machine_info, print_table, write_json
from memalpha_lab.parity_job import add_job_arguments, check_job_arguments, job_settings, load_job

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench_update.json"
PATHS = ("padded", "packed", "streamed", "accumulated")


def _no_switch(model):
    return contextlib.nullcontext(0)


def run_path(path: str, model, batch: GRPOBatch, settings: UpdateSettings, pad_id: int, max_len: int):
    """One update's forward and backward along ``path``: seconds, loss and the gradients."""
    level = PATHS.index(path)
    saved = (prompt_sharing.packed_response_hidden, per_token.streams_head, per_token.accumulated_adapters,
             prompt_sharing.accumulated_adapters)
    if level < PATHS.index("packed"):
        prompt_sharing.packed_response_hidden = lambda *args: None
    if level < PATHS.index("streamed"):
        per_token.streams_head = lambda head, config: False
    if level < PATHS.index("accumulated"):
        per_token.accumulated_adapters = prompt_sharing.accumulated_adapters = _no_switch
    try:
        model.zero_grad(set_to_none=True)
        params = [p for p in model.parameters() if p.requires_grad]
        # the step training takes, with a zero learning rate and no clipping: every path starts from
        # the same weights and leaves its gradients to compare
        hold_still = Optimisation(torch.optim.SGD(params, lr=0.0), params, grad_clip=0.0)
        logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=settings.micro_batch_size, pad_id=pad_id,
                              share_prefix=True)
        start = time.perf_counter()
        result = train_minibatch(micro_batch_scorer(model, logprob_spec), batch, settings, ONE_PROCESS,
                                 hold_still, max_response_len=max_len)
        seconds = time.perf_counter() - start
    finally:
        (prompt_sharing.packed_response_hidden, per_token.streams_head, per_token.accumulated_adapters,
         prompt_sharing.accumulated_adapters) = saved
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return seconds, result.metrics["loss"], grads


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4, help="rounds of the four paths, alternating")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS), help="JSON report path")
    args = parser.parse_args(argv)
    check_job_arguments(parser, args, "micro_batch_size", "repeats")
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = machine_info()
    torch.manual_seed(args.seed)
    model, tokenizer, prompts, rows = load_job(args, job_seed=0)
    sampled = sampler_for(model, tokenizer, "auto")(rows, max_new_tokens=args.max_new_tokens, seed=args.seed)
    groups = torch.arange(args.prompts).repeat_interleave(args.group_size)
    drawn = torch.randn(len(rows), generator=torch.Generator().manual_seed(args.seed))  # the rewards
    settings = UpdateSettings(kl_coef=0.0, loss_agg="token-mean", micro_batch_size=args.micro_batch_size)
    logprob_spec = LogprobSpec(temperature=1.0, micro_batch_size=args.micro_batch_size,
                          pad_id=tokenizer.pad_token_id)
    samples = Samples(sampled.prompt_ids, sampled.response_ids, drawn, groups)
    scored = score_samples(model, samples, settings, logprob_spec, round_samples=len(rows), seed=args.seed)
    (batch,) = scored.batches
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    losses: dict[str, float] = {}
    grads: dict[str, torch.Tensor] = {}
    model.train()
    for repeat in range(args.repeats):
        for path in PATHS:
            took, losses[path], grads[path] = run_path(
                path, model, batch, settings, tokenizer.pad_token_id, args.max_new_tokens
            )
            seconds[path].append(took)
            print(f"[bench_update] repeat {repeat + 1}/{args.repeats} {path}: {took:.2f} s", flush=True)
    reference = grads["padded"]
    summary = {
        path: {
            "runs": len(values), "update_s_median": statistics.median(values),
            "update_s_min": min(values), "update_s_max": max(values), "loss": losses[path],
            "over_padded": statistics.median(values) / statistics.median(seconds["padded"]),
            "gradient_relative_difference": float((grads[path] - reference).norm() / reference.norm()),
        }
        for path, values in seconds.items()
    }
    lengths = [len(r) for r in batch.response_ids]
    print_table(
        ["path", "runs", "update s med", "min", "max", "x padded", "loss", "grad diff"],
        [
            [
                path,
                s["runs"],
                s["update_s_median"],
                s["update_s_min"],
                s["update_s_max"],
                s["over_padded"],
                s["loss"],
                f"{s['gradient_relative_difference']:.1e}",
            ]
            for path, s in summary.items()
        ],
        floats=3,
    )
    print(f"response lengths {lengths}")
    report = {
        "benchmark": "bench_update",
        "command": command_line(),
        "settings": job_settings(
            args, prompts, micro_batch_size=args.micro_batch_size, response_tokens=lengths
        ),
        "summary": summary,
        "ratio_packed_over_padded": summary["packed"]["over_padded"],
        "ratio_default_over_padded": summary["accumulated"]["over_padded"],
        "runs": seconds,
    }
    path = write_json(report, args.out, machine=machine)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
