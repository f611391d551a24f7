"""The pre-registered decisive study as it runs (issue 39, item 3; its configs and scores are
:mod:`memalpha_lab.decisive_plan`), shared by the studies built on it: :class:`Decisive`, the control
arms' experiment (:class:`memalpha_lab.arm_runs.Experiment`) with the decisive study's held-out set, arm
A's recipe and summaries rebuilt from the run folder; its options (:func:`parse_args`) and settings; arm
B's CPU budget, arm A's CPU seconds from the compute ledger (:func:`grpo_cpu_seconds`); and a study's
command line (:func:`run_study`: ``--check``, or the start under a lock, then each seed's stages).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memalpha_lab.arm_configs import cpu_matched_sft_config, tag
from memalpha_lab.arm_runs import Experiment, arm_compute, step_seconds
from memalpha_lab.common import command_line, write_json
from memalpha_lab.compute import (
    ledger_path,
    running_marker,
    stage_record,
    stage_seconds,
    training_compute,
    unrecorded_attempt,
)
from memalpha_lab.control_arms_report import INTERVALS, START, TRAIN_TAGS
from memalpha_lab.decisive_plan import (
    TRAIN_DATA_SEED_BASE,
    VAL_DATA_SEED,
    collect_scores,
    held_out_config,
    recipe_config,
)
from memalpha_lab.decisive_report import GRPO, GUARD_LIMIT, PRIMARY, SECONDARY, SFT, print_decisive, rebuild
from memalpha_lab.levers import LEVERS
from memalpha_lab.recipe_configs import write_yaml
from memalpha_lab.run_state import check_product, trained
from memalpha_lab.study_runner import (
    add_plan_arguments,
    add_recipe_arguments,
    add_run_arguments,
    check_positive,
    parse_seeds,
    refuse_run_dir,
    start_lock,
)
from memalpha_lab.tb_scalars import event_scalars


def collect_runs(run_dir: Path, seeds: list[int],
                 arm_commands: tuple[tuple[str, str], ...] = ((GRPO, "fit"), (SFT, "sft")),
                 budget_arm: str = GRPO) -> dict[str, Any]:
    """Each trained run's training seconds, steps and compute (:func:`memalpha_lab.arm_runs.arm_compute`), the
    matched arms' ``cpu_budget_s`` (``budget_arm``'s recorded CPU seconds), and the start's SFT; from
    what ``run_dir`` holds. ``arm_commands``: each arm and the ``memalpha`` command that trains it."""
    runs: dict[str, Any] = {}
    if trained(run_dir, run_dir / "sft" / "adapter"):
        runs[f"seed0_{START}"] = {"train_s": sum(step_seconds(run_dir / "sft" / START)),
                                  "steps": len(step_seconds(run_dir / "sft" / START)),
                                  "compute": {"train": arm_compute_start(run_dir)}}
    for seed in seeds:
        for arm, command in arm_commands:
            name = tag(seed, arm)
            if trained(run_dir, run_dir / "arms" / name / "adapter"):
                taken = step_seconds(run_dir / "arms" / name)
                runs[name] = {"train_s": sum(taken), "steps": len(taken),
                              "compute": arm_compute(run_dir, name, command)}
                if arm != budget_arm:
                    runs[name]["cpu_budget_s"] = recorded_grpo_cpu_seconds(run_dir, seed, budget_arm)
    return runs


def recorded_grpo_cpu_seconds(run_dir: Path, seed: int, arm: str = GRPO) -> float | None:
    """The CPU seconds of arm A's (or GRPO ``arm``'s) ``memalpha fit`` for ``seed`` summed over its
    recorded attempts; None when the ledger does not hold every attempt (none recorded, or one killed
    with the experiment)."""
    stage = f"fit_{tag(seed, arm)}"
    seconds = stage_seconds(run_dir, stage)
    if seconds is None or not seconds["complete"] or unrecorded_attempt(run_dir, stage):
        return None
    return seconds["cpu_s"]


def budget_unknown(run_dir: Path, seed: int, arm: str = GRPO) -> SystemExit:
    """The one-line stop when the CPU seconds of ``arm``'s fit (the budget of the arms matched to it)
    are not all recorded, naming what to move aside."""
    stage, name = f"fit_{tag(seed, arm)}", tag(seed, arm)
    return SystemExit(
        f"{run_dir.name}: {ledger_path(run_dir, stage)} does not hold every attempt of {name}'s fit "
        f"(an attempt was killed with the experiment), so the matched arms' CPU budget is unknown; move "
        f"{run_dir / 'arms' / name}, {run_dir / 'checkpoints' / name}, that ledger "
        f"and {running_marker(run_dir, stage)} aside and rerun"
    )


def grpo_cpu_seconds(run_dir: Path, seed: int, arm: str = GRPO) -> float:
    """The matched arms' budget, :func:`recorded_grpo_cpu_seconds`; exits with one line when it is unknown."""
    seconds = recorded_grpo_cpu_seconds(run_dir, seed, arm)
    if seconds is None:
        raise budget_unknown(run_dir, seed, arm)
    return seconds


