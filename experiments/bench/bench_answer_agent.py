"""Does a trained answer agent read what the memory holds? Readers side by side on the same long memories
(issue 73, item 3; docs/results.md, "bench_answer_agent").

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_answer_agent.py
          [--memory-adapter PATH] [--lengths 32,128] [--held-out 4] [--questions 8] [--data-seed 5802]
          [--train 48] [--train-chunks 8] [--run-dir runs/bench_answer_agent]
          [--out experiments/results/bench_answer_agent.json] [--reuse]

Everything runs through the product's commands, each in a process of its own:

1. the memory agent: ``--memory-adapter`` or, by default, the demo's cold start built in the run folder
   (``configs/sft_tiny_cpu.yaml`` on oracle demonstrations);
2. the answer agent's training memories: ``--train`` synthetic training instances of ``--train-chunks``
   chunks memorised by the memory agent (``memalpha predict``), then ``memalpha data answers`` and
   ``memalpha sft --config configs/sft_answer_tiny_cpu.yaml`` (the SFT answer agent) and ``memalpha fit
   --config configs/answer_tiny_cpu.yaml`` from it (SFT then GRPO);
3. the held-out memories: ``--held-out`` validation instances of each length (data seed ``--data-seed``,
   on which no setting was chosen; questions spread over the input), memorised once by the memory
   agent (``memalpha predict``: each question records whether the memory holds its answer);
4. the arms, each a ``memalpha validate`` with ``configs/tiny_cpu.yaml``'s reader settings: on the
   memories (the ``memories`` layout: every arm reads the same memories) the config's reader, the top
   sentence (``retrieval.unit: sentence``, ``top_k_entries: 1``, the best setting of bench_length), the
   SFT answer agent and the SFT-then-GRPO one (``reader.adapter_path``); on the instances themselves
   raw chunks with BM25 top 2 and the full text (``rollout.baseline.kind``).

Per length and arm: accuracy, memory tokens, and the answered share of the questions whose answer the
memory holds (the target: 0.8), each with a 95 % t interval over instances.
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
from memalpha_lab.cli_runs import cold_start, memalpha
from memalpha_lab.common import REPO_ROOT, command_line, machine_info, print_table, write_json
from memalpha_lab.recipe_configs import load_yaml, write_yaml
from memalpha_lab.run_state import exported
from memalpha_lab.study_runner import add_run_arguments

WHO = "bench_answer_agent"
CONFIGS = REPO_ROOT / "configs"
TRAIN_SEED = 21
"""The data seed of the answer agent's training instances."""
MEMORY_ARMS: dict[str, list[str]] = {
    "config_reader": [],
    "top_sentence": ["--model.reader.retrieval.unit", "sentence",
                     "--model.reader.retrieval.top_k_entries", "1"],
    "answer_sft": ["--model.reader.adapter_path", "{sft}"],
    "answer_grpo": ["--model.reader.adapter_path", "{grpo}"],
}
"""Readers of the memories the memory agent wrote, each a ``memalpha validate`` of the memories file."""
BASELINE_ARMS = {"raw_chunks_top2": "raw_chunks", "full_text": "full_text"}
"""The baselines, each a ``memalpha validate`` of the instances themselves."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--memory-adapter", type=Path,
                        help="the memory agent (default: the demo's cold start)")
    parser.add_argument("--lengths", default="32,128", help="comma-separated held-out lengths in chunks")
    parser.add_argument("--held-out", type=int, default=4, help="held-out instances per length")
    parser.add_argument("--questions", type=int, default=8, help="questions per held-out instance")
    parser.add_argument("--data-seed", type=int, default=5802, help="the held-out instances' data seed")
    parser.add_argument("--train", type=int, default=48, help="the answer agent's training instances")
    parser.add_argument("--train-chunks", type=int, default=8, help="chunks per training instance")
    add_run_arguments(parser, "bench_answer_agent", "bench_answer_agent",
                      "keep every stage whose output exists")
    args = parser.parse_args(argv)
    try:
        args.length_list = [int(n) for n in args.lengths.split(",") if n]
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if not args.length_list or min(args.length_list + [args.held_out, args.questions, args.train,
                                                       args.train_chunks]) < 1:
        parser.error("--lengths, --held-out, --questions, --train and --train-chunks must be >= 1")
    return args


def synthetic(chunks: int, questions: int) -> SyntheticSettings:
    """``configs/tiny_cpu.yaml``'s synthetic tasks at ``chunks`` chunks, questions spread over them."""
    values = {**load_yaml(CONFIGS / "tiny_cpu.yaml")["data"]["synthetic"], "chunks": chunks,
              "questions": questions, "evidence": "spread"}
    return SyntheticSettings(**values)


