"""memalpha against TRL on the memory task itself (issue 46, item 3): step time, memory, tokens, reward and
held-out accuracy of ``memalpha fit`` and of TRL's ``GRPOTrainer`` with memalpha's task as its environment.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/memory_vs_trl.py --reuse
          [--seeds 0,1,2] [--steps 6] [--val 48] [--run-dir runs/memory_vs_trl]
          [--out experiments/results/memory_vs_trl.json]

The job, the same on both sides: the embedded SmolLM2-135M policy from one SFT start (the decisive study's
start recipe: oracle demonstrations of 24 instances, 16 SFT steps), LoRA r 8 on every linear layer, the
decisive recipe (r1 from the extractive reader, 4 instances a step, group 4, 112 new tokens, learning rate
2e-4, KL 0.001, token-mean loss), memalpha's reward, ``--steps`` optimiser steps on synthetic training
instances of **one chunk** (data seed 6910 + seed), then ``memalpha validate`` of each side's adapter on
``--val`` held-out instances of the usual two-chunk task (data seed 6900, no earlier study's) with the
local 135M reader.

Why one chunk: in TRL's tool loop the agent must call ``read_next_chunk`` to see chunk 2, which nothing in
the shared SFT start taught, so on two-chunk instances TRL's rollouts would stop after chunk 1 and the
comparison would measure that. With one chunk TRL's loop expresses the task exactly: its rows carry
memalpha's own memorising prompt (:func:`memalpha.integrations.trl_environment.memorising_rows`, with
:func:`~memalpha.integrations.trl_environment.use_memorising_template`: TRL's Qwen2.5 template and
parser without the tool schemas it would add to the system message), the policy answers once
(``max_completion_length`` = memalpha's 112 new tokens, so a tool result never earns a second
response), its calls run on the rollout's memory, and the environment's reward is
memalpha's ``R_t`` of that one turn. A first try with TRL's template as shipped (its tool schemas in
the system message beside memalpha's own tool lines) had the SFT start write broken calls: every
tool call of the first step failed and every reward was 0.

TRL's micro-batch is memalpha's ``update.micro_batch_size`` (4 rows; the 16 rollouts of a step are one
generation batch and one optimiser step on both sides): with all 16 rows in one forward and backward,
TRL's process grew past 21 GB and was killed by the out-of-memory killer on the 23 GB machine.

Each side runs as its own subprocess, the sides alternating within a seed; per side the JSON holds the
median step time and the phases each side logs (memalpha: sampling, reader, log-probs, update; TRL: the
step only), the subprocess's peak RSS (``os.wait4``) and CPU seconds, the tokens sampled per second of
step, the reward of every step, and held-out local-reader accuracy; across seeds, memalpha - TRL on the
step time ratio and on accuracy (paired per held-out instance, t over seeds).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha.tools.executor import SUCCESS_STATUSES
from memalpha_lab.arm_configs import tag
from memalpha_lab.common import REPO_ROOT, RESULTS_DIR, command_line, load_records, print_table, write_json
from memalpha_lab.compute import measured
from memalpha_lab.control_arms_report import START, compare
from memalpha_lab.decisive_plan import collect_scores, recipe_config, validated
from memalpha_lab.decisive_study import Decisive
from memalpha_lab.decisive_study import parse_args as decisive_args
from memalpha_lab.recipe_configs import load_yaml, write_yaml
from memalpha_lab.run_state import exported
from memalpha_lab.study_runner import refuse_run_dir, start_lock
from memalpha_lab.tb_scalars import event_scalars

SIDES = ("memalpha", "trl")
VAL_DATA_SEED, TRAIN_DATA_SEED_BASE = 6900, 6910
"""This benchmark's held-out set and training streams (no earlier study's)."""
MEMALPHA_TAGS = ("step_s", "train/reward", "perf/rollout_s", "perf/reader_s", "perf/ref_old_logprob_s",
                 "perf/train_s", "perf/generated_tokens")


def side_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace, seed: int, side: str) -> dict:
    """Both sides' settings: the decisive recipe of ``seed`` on one-chunk training instances."""
    config = recipe_config(base, run_dir, args, seed, side)
    config["data"]["synthetic"]["chunks"] = 1
    config["data"]["synthetic"]["facts_per_chunk"] = 4  # the two-chunk task's facts, in one chunk
    return config