def arm_compute_start(run_dir: Path) -> dict[str, Any]:
    """The start's SFT compute (its events are under ``sft/start``)."""
    return stage_record(run_dir, f"sft_{START}", training_compute(run_dir / "sft" / START, sampled=False))


class Decisive(Experiment):
    """:class:`memalpha_lab.arm_runs.Experiment` with the decisive study's held-out set, arm A's recipe, and
    summaries rebuilt from the run folder. A study with other arms sets the class attributes: its
    arms and the commands that train them, the arm whose CPU seconds the others are matched to, the
    GRPO arms whose training scalars the summary keeps, and its report."""

    benchmark = "decisive"
    arm_commands: tuple[tuple[str, str], ...] = ((GRPO, "fit"), (SFT, "sft"))
    budget_arm = GRPO
    sampled_arms: tuple[str, ...] = (GRPO,)
    train_tags: tuple[str, ...] = TRAIN_TAGS

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        demos = held_out_config(self.base_fit, self.run_dir, args, args.demos_data_seed)
        self.demos_yaml = write_yaml(demos, self.run_dir / "demos.yaml")

    def validation_config(self) -> dict[str, Any]:
        return held_out_config(self.base_fit, self.run_dir, self.args, self.args.val_data_seed)

    def fit_config(self, seed: int, arm: str) -> dict[str, Any]:
        return recipe_config(self.base_fit, self.run_dir, self.args, seed)

    def train_grpo(self, seed: int, arm: str) -> Path:
        """A's fit (:meth:`memalpha_lab.arm_runs.Experiment.train_grpo`), refused before it starts when an
        earlier attempt went unrecorded (B's budget would then be unknown, :func:`budget_unknown`)."""
        name = tag(seed, arm)
        if not (self.args.reuse and trained(self.run_dir, self.run_dir / "arms" / name / "adapter")) \
                and unrecorded_attempt(self.run_dir, f"fit_{name}"):
            raise budget_unknown(self.run_dir, seed, arm)
        return super().train_grpo(seed, arm)

    def train_sft(self, seed: int) -> Path:
        """B's SFT (:meth:`memalpha_lab.arm_runs.Experiment.train_sft`), refused before it resumes when an
        earlier attempt was killed (its marker left): :class:`memalpha_lab.cpu_budget.CpuBudget` does not
        count a killed process's seconds after its last checkpoint, so a resumed B could overshoot A's CPU
        seconds."""
        name, stage = tag(seed, SFT), f"sft_{tag(seed, SFT)}"
        if not (self.args.reuse and trained(self.run_dir, self.run_dir / "arms" / name / "adapter")) \
                and unrecorded_attempt(self.run_dir, stage):
            raise SystemExit(
                f"{self.run_dir.name}: an attempt of {name}'s SFT was killed "
                f"({running_marker(self.run_dir, stage)} left), so resuming "
                f"it could spend more than its CPU budget; move {self.run_dir / 'arms' / name}, "
                f"{self.run_dir / 'checkpoints' / name} and that marker aside and rerun"
            )
        return super().train_sft(seed)

    def continued_sft(self, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """B's config: SFT continued from the start until its process has spent A's CPU seconds."""
        budget = grpo_cpu_seconds(self.run_dir, seed, self.budget_arm)
        return cpu_matched_sft_config(self.base_sft, self.run_dir, seed, budget), {"cpu_budget_s": budget}

    def study_settings(self) -> dict[str, Any]:
        """The plan as this run carries it out."""
        return settings(self.args)

    def rebuild(self, scores: dict[str, Any], planned: list[int]) -> dict[str, Any]:
        """What the study's report rebuilds from the scores (means, comparisons, the decision)."""
        return rebuild(scores, planned)

    def print_result(self, result: dict[str, Any]) -> None:
        """The rebuilt comparisons and the verdict, as the study's report prints them."""
        print_decisive(result)

    def collect_scores(self) -> dict[str, Any]:
        """The per-instance scores of every validation ``run_dir`` holds."""
        return collect_scores(self.run_dir, self.args.seed_list, tuple(arm for arm, _ in self.arm_commands))

    def write(self) -> dict[str, Any]:
        """Both JSON files from everything ``run_dir`` holds (this process's stages and another's)."""
        args = self.args
        scores = self.collect_scores()
        scores_path = args.out.parent / args.out.stem / "instance_scores.json"
        write_json({"benchmark": self.benchmark, **scores}, scores_path, machine=self.machine)
        planned = args.planned_list
        seeds = sorted(set(planned) | set(args.seed_list))
        result = {
            "benchmark": self.benchmark,
            "command": command_line(),
            "settings": self.study_settings(),
            "instance_scores": os.path.relpath(scores_path, args.out.resolve().parent.parent.parent),
            "runs": collect_runs(self.run_dir, seeds, self.arm_commands, self.budget_arm),
            **self.rebuild(scores, planned),
            "train": {tag(s, arm): {t: {str(k): v for k, v in series.items()}
                                    for t, series in event_scalars(self.run_dir / "arms" / tag(s, arm),
                                                                   self.train_tags).items()}
                      for s in planned for arm in self.sampled_arms
                      if (self.run_dir / "arms" / tag(s, arm)).is_dir()},
            "wall_s": round(time.perf_counter() - self.started, 1),
        }
        write_json(result, args.out, machine=self.machine)
        return result


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as this run carries it out (docs/results.md, "Pre-registered: ...")."""
    return {
        "plan_commit": args.plan_commit, "product_commit": args.product_commit,
        "config": str(args.config), "sft_config": str(args.sft_config),
        "demos": args.demos, "demos_data_seed": args.demos_data_seed, "sft_steps": args.sft_steps,
        "recipe": args.recipe, "recipe_settings": LEVERS[args.recipe], "steps": args.steps,
        "seeds": args.planned_list,
        "train_data_seeds": {str(s): args.train_data_seed_base + s for s in args.planned_list},
        "val_instances": args.val, "questions": args.questions, "val_data_seed": args.val_data_seed,
        "val_split": "validation", "primary": f"{PRIMARY}, {GRPO} - {SFT}, t over seeds",
        "secondary": list(SECONDARY), "guard": f"memory_share <= {GUARD_LIMIT} in every seed's {GRPO} run",
        "compute_matching": f"{SFT}: stopped (memalpha_lab.cpu_budget.CpuBudget) when its memalpha sft "
                            f"process has spent the CPU seconds of the same seed's {GRPO} memalpha fit "
                            "(compute ledger); amendment in docs/results.md",
        "intervals": INTERVALS,
    }


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The decisive study's options (``description`` heads their help), checked; the studies built on it
    put their own defaults before ``argv``."""
    parser = argparse.ArgumentParser(description=description)
    add_recipe_arguments(
        parser,
        sft_steps=16,
        sft_help="SFT steps of the start (the control arms': 16)",
        steps=8,
        steps_help="GRPO steps of arm A",
    )
    parser.add_argument("--recipe", default="extractive_instances_4", choices=sorted(LEVERS),
                        help="the grpo_levers lever whose settings arm A trains with")
    parser.add_argument("--val", type=int, default=96, help="held-out synthetic validation instances")
    parser.add_argument(
        "--questions", type=int, default=4, help="questions per training and validation instance"
    )
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds this process runs")
    parser.add_argument(
        "--planned-seeds", default="0,1,2,3,4", help="the pre-registered seeds the verdict needs"
    )
    parser.add_argument("--val-data-seed", type=int, default=VAL_DATA_SEED)
    parser.add_argument("--train-data-seed-base", type=int, default=TRAIN_DATA_SEED_BASE)
    parser.add_argument("--demos-data-seed", type=int, default=0)
    add_plan_arguments(parser, "decisive_report.py")
    add_run_arguments(parser, "decisive", "decisive")
    args = parser.parse_args(argv)
    check_positive(parser, args, ("demos", "sft_steps", "steps", "val", "questions"))
    args.seed_list = parse_seeds(parser, args.seeds)
    args.planned_list = parse_seeds(parser, args.planned_seeds)
    stream = {args.train_data_seed_base + s for s in args.planned_list}
    if args.val_data_seed in stream or args.val_data_seed == args.demos_data_seed:
        parser.error(f"--val-data-seed {args.val_data_seed} must differ from every training data seed")
    args.lr0 = None  # arm_fit_config reads it only for the arm grpo_lr0
    return args


def run_study(args: argparse.Namespace, name: str, experiment_class: type[Decisive],
              stages: Callable[[Decisive, int], None], report: Callable[[list[str]], int]) -> int:
    """A study's command line: with ``--check`` only ``report``'s rebuild of the committed files; else the
    start (trained under a lock by the first of several processes over one folder, then validated: a
    validation another process runs is left to it), ``stages`` of every seed in turn, and the summary."""
    if args.check:
        return report(["--scores", str(args.out.parent / args.out.stem / "instance_scores.json"),
                       "--summary", str(args.out), "--check"])
    if args.product_commit is not None:
        check_product(args.product_commit, name)
    run_dir = args.run_dir.resolve()
    refuse_run_dir(run_dir, args.reuse, name)
    print(f"{name} in {run_dir}, seeds {args.seed_list}", flush=True)
    with start_lock(run_dir):
        experiment = experiment_class(args)
        experiment.train_start()
    experiment.validate_start()
    for seed in args.seed_list:
        stages(experiment, seed)
    result = experiment.write()
    experiment.print_result(result)
    print(f"\n(written to {args.out}; {result['wall_s'] / 60:.1f} min)")
    return 0


def decisive_stages(experiment: Decisive, seed: int) -> None:
    """A's fit, B matched to its CPU seconds right after it (so on the same machine: a study spans
    sessions, and a new machine may be faster or slower), then the validations of both."""
    adapters = {GRPO: experiment.train_grpo(seed, GRPO), SFT: experiment.train_sft(seed)}
    for arm, adapter in adapters.items():
        experiment.finish_arm(seed, arm, adapter)
