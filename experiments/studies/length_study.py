"""The pre-registered length study (issue 55, item 3): does GRPO's gain hold at 16 times the training length?

Run:  HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python experiments/studies/length_study.py --reuse
          --plan-commit b1b81a7 --product-commit bf7256b
          [--seeds 0,1,2 | --seeds 3,4 in two processes over one --run-dir] [--run-dir runs/length_study]
      .venv/bin/python experiments/studies/length_study.py --check

The plan is in docs/results.md ("Pre-registered: does GRPO's gain hold at 16 times the training length?").
The stages are the decisive study's (:mod:`memalpha_lab.decisive_study`, whose options this script takes,
with this study's defaults: held-out data seed 5900, 64 held-out instances, training streams at 5910 +
seed), each the user's command line:

* **C, the start**: the decisive study's start recipe, built in this run folder;
* per seed ``s``, **A** (``grpo``): ``memalpha fit`` from the start for ``--steps`` steps with the recipe
  ``--recipe``, on training instances of the recipe's length (``configs/tiny_cpu.yaml``: 2 chunks);
* **B** (``sft_continued``): ``memalpha sft`` continued from the start, stopped when its process has
  spent the CPU seconds of the same seed's A;
* every adapter validated by ``memalpha validate`` (greedy, the local 135M reader) on three held-out
  sets of ``--val`` instances, one per length of ``--lengths`` (chunks per instance; the first is the
  training length), their questions' evidence spread over the whole input
  (``data.synthetic.evidence: spread``), each set under ``validate_chunks<N>/`` of the run folder.

Outputs: ``<out stem>/instance_scores.json`` (per length, the control arms' layout; each instance's
values from :func:`memalpha_lab.length_report.length_values`: the extractive reader's accuracy from its
final memory, whether its answers were stored, and its scores by where the evidence sits) and the summary
``--out``, rebuilt from the run folder after every stage (:mod:`memalpha_lab.length_report` rebuilds the
verdict from the first and ``--check`` compares it with the second). ``--reuse`` keeps every stage whose
output exists and resumes an interrupted fit or SFT from its ``last.ckpt``; two processes over one run
folder never run the same validation (the second goes on with its next stage).

The study runs for more CPU hours than a machine is kept here (docs/results.md, amendment 2), so its
product is pinned (``--product-commit``) and its run folder, all but the weights, is committed as it
grows (``python -m memalpha_lab.run_state save runs/length_study
experiments/results/length_study/run_state``) and laid back on a new machine (``... restore``, into
the same run-folder path) before ``--reuse``: a lost adapter still needed is trained again (B to the
step its CPU budget stopped it at) and used only if it equals the recorded one
(:mod:`memalpha_lab.run_state`). Each seed trains B right after A, then validates both, so that the
two arms matched in CPU seconds train on one machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from memalpha_lab.arm_configs import logger
from memalpha_lab.arm_runs import validate
from memalpha_lab.common import REPO_ROOT, RESULTS_DIR
from memalpha_lab.compute import stage_seconds
from memalpha_lab.control_arms_report import START
from memalpha_lab.decisive_plan import collect_scores, held_out_config
from memalpha_lab.decisive_study import Decisive, decisive_stages, run_study
from memalpha_lab.decisive_study import parse_args as decisive_args
from memalpha_lab.decisive_study import settings as decisive_settings
from memalpha_lab.length_report import (
    DROP_METRICS,
    GRPO,
    METRICS,
    PRIMARY,
    SFT,
    length_values,
    print_length,
    rebuild,
)
from memalpha_lab.length_report import main as report
from memalpha_lab.recipe_configs import write_yaml

VAL_DATA_SEED, TRAIN_DATA_SEED_BASE = 5900, 5910
"""This study's held-out sets (no earlier study's: they used 0, 3900 and 4900; bench_length uses 5800)
and training streams."""
LENGTHS = "2,8,32"
"""The held-out lengths in chunks: the recipe's training length, 4 and 16 times it."""


def folder(chunks: int) -> str:
    """The run-folder subfolder of the held-out set of ``chunks`` chunks per instance."""
    return f"validate_chunks{chunks}"


