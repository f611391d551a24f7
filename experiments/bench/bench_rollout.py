"""Memory-agent rollout throughput and where a GRPO step's time goes, on the embedded model.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_rollout.py
      [--groups 1,4,8] [--instances 1,2,4] [--max-new-tokens 48] [--chunks 2] [--out PATH]
      [--engine hf,vllm [--vllm-venv .venv-vllm | --vllm-url URL]]
      [--adapter-path DIR [--kl-reference start]]

For every (group size n, instances per step) pair one GRPO step runs on synthetic training
instances (two chunks each by default: the first turn of every rollout starts from an empty
memory, the second from the memory that rollout wrote), driving the real code:
:class:`memalpha.train.module.GRPOModule` loads the policy (LoRA on the embedded
SmolLM2-135M-Instruct, fp32) and its local reader, :meth:`memalpha.agent.rollout.Agent.rollouts`
plays the memory agent chunk by chunk and lets the reader answer every question (it reports
both times), and the rest of the step is the module's own (:mod:`memalpha.train.step`):
:func:`~memalpha.train.step.collect_round` (rewards, advantages, reference log-probs under
``update.kl_reference``) and :func:`~memalpha.grpo.update.train_minibatch` (per micro-batch policy
log-probs, the clipped GRPO loss with the k3 KL term, backward, gradient clipping and an AdamW
step). Reported per pair: generated tokens/s and turns/s of
the agent's generation, reader questions/s, and the share of the step in rollout (agent
generation, parsing and tool execution), reader (answers and scoring) and training (reference
pass and update).

The policy starts from a fresh LoRA adapter, or from ``--adapter-path`` (a ``memalpha sft``
export); ``--kl-reference start`` then makes that adapter, frozen, the KL reference instead of
the base model, as ``model.update.kl_reference: start`` does in training.

``--engine hf,vllm`` runs every pair with both ways of sampling, alternating (hf, vllm, hf, ...
so slow drifts of a shared machine hit both alike): ``hf`` samples in this process as
``--backend`` (``model.rollout.backend``, default ``auto``) says, ``vllm`` through a vLLM server
(:class:`memalpha.train.engine_sync.EngineSync`, started from ``--vllm-venv`` unless ``--vllm-url``
names one) to which every step's adapter is synced before its rollouts, as in training; the sync
is timed apart (``sync s``) and counted in the step. For the ``vllm`` rows the JSON also holds
``sampler_logprob_gap``, computed outside the timed parts: the server's log-probs of its tokens
against the trainer's, held to ``rollout.vllm.max_logprob_gap`` as in training.

The configurations run in one process one after another, each starting from the adapter the
previous one left (the learning rate is small, so the policy barely moves); a short warm-up
step comes first and is not reported. The development machines have 2 shared CPU cores, so
the load average is recorded in the JSON; compare runs only at similar load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.synthetic import generate_synthetic
from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import KLReference, OptimizerSettings, UpdateSettings
from memalpha.grpo.update import ONE_PROCESS, Optimisation, train_minibatch
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.lm.logprobs.per_token import micro_batch_scorer
from memalpha.lm.sampling.backend import SAMPLING_BACKENDS
from memalpha.lm.sampling.vllm_settings import VllmSettings
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.settings import ReaderSettings
from memalpha.train.engine_sync import EngineSync
from memalpha.train.module import GRPOModule
from memalpha.train.step import collect_round
from memalpha_lab.common import (
    RESULTS_DIR,
    Stopwatch,
    command_line,
    gib,
    lifetime_peak_rss_bytes,
    machine_info,
    print_table,
    write_json,
)

DEFAULT_OUT = RESULTS_DIR / "bench_rollout.json"
ENGINES = ("hf", "vllm")
HEADERS = (
    "engine", "n", "inst", "turns", "gen tok", "tok/s", "turns/s", "questions", "q/s",
    "sync s", "rollout s", "reader s", "train s", "rollout %", "reader %", "train %",
)


def build_module(
    model: str,
    *,
    max_new_tokens: int,
    max_prompt_tokens: int,
    reader_max_new_tokens: int,
    micro_batch_size: int,
    learning_rate: float,
    seed: int,
    backend: str = "auto",
    adapter_path: str | None = None,
    kl_reference: str = "base",
) -> GRPOModule:
    """A GRPOModule with the tiny-CPU recipe's shapes (hermes calls, LoRA r 8), policy loaded;
    ``backend`` is its ``rollout.backend`` (in-process: the ``vllm`` rows bring their own server),
    ``adapter_path`` the adapter it starts from (and, under ``kl_reference: start``, its KL
    reference: ``update.kl_reference``)."""
    module = GRPOModule(
        model=model,
        adapter_path=adapter_path,
        lm=LMSettings(precision="fp32"),
        lora=LoraSettings(r=8, alpha=16, dropout=0.0, target_modules="all-linear"),
        rollout=RolloutSettings(
            group_size=1,
            max_new_tokens=max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
            temperature=1.0,
            call_format="hermes",
            memory_view_k=5,
            core_token_limit=128,
            backend=backend,
        ),
        reader=ReaderSettings(kind="local", max_new_tokens=reader_max_new_tokens, batch_size=16,
                              retrieval=RetrievalSettings(prompt_tokens=1024)),
        reward=RewardSettings(),
        update=UpdateSettings(kl_coef=0.001, kl_reference=kl_reference, micro_batch_size=micro_batch_size),
        optimizer=OptimizerSettings(learning_rate=learning_rate, weight_decay=0.01, warmup_ratio=0.0),
        seed=seed,
    )
    module.configure_model()
    return module


def bench_step(
    module: GRPOModule,
    instances,
    group_size: int,
    optimizer,
    seed: int,
    engine_sync: EngineSync | None = None,
) -> dict[str, Any]:
    """One GRPO step on ``instances`` at ``group_size``, through :mod:`memalpha.train.step` as
    :meth:`~memalpha.train.module.GRPOModule.training_step` runs it: the round collected
    (:func:`~memalpha.train.step.collect_round`: the agent's rollouts with the module's sampler,
    the reader, rewards, reference log-probs under ``update.kl_reference``), then its one
    mini-batch trained (:func:`~memalpha.grpo.update.train_minibatch`). Timings and counts.

    With ``engine_sync`` the agent's turns are sampled by its vLLM server, the policy's adapter
    synced to it first (``sync_s``), as :class:`~memalpha.train.module.GRPOModule` does."""
    with Stopwatch() as sync_watch:  # the round's own sync finds the server up to date
        if engine_sync is not None:
            engine_sync.sync(module.policy, module.tokenizer)
    rollout = dataclasses.replace(module.rollout_settings, group_size=group_size)
    sampler = None if engine_sync is None else engine_sync.sampler(module.policy, module.tokenizer)
    agent = dataclasses.replace(module.agent, rollout=rollout, sampler=sampler)
    collected = collect_round(
        agent, instances, module.update_settings, module.logprob_spec, ONE_PROCESS, seed=seed,
        where="benchmark round", engine=engine_sync,
    )
    out = collected.out
    if collected.nonfinite is not None or len(collected.batches) != 1:
        raise RuntimeError(f"the benchmark round gave {len(collected.batches)} mini-batches "
                           f"(non-finite: {collected.nonfinite}); it times one")
    params = [p for p in module.policy.parameters() if p.requires_grad]
    with Stopwatch() as update_watch:
        result = train_minibatch(
            micro_batch_scorer(module.policy, module.logprob_spec),
            collected.batches[0],
            module.update_settings,
            ONE_PROCESS,
            Optimisation(optimizer, params, module.optimizer_settings.grad_clip),
            max_response_len=module.rollout_settings.max_new_tokens,
        )
    if engine_sync is not None:
        engine_sync.policy_changed()
    ref_s = collected.metrics["perf/ref_old_logprob_s"]
    train_s = ref_s + update_watch.seconds
    step_s = sync_watch.seconds + out.rollout_s + out.reader_s + train_s
    questions = sum(len(r.questions) for r in out.records)
    turns = len(out.samples)
    return {
        "engine": "hf" if engine_sync is None else "vllm",
        "group_size": group_size,
        "instances": len(instances),
        "rollouts": len(out.records),
        "turns": turns,
        "generated_tokens": out.generated_tokens,
        "mean_prompt_tokens": sum(len(s.prompt_ids) for s in out.samples) / max(turns, 1),
        "mean_response_tokens": out.generated_tokens / max(turns, 1),
        "truncated_ratio": sum(s.truncated for s in out.samples) / max(turns, 1),
        "questions": questions,
        "sync_s": sync_watch.seconds,
        "rollout_s": out.rollout_s,
        "reader_s": out.reader_s,
        "ref_logprob_s": ref_s,
        "update_s": update_watch.seconds,
        "train_s": train_s,
        "step_s": step_s,
        "tokens_per_s": out.generated_tokens / out.rollout_s if out.rollout_s > 0 else 0.0,
        "turns_per_s": turns / out.rollout_s if out.rollout_s > 0 else 0.0,
        "questions_per_s": questions / out.reader_s if out.reader_s > 0 else 0.0,
        "sampler_logprob_gap": collected.metrics.get("rollout/sampler_logprob_gap"),
        "share": {
            "sync": sync_watch.seconds / step_s,
            "rollout": out.rollout_s / step_s,
            "reader": out.reader_s / step_s,
            "training": train_s / step_s,
        },
        "mean_reward": sum(s.reward for s in out.samples) / max(turns, 1),
        "peak_rss_gib_so_far": gib(lifetime_peak_rss_bytes()),
        "loss": result.metrics["loss"],
    }


def table_row(r: dict[str, Any]) -> list[Any]:
    return [
        r["engine"],
        r["group_size"],
        r["instances"],
        r["turns"],
        r["generated_tokens"],
        r["tokens_per_s"],
        r["turns_per_s"],
        r["questions"],
        r["questions_per_s"],
        r["sync_s"],
        r["rollout_s"],
        r["reader_s"],
        r["train_s"],
        100 * r["share"]["rollout"],
        100 * r["share"]["reader"],
        100 * r["share"]["training"],
    ]


def run_benchmark(
    model: str = "smollm2-135m-instruct",
    groups: Sequence[int] = (1, 4, 8),
    instances: Sequence[int] = (1, 2, 4),
    *,
    max_new_tokens: int = 48,
    chunks: int = 2,
    chunk_words: int = 60,
    questions: int = 2,
    max_prompt_tokens: int = 1536,
    reader_max_new_tokens: int = 24,
    micro_batch_size: int = 2,
    learning_rate: float = 1e-5,
    warmup: bool = True,
    seed: int = 0,
    engines: Sequence[str] = ("hf",),
    backend: str = "auto",
    vllm_venv: str = ".venv-vllm",
    vllm_url: str | None = None,
    vllm_dir: str | os.PathLike = "runs/bench_rollout_vllm",
    max_logprob_gap: float = VllmSettings.max_logprob_gap,
    out: str | os.PathLike | None = DEFAULT_OUT,
    verbose: bool = True,
    adapter_path: str | None = None,
    kl_reference: str = "base",
) -> dict[str, Any]:
    """Run every (group size, instances) pair with every engine; print the table; write the
    JSON to ``out`` (None: don't). The policy starts from ``adapter_path`` (a fresh adapter when
    None), its KL reference as ``kl_reference`` says (``update.kl_reference``)."""
    if not groups or not instances or min(groups) < 1 or min(instances) < 1:
        raise ValueError(
            f"groups and instances must be non-empty lists of positive ints, got {groups}, {instances}"
        )
    if not engines or any(e not in ENGINES for e in engines):
        raise ValueError(f"engines must be a non-empty list of {list(ENGINES)}, got {list(engines)}")
    machine = machine_info()
    module = build_module(
        model,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        reader_max_new_tokens=reader_max_new_tokens,
        micro_batch_size=micro_batch_size,
        learning_rate=learning_rate,
        seed=seed,
        backend=backend,
        adapter_path=adapter_path,
        kl_reference=kl_reference,
    )
    optimizer, _ = build_optimizer(
        [p for p in module.policy.parameters() if p.requires_grad], module.optimizer_settings
    )
    pool = generate_synthetic(
        max(instances), split="train", seed=seed, num_chunks=chunks, facts_per_chunk=2,
        questions_per_instance=questions, chunk_words=chunk_words,
    )
    syncs: dict[str, EngineSync | None] = {"hf": None}
    server_start_s = None
    if "vllm" in engines:
        settings = RolloutSettings(
            backend="vllm",
            max_new_tokens=max_new_tokens,
            max_prompt_tokens=max_prompt_tokens,
            vllm=VllmSettings(url=vllm_url, venv=vllm_venv, max_logprob_gap=max_logprob_gap),
        )
        syncs["vllm"] = EngineSync(settings, model, module.lora_settings.r, Path(vllm_dir), tag="bench")
        with Stopwatch() as start_watch:
            syncs["vllm"].start()
        server_start_s = start_watch.seconds
    try:
        if warmup:
            for engine in engines:
                bench_step(module, pool[:1], 1, optimizer, seed=seed + 10_000, engine_sync=syncs[engine])
        results: list[dict[str, Any]] = []
        report = {
            "benchmark": "bench_rollout",
            "command": command_line(),
            "model": f"{model} (fp32, LoRA r 8 all-linear, hermes calls)",
            "settings": {
                "groups": list(groups),
                "instances": list(instances),
                "max_new_tokens": max_new_tokens,
                "max_prompt_tokens": max_prompt_tokens,
                "synthetic": {
                    "chunks": chunks,
                    "chunk_words": chunk_words,
                    "facts_per_chunk": 2,
                    "questions": questions,
                },
                "reader_max_new_tokens": reader_max_new_tokens,
                "micro_batch_size": micro_batch_size,
                "learning_rate": learning_rate,
                "temperature": 1.0,
                "kl_coef": 0.001,
                "seed": seed,
                "engines": list(engines),
                "backend": backend,
                "adapter_path": adapter_path,
                "kl_reference": kl_reference,
                "vllm_server_start_s": server_start_s,
            },
            "columns": {
                "tokens_per_s": "agent tokens generated / rollout_s",
                "turns_per_s": "chunk turns (GRPO samples) / rollout_s",
                "questions_per_s": "reader answers (all rollouts' questions) / reader_s",
                "sync_s": "vllm: exporting the adapter and loading it into the server before the rollouts",
                "rollout_s": "agent generation, parsing and tool execution over all chunks",
                "reader_s": "reader answers and scoring",
                "train_s": "reference log-probs + policy log-probs, loss, backward, optimiser step",
            },
            "results": results,
            "complete": False,
        }
        planned = [(k, g, e) for k in range(len(instances)) for g in range(len(groups)) for e in engines]
        for k, g, engine in planned:
            n_instances, group_size = instances[k], groups[g]
            result = bench_step(
                module,
                pool[:n_instances],
                group_size,
                optimizer,
                seed=seed + 100 * k + g,
                engine_sync=syncs[engine],
            )
            results.append(result)
            report["complete"] = len(results) == len(planned)
            if out is not None:  # after every row, so a long run interrupted still leaves its finished rows
                write_json(report, out, machine=machine)
            if verbose:
                print(f"{engine} n={group_size} instances={n_instances}: step {result['step_s']:.1f} s "
                      f"({result['turns']} turns, {result['generated_tokens']} tokens)", flush=True)
        if verbose:
            print()
            print_table(HEADERS, [table_row(r) for r in results])
            if out is not None:
                print(f"wrote {out}")
        report["machine"] = machine
        return report
    finally:
        if syncs.get("vllm") is not None:
            syncs["vllm"].close()  # a server this run started stops with it

def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _engine_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ENGINES for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {list(ENGINES)}, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="embedded name or a local HF folder")
    parser.add_argument("--groups", type=_int_list, default=[1, 4, 8], help="group sizes n, e.g. 1,4,8")
    parser.add_argument(
        "--instances", type=_int_list, default=[1, 2, 4], help="instances per step, e.g. 1,2,4"
    )
    parser.add_argument("--max-new-tokens", type=int, default=48, help="agent response cap per chunk turn")
    parser.add_argument(
        "--chunks",
        type=int,
        default=2,
        help="synthetic chunks per instance (from the second on, each rollout sees its own memory)",
    )
    parser.add_argument("--chunk-words", type=int, default=60, help="synthetic chunk length in words")
    parser.add_argument("--questions", type=int, default=2, help="synthetic questions per instance")
    parser.add_argument("--reader-max-new-tokens", type=int, default=24)
    parser.add_argument("--micro-batch-size", type=int, default=2,
                        help="samples per forward/backward (8 x 1.2k-token turns needed > 12 GB RSS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warmup", action="store_true", help="skip the unreported warm-up step")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny run for tests: n 2, 1 instance, 1 chunk, 4 new tokens (with --model a tiny folder)",
    )
    parser.add_argument("--engine", type=_engine_list, default=["hf"],
                        help="rollout engines to compare, alternating: hf, vllm or hf,vllm")
    parser.add_argument("--backend", default="auto", choices=SAMPLING_BACKENDS,
                        help="how the hf rows sample in this process (model.rollout.backend; default auto)")
    parser.add_argument("--adapter-path", default=None,
                        help="PEFT adapter folder the policy starts from (default: a fresh adapter)")
    parser.add_argument("--kl-reference", default="base", choices=get_args(KLReference),
                        help="what the KL term pulls towards (model.update.kl_reference): the base model, "
                             "or the adapter the policy started from")
    parser.add_argument("--vllm-venv", default=".venv-vllm", help="venv of the vLLM server (make vllm-env)")
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server instead of starting one")
    parser.add_argument("--vllm-dir", default="runs/bench_rollout_vllm",
                        help="folder of the server's log and the synced adapter versions")
    parser.add_argument("--max-logprob-gap", type=float, default=VllmSettings.max_logprob_gap,
                        help="rollout.vllm.max_logprob_gap: a larger gap stops the run, as in training "
                             "(inf: report it only, e.g. against a fake server)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.smoke:
        args.groups, args.instances, args.max_new_tokens, args.chunks = [2], [1], 4, 1
        args.chunk_words, args.questions, args.reader_max_new_tokens, args.no_warmup = 20, 1, 4, True
    return run_benchmark(
        args.model,
        args.groups,
        args.instances,
        max_new_tokens=args.max_new_tokens,
        chunks=args.chunks,
        chunk_words=args.chunk_words,
        questions=args.questions,
        reader_max_new_tokens=args.reader_max_new_tokens,
        micro_batch_size=args.micro_batch_size,
        warmup=not args.no_warmup,
        seed=args.seed,
        engines=args.engine,
        backend=args.backend,
        vllm_venv=args.vllm_venv,
        vllm_url=args.vllm_url,
        vllm_dir=args.vllm_dir,
        max_logprob_gap=args.max_logprob_gap,
        out=args.out,
        adapter_path=args.adapter_path,
        kl_reference=args.kl_reference,
    )


if __name__ == "__main__":
    main()
