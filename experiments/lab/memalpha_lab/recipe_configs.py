"""The configs of the studies' recipe, derived from the user's configs, and their YAML files.

``experiments/studies/learning_curve.py`` runs the recipe (oracle demonstrations, an SFT start, GRPO
from it); the control arms, the GRPO levers and the decisive study build their runs on the same two
configs (:mod:`memalpha_lab.arm_configs`):

* :func:`sft_config`: ``memalpha sft`` of the start, ``steps`` SFT steps on the run's demonstrations,
  its adapter exported to ``<run_dir>/sft/adapter``;
* :func:`fit_config`: ``memalpha fit`` of one seed, validating every ``args.every`` steps, with its own
  TensorBoard version, checkpoints and exported adapter.

Every stage reads its config from a file written next to the run (:func:`write_yaml`, atomically).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml

from memalpha_lab.common import write_text_atomically


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML config as a mapping; stops the experiment when the file holds anything else."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise SystemExit(f"learning curve: {path} is not a YAML mapping")
    return config


def write_yaml(config: dict[str, Any], path: Path) -> Path:
    """Write ``config`` atomically (a second experiment process rewriting the same config never shows a
    half-written file to a running stage)."""
    return write_text_atomically(path, yaml.safe_dump(config, sort_keys=False))


def sft_config(base: dict[str, Any], run_dir: Path, steps: int) -> dict[str, Any]:
    """The SFT start: ``steps`` steps on ``<run_dir>/demos``, logged under ``sft``, no checkpoints."""
    config = copy.deepcopy(base)
    trainer = config.setdefault("trainer", {})
    trainer["max_steps"] = steps
    trainer["val_check_interval"] = steps
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(run_dir), "name": "sft"},
    }
    trainer["callbacks"] = []
    trainer["enable_checkpointing"] = False
    config["model"]["export_adapter_dir"] = str(run_dir / "sft" / "adapter")
    config["data"]["train_path"] = str(run_dir / "demos" / "train.jsonl")
    config["data"]["val_path"] = str(run_dir / "demos" / "val.jsonl")
    return config


def fit_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The GRPO run of one seed (its own TensorBoard version, checkpoints and adapter); ``args`` holds
    ``steps``, ``every``, ``learning_rate``, ``val`` and ``questions`` (None keeps the base's)."""
    config = copy.deepcopy(base)
    version = f"seed{seed}"
    config["seed_everything"] = seed
    config["model"]["seed"] = seed
    config["model"]["export_adapter_dir"] = str(run_dir / "curve" / version / "adapter")
    trainer = config.setdefault("trainer", {})
    trainer["max_steps"] = args.steps
    trainer["val_check_interval"] = args.every
    trainer["check_val_every_n_epoch"] = None
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(run_dir), "name": "curve", "version": version},
    }
    trainer["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {
                "dirpath": str(run_dir / "checkpoints" / version),
                "every_n_train_steps": 1,
                "save_top_k": 0,
                "save_last": True,
            },
        }
    ]
    config["model"]["log_text_every_n_steps"] = 0
    if args.learning_rate is not None:
        config["model"].setdefault("optimizer", {})["learning_rate"] = args.learning_rate
    config["data"].setdefault("synthetic", {})["val"] = args.val
    if args.questions is not None:  # more questions per instance make r1 (and accuracy) finer-grained
        config["data"]["synthetic"]["questions"] = args.questions
    config["data"]["val_path"] = None
    return config