def waited(command: list[str], log: Path) -> dict[str, Any]:
    """Run ``command`` (output to ``log``) and return its wall and CPU seconds and peak RSS."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"memory_vs_trl: {' '.join(command[:3])} failed (exit {process.returncode}); "
                         f"see {log}")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


class MemoryVsTrl(Decisive):
    """The decisive study's start and validation, with the two sides as its arms."""

    def fit_config(self, seed: int, arm: str) -> dict[str, Any]:
        return side_config(self.base_fit, self.run_dir, self.args, seed, arm)

    def side(self, seed: int, side: str) -> dict[str, Any]:
        """One side's run of ``seed`` (kept under ``--reuse`` when its adapter exists) and its validation."""
        name = tag(seed, side)
        config = self.fit_config(seed, side)
        path = write_yaml(config, self.run_dir / f"{name}.yaml")
        adapter = Path(config["model"]["export_adapter_dir"])
        record = self.run_dir / "arms" / name / "run.json"
        if not (self.args.reuse and exported(adapter) and record.is_file()):
            if side == "memalpha":
                command = [sys.executable, "-m", "memalpha.cli", "fit", "--config", str(path)]
            else:
                command = [sys.executable, __file__, "--trl-child", str(path), "--trl-metrics", str(record)]
            with measured(self.run_dir, f"fit_{name}"):
                process = waited(command, self.logs / f"fit_{name}.log")
            steps = memalpha_steps(self.run_dir / "arms" / name) if side == "memalpha" else \
                json.loads(record.read_text())["steps"]
            write_json({"process": process, "steps": steps}, record)
        self.runs[name] = {}
        self.finish_arm(seed, side, adapter)
        return json.loads(record.read_text())

    def write(self) -> dict[str, Any]:
        args = self.args
        scores = collect_scores(self.run_dir, args.seed_list, SIDES)
        runs = {tag(s, side): json.loads(p.read_text()) for s in args.seed_list for side in SIDES
                if (p := self.run_dir / "arms" / tag(s, side) / "run.json").is_file()}
        result = {"benchmark": "memory_vs_trl", "command": command_line(), "settings": settings(args),
                  "runs": runs, "sides": summarise(runs),
                  "accuracy": compare(scores, "memalpha", "trl", "accuracy"),
                  "held_out": held_out(self.run_dir, args.seed_list), "instance_scores": scores,
                  "wall_s": round(time.perf_counter() - self.started, 1)}
        write_json(result, args.out, machine=self.machine)
        if runs:
            plot(result, args.out.with_suffix(".png"))
        return result


def held_out(run_dir: Path, seeds: list[int]) -> dict[str, dict[str, float | None]]:
    """What each validation's records say besides accuracy, per run (the start, then ``seed<s>_<side>``):
    the share of tool calls that succeeded (as the report counts them: ``SUCCESS_STATUSES``), the final
    memory's tokens and the share of memorising turns
    cut at ``rollout.max_new_tokens`` (None where a report holds no call or no turn)."""

    def share(hits: list[bool]) -> float | None:
        return round(sum(hits) / len(hits), 4) if hits else None

    out = {}
    for name in [START, *(tag(s, side) for s in seeds for side in SIDES)]:
        if (report := validated(run_dir, name)) is None:
            continue
        records = load_records(report)
        turns = [turn for record in records for turn in record["turns"]]
        results = [result for turn in turns for result in turn["results"]]
        out[name] = {
            "tool_success": share([result["status"] in SUCCESS_STATUSES for result in results]),
            "memory_tokens": round(sum(r["memory_tokens"] for r in records) / len(records), 1),
            "turns_cut": share([turn["truncated"] for turn in turns]),
        }
    return out


def memalpha_steps(folder: Path) -> list[dict[str, float]]:
    """Per optimiser step of a ``memalpha fit``: its seconds, phases, reward and tokens sampled."""
    series = event_scalars(folder, MEMALPHA_TAGS)
    names = {"step_s": "step_s", "train/reward": "reward", "perf/rollout_s": "sampling_s",
             "perf/reader_s": "reader_s", "perf/ref_old_logprob_s": "logprobs_s", "perf/train_s": "update_s",
             "perf/generated_tokens": "tokens_sampled"}
    return [{names[t]: series[t][step] for t in MEMALPHA_TAGS if step in series.get(t, {})}
            for step in sorted(series.get("step_s", {}))]


