"""Pre-registered (docs/results.md, "Pre-registered: does GRPO on the answer agent beat SFT continued?"):
the answer agent's GRPO against its SFT continued for the same CPU seconds, 5 seeds, on long memories.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/answer_study.py
          [--start-dir runs/bench_answer_agent] [--seeds 0,1,2,3,4] [--held-out 4] [--questions 8]
          [--chunks 128] [--data-seed 5803] [--run-dir runs/answer_study]
          [--out experiments/results/answer_study.json] [--reuse] [--stage all|memorise|arms]
          [--plan-commit C] [--product-commit C] [--check]

The start is bench_answer_agent's (``--start-dir``, run first): its memory agent, the SFT answer agent
and the answer demonstrations and memories it trained on. Per seed:

* A: ``memalpha fit --config configs/answer_tiny_cpu.yaml`` from the SFT answer agent (its 8 GRPO steps),
  its CPU seconds measured over the whole process;
* B: ``memalpha sft`` continued from the same adapter on the same answer demonstrations, stopped at A's
  CPU seconds (:class:`memalpha_lab.cpu_budget.CpuBudget`).

Both are validated as the reader (``reader.adapter_path``) of the same held-out memories: ``--held-out``
validation instances of ``--chunks`` chunks (data seed ``--data-seed``, ``--questions`` questions spread
over the input), memorised once by the memory agent. The primary measure is the answered share of the
questions whose answer the memory holds, per instance; A − B paired per instance per seed, then a 95 % t
interval over the seeds. The verdict is the plan's rule, printed with the numbers.

On 2 cores the stages that do not need each other run side by side over one ``--run-dir``:
``--stage memorise`` only memorises the held-out set, ``--stage arms`` only trains A then B of each seed;
``--stage all`` (the default; once those two have ended, as it trains any arm still missing) runs what
is left, validates and writes the summary. ``--product-commit``
refuses a checkout whose ``memalpha/`` and ``configs/`` are not that commit's (a study that spans
sessions keeps its product), and ``--check`` only rebuilds the intervals and verdict from the committed
summary's per-seed figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from memalpha.data.loaders import save_jsonl
from memalpha.data.synthetic import SyntheticSettings
from memalpha.intervals import mean_interval
from memalpha_lab.cli_runs import memalpha
from memalpha_lab.common import REPO_ROOT, command_line, machine_info, write_json
from memalpha_lab.compute import children_cpu_s
from memalpha_lab.recipe_configs import load_yaml, write_yaml
from memalpha_lab.run_state import check_product, exported
from memalpha_lab.study_runner import add_plan_arguments, add_run_arguments, check_positive, parse_seeds

WHO = "answer_study"
CONFIGS = REPO_ROOT / "configs"
STAGES = ("all", "memorise", "arms")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--start-dir", type=Path, default=REPO_ROOT / "runs" / "bench_answer_agent")
    parser.add_argument("--memory-adapter", type=Path,
                        help="the memory agent (default: bench_answer_agent's, START_DIR/sft/adapter)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--held-out", type=int, default=4)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=128)
    parser.add_argument("--data-seed", type=int, default=5803)
    add_run_arguments(parser, "answer_study", "answer_study", "keep every run already trained or validated")
    add_plan_arguments(parser, "answer_study.py")
    parser.add_argument("--stage", choices=STAGES, default="all",
                        help="memorise: only the held-out memories; arms: only A and B of each seed; all: the"
                             " rest, then the summary")
    args = parser.parse_args(argv)
    args.seed_list = parse_seeds(parser, args.seeds)
    check_positive(parser, args, ("held_out", "questions", "chunks"))
    return args


def start_of(start_dir: Path, memory_adapter: Path | None) -> dict[str, Path]:
    """bench_answer_agent's memory agent, SFT answer agent and answer data; one line when missing."""
    parts = {"memory": memory_adapter or start_dir / "sft" / "adapter",
             "sft": start_dir / "answer_sft" / "adapter", "data": start_dir / "answer_data"}
    if not exported(parts["sft"]) or not (parts["data"] / "answers_train.jsonl").is_file():
        raise SystemExit(
            f"{WHO}: no SFT answer agent in {start_dir}: run experiments/bench/bench_answer_agent.py first"
        )
    if not exported(parts["memory"]):
        raise SystemExit(f"{WHO}: no memory agent at {parts['memory']}: name it with --memory-adapter")
    return parts