def predicted(args: argparse.Namespace, adapter: Path, instances: Path, out: Path, name: str) -> Path:
    """The memory agent's memories of ``instances`` (``memalpha predict``, resumable)."""
    if not (args.reuse and out.is_file() and _complete(out, instances)):
        memalpha(["predict", "--config", str(CONFIGS / "tiny_cpu.yaml"), "--model.adapter_path",
                  str(adapter), "--data.predict.path", str(instances), "--data.predict.output", str(out),
                  "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
                  "--trainer.default_root_dir", str(args.run_dir / "predict" / name)],
                 args.run_dir / "logs" / f"predict_{name}.log", WHO)
    return out


def _complete(records: Path, instances: Path) -> bool:
    return len(records.read_text().splitlines()) == len(instances.read_text().splitlines())


def answer_agents(args: argparse.Namespace, adapter: Path) -> dict[str, Path]:
    """The SFT answer agent and the SFT-then-GRPO one, trained on the memory agent's memories."""
    run = args.run_dir
    data = run / "answer_data"
    for split, seed, count in (("train", TRAIN_SEED, args.train), ("validation", TRAIN_SEED + 1, 8)):
        path = data / f"{split}.jsonl"
        if not path.is_file():
            save_jsonl(synthetic(args.train_chunks, 4).generate(split, seed, count), path)
        memories = predicted(args, adapter, path, data / f"memories_{split}.jsonl", f"train_{split}")
        demos = data / f"answers_{split}.jsonl"
        if not (args.reuse and demos.is_file()):
            memalpha(["data", "answers", "--config", str(CONFIGS / "tiny_cpu.yaml"), "--memories",
                      str(memories), "--out", str(demos)], run / "logs" / f"answers_{split}.log", WHO)
    sft = run / "answer_sft" / "adapter"
    if not (args.reuse and exported(sft)):
        config = load_yaml(CONFIGS / "sft_answer_tiny_cpu.yaml")
        config["trainer"].update(callbacks=[], enable_checkpointing=False, enable_progress_bar=False)
        config["trainer"]["logger"]["init_args"].update(save_dir=str(run), name="answer_sft")
        config["model"]["export_adapter_dir"] = str(sft)
        config["data"].update(train_path=str(data / "answers_train.jsonl"),
                              val_path=str(data / "answers_validation.jsonl"))
        path = write_yaml(config, run / "answer_sft.yaml")
        memalpha(["sft", "--config", str(path)], run / "logs" / "answer_sft.log", WHO)
    grpo = run / "answer_grpo" / "adapter"
    if not (args.reuse and exported(grpo)):
        config = load_yaml(CONFIGS / "answer_tiny_cpu.yaml")
        config["trainer"].update(callbacks=[], enable_checkpointing=False, enable_progress_bar=False)
        config["trainer"]["logger"]["init_args"].update(save_dir=str(run), name="answer_grpo")
        config["model"].update(adapter_path=str(sft), export_adapter_dir=str(grpo))
        config["data"].update(train_path=str(data / "memories_train.jsonl"),
                              val_path=str(data / "memories_validation.jsonl"))
        path = write_yaml(config, run / "answer_grpo.yaml")
        memalpha(["fit", "--config", str(path)], run / "logs" / "answer_grpo.log", WHO)
    return {"sft": sft, "grpo": grpo}


def validate(args: argparse.Namespace, data: Path, name: str, extra: list[str]) -> dict[str, Any]:
    """``memalpha validate`` of ``data`` with ``configs/tiny_cpu.yaml`` and ``extra``; the report."""
    report = args.run_dir / "validate" / name / "validation.json"
    if not (args.reuse and report.is_file()):
        memalpha(["validate", "--config", str(CONFIGS / "tiny_cpu.yaml"), "--data.val_path", str(data),
                  "--trainer.logger.init_args.save_dir", str(args.run_dir), "--trainer.logger.init_args.name",
                  "validate", "--trainer.logger.init_args.version", name, "--trainer.enable_progress_bar",
                  "false", *extra], args.run_dir / "logs" / f"validate_{name}.log", WHO)
    return json.loads(report.read_text(encoding="utf-8"))


