"""The control-arms experiment's pure parts (experiments/lab/memalpha_lab/control_arms_report.py,
arm_configs.py): paired intervals pooled over seeds and per seed against hand-computed numbers, the
rebuild check, the wall-clock matching rule, and the configs of the arms."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from memalpha_lab.control_arms_report import arm_means, compare, comparisons, main

T2 = 4.302653  # the 0.975 quantile of Student's t with 2 degrees of freedom


def table(accuracy: dict[str, float], recall: dict[str, float] | None = None) -> dict:
    """A made-up InstanceScores of one source ``s``."""
    recall = recall or {}
    return {
        "s": {
            k: {"accuracy": v, **({"fact_recall": recall[k]} if k in recall else {})}
            for k, v in accuracy.items()
        }
    }


SCORES = {
    "start": table({"a": 0.5, "b": 0.0, "c": 0.0}),
    "seeds": {
        "0": {"grpo": table({"a": 1.0, "b": 0.5, "c": 0.0}, {"a": 1.0, "b": 0.5, "c": 0.5}),
              "sft_continued": table({"a": 0.5, "b": 0.5, "c": 0.0}, {"a": 0.5, "b": 0.5, "c": 0.0})},
        "1": {"grpo": table({"a": 0.5, "b": 1.0, "c": 0.5}, {"a": 1.0, "b": 1.0}),
              "sft_continued": table({"a": 0.5, "b": 0.0, "c": 0.5}, {"a": 0.5, "b": 0.0, "c": 1.0})},
        # its control not run yet: left out of grpo - sft
        "2": {"grpo": table({"a": 0.0, "b": 0.0, "c": 0.0})},
    },
}


def test_per_seed_interval_is_the_paired_t_of_that_seed():
    result = compare(SCORES, "grpo", "sft_continued", "accuracy")
    assert result["seeds"] == [0, 1]
    seed0 = result["per_seed"]["0"]  # differences 0.5, 0, 0: mean 1/6, variance 1/12
    assert seed0["n"] == 3 and math.isclose(seed0["mean"], 1 / 6)
    assert math.isclose(seed0["half_width"], T2 * math.sqrt((1 / 12) / 3), rel_tol=1e-6)


def test_pooled_interval_averages_each_instance_over_seeds_first():
    pooled = compare(SCORES, "grpo", "sft_continued", "accuracy")["pooled"]
    # grpo averages 0.75, 0.75, 0.25; sft_continued 0.5, 0.25, 0.25: differences 0.25, 0.5, 0
    assert pooled["n"] == 3 and math.isclose(pooled["mean"], 0.25)
    assert math.isclose(pooled["half_width"], T2 * math.sqrt(0.0625 / 3), rel_tol=1e-6)
    assert math.isclose(pooled["low"], 0.25 - pooled["half_width"])


def test_fact_recall_pairs_only_instances_every_seed_scores():
    pooled = compare(SCORES, "grpo", "sft_continued", "fact_recall")["pooled"]
    # c has no recall under grpo seed 1: a and b only; grpo 1.0, 0.75; sft 0.5, 0.25: differences 0.5, 0.5
    assert pooled["n"] == 2 and math.isclose(pooled["mean"], 0.5) and pooled["half_width"] == 0.0


def test_start_is_shared_by_every_seed_and_arms_without_runs_are_left_out():
    against_start = compare(SCORES, "grpo", "start", "accuracy")
    assert against_start["seeds"] == [0, 1, 2]
    # grpo averaged over three seeds: a 0.5, b 0.5, c 1/6; minus start 0.5, 0, 0
    assert math.isclose(against_start["pooled"]["mean"], (0.0 + 0.5 + 1 / 6) / 3)
    assert compare(SCORES, "grpo", "grpo_lr0", "accuracy") == {
        "seed_level": None,
        "pooled": None,
        "seeds": [],
        "per_seed": {},
    }
    means = arm_means(SCORES, ("accuracy",))
    assert set(means) == {"start", "grpo", "sft_continued"} and means["grpo"]["seeds"] == [0, 1, 2]
    assert math.isclose(means["start"]["accuracy"]["mean"], 0.5 / 3)


def test_seed_level_is_the_t_over_the_per_seed_paired_means_beside_a_bootstrap():
    level = compare(SCORES, "grpo", "sft_continued", "accuracy")["seed_level"]
    # seed 0: differences 0.5, 0, 0 (mean 1/6); seed 1: 0, 1, 0 (mean 1/3); seed 2 has no control run
    # mean 1/4; sd of two values |1/3 - 1/6| / sqrt(2); se = sd / sqrt(2) = 1/12; t(0.975, 1) = 12.7062
    assert level["seeds"] == [0, 1] and level["t"]["n"] == 2 and level["t"]["df"] == 1
    assert math.isclose(level["t"]["mean"], 0.25) and math.isclose(level["bootstrap"]["mean"], 0.25)
    assert math.isclose(level["t"]["half_width"], 12.706205 / 12, rel_tol=1e-6)
    assert level["bootstrap"]["resamples"] == 4000 and level["bootstrap"]["seed"] == 0
    assert 0.0 <= level["bootstrap"]["low"] <= 0.25 <= level["bootstrap"]["high"] <= 2 / 3
    # one seed only: no spread over seeds to estimate
    assert compare(SCORES, "grpo", "start", "accuracy")["seed_level"]["seeds"] == [0, 1, 2]
    one = {"start": SCORES["start"], "seeds": {"0": SCORES["seeds"]["0"]}}
    assert compare(one, "grpo", "sft_continued", "accuracy")["seed_level"] is None


def test_the_committed_summary_is_rebuilt_from_the_committed_scores(capsys):
    # experiments/results/control_arms.json from .../control_arms/instance_scores.json
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt intervals match" in out and "seeds, t" in out and "optimiser steps" in out


def test_update_rewrites_only_the_intervals_of_the_summary(tmp_path):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps(SCORES))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"comparisons": {}, "runs": {"seed0_grpo": {"train_s": 3.5, "steps": 8}},
                                   "machine": {"cpu_count": 2}}))
    assert main(["--scores", str(scores), "--summary", str(summary), "--update"]) == 0
    written = json.loads(summary.read_text())
    assert (
        written["runs"] == {"seed0_grpo": {"train_s": 3.5, "steps": 8}}
        and written["machine"] == {"cpu_count": 2}
    )
    assert "--update" in written["intervals_rebuilt"]["command"]
    assert main(["--scores", str(scores), "--summary", str(summary), "--check"]) == 0


def test_compute_lists_what_the_summary_records_and_nothing_else():
    from memalpha_lab.control_arms_report import run_compute

    runs = {
        "seed1_sft_continued": {"train_s": 389.2, "steps": 44, "max_time_s": 380.4},
        "seed0_grpo": {"train_s": 380.4},
    }
    assert run_compute(runs) == [
        {"run": "seed1_sft_continued", "seed": 1, "arm": "sft_continued", "train_s": 389.2, "steps": 44},
        {"run": "seed0_grpo", "seed": 0, "arm": "grpo", "train_s": 380.4},
    ]


def test_report_check_passes_on_its_own_summary_and_fails_on_a_changed_number(tmp_path, capsys):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps(SCORES))
    summary = {"comparisons": comparisons(SCORES), "arm_means": arm_means(SCORES)}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(summary))
    assert main(["--scores", str(scores), "--summary", str(good), "--check"]) == 0
    summary["comparisons"]["grpo - sft_continued"]["accuracy"]["pooled"]["mean"] += 0.01
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(summary))
    assert main(["--scores", str(scores), "--summary", str(bad), "--check"]) == 1
    assert "DIFFER" in capsys.readouterr().out


def test_arm_configs_validate_outside_the_fit_and_the_no_update_arm_has_its_rate(tmp_path):
    from memalpha_lab.arm_configs import arm_fit_config, continued_sft_config
    from memalpha_lab.recipe_configs import load_yaml

    root = Path(__file__).resolve().parent.parent
    args = argparse.Namespace(steps=8, val=48, questions=4, lr0=1e-30)
    base = load_yaml(root / "configs" / "tiny_cpu.yaml")
    grpo = arm_fit_config(base, tmp_path, args, 1, "grpo")
    lr0 = arm_fit_config(base, tmp_path, args, 1, "grpo_lr0")
    assert grpo["trainer"]["limit_val_batches"] == 0 and grpo["trainer"]["max_steps"] == 8
    assert grpo["model"]["optimizer"]["learning_rate"] == base["model"]["optimizer"]["learning_rate"]
    assert lr0["model"]["optimizer"]["learning_rate"] == 1e-30 and lr0["seed_everything"] == 1
    assert grpo["data"]["synthetic"]["val"] == 48 and grpo["data"]["synthetic"]["questions"] == 4
    assert grpo["model"]["export_adapter_dir"] != lr0["model"]["export_adapter_dir"]
    start = str(tmp_path / "sft" / "adapter")  # both GRPO arms train from the SFT start, not the base model
    assert grpo["model"]["adapter_path"] == start and lr0["model"]["adapter_path"] == start
    sft = continued_sft_config(load_yaml(root / "configs" / "sft_tiny_cpu.yaml"), tmp_path, 2, 380.4)
    assert sft["trainer"]["max_time"] == "00:00:06:20" and sft["data"]["seed"] == 2  # GRPO's training time
    assert sft["trainer"]["max_steps"] > 10_000 and sft["trainer"]["limit_val_batches"] == 0
    assert sft["model"]["adapter_path"] == str(tmp_path / "sft" / "adapter")
