"""The pre-registered credit study (issue 47): does per-chunk credit make GRPO beat SFT continued?

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/credit_study.py --reuse --plan-commit HASH
          [--seeds 0,1,2 | --seeds 3,4 in two processes over one --run-dir] [--run-dir runs/credit_study]
      .venv/bin/python experiments/studies/credit_study.py --check

The plan is in docs/results.md ("Pre-registered: does per-chunk credit make GRPO beat SFT continued?").
The stages are the decisive study's (``experiments/studies/decisive.py``, whose options this script
takes, with this study's defaults: held-out data seed 4900, training streams at 4910 + seed), each the
user's command line:

* **C, the start**: the decisive study's start recipe, built in this run folder, validated once;
* per seed ``s``, **A′** (``grpo_per_chunk``): ``memalpha fit`` from the start for ``--steps`` steps
  with the recipe ``--recipe`` and ``model.update.credit: per_chunk``;
* **A** (``grpo``): the same fit with ``broadcast`` credit, ``trainer.max_steps`` :data:`A_STEP_CAP`,
  stopped by :class:`memalpha_lab.cpu_budget.CpuBudget` at the CPU seconds the compute ledger
  recorded for the same seed's A′;
* **B** (``sft_continued``): ``memalpha sft`` continued from the start, stopped at the same budget;
* every adapter validated on ``--val`` held-out instances by the local reader.

Outputs: ``<out stem>/instance_scores.json`` and the summary ``--out``, rebuilt from the run folder after
every stage (:mod:`memalpha_lab.credit_report` rebuilds the verdict from the first and ``--check``
compares it with the second). ``--reuse`` keeps every stage whose output exists and resumes an
interrupted fit or SFT from its ``last.ckpt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from control_arms import adapter_done, arm_compute, step_seconds
from decisive import Decisive, arm_compute_start, grpo_cpu_seconds, run_study
from decisive import parse_args as decisive_args
from decisive import settings as decisive_settings

from memalpha.train.demo_summary import event_scalars
from memalpha_lab.arm_configs import cpu_matched_sft_config, tag
from memalpha_lab.common import REPO_ROOT, RESULTS_DIR, command_line, write_json
from memalpha_lab.control_arms_report import START, TRAIN_TAGS
from memalpha_lab.credit_report import ARMS, GRPO, PER_CHUNK, SFT, rebuild
from memalpha_lab.credit_report import main as report
from memalpha_lab.decisive_plan import collect_scores, recipe_config

A_STEP_CAP = 64
"""A's ``trainer.max_steps``: far above what A′'s CPU seconds buy, so the budget ends the run."""
VAL_DATA_SEED, TRAIN_DATA_SEED_BASE = 4900, 4910
"""This study's held-out set (no earlier study's: they used 0 and 3900) and training streams."""
TRAIN_TAGS_PER_CHUNK = (*TRAIN_TAGS, "train/turn_reward", "reader/turn_questions", "reader/questions")


class CreditStudy(Decisive):
    """The decisive study's stages with three arms a seed: A′ first, then A and B at its CPU seconds."""

    def fit_config(self, seed: int, arm: str) -> dict[str, Any]:
        config = recipe_config(self.base_fit, self.run_dir, self.args, seed, arm)
        if arm == PER_CHUNK:
            config["model"]["update"]["credit"] = "per_chunk"
            return config
        budget = grpo_cpu_seconds(self.run_dir, seed, PER_CHUNK)
        config["model"]["update"]["credit"] = "broadcast"
        config["trainer"]["max_steps"] = A_STEP_CAP
        config["trainer"]["callbacks"].append({"class_path": "memalpha_lab.cpu_budget.CpuBudget",
                                               "init_args": {"seconds": round(float(budget), 3)}})
        return config

    def continued_sft(self, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """B's config: SFT continued from the start until its process has spent A′'s CPU seconds."""
        budget = grpo_cpu_seconds(self.run_dir, seed, PER_CHUNK)
        return cpu_matched_sft_config(self.base_sft, self.run_dir, seed, budget), {"cpu_budget_s": budget}

    def write(self) -> dict[str, Any]:
        """Both JSON files from everything ``run_dir`` holds (this process's stages and another's)."""
        args = self.args
        scores = collect_scores(self.run_dir, args.seed_list, ARMS)
        scores_path = args.out.parent / args.out.stem / "instance_scores.json"
        write_json({"benchmark": "credit_study", **scores}, scores_path, machine=self.machine)
        planned = args.planned_list
        result = {
            "benchmark": "credit_study",
            "command": command_line(),
            "settings": settings(args),
            "instance_scores": os.path.relpath(scores_path, args.out.resolve().parent.parent.parent),
            "runs": collect_runs(self.run_dir, sorted(set(planned) | set(args.seed_list))),
            **rebuild(scores, planned),
            "train": {tag(s, arm): {t: {str(k): v for k, v in series.items()}
                                    for t, series in event_scalars(self.run_dir / "arms" / tag(s, arm),
                                                                   TRAIN_TAGS_PER_CHUNK).items()}
                      for s in planned for arm in (PER_CHUNK, GRPO)
                      if (self.run_dir / "arms" / tag(s, arm)).is_dir()},
            "wall_s": round(time.perf_counter() - self.started, 1),
        }
        write_json(result, args.out, machine=self.machine)
        return result


def collect_runs(run_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """Each trained run's training seconds, steps and compute, the matched arms' ``cpu_budget_s`` (A′'s
    recorded CPU seconds), and the start's SFT; from what ``run_dir`` holds."""
    runs: dict[str, Any] = {}
    if adapter_done(run_dir / "sft" / "adapter"):
        taken = step_seconds(run_dir / "sft" / START)
        runs[f"seed0_{START}"] = {"train_s": sum(taken), "steps": len(taken),
                                  "compute": {"train": arm_compute_start(run_dir)}}
    for seed in seeds:
        for arm, command in ((PER_CHUNK, "fit"), (GRPO, "fit"), (SFT, "sft")):
            name = tag(seed, arm)
            if adapter_done(run_dir / "arms" / name / "adapter"):
                taken = step_seconds(run_dir / "arms" / name)
                runs[name] = {"train_s": sum(taken), "steps": len(taken),
                              "compute": arm_compute(run_dir, name, command)}
                if arm != PER_CHUNK:
                    runs[name]["cpu_budget_s"] = grpo_cpu_seconds(run_dir, seed, PER_CHUNK)
    return runs


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as this run carries it out (docs/results.md, "Pre-registered: does per-chunk credit ...")."""
    return {
        **decisive_settings(args),
        "arms": {PER_CHUNK: f"the recipe, {args.steps} steps, model.update.credit: per_chunk",
                 GRPO: f"the recipe, broadcast credit, max_steps {A_STEP_CAP}, stopped at "
                       f"{PER_CHUNK}'s CPU s",
                 SFT: f"memalpha sft continued, stopped at {PER_CHUNK}'s CPU s"},
        "primary": f"accuracy, {PER_CHUNK} - {SFT}, t over seeds",
        "guard": f"memory_share <= 0.5 in every seed's {PER_CHUNK} run",
        "compute_matching": f"{GRPO} and {SFT}: stopped (memalpha_lab.cpu_budget.CpuBudget) when their "
                            f"process has spent the CPU seconds of the same seed's {PER_CHUNK} memalpha fit "
                            "(compute ledger)",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The decisive study's options with this study's defaults (later options on the command line win)."""
    defaults = ["--val-data-seed", str(VAL_DATA_SEED), "--train-data-seed-base", str(TRAIN_DATA_SEED_BASE),
                "--run-dir", str(REPO_ROOT / "runs" / "credit_study"),
                "--out", str(RESULTS_DIR / "credit_study.json")]
    return decisive_args([*defaults, *(sys.argv[1:] if argv is None else argv)])


def credit_stages(experiment: Decisive, seed: int) -> None:
    """A′'s fit, then A and B matched to its CPU seconds."""
    experiment.grpo_arm(seed, PER_CHUNK)
    experiment.grpo_arm(seed, GRPO)
    experiment.sft_arm(seed)


def main(argv: list[str] | None = None) -> int:
    return run_study(parse_args(argv), "credit_study", CreditStudy, credit_stages, report)


if __name__ == "__main__":
    raise SystemExit(main())