def arm_figures(report: dict[str, Any], stored: dict[tuple[str, int], bool]) -> dict[str, Any]:
    """Accuracy, memory tokens and the answered share of stored answers, each a mean over instances
    with its 95 % t interval (``stored``: whether the memory agent's memory holds each answer), and
    the stored answers' scores summed over every instance (``stored_score_sum`` of
    ``stored_questions``: with few instances, the pooled share says more than an interval over them)."""
    accuracy, tokens, answered, pooled = [], [], [], []
    for record in report["records"]:
        scores = [q["score"] for q in record["questions"]]
        accuracy.append(sum(scores) / len(scores))
        tokens.append(float(record["memory_tokens"]))
        held = [q["score"] for k, q in enumerate(record["questions"])
                if stored.get((record["instance_id"], k))]
        if held:
            answered.append(sum(held) / len(held))
        pooled += held
    return {"instances": len(accuracy), "accuracy": mean_interval(accuracy),
            "memory_tokens": mean_interval(tokens),
            "stored_answered": mean_interval(answered) if answered else None,
            "stored_questions": len(pooled), "stored_score_sum": sum(pooled)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.run_dir = args.run_dir.resolve()
    machine, started = machine_info(), time.perf_counter()
    adapter = args.memory_adapter or cold_start(args.run_dir, CONFIGS / "tiny_cpu.yaml",
                                                CONFIGS / "sft_tiny_cpu.yaml", WHO)
    agents = answer_agents(args, adapter)
    result: dict[str, Any] = {
        "benchmark": "bench_answer_agent", "command": command_line(),
        "settings": {"memory_adapter": str(adapter), "lengths": args.length_list,
                     "held_out": args.held_out, "questions": args.questions, "data_seed": args.data_seed,
                     "train": args.train, "train_chunks": args.train_chunks, "memory_arms": MEMORY_ARMS,
                     "baselines": BASELINE_ARMS},
        "lengths": {},
    }
    rows = []
    for length in args.length_list:
        instances = args.run_dir / "held_out" / f"chunks_{length}.jsonl"
        if not instances.is_file():
            held_out = synthetic(length, args.questions).generate("validation", args.data_seed, args.held_out)
            save_jsonl(held_out, instances)
        memories = args.run_dir / "held_out" / f"memories_{length}.jsonl"
        predicted(args, adapter, instances, memories, f"held_out_{length}")
        written = [json.loads(line) for line in memories.read_text().splitlines()]
        stored = {(r["instance_id"], k): bool(q.get("stored"))
                  for r in written for k, q in enumerate(r["questions"])}
        arms: dict[str, Any] = {}
        for arm, extra in MEMORY_ARMS.items():
            extra = [e.format(sft=agents["sft"], grpo=agents["grpo"]) for e in extra]
            arms[arm] = arm_figures(validate(args, memories, f"{arm}_{length}", extra), stored)
        for arm, kind in BASELINE_ARMS.items():
            report = validate(args, instances, f"{arm}_{length}", ["--model.rollout.baseline.kind", kind])
            arms[arm] = arm_figures(report, stored)
        result["lengths"][str(length)] = {"stored_share": sum(stored.values()) / len(stored), "arms": arms}
        for arm, figures in arms.items():
            answered = figures["stored_answered"]
            rows.append([length, arm, figures["accuracy"]["mean"], figures["memory_tokens"]["mean"],
                         "-" if answered is None else f"{answered['mean']:.3f} [{answered['low']:+.2f}, "
                         f"{answered['high']:+.2f}]",
                         f"{figures['stored_score_sum']:.1f} / {figures['stored_questions']}"])
        result["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(result, args.out, machine=machine)
    print_table(["chunks", "arm", "accuracy", "memory tokens", "stored answered [95 %]", "stored, pooled"],
                rows, floats=3)
    print(f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
