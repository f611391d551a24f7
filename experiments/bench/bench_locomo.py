"""LoCoMo on Memory-R1's split: memories that learn nothing and trained agents, scored by LoCoMo's F1
and BLEU-1 per category (issue 74, item 3; docs/results.md, "bench_locomo").

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench/bench_locomo.py --data locomo10.json
          [--split test] [--arms empty,raw_chunks,full_text,demo,recipe] [--config configs/tiny_cpu.yaml]
          [--demo-adapter PATH] [--recipe-adapter PATH --recipe-config configs/locomo_cpu.yaml]
          [--answer-adapter PATH] [--run-dir runs/bench_locomo] [--out experiments/results/bench_locomo.json]
          [--reuse]

``--data`` is LoCoMo's public ``data/locomo10.json`` (not in the repository). Memory-R1 splits it by
whole conversation: train ``conv-26``, validation ``conv-30`` (where settings are chosen), test the
other eight (read once, at the end). ``--split`` picks one; its conversations are written to the run
folder and each arm is one ``memalpha validate`` of that file, in a process of its own:

* ``empty``, ``raw_chunks`` (BM25 top 2) and ``full_text``: the baselines (``rollout.baseline.kind``),
  no adapter;
* ``demo``: the demo's cold-start adapter (``--demo-adapter``, default built in the run folder as
  ``make demo`` builds it: oracle demonstrations of ``configs/tiny_cpu.yaml``, then
  ``configs/sft_tiny_cpu.yaml``);
* ``recipe``: the LoCoMo recipe's adapter (``--recipe-adapter``) under its own config (``--recipe-config``);
* ``answer``: the recipe's adapter answered by a trained answer agent (``--answer-adapter`` as
  ``reader.adapter_path``).

Per arm: LoCoMo F1 and BLEU-1 per category and over all but the adversarial category (the headline;
the adversarial category is scored by LoCoMo's protocol and reported apart), memory tokens and their
share of the input's tokens, the share of turns with any call and with a call that worked (status
``ok``), entries per session, and replies cut at ``rollout.max_new_tokens``. Then the targets of
issue 74, item 4, for the trained arms, and each arm's F1 against raw chunks', paired per question with
a 95 % t interval over conversations (over questions for a split of one conversation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from memalpha.intervals import mean_interval
from memalpha_lab.cli_runs import cold_start, memalpha
from memalpha_lab.common import REPO_ROOT, command_line, machine_info, print_table, write_json
from memalpha_lab.study_runner import add_run_arguments

WHO = "bench_locomo"
CONFIGS = REPO_ROOT / "configs"
SPLITS: dict[str, tuple[str, ...] | None] = {"train": ("conv-26",), "validation": ("conv-30",), "test": None}
"""Memory-R1's split of LoCoMo's ten conversations (test: every one not named by the others)."""
BASELINES = {"empty": "empty", "raw_chunks": "raw_chunks", "full_text": "full_text"}
ARMS = ("empty", "raw_chunks", "full_text", "demo", "recipe", "answer")
HEADLINE = "all_but_adversarial"
TARGETS = {"ok_call_share": 0.95, "entries_per_session": 1.0, "memory_share": 0.3}
"""Issue 74, item 4: a call that works in 95 % of turns, an entry per session at least, a memory of at
most 0.3 of the input's tokens (and F1 at least raw chunks top 2's)."""
_SESSION = re.compile(r"^session_\d+$")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True, help="LoCoMo's locomo10.json")
    parser.add_argument("--split", choices=tuple(SPLITS), default="test")
    parser.add_argument("--arms", default="empty,raw_chunks,full_text,demo")
    parser.add_argument("--config", type=Path, default=CONFIGS / "tiny_cpu.yaml")
    parser.add_argument("--demo-adapter", type=Path)
    parser.add_argument("--recipe-adapter", type=Path)
    parser.add_argument("--recipe-config", type=Path, default=CONFIGS / "locomo_cpu.yaml")
    parser.add_argument("--answer-adapter", type=Path)
    add_run_arguments(parser, "bench_locomo", "bench_locomo", "keep every validation already written")
    args = parser.parse_args(argv)
    args.arm_list = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(args.arm_list) - set(ARMS))
    if unknown or not args.arm_list:
        parser.error(f"--arms: each one of {list(ARMS)}, got {args.arms!r}")
    if {"recipe", "answer"} & set(args.arm_list) and args.recipe_adapter is None:
        parser.error("--arms recipe and answer need --recipe-adapter")
    if "answer" in args.arm_list and args.answer_adapter is None:
        parser.error("--arms answer needs --answer-adapter")
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (LoCoMo's data/locomo10.json)")
    return args


def split_file(data: Path, split: str, out: Path) -> tuple[Path, dict[str, int]]:
    """The conversations of ``split`` written to ``out`` (the file read as it is), and each one's
    sessions with turns."""
    conversations = json.loads(data.read_text(encoding="utf-8"))
    named = {c.get("sample_id") for c in conversations}
    held = {name for names in SPLITS.values() if names for name in names}
    if not held <= named:
        raise SystemExit(f"{WHO}: {data} lacks {sorted(held - named)}: is it LoCoMo's locomo10.json?")
    keep = SPLITS[split]
    chosen = [c for c in conversations if (c["sample_id"] in keep if keep else c["sample_id"] not in held)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(chosen), encoding="utf-8")
    sessions = {
        c["sample_id"]: sum(1 for key, turns in c["conversation"].items() if _SESSION.match(key) and turns)
        for c in chosen
    }
    return out, sessions


def arm_flags(args: argparse.Namespace, arm: str, demo: Path | None) -> tuple[Path, list[str]]:
    """The config and the flags of ``arm``'s ``memalpha validate``."""
    if arm in BASELINES:
        return args.config, ["--model.rollout.baseline.kind", BASELINES[arm]]
    if arm == "demo":
        return args.config, ["--model.adapter_path", str(demo)]
    flags = ["--model.adapter_path", str(args.recipe_adapter)]
    if arm == "answer":
        flags += ["--model.reader.adapter_path", str(args.answer_adapter)]
    return args.recipe_config, flags