def trained_a(args: argparse.Namespace, start: dict[str, Path], seed: int) -> tuple[Path, float]:
    """A of ``seed``: the answer agent's GRPO from the start; its adapter and CPU seconds."""
    folder = args.run_dir / "arms" / f"grpo_seed{seed}"
    ledger = folder / "cpu_s.json"
    if args.reuse and exported(folder / "adapter") and ledger.is_file():
        return folder / "adapter", json.loads(ledger.read_text())["cpu_s"]
    config = load_yaml(CONFIGS / "answer_tiny_cpu.yaml")
    config["seed_everything"] = seed
    config["trainer"].update(callbacks=[], enable_checkpointing=False, enable_progress_bar=False,
                             limit_val_batches=0)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(args.run_dir), name="arms",
                                                    version=f"grpo_seed{seed}")
    config["model"].update(adapter_path=str(start["sft"]), export_adapter_dir=str(folder / "adapter"),
                           seed=seed)
    config["data"].update(train_path=str(start["data"] / "memories_train.jsonl"),
                          val_path=str(start["data"] / "memories_validation.jsonl"), seed=seed)
    path = write_yaml(config, args.run_dir / "configs" / f"grpo_seed{seed}.yaml")
    before = children_cpu_s()
    memalpha(["fit", "--config", str(path)], args.run_dir / "logs" / f"grpo_seed{seed}.log", WHO)
    cpu_s = children_cpu_s() - before
    ledger.write_text(json.dumps({"cpu_s": cpu_s}))
    return folder / "adapter", cpu_s


def trained_b(args: argparse.Namespace, start: dict[str, Path], seed: int, cpu_s: float) -> Path:
    """B of ``seed``: SFT continued from the start on its answer demonstrations for ``cpu_s`` CPU seconds."""
    folder = args.run_dir / "arms" / f"sft_continued_seed{seed}"
    if args.reuse and exported(folder / "adapter"):
        return folder / "adapter"
    config = load_yaml(CONFIGS / "sft_answer_tiny_cpu.yaml")
    config["seed_everything"] = seed
    budget = {"class_path": "memalpha_lab.cpu_budget.CpuBudget", "init_args": {"seconds": cpu_s}}
    config["trainer"].update(max_steps=10_000, callbacks=[budget], enable_checkpointing=False,
                             enable_progress_bar=False, limit_val_batches=0)
    config["trainer"].pop("val_check_interval", None)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(args.run_dir), name="arms",
                                                    version=f"sft_continued_seed{seed}")
    config["model"].update(adapter_path=str(start["sft"]), export_adapter_dir=str(folder / "adapter"),
                           seed=seed)
    config["model"]["optimizer"]["warmup_ratio"] = 0.0  # continued: no second warm-up over 10,000 steps
    # the demonstrations' order is B's only randomness (no dropout): data.seed is the seed, or every
    # seed stopped at the same step trains the same adapter (as the committed run's B arms did)
    config["data"].update(train_path=str(start["data"] / "answers_train.jsonl"),
                          val_path=str(start["data"] / "answers_validation.jsonl"), seed=seed)
    path = write_yaml(config, args.run_dir / "configs" / f"sft_continued_seed{seed}.yaml")
    memalpha(["sft", "--config", str(path)], args.run_dir / "logs" / f"sft_continued_seed{seed}.log", WHO)
    return folder / "adapter"


