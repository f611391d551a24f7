"""The same single-turn GRPO job run by memalpha's single-turn trainer and by TRL's ``GRPOTrainer``,
side by side.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_vs_trl.py
      (needs the ``bench`` extra: ``pip install -e '.[bench]' -c constraints.txt``)

The job: the embedded SmolLM2-135M-Instruct (``--model`` to change) with a fresh LoRA adapter
(r 16, alpha 32, dropout 0, all linear layers) learns to write valid memory tool calls. Each
prompt is one memorising turn: one synthetic chunk (``memalpha.data.synthetic``, train split)
wrapped in :func:`memalpha.agent.memorise_prompts.memorise_messages` with an empty memory and the ``hermes``
call format. The reward, shared by both sides, is tool-call validity: the share of a reply's
calls (parse errors count as failed calls) that execute on a fresh :class:`memalpha.memory.store.Memory`,
0 for a reply without calls. The memalpha side is :func:`memalpha_lab.single_turn.train_single_turn`.

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
normaliser; ``bnpo`` would divide by each micro-batch's own count). TRL runs without vLLM, logs nowhere
(``report_to="none"``) and saves nothing.

Measurement: the runs alternate memalpha, TRL, memalpha, TRL, ... (``--repeats`` pairs) so
drift of the shared machine hits both sides alike. Every run is a fresh Python subprocess
so its peak RSS (``getrusage``, imports and model included) is its own. Per-step wall time
counts generation, reward, reference and policy passes, backward and the optimiser step;
step 0 of every run is dropped as warm-up when a run has more than one step. Generated
tokens/s is completion tokens (up to and including the end-of-turn token) per second of
step time; "gen tok/s" divides by generation time only. Sampling differs between the two
implementations, so the completion lengths differ too: compare tokens/s, not only step time.
The table goes to stdout and the JSON report to ``experiments/results/bench_vs_trl.json``.

``--parity``: the learning-parity check of ``experiments/lab/memalpha_lab/parity.py``: the arms ``memalpha``,
``trl`` and ``memalpha-lr0`` (memalpha at learning rate 0, the negative control), ``--repeats``
fresh runs each at seeds ``--seed``, ``--seed + 1``, ..., one JSON per finished run in
``--runs-dir`` (finished runs are not run again; ``--summary-only`` only reads them), and once
all are in, Welch's 95 % interval of each arm's last-``--window``-step mean reward minus TRL's
against ``±--margin``. The report goes to ``experiments/results/bench_vs_trl_parity.json`` and
its plot next to it (docs/results.md, "Learning parity").

``--exact``: no training runs. One identical batch through memalpha's update path and TRL's
``GRPOTrainer`` loss (``experiments/lab/memalpha_lab/trl_exact.py``): per loss aggregation (memalpha
``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm`` against TRL ``dapo``,
``grpo``, ``dr_grpo``), KL off and on, the largest differences of the per-token log-probs, the
loss and the LoRA gradient, end to end and on the same float64 log-probs, against their
tolerances. The table goes to stdout, the report to ``experiments/results/bench_vs_trl_exact.json``
(about a minute on a CPU; exits 1 when a setting is outside its tolerance).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab import vs_trl_parity
from memalpha_lab.common import (
    command_line,
    current_rss_bytes,
    lifetime_peak_rss_bytes,
    load_average,
    machine_info,
    print_table,
    write_json,
)
from memalpha_lab.parity import ARMS
from memalpha_lab.vs_trl_job import SIDES, BenchSettings, build_job, job_reward
from memalpha_lab.vs_trl_options import (
    DEFAULT_OUT,
    EXACT_OUT,
    names,
    parse_args,
    require_trl,
    settings_from_args,
)
from memalpha_lab.vs_trl_report import TABLE_HEADERS, build_report, table_rows

RESULT_MARKER = "BENCH_VS_TRL_RESULT "
MIB = 2**20


def _lora(settings: BenchSettings):
    from memalpha.lm.core.policy import LoraSettings

    return LoraSettings(
        r=settings.lora_r, alpha=settings.lora_alpha, dropout=0.0, target_modules="all-linear"
    )


def run_memalpha(settings: BenchSettings, learning_rate: float | None = None) -> dict[str, Any]:
    """Train with :func:`memalpha_lab.single_turn.train_single_turn`; per-step records and setup time.

    ``learning_rate``: overrides ``settings.learning_rate``; 0 gives the parity check's
    no-update arm (AdamW at learning rate 0 leaves every weight as it was, all else runs).
    """
    from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
    from memalpha.lm.core.policy import LMSettings
    from memalpha_lab.single_turn import SingleTurnSettings, train_single_turn

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
            name="adamw",
            learning_rate=settings.learning_rate,
            weight_decay=0.0,
            warmup_ratio=0.0,
            grad_clip=1.0,
        ),
        seed=settings.seed,
    )
    if learning_rate is not None:
        # OptimizerSettings refuses 0 (a training run at 0 is a mistake); the no-update arm sets it
        # after validation
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
        raise RuntimeError(
            "this TRL has no GRPOTrainer._generate_single_turn; install the version in constraints.txt"
        )

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
            model, peft_config = (
                PeftModel.from_pretrained(base, settings.adapter_path, is_trainable=True),
                None,
            )
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
            f"TRL ran {len(timer.step_s)} steps and {len(generations)} "
            f"generation rounds, expected {settings.steps} of each"
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
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        side,
        "--settings",
        json.dumps(asdict(settings)),
    ]
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-4000:]
        raise RuntimeError(f"{side} run failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len(RESULT_MARKER) :])
    result["process_s"] = time.perf_counter() - began
    return result


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



def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv, __doc__.split("\n\n")[0])
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
        require_trl()
        from memalpha_lab import trl_exact  # torch: only this mode imports it in the driver

        return trl_exact.check(Path(args.out) if args.out else EXACT_OUT, extra)
    if args.parity:
        if not args.summary_only and "trl" in names(args.arms, ARMS, "--arms"):  # stored runs need no TRL
            require_trl()
        return vs_trl_parity.run(args, settings, extra, run_child)
    sides = names(args.sides, SIDES, "--sides")
    if "trl" in sides:
        require_trl()
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
        rows = [[side, *data["reward_per_step_mean"], data["final_window_mean"]]
                for side, data in learning["sides"].items()]
        print_table(["side", *[f"step {i}" for i in range(settings.steps)], "final"], rows, floats=3)
    path = write_json(report, out, machine=machine)
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