class LengthStudy(Decisive):
    """The decisive study's stages, every adapter validated at each held-out length."""

    benchmark = "length_study"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.length_yamls = {
            n: write_yaml(self.length_config(n), self.run_dir / f"{folder(n)}.yaml") for n in args.length_list
        }

    def length_config(self, chunks: int) -> dict[str, Any]:
        """``memalpha validate`` on the held-out set of ``chunks`` chunks per instance."""
        config = held_out_config(self.base_fit, self.run_dir, self.args, self.args.val_data_seed)
        config["data"]["synthetic"]["chunks"] = chunks
        config["data"]["synthetic"]["evidence"] = "spread"
        config["trainer"]["logger"] = logger(self.run_dir, folder(chunks), START)
        return config

    def validate_adapter(self, adapter: Path, name: str) -> dict[int, Any]:
        return {
            n: validate(self.run_dir, self.length_yamls[n], adapter, name, self.args.reuse, folder(n))
            for n in self.args.length_list
        }

    def validation_reports(self, name: str) -> list[Path]:
        return [self.run_dir / folder(n) / name / "validation.json" for n in self.args.length_list]

    def collect_scores(self) -> dict[str, Any]:
        arms = tuple(arm for arm, _ in self.arm_commands)
        return {
            "lengths": {
                str(n): collect_scores(self.run_dir, self.args.seed_list, arms, folder(n), length_values)
                for n in self.args.length_list
            }
        }

    def study_settings(self) -> dict[str, Any]:
        return {**settings(self.args), "validation_compute": self.validation_compute()}

    def validation_compute(self) -> dict[str, Any]:
        """Wall and CPU seconds of every validation so far, from the run's compute ledger."""
        stages = sorted(
            p.stem
            for n in self.args.length_list
            for p in (self.run_dir / "compute").glob(f"{folder(n)}_*.json")
        )
        return {stage: stage_seconds(self.run_dir, stage) for stage in stages}

    def rebuild(self, scores: dict[str, Any], planned: list[int]) -> dict[str, Any]:
        return rebuild(scores, planned)

    def print_result(self, result: dict[str, Any]) -> None:
        print_length(result)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as this run carries it out (docs/results.md, "Pre-registered: does GRPO's gain hold ...")."""
    return {
        **decisive_settings(args),
        "lengths": args.length_list,
        "evidence": "spread",
        "primary": f"{PRIMARY} at {max(args.length_list)} chunks, {GRPO} - {SFT}, t over seeds",
        "secondary": list(METRICS),
        "drops": list(DROP_METRICS),
        "guard": f"memory_share <= 0.5 at {max(args.length_list)} chunks in every seed's {GRPO} run",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The decisive study's options with this study's defaults and ``--lengths``."""
    raw = list(sys.argv[1:] if argv is None else argv)
    lengths = LENGTHS
    if "--lengths" in raw:
        at = raw.index("--lengths")
        lengths = raw[at + 1] if at + 1 < len(raw) else ""
        raw = raw[:at] + raw[at + 2 :]
    defaults = [
        "--val",
        "64",
        "--val-data-seed",
        str(VAL_DATA_SEED),
        "--train-data-seed-base",
        str(TRAIN_DATA_SEED_BASE),
        "--run-dir",
        str(REPO_ROOT / "runs" / "length_study"),
        "--out",
        str(RESULTS_DIR / "length_study.json"),
    ]
    args = decisive_args([*defaults, *raw], __doc__.split("\n", 1)[0])
    try:
        args.length_list = sorted({int(n) for n in lengths.split(",")})
    except ValueError:
        raise SystemExit(
            f"length_study: --lengths must be comma-separated integers, got {lengths!r}"
        ) from None
    if len(args.length_list) < 2 or args.length_list[0] < 1:
        raise SystemExit(f"length_study: --lengths needs two lengths or more, each >= 1, got {lengths!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_study(parse_args(argv), "length_study", LengthStudy, decisive_stages, report)


if __name__ == "__main__":
    raise SystemExit(main())