def summarise(runs: dict[str, Any]) -> dict[str, Any]:
    """Per side over its runs: median step seconds and phases, peak RSS, tokens per step-second, rewards."""
    out: dict[str, Any] = {}
    for side in SIDES:
        mine = [r for name, r in runs.items() if name.endswith(f"_{side}")]
        steps = [s for r in mine for s in r["steps"]]
        if not steps:
            continue
        phases = sorted({k for s in steps for k in s if k.endswith("_s")})
        out[side] = {
            "runs": len(mine),
            **{f"median_{k}": round(median(s[k] for s in steps if k in s), 2) for k in phases},
            "peak_rss_mib": max(r["process"]["peak_rss_mib"] for r in mine),
            "tokens_per_step_s": round(
                sum(s["tokens_sampled"] for s in steps) / sum(s["step_s"] for s in steps), 1
            ),
            "reward_per_step": [[round(s["reward"], 4) for s in r["steps"]] for r in mine],
        }
    if len(out) == 2:
        out["step_time_ratio"] = round(out["memalpha"]["median_step_s"] / out["trl"]["median_step_s"], 3)
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Each side's reward over its steps (one line a seed), and each side's held-out accuracy per seed
    beside the start's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rewards, accuracy) = plt.subplots(1, 2, figsize=(10, 3.8))
    colours = {"memalpha": "tab:blue", "trl": "tab:orange"}
    for name, run in sorted(result["runs"].items()):
        side = name.split("_", 1)[1]
        rewards.plot([s["reward"] for s in run["steps"]], color=colours[side], marker="o",
                     label=f"{side} ({name.split('_', 1)[0]})")
    rewards.set(xlabel="optimiser step", ylabel="mean reward of the step", title="training reward")
    rewards.legend(fontsize=8)
    scores = result["instance_scores"]

    def mean_accuracy(run: dict[str, Any]) -> float:
        values = [v["accuracy"] for source in run.values() for v in source.values()]
        return sum(values) / len(values)

    seeds = sorted(scores["seeds"], key=int)
    for offset, side in enumerate(SIDES):
        values = [mean_accuracy(scores["seeds"][s][side]) for s in seeds if side in scores["seeds"][s]]
        accuracy.bar([int(s) + 0.35 * offset for s in seeds[: len(values)]], values, width=0.35,
                     color=colours[side], label=side)
    accuracy.set_xticks([int(s) + 0.175 for s in seeds], seeds)
    if scores.get(START):
        accuracy.axhline(mean_accuracy(scores[START]), color="grey", linestyle="--", label="SFT start")
    accuracy.set(xlabel="seed", ylabel="held-out local-reader accuracy", title="after the steps")
    accuracy.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"seeds": args.seed_list, "steps": args.steps, "recipe": args.recipe, "val_instances": args.val,
            "questions": args.questions, "val_data_seed": args.val_data_seed,
            "train_data_seeds": {str(s): args.train_data_seed_base + s for s in args.seed_list},
            "training_instances": "synthetic, one chunk of 4 facts",
            "held_out": "synthetic, the usual two chunks", "start": "the decisive study's SFT start recipe",
            "trl_prompt": "memalpha's memorising prompt of chunk 0",
            "trl_max_completion_length": "memalpha's rollout.max_new_tokens: one response, no second turn"}