def validate(
    args: argparse.Namespace, data: Path, arm: str, config: Path, flags: list[str]
) -> dict[str, Any]:
    """``memalpha validate`` of ``data`` for ``arm``; its report (kept with ``--reuse``). Every
    conversation of the split, one a batch: validate journals each finished batch, so a killed arm,
    run again, resumes at the conversation it was reading."""
    version = f"{args.split}_{arm}"
    report = args.run_dir / "validate" / version / "validation.json"
    if not (args.reuse and report.is_file()):
        memalpha(["validate", "--config", str(config), "--data.val_path", str(data),
                  "--trainer.logger.init_args.save_dir", str(args.run_dir), "--trainer.logger.init_args.name",
                  "validate", "--trainer.logger.init_args.version", version, "--trainer.enable_progress_bar",
                  "false", "--data.val_batch_size", "1", "--trainer.limit_val_batches", "null", *flags],
                 args.run_dir / "logs" / f"validate_{version}.log", WHO)
    return json.loads(report.read_text(encoding="utf-8"))


def arm_figures(report: dict[str, Any], sessions: dict[str, int]) -> dict[str, Any]:
    """What issue 74 reports of an arm, from its validation report."""
    records = report["records"]
    turns = [turn for record in records for turn in record["turns"]]
    entries = sum(len(r["memory"]["semantic"]) + len(r["memory"]["episodic"]) for r in records)
    memory, text = sum(r["memory_tokens"] for r in records), sum(r["chunk_tokens"] for r in records)
    categories = report["summary"]["per_source"]["locomo"]["per_category"]
    return {
        "conversations": len(records),
        "questions": sum(len(r["questions"]) for r in records),
        "per_category": categories,
        "f1": categories[HEADLINE]["locomo_f1"],
        "bleu1": categories[HEADLINE]["locomo_bleu1"],
        "adversarial_f1": categories.get("adversarial", {}).get("locomo_f1"),
        "memory_tokens": memory / len(records),
        "memory_share": memory / text,
        "turns": len(turns),
        "call_share": sum(bool(t["results"]) for t in turns) / len(turns) if turns else None,
        "ok_call_share": (sum(any(r["status"] == "ok" for r in t["results"]) for t in turns) / len(turns)
                          if turns else None),
        "entries_per_session": entries / sum(sessions[r["instance_id"]] for r in records),
        "replies_cut": sum(bool(t["truncated"]) for t in turns),
    }