def held_out_memories(args: argparse.Namespace, memory_adapter: Path) -> Path:
    """The held-out instances, memorised once by the memory agent (``memalpha predict``)."""
    instances = args.run_dir / "held_out.jsonl"
    values = {**load_yaml(CONFIGS / "tiny_cpu.yaml")["data"]["synthetic"], "chunks": args.chunks,
              "questions": args.questions, "evidence": "spread"}
    # written each run (it is deterministic), so a changed --held-out is never read from an old file
    save_jsonl(SyntheticSettings(**values).generate("validation", args.data_seed, args.held_out), instances)
    memories = args.run_dir / "held_out_memories.jsonl"
    done = memories.is_file() and len(memories.read_text().splitlines()) == args.held_out
    if not (args.reuse and done):
        memalpha(["predict", "--config", str(CONFIGS / "tiny_cpu.yaml"), "--model.adapter_path",
                  str(memory_adapter), "--data.predict.path", str(instances), "--data.predict.output",
                  str(memories),
                  "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                  "--trainer.default_root_dir", str(args.run_dir / "predict")],
                 args.run_dir / "logs" / "predict_held_out.log", WHO)
    return memories


def stored_answered(args: argparse.Namespace, memories: Path, name: str, adapter: Path,
                    stored: dict[tuple[str, int], bool]) -> dict[str, float]:
    """Per instance, the share of its stored questions the answer agent at ``adapter`` answers right."""
    report = args.run_dir / "validate" / name / "validation.json"
    if not (args.reuse and report.is_file()):
        memalpha(["validate", "--config", str(CONFIGS / "tiny_cpu.yaml"), "--data.val_path", str(memories),
                  "--model.reader.adapter_path", str(adapter), "--trainer.logger.init_args.save_dir",
                  str(args.run_dir), "--trainer.logger.init_args.name", "validate",
                  "--trainer.logger.init_args.version", name, "--trainer.enable_progress_bar", "false"],
                 args.run_dir / "logs" / f"validate_{name}.log", WHO)
    out = {}
    for record in json.loads(report.read_text())["records"]:
        held = [q["score"] for k, q in enumerate(record["questions"]) if stored[(record["instance_id"], k)]]
        if held:
            out[record["instance_id"]] = sum(held) / len(held)
    return out


def verdict(interval: dict[str, float]) -> str:
    """The plan's rule on the t interval over seeds of A − B."""
    if interval["low"] > 0:
        return "shown: GRPO beats SFT continued"
    if interval["high"] < 0:
        return "SFT continued beats GRPO"
    return "not shown"


SECONDARY = ("grpo_minus_start", "sft_continued_minus_start")
"""The plan's secondary measures: each arm's change from the start, with its interval over seeds."""


def over_seeds(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The primary interval over seeds of A − B with its verdict, and the secondary intervals."""
    primary = mean_interval([s["grpo_minus_sft_continued"] for s in seeds.values()])
    return {"primary": {"grpo_minus_sft_continued": primary, "verdict": verdict(primary)},
            "secondary": {name: mean_interval([s[name] for s in seeds.values()]) for name in SECONDARY}}


def check(summary: Path) -> int:
    """Rebuild the intervals over seeds and the verdict from ``summary``'s per-seed figures; 0 when they
    match the committed ones, else 1 with what differs."""
    result = json.loads(summary.read_text())
    rebuilt = over_seeds(result["seeds"])
    pairs = [(rebuilt["primary"]["grpo_minus_sft_continued"], result["primary"]["grpo_minus_sft_continued"])]
    pairs += [(rebuilt["secondary"][name], result["secondary"][name]) for name in SECONDARY]
    same = rebuilt["primary"]["verdict"] == result["primary"]["verdict"] and all(
        abs(mine[k] - theirs[k]) <= 1e-9 for mine, theirs in pairs for k in ("mean", "low", "high")
    )
    primary = rebuilt["primary"]["grpo_minus_sft_continued"]
    print(f"{'rebuilt numbers match' if same else 'rebuilt numbers differ from'} {summary}"
          f" ({primary['mean']:+.3f} [{primary['low']:+.3f}, {primary['high']:+.3f}]:"
          f" {rebuilt['primary']['verdict']})")
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        return check(args.out)
    if args.product_commit is not None:
        check_product(args.product_commit, WHO)
    args.run_dir = args.run_dir.resolve()
    machine, started = machine_info(), time.perf_counter()
    start = start_of(args.start_dir.resolve(), args.memory_adapter)
    if args.stage == "arms":
        for seed in args.seed_list:
            trained_b(args, start, seed, trained_a(args, start, seed)[1])
        return 0
    memories = held_out_memories(args, start["memory"])
    if args.stage == "memorise":
        return 0
    written = [json.loads(line) for line in memories.read_text().splitlines()]
    stored = {(r["instance_id"], k): bool(q.get("stored"))
              for r in written for k, q in enumerate(r["questions"])}
    start_scores = stored_answered(args, memories, "start", start["sft"], stored)
    seeds: dict[str, Any] = {}
    for seed in args.seed_list:
        a, cpu_s = trained_a(args, start, seed)
        b = trained_b(args, start, seed, cpu_s)
        scores = {"grpo": stored_answered(args, memories, f"grpo_seed{seed}", a, stored),
                  "sft_continued": stored_answered(args, memories, f"sft_continued_seed{seed}", b, stored)}
        shared = sorted(scores["grpo"].keys() & scores["sft_continued"].keys())

        def change(after: dict[str, float], before: dict[str, float], ids=shared) -> float:
            return sum(after[i] - before[i] for i in ids) / len(ids)

        seeds[str(seed)] = {
            "cpu_s": cpu_s, "scores": scores,
            "grpo_minus_sft_continued": change(scores["grpo"], scores["sft_continued"]),
            "grpo_minus_start": change(scores["grpo"], start_scores),
            "sft_continued_minus_start": change(scores["sft_continued"], start_scores),
        }
    result = {
        "benchmark": "answer_study", "command": command_line(),
        "settings": {"start_dir": str(args.start_dir), "seeds": args.seed_list, "held_out": args.held_out,
                     "questions": args.questions, "chunks": args.chunks, "data_seed": args.data_seed},
        "plan_commit": args.plan_commit, "product_commit": args.product_commit,
        "stored_share": sum(stored.values()) / len(stored), "start": start_scores, "seeds": seeds,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if len(seeds) > 1:
        result.update(over_seeds(seeds))
        for name, interval in (("GRPO − SFT continued", result["primary"]["grpo_minus_sft_continued"]),
                               *result["secondary"].items()):
            print(f"{name}, stored answered at {args.chunks} chunks: {interval['mean']:+.3f} "
                  f"[{interval['low']:+.3f}, {interval['high']:+.3f}] over {len(seeds)} seeds")
        print(f"verdict: {result['primary']['verdict']}")
    write_json(result, args.out, machine=machine)
    print(f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