def trl_child(config_path: Path, metrics_path: Path) -> None:
    """TRL's ``GRPOTrainer`` with :class:`~memalpha.integrations.trl_environment.MemoryEnvironment` on the
    settings of ``config_path`` (a ``memalpha fit`` config), from its ``model.adapter_path``; exports the
    adapter where the config says and writes every step's metrics."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from memalpha.agent.reward_settings import RewardSettings
    from memalpha.agent.rollout import make_token_counter
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.synthetic import SyntheticSettings
    from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
    from memalpha.integrations.trl_environment import (
        MemoryEnvironment,
        memorising_rows,
        use_memorising_template,
    )
    from memalpha.lm.core.embedded import resolve_model_path
    from memalpha.lm.core.policy import LMSettings
    from memalpha.reader.settings import ReaderSettings

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    config = load_yaml(config_path)
    model_config, data = config["model"], config["data"]
    rollout = RolloutSettings(**model_config["rollout"])
    update = UpdateSettings(**model_config.get("update", {}))
    optimizer = OptimizerSettings(**model_config.get("optimizer", {}))
    path = resolve_model_path(model_config["model"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    use_memorising_template(tokenizer)
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(path)
    model = PeftModel.from_pretrained(base, model_config["adapter_path"], is_trainable=True)
    instances = SyntheticSettings(**data["synthetic"]).generate("train", data["seed"])
    reader = ReaderSettings(**model_config["reader"]).build(None, None)
    environment = functools.partial(
        MemoryEnvironment, reader, reward=RewardSettings(**model_config.get("reward", {})), rollout=rollout,
        count_tokens=make_token_counter(tokenizer), first_chunk_in_prompt=True,
    )
    batch = data["instances_per_step"] * rollout.group_size
    args = GRPOConfig(
        output_dir=str(metrics_path.parent / "trl"), per_device_train_batch_size=update.micro_batch_size,
        gradient_accumulation_steps=batch // update.micro_batch_size,  # one generation of `batch` a step
        num_generations=rollout.group_size, max_steps=config["trainer"]["max_steps"],
        max_completion_length=rollout.max_new_tokens, max_tool_calling_iterations=1,
        temperature=rollout.temperature, learning_rate=optimizer.learning_rate, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=optimizer.weight_decay, max_grad_norm=optimizer.grad_clip,
        beta=update.kl_coef, epsilon=update.clip_low, epsilon_high=update.clip_high, loss_type="dapo",
        scale_rewards="group", use_cpu=True, seed=config["seed_everything"], logging_steps=1,
        gradient_checkpointing=LMSettings(**model_config.get("lm", {})).gradient_checkpointing,
        report_to="none", save_strategy="no", disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          train_dataset=Dataset.from_list(memorising_rows(instances, rollout)),
                          environment_factory=environment)
    trainer.train()
    model.save_pretrained(model_config["export_adapter_dir"])
    steps = [{"step_s": log["step_time"], "reward": log["reward"],
              "tokens_sampled": log["completions/mean_length"] * batch,
              "tool_calls": log.get("tools/call_frequency", 0.0)}
             for log in trainer.state.log_history if "step_time" in log]
    write_json({"steps": steps}, metrics_path)


def print_summary(result: dict[str, Any]) -> None:
    sides = result["sides"]
    phases = ("step_s", "sampling_s", "reader_s", "update_s")
    rows = [[side, s["runs"], *(s.get(f"median_{k}", "-") for k in phases), s["peak_rss_mib"],
             s["tokens_per_step_s"]] for side, s in sides.items() if side in SIDES]
    print_table(["side", "runs", "median step s", "sampling s", "reader s", "update s", "peak RSS MiB",
                 "tokens / step-s"], rows)
    level = result["accuracy"]["seed_level"]
    t = None if level is None else level["t"]
    print(f"step time memalpha / TRL: {sides.get('step_time_ratio')}; held-out accuracy memalpha - TRL: "
          + ("-" if t is None else f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}] (t over seeds)"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    defaults = ["--val-data-seed", str(VAL_DATA_SEED), "--train-data-seed-base", str(TRAIN_DATA_SEED_BASE),
                "--run-dir", str(REPO_ROOT / "runs" / "memory_vs_trl"),
                "--out", str(RESULTS_DIR / "memory_vs_trl.json"), "--seeds", "0,1,2",
                "--planned-seeds", "0,1,2", "--steps", "6", "--val", "48"]
    return decisive_args([*defaults, *argv], __doc__.split("\n", 1)[0])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--trl-child"]:
        trl_child(Path(argv[1]), Path(argv[3]))
        return 0
    if argv[:1] == ["--plot"]:  # the figure of a written result: --plot RESULT.json
        plot(json.loads(Path(argv[1]).read_text()), Path(argv[1]).with_suffix(".png"))
        return 0
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    refuse_run_dir(run_dir, args.reuse, "memory_vs_trl")
    with start_lock(run_dir):
        bench = MemoryVsTrl(args)
        bench.start()
    for seed in args.seed_list:
        for side in (SIDES if seed % 2 == 0 else SIDES[::-1]):  # alternate which side runs first
            bench.side(seed, side)
        print_summary(bench.write())
    result = bench.write()
    print_summary(result)
    print(f"\n(written to {args.out}; {result['wall_s'] / 60:.1f} min; start: {START})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
