"""The pre-registered credit study (issue 47): does per-chunk credit make GRPO beat SFT continued?

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/credit_study.py --reuse --plan-commit HASH
          [--seeds 0,1,2 | --seeds 3,4 in two processes over one --run-dir] [--run-dir runs/credit_study]
      .venv/bin/python experiments/studies/credit_study.py --check

The plan is in docs/results.md ("Pre-registered: does per-chunk credit make GRPO beat SFT continued?").
The stages are the decisive study's (:mod:`memalpha_lab.decisive_study`, whose options this script
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
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab.common import REPO_ROOT, RESULTS_DIR
from memalpha_lab.control_arms_report import TRAIN_TAGS
from memalpha_lab.credit_report import GRPO, PER_CHUNK, SFT, rebuild
from memalpha_lab.credit_report import main as report
from memalpha_lab.decisive_plan import recipe_config
from memalpha_lab.decisive_study import Decisive, grpo_cpu_seconds, run_study
from memalpha_lab.decisive_study import parse_args as decisive_args
from memalpha_lab.decisive_study import settings as decisive_settings

A_STEP_CAP = 64
"""A's ``trainer.max_steps``: far above what A′'s CPU seconds buy, so the budget ends the run."""
VAL_DATA_SEED, TRAIN_DATA_SEED_BASE = 4900, 4910
"""This study's held-out set (no earlier study's: they used 0 and 3900) and training streams."""
TRAIN_TAGS_PER_CHUNK = (*TRAIN_TAGS, "train/turn_reward", "reader/turn_questions", "reader/questions")


class CreditStudy(Decisive):
    """The decisive study's stages with three arms a seed: A′ first, then A and B at its CPU seconds."""

    benchmark = "credit_study"
    arm_commands = ((PER_CHUNK, "fit"), (GRPO, "fit"), (SFT, "sft"))
    budget_arm = PER_CHUNK
    sampled_arms = (PER_CHUNK, GRPO)
    train_tags = TRAIN_TAGS_PER_CHUNK

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

    def study_settings(self) -> dict[str, Any]:
        return settings(self.args)

    def rebuild(self, scores: dict[str, Any], planned: list[int]) -> dict[str, Any]:
        return rebuild(scores, planned)


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
    return decisive_args([*defaults, *(sys.argv[1:] if argv is None else argv)], __doc__.split("\n", 1)[0])


def credit_stages(experiment: Decisive, seed: int) -> None:
    """A′'s fit, then A and B matched to its CPU seconds."""
    experiment.grpo_arm(seed, PER_CHUNK)
    experiment.grpo_arm(seed, GRPO)
    experiment.sft_arm(seed)


def main(argv: list[str] | None = None) -> int:
    return run_study(parse_args(argv), "credit_study", CreditStudy, credit_stages, report)


if __name__ == "__main__":
    raise SystemExit(main())
