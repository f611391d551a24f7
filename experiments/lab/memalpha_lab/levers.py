"""The GRPO levers (``experiments/studies/grpo_levers.py``): the control arms' ``grpo`` run with one
setting changed, each lever's config, and the lever runs a run folder has validated.

A lever run of seed ``S`` is named ``seed<S>_lever_<lever>`` (:func:`memalpha_lab.arm_configs.tag`);
its config is the seed's ``grpo`` fit config (:func:`memalpha_lab.arm_configs.arm_fit_config`) with
the dotted settings of :data:`LEVERS` set and its own adapter, logger version and checkpoints.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memalpha_lab.arm_configs import arm_fit_config, tag

LEVERS: dict[str, dict[str, Any]] = {
    "extractive_reader": {"model.reader.kind": "extractive"},
    "r1_weight_3": {"model.reward.accuracy_weight": 3.0},
    "lr_1e-3": {"model.optimizer.learning_rate": 1e-3},
    "group_8": {"model.rollout.group_size": 8},
    "instances_4": {"data.instances_per_step": 4},
    "extractive_instances_4": {"model.reader.kind": "extractive", "data.instances_per_step": 4},
    "steps_24": {"trainer.max_steps": 24},
}
"""Lever name -> the dotted settings it changes in the seed's ``grpo`` fit config."""


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    """``config[a][b][c] = value`` for ``key = "a.b.c"``, creating the groups on the way."""
    *groups, last = key.split(".")
    for group in groups:
        config = config.setdefault(group, {})
    config[last] = value


def lever_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace, lever: str,
                 seed: int) -> dict[str, Any]:
    """The seed's ``grpo`` fit config with ``lever``'s settings, under its own name."""
    config = arm_fit_config(base, run_dir, args, seed, "grpo")
    name = tag(seed, f"lever_{lever}")
    config["model"]["export_adapter_dir"] = str(run_dir / "arms" / name / "adapter")
    config["trainer"]["logger"]["init_args"]["version"] = name
    config["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(run_dir / "checkpoints" / name)
    for key, value in LEVERS[lever].items():
        set_dotted(config, key, value)
    return config


def lever_runs(run_dir: Path) -> list[tuple[int, str]]:
    """Every ``(seed, lever)`` validated in ``run_dir`` so far, by seed then lever order."""
    found = []
    for report in (run_dir / "validate").glob("seed*_lever_*/validation.json"):
        seed, _, lever = report.parent.name.removeprefix("seed").partition("_lever_")
        if seed.isdigit() and lever in LEVERS:
            found.append((int(seed), lever))
    return sorted(found, key=lambda run: (run[0], list(LEVERS).index(run[1])))
