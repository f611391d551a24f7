"""The configs of the control arms (``experiments/studies/control_arms.py``), which the GRPO levers
and the decisive study reuse (:mod:`memalpha_lab.levers`, :mod:`memalpha_lab.decisive_plan`).

Every arm starts from the shared SFT start ``<run_dir>/sft/adapter`` and exports its own adapter to
``<run_dir>/arms/seed<S>_<arm>/adapter`` (:func:`tag`), logs under ``arms/seed<S>_<arm>`` and
checkpoints under ``checkpoints/seed<S>_<arm>``:

* :func:`arm_fit_config`: ``memalpha fit`` of a GRPO arm (``grpo``, or ``grpo_lr0`` at ``args.lr0``),
  with no validation inside the run;
* :func:`continued_sft_config`: ``memalpha sft`` of ``sft_continued``, stopped by Lightning's
  ``trainer.max_time`` (the control arms) or, with :func:`cpu_matched_sft_config`, by a budget of CPU
  seconds (:class:`memalpha_lab.cpu_budget.CpuBudget`; the decisive study's amendment);
* :func:`validate_config`: ``memalpha validate`` of any adapter on the held-out instances.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

from memalpha_lab.control_arms_report import START
from memalpha_lab.recipe_configs import fit_config, sft_config

CONTINUED_SFT_STEP_CAP = 100_000
"""``max_steps`` of the continued SFT arm, whose length ``trainer.max_time`` sets."""


def tag(seed: int, arm: str) -> str:
    """The run's name: ``seed<seed>_<arm>``."""
    return f"seed{seed}_{arm}"


def checkpointing(dirpath: Path, every: int) -> list[dict[str, Any]]:
    """The callbacks of a resumable run: ``last.ckpt`` in ``dirpath`` every ``every`` steps."""
    return [{
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(dirpath), "every_n_train_steps": every, "save_top_k": 0,
                      "save_last": True},
    }]


def logger(run_dir: Path, name: str, version: str) -> dict[str, Any]:
    """A TensorBoard logger writing to ``<run_dir>/<name>/<version>``."""
    return {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": str(run_dir), "name": name, "version": version}}


def curve_settings(args: argparse.Namespace, learning_rate: float | None) -> argparse.Namespace:
    """The options :func:`memalpha_lab.recipe_configs.fit_config` reads."""
    return argparse.Namespace(steps=args.steps, every=args.steps, learning_rate=learning_rate, val=args.val,
                              questions=args.questions)


def arm_fit_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace, seed: int,
                   arm: str) -> dict[str, Any]:
    """``fit`` of a GRPO arm: no validation inside the run (``validate`` scores its exported adapter)."""
    config = fit_config(base, run_dir, curve_settings(args, args.lr0 if arm == "grpo_lr0" else None), seed)
    name = tag(seed, arm)
    config["model"]["adapter_path"] = str(run_dir / "sft" / "adapter")  # every arm starts from the SFT start
    config["model"]["export_adapter_dir"] = str(run_dir / "arms" / name / "adapter")
    config["trainer"]["logger"] = logger(run_dir, "arms", name)
    config["trainer"]["callbacks"] = checkpointing(run_dir / "checkpoints" / name, 1)
    config["trainer"]["limit_val_batches"] = 0
    return config


def validate_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``validate`` of any adapter on the held-out instances (they depend on ``data.seed`` only)."""
    config = fit_config(base, run_dir, curve_settings(args, None), 0)
    config["trainer"]["logger"] = logger(run_dir, "validate", START)
    config["trainer"]["callbacks"] = []
    config["model"].pop("export_adapter_dir", None)  # validate exports nothing
    return config


def max_time(seconds: float) -> str:
    """``seconds`` (at least 1, rounded) in Lightning's ``DD:HH:MM:SS`` form (a mapping would parse as
    text on the command line)."""
    whole = max(1, round(seconds))
    return f"{whole // 86400:02d}:{whole % 86400 // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def continued_sft_config(base: dict[str, Any], run_dir: Path, seed: int,
                         seconds: float | None) -> dict[str, Any]:
    """``sft`` of the arm ``sft_continued``: SFT from the start adapter for ``seconds`` of training
    (``trainer.max_time``; None: no time limit, a callback ends the run), its own seed for the
    demonstrations' order, checkpoints every 10 steps."""
    config = sft_config(base, run_dir, CONTINUED_SFT_STEP_CAP)
    config["trainer"]["max_time"] = None if seconds is None else max_time(seconds)
    config["trainer"]["limit_val_batches"] = 0  # validate scores its exported adapter
    name = tag(seed, "sft_continued")
    config["seed_everything"] = seed
    config["model"]["seed"] = seed
    config["model"]["adapter_path"] = str(run_dir / "sft" / "adapter")
    config["model"]["export_adapter_dir"] = str(run_dir / "arms" / name / "adapter")
    config["data"]["seed"] = seed
    config["trainer"]["logger"] = logger(run_dir, "arms", name)
    config["trainer"]["callbacks"] = checkpointing(run_dir / "checkpoints" / name, 10)
    config["trainer"]["enable_checkpointing"] = True
    return config


def cpu_matched_sft_config(base: dict[str, Any], run_dir: Path, seed: int,
                           cpu_seconds: float) -> dict[str, Any]:
    """:func:`continued_sft_config` stopped by CPU seconds instead of wall time: no ``trainer.max_time``,
    and a :class:`memalpha_lab.cpu_budget.CpuBudget` of ``cpu_seconds`` after the checkpoint callback
    (its state is saved in ``last.ckpt``, so a resumed run counts its earlier processes)."""
    config = continued_sft_config(base, run_dir, seed, None)
    config["trainer"]["callbacks"].append({"class_path": "memalpha_lab.cpu_budget.CpuBudget",
                                           "init_args": {"seconds": round(float(cpu_seconds), 3)}})
    return config


def replayed_config(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """A :func:`cpu_matched_sft_config` run trained again to the ``steps`` its CPU budget stopped it at:
    the budget's callback replaced by :class:`memalpha_lab.cpu_budget.StepCount` (a budget depends on the
    machine's speed, a step count does not)."""
    replay = copy.deepcopy(config)
    callbacks = replay["trainer"]["callbacks"]
    budgets = [k for k, c in enumerate(callbacks) if c["class_path"] == "memalpha_lab.cpu_budget.CpuBudget"]
    if len(budgets) != 1:
        raise ValueError(f"replayed_config: {len(budgets)} CpuBudget callbacks in the config, expected one")
    callbacks[budgets[0]] = {"class_path": "memalpha_lab.cpu_budget.StepCount", "init_args": {"steps": steps}}
    return replay
