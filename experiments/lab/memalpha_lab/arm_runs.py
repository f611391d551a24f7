"""The control arms' runs, which the learning studies built on them share: one arm's training
(:func:`train_run`, resumed from its ``last.ckpt``), its validation (:func:`validate`, one process per
validation of a run folder), its compute record (:func:`arm_compute`) and TensorBoard step times
(:func:`step_seconds`), and :class:`Experiment`, the control arms' run folder, configs and stages (the
shared SFT start, the GRPO arms and SFT continued), whose summaries are rewritten after every stage.
Every stage is the user's command line (:func:`memalpha_lab.cli_runs.memalpha_stage`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memalpha_lab.arm_configs import (
    arm_fit_config,
    continued_sft_config,
    logger,
    replayed_config,
    tag,
    validate_config,
)
from memalpha_lab.cli_runs import memalpha_stage
from memalpha_lab.common import REPO_ROOT, command_line, load_records, machine_info, write_json
from memalpha_lab.compute import measured, stage_record, training_compute, validation_counts
from memalpha_lab.control_arms_report import INTERVALS, START, TRAIN_TAGS, arm_means, comparisons, plot
from memalpha_lab.instance_scores import study_instance_values
from memalpha_lab.recipe_configs import load_yaml, sft_config, write_yaml
from memalpha_lab.run_state import claimed, lost, rebuild, trained
from memalpha_lab.tb_scalars import event_scalars


def step_seconds(folder: Path) -> list[float]:
    """The TensorBoard ``step_s`` of every step of the run logged under ``folder``."""
    series = event_scalars(folder, ("step_s",)).get("step_s", {})
    return [series[s] for s in sorted(series)]


def train_run(config_path: Path, config: dict[str, Any], log: Path, command: str) -> None:
    """``memalpha fit``/``sft`` of one arm, resumed from its ``last.ckpt`` when a killed run left one."""
    last = Path(config["trainer"]["callbacks"][0]["init_args"]["dirpath"]) / "last.ckpt"
    resume = ["--ckpt_path", str(last)] if last.is_file() else []
    memalpha_stage(command, "--config", str(config_path), *resume, log=log)


def validate(run_dir: Path, val_yaml: Path, adapter: Path, version: str, reuse: bool,
             folder: str = "validate") -> dict[str, Any] | None:
    """``memalpha validate`` of ``adapter`` into ``<run_dir>/<folder>/<version>`` (kept when its report
    exists under ``--reuse``; its wall and CPU seconds recorded as the stage ``<folder>_<version>``); its
    per-instance scores. None when another process over the same run folder is running this validation
    (it holds ``<folder>/<version>.lock``): this one goes on with its next stage."""
    report = run_dir / folder / version / "validation.json"
    if not (reuse and report.is_file()):
        with claimed(run_dir / folder / f"{version}.lock") as mine:
            if not mine:
                print(f"  {folder}/{version}: another process is validating it; going on", flush=True)
                return None
            if not (reuse and report.is_file()):  # not finished by that other process meanwhile
                with measured(run_dir, f"{folder}_{version}"):
                    memalpha_stage(
                        "validate", "--config", str(val_yaml), "--model.adapter_path", str(adapter),
                        "--trainer.logger.init_args.name", folder, "--trainer.logger.init_args.version",
                        version, log=run_dir / "logs" / f"{folder}_{version}.log",
                    )
    return study_instance_values(load_records(report))


def arm_compute(run_dir: Path, name: str, command: str) -> dict[str, Any]:
    """The compute of the run ``name`` (:mod:`memalpha_lab.compute`): ``train`` (its ``memalpha
    <command>``: optimiser steps, training seconds, rollouts, tokens sampled and reader calls from its
    TensorBoard events, wall and CPU seconds of the subprocess) and ``validate`` (its validation, when
    there is one)."""
    out = {"train": stage_record(run_dir, f"{command}_{name}",
                                 training_compute(run_dir / "arms" / name, sampled=command == "fit"))}
    report = run_dir / "validate" / name / "validation.json"
    if report.is_file():
        out["validate"] = stage_record(run_dir, f"validate_{name}", validation_counts(load_records(report)))
    return out


def command_runner(command: str) -> Callable[[Path, Path], None]:
    """``memalpha <command> --config CONFIG`` with its output in ``LOG``, as a function of both."""
    return lambda config, log: memalpha_stage(command, "--config", str(config), log=log)


def max_abs_change(before: Path, after: Path) -> float:
    """The largest absolute change of any weight between two exported adapters."""
    from safetensors.torch import load_file

    a, b = (
        load_file(str(before / "adapter_model.safetensors")),
        load_file(str(after / "adapter_model.safetensors")),
    )
    if a.keys() != b.keys():
        raise SystemExit(f"control arms: {before} and {after} hold different tensors")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


class Experiment:
    """The run's folders and configs, and what it has measured so far (written after every stage)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_dir = args.run_dir.resolve()
        self.logs = self.run_dir / "logs"
        self.adapter = self.run_dir / "sft" / "adapter"
        self.base_fit, self.base_sft = load_yaml(args.config), load_yaml(args.sft_config)
        self.val_yaml = write_yaml(self.validation_config(), self.run_dir / "validate.yaml")
        self.demos_yaml = self.val_yaml  # the config the demonstrations are drawn with (its data.seed)
        self.scores: dict[str, Any] = {START: None, "seeds": {}}
        self.runs: dict[str, dict[str, Any]] = {}
        self.train: dict[str, dict[str, dict[str, float]]] = {}
        self.machine = machine_info()
        self.started = time.perf_counter()

    def validation_config(self) -> dict[str, Any]:
        """The ``validate`` config every adapter is scored with (its ``data.seed`` sets the held-out set)."""
        return validate_config(self.base_fit, self.run_dir, self.args)

    def fit_config(self, seed: int, arm: str) -> dict[str, Any]:
        """The ``fit`` config of a GRPO arm."""
        return arm_fit_config(self.base_fit, self.run_dir, self.args, seed, arm)

    def start(self) -> None:
        """Demonstrations, the shared SFT start, and its validation."""
        self.train_start()
        self.validate_start()

    def train_start(self) -> None:
        """Demonstrations and the shared SFT start (trained again where a restored run state lost it)."""
        args, run_dir = self.args, self.run_dir
        demos = run_dir / "demos"
        if not (args.reuse and (demos / "val.jsonl").is_file()):
            with measured(run_dir, "demos"):
                memalpha_stage("data", "demos", "--config", str(self.demos_yaml),
                               "--out", str(demos / "train.jsonl"), "--count", str(args.demos),
                               log=self.logs / "demos_train.log")
                memalpha_stage("data", "demos", "--config", str(self.demos_yaml),
                               "--out", str(demos / "val.jsonl"), "--split", "test", "--count", "2",
                               log=self.logs / "demos_val.log")
        if not (args.reuse and trained(run_dir, self.adapter)):
            config = sft_config(self.base_sft, run_dir, args.sft_steps)
            config["trainer"]["logger"] = logger(run_dir, "sft", START)  # one events folder, rerun or not
            with measured(run_dir, f"sft_{START}"):
                memalpha_stage("sft", "--config", str(write_yaml(config, run_dir / "sft.yaml")),
                               log=self.logs / "sft.log")
        elif lost(run_dir, self.adapter):  # every arm trains from it: always needed again
            rebuild(run_dir, self.adapter, run_dir / "sft.yaml", command_runner("sft"))
        self.sft_step_s = step_seconds(run_dir / "sft" / START)

    def validate_start(self) -> None:
        """The start's validation and both JSON files."""
        self.scores[START] = self.validate_adapter(self.adapter, START)
        self.write()

    def validate_adapter(self, adapter: Path, name: str) -> Any:
        """``memalpha validate`` of the run ``name``'s adapter on the held-out set (:func:`validate`)."""
        return validate(self.run_dir, self.val_yaml, adapter, name, self.args.reuse)

    def validation_reports(self, name: str) -> list[Path]:
        """The reports :meth:`validate_adapter` writes for the run ``name``."""
        return [self.run_dir / "validate" / name / "validation.json"]

    def pending(self, name: str) -> bool:
        """Whether a validation of the run ``name`` is still to finish (so its weights are needed)."""
        return not all(report.is_file() for report in self.validation_reports(name))

    def train_arm(self, name: str, config: dict[str, Any], command: str) -> tuple[Path, Path, bool]:
        """The run ``name``'s config written, and its ``memalpha <command>`` (:func:`train_run`, its compute
        recorded as the stage ``<command>_<name>``) unless ``--reuse`` finds it trained: its config file, its
        folder under ``arms/`` and whether it trained now."""
        path = write_yaml(config, self.run_dir / f"{name}.yaml")
        folder = self.run_dir / "arms" / name
        if self.args.reuse and trained(self.run_dir, folder / "adapter"):
            return path, folder, False
        with measured(self.run_dir, f"{command}_{name}"):
            train_run(path, config, self.logs / f"{command}_{name}.log", command)
        return path, folder, True

    def grpo_arm(self, seed: int, arm: str) -> None:
        self.finish_arm(seed, arm, self.train_grpo(seed, arm))

    def train_grpo(self, seed: int, arm: str) -> Path:
        """The GRPO arm's fit (trained again where a restored run state lost it and a validation needs
        it); its adapter."""
        name = tag(seed, arm)
        path, folder, ran = self.train_arm(name, self.fit_config(seed, arm), "fit")
        if not ran and lost(self.run_dir, folder / "adapter") and self.pending(name):
            rebuild(self.run_dir, folder / "adapter", path, command_runner("fit"))
        self.train[name] = {
            t: {str(k): v for k, v in s.items()} for t, s in event_scalars(folder, TRAIN_TAGS).items()
        }
        self.runs[name] = {"train_s": sum(step_seconds(folder)), "steps": self.args.steps}
        if arm == "grpo_lr0":
            self.runs[name]["no_update_max_abs_change"] = max_abs_change(self.adapter, folder / "adapter")
        return folder / "adapter"

    def continued_sft(self, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``sft_continued`` run's config, and how its compute was matched (for its run record):
        Lightning's ``trainer.max_time`` = the same seed's ``grpo`` run's summed ``step_s``."""
        seconds = sum(step_seconds(self.run_dir / "arms" / tag(seed, "grpo")))
        return continued_sft_config(self.base_sft, self.run_dir, seed, seconds), {"max_time_s": seconds}

    def sft_arm(self, seed: int) -> None:
        self.finish_arm(seed, "sft_continued", self.train_sft(seed))

    def train_sft(self, seed: int) -> Path:
        """The continued SFT arm (trained again to the steps it took where a restored run state lost it
        and a validation needs it); its adapter."""
        name = tag(seed, "sft_continued")
        config, matched = self.continued_sft(seed)
        _, folder, ran = self.train_arm(name, config, "sft")
        if not ran and lost(self.run_dir, folder / "adapter") and self.pending(name):
            replay = write_yaml(replayed_config(config, len(step_seconds(folder))),
                                self.run_dir / f"{name}.replay.yaml")
            rebuild(self.run_dir, folder / "adapter", replay, command_runner("sft"))
        taken = step_seconds(folder)
        self.runs[name] = {"train_s": sum(taken), "steps": len(taken), **matched}
        return folder / "adapter"

    def finish_arm(self, seed: int, arm: str, adapter: Path) -> None:
        """Validate the arm, record its compute (training and validation) and write both JSON files."""
        name = tag(seed, arm)
        self.scores["seeds"].setdefault(str(seed), {})[arm] = self.validate_adapter(adapter, name)
        self.runs[name]["compute"] = arm_compute(
            self.run_dir, name, "sft" if arm == "sft_continued" else "fit"
        )
        self.write()

    def write(self) -> dict[str, Any]:
        """Both JSON files and the plot, from everything measured so far."""
        args = self.args
        scores_path = args.out.parent / args.out.stem / "instance_scores.json"
        write_json({"benchmark": "control_arms", **self.scores}, scores_path, machine=self.machine)
        means, compared = arm_means(self.scores), comparisons(self.scores)
        sft_step_s = getattr(self, "sft_step_s", [])
        result = {
            "benchmark": "control_arms",
            "command": command_line(),
            "settings": {
                "config": str(args.config),
                "sft_config": str(args.sft_config),
                "demos": args.demos,
                "sft_steps": args.sft_steps,
                "steps": args.steps,
                "val_instances": args.val,
                "questions": args.questions,
                "seeds": args.seed_list,
                "lr0": args.lr0,
                "time_matching": (
                    "sft_continued: Lightning trainer.max_time = the same seed grpo run summed step_s"
                ),
                "intervals": INTERVALS,
            },
            "instance_scores": str(
                scores_path.relative_to(REPO_ROOT) if scores_path.is_relative_to(REPO_ROOT) else scores_path
            ),
            "start_sft_step_s": sft_step_s,
            "runs": self.runs,
            "arm_means": means,
            "comparisons": compared,
            "train": self.train,
            "wall_s": round(time.perf_counter() - self.started, 1),
        }
        write_json(result, args.out, machine=self.machine)
        if self.scores[START]:
            plot(means, compared, self.train, args.out.with_suffix(".png"))
        return result
