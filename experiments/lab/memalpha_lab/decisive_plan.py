"""The pre-registered decisive study's runs (``experiments/studies/decisive.py``; the plan is in
docs/results.md, "Pre-registered: ..."): its held-out set, arm A's config, and the scores of every
validation its run folder holds.

* arm A (``grpo``) of seed ``s`` is the control arms' ``grpo`` fit config with the settings of the lever
  ``args.recipe`` (:data:`memalpha_lab.levers.LEVERS`) and its own GRPO stream, synthetic data seed
  ``args.train_data_seed_base + s`` (:func:`recipe_config`);
* every adapter is validated on the held-out set of synthetic data seed :data:`VAL_DATA_SEED`
  (:func:`held_out_config`), no earlier study's;
* each validated instance also holds ``memory_share``, its final memory tokens over its input tokens,
  the guard's metric (:func:`guarded_values`, :mod:`memalpha_lab.decisive_report`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memalpha.train.instance_scores import InstanceScores
from memalpha_lab.arm_configs import arm_fit_config, tag, validate_config
from memalpha_lab.common import load_records
from memalpha_lab.control_arms_report import START
from memalpha_lab.decisive_report import GRPO, SFT
from memalpha_lab.instance_scores import study_instance_values
from memalpha_lab.levers import LEVERS, set_dotted

VAL_DATA_SEED = 3900
"""The held-out set's synthetic data seed: every earlier study validated on data seed 0."""
TRAIN_DATA_SEED_BASE = 3910
"""Seed ``s``'s GRPO stream draws its training instances at synthetic data seed ``3910 + s``."""


def memory_shares(records: list[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """``{source: {instance: mean over its rollouts of memory_tokens / chunk_tokens}}`` (the guard's
    metric; an instance without input tokens has none)."""
    sums: dict[tuple[str, str], list[float]] = {}
    for record in records:
        if record["chunk_tokens"] > 0:
            key = (record["data_source"], record["instance_id"])
            sums.setdefault(key, []).append(record["memory_tokens"] / record["chunk_tokens"])
    out: dict[str, dict[str, float]] = {}
    for (source, instance), shares in sums.items():
        out.setdefault(source, {})[instance] = sum(shares) / len(shares)
    return out


def guarded_values(records: list[Mapping[str, Any]]) -> InstanceScores:
    """:func:`memalpha_lab.instance_scores.study_instance_values` with each instance's ``memory_share``."""
    values = study_instance_values(records)
    for source, instances in memory_shares(records).items():
        for instance, share in instances.items():
            values[source][instance]["memory_share"] = share
    return values


def recipe_config(
    base: dict[str, Any], run_dir: Path, args: argparse.Namespace, seed: int, arm: str = GRPO
) -> dict[str, Any]:
    """Arm A of ``seed`` (or another GRPO ``arm`` of the recipe, named so in its folders): the control
    arms' ``grpo`` fit config with the recipe's settings and its own GRPO stream (synthetic data seed
    ``args.train_data_seed_base + seed``)."""
    config = arm_fit_config(base, run_dir, args, seed, arm)
    for key, value in LEVERS[args.recipe].items():
        set_dotted(config, key, value)
    config["data"]["seed"] = args.train_data_seed_base + seed
    return config


def held_out_config(base: dict[str, Any], run_dir: Path, args: argparse.Namespace,
                    data_seed: int) -> dict[str, Any]:
    """The control arms' ``validate`` config on the held-out set of synthetic data seed ``data_seed``."""
    config = validate_config(base, run_dir, args)
    config["data"]["seed"] = data_seed
    return config


def validated(run_dir: Path, name: str, folder: str = "validate") -> Path | None:
    """The validation report of ``name`` in ``run_dir/folder``, None before it exists."""
    report = run_dir / folder / name / "validation.json"
    return report if report.is_file() else None


def collect_scores(run_dir: Path, seeds: list[int], arms: tuple[str, ...] = (GRPO, SFT),
                   folder: str = "validate",
                   values: Callable[[list[dict[str, Any]]], InstanceScores] = guarded_values,
                   ) -> dict[str, Any]:
    """``{"start": ..., "seeds": {seed: {arm: ...}}}`` of every validation under ``run_dir/folder`` so far
    (``values`` of its records, :func:`guarded_values` by default), over ``seeds`` and any other seed
    validated there, for ``arms``."""
    found = {int(p.parent.name.removeprefix("seed").split("_")[0])
             for p in (run_dir / folder).glob("seed*_*/validation.json")
             if p.parent.name.removeprefix("seed").split("_")[0].isdigit()}
    scores: dict[str, Any] = {START: None, "seeds": {}}
    if (report := validated(run_dir, START, folder)) is not None:
        scores[START] = values(load_records(report))
    for seed in sorted(set(seeds) | found):
        for arm in arms:
            if (report := validated(run_dir, tag(seed, arm), folder)) is not None:
                scores["seeds"].setdefault(str(seed), {})[arm] = values(load_records(report))
    return scores