def question_f1(report: dict[str, Any]) -> dict[str, list[float]]:
    """Each conversation's non-adversarial questions' LoCoMo F1, in order."""
    return {
        r["instance_id"]: [q["locomo_f1"] for q in r["questions"] if q["metadata"]["category"] != 5]
        for r in report["records"]
    }


def against_raw_chunks(report: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The arm's F1 minus raw chunks' (all but adversarial), paired per question: the mean of each
    conversation's mean difference with its 95 % t interval over conversations, or, for a split of one
    conversation (validation, train), over its questions (``over`` says which)."""
    mine, theirs = question_f1(report), question_f1(raw)
    pairs = {c: [a - b for a, b in zip(mine[c], theirs[c])] for c in sorted(mine) if mine[c]}
    if len(pairs) > 1:
        return {**mean_interval([sum(d) / len(d) for d in pairs.values()]), "over": "conversations"}
    return {**mean_interval([d for ds in pairs.values() for d in ds]), "over": "questions"}


def targets(figures: dict[str, Any], raw: dict[str, Any] | None) -> dict[str, bool | None]:
    """Issue 74's targets for a trained arm: each met or not (None: not measurable here)."""
    met: dict[str, bool | None] = {
        "ok_call_share": figures["ok_call_share"] is not None
        and figures["ok_call_share"] >= TARGETS["ok_call_share"],
        "entries_per_session": figures["entries_per_session"] >= TARGETS["entries_per_session"],
        "memory_share": figures["memory_share"] <= TARGETS["memory_share"],
    }
    met["f1_at_least_raw_chunks"] = None if raw is None else figures["f1"] >= raw["f1"]
    return met


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.run_dir = args.run_dir.resolve()
    machine, started = machine_info(), time.perf_counter()
    data, sessions = split_file(args.data, args.split, args.run_dir / f"locomo_{args.split}.json")
    demo = None
    if "demo" in args.arm_list:
        demo = args.demo_adapter or cold_start(args.run_dir, CONFIGS / "tiny_cpu.yaml",
                                               CONFIGS / "sft_tiny_cpu.yaml", WHO)
    result: dict[str, Any] = {
        "benchmark": WHO, "command": command_line(),
        "settings": {"split": args.split, "conversations": sorted(sessions), "sessions": sessions,
                     "arms": args.arm_list, "config": str(args.config), "demo_adapter": str(demo),
                     "recipe_adapter": str(args.recipe_adapter), "recipe_config": str(args.recipe_config),
                     "answer_adapter": str(args.answer_adapter), "targets": TARGETS},
        "arms": {},
    }
    reports = {}
    for arm in args.arm_list:
        config, flags = arm_flags(args, arm, demo)
        reports[arm] = validate(args, data, arm, config, flags)
        result["arms"][arm] = arm_figures(reports[arm], sessions)
        result["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(result, args.out, machine=machine)
    raw = result["arms"].get("raw_chunks")
    rows = []
    for arm, figures in result["arms"].items():
        if arm != "raw_chunks" and "raw_chunks" in reports:
            figures["f1_minus_raw_chunks"] = against_raw_chunks(reports[arm], reports["raw_chunks"])
        if arm in ("demo", "recipe", "answer"):
            figures["targets_met"] = targets(figures, raw)
        change = figures.get("f1_minus_raw_chunks")
        rows.append([
            arm, figures["f1"], figures["bleu1"], figures["adversarial_f1"],
            "-" if change is None else f"{change['mean']:+.3f} [{change['low']:+.3f}, {change['high']:+.3f}]",
            figures["memory_tokens"], figures["memory_share"],
            "-" if figures["ok_call_share"] is None else f"{figures['ok_call_share']:.2f}",
            figures["entries_per_session"], f"{figures['replies_cut']}/{figures['turns']}",
        ])
    write_json(result, args.out, machine=machine)
    print_table(["arm", "F1 (1-4)", "BLEU-1 (1-4)", "F1 adversarial", "F1 - raw chunks [95 %]",
                 "memory tokens", "memory share", "ok calls", "entries/session", "cut"], rows, floats=3)
    print(f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
