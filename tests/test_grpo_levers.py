"""The GRPO-levers experiment's pure parts (experiments/lab/memalpha_lab/levers.py, grpo_levers_report.py):
every
lever's config is a valid `memalpha fit` config that differs from the seed's grpo arm only where the
lever says, and the report's paired intervals against hand-computed numbers and its rebuild check."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import yaml

from memalpha_lab.grpo_levers_report import lever_comparisons, main
from memalpha_lab.levers import LEVERS, lever_config

REPO = Path(__file__).resolve().parent.parent
T2 = 4.302653  # the 0.975 quantile of Student's t with 2 degrees of freedom


def flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("lever", list(LEVERS))
def test_each_lever_changes_only_its_settings_and_parses_as_a_fit_config(lever, tmp_path, capsys):
    from memalpha.cli import main as memalpha
    from memalpha_lab.arm_configs import arm_fit_config
    from memalpha_lab.recipe_configs import load_yaml

    args = argparse.Namespace(steps=8, val=48, questions=4, lr0=None)
    base = load_yaml(REPO / "configs" / "tiny_cpu.yaml")
    grpo, changed = (
        flat(arm_fit_config(base, tmp_path, args, 0, "grpo")),
        flat(lever_config(base, tmp_path, args, lever, 0)),
    )
    differing = {k for k in grpo.keys() | changed.keys() if grpo.get(k) != changed.get(k)}
    own_folders = {"model.export_adapter_dir", "trainer.logger.init_args.version", "trainer.callbacks"}
    assert differing - own_folders == set(LEVERS[lever])
    assert changed["model.adapter_path"] == str(tmp_path / "sft" / "adapter")  # the control arms' SFT start
    assert "lever_" + lever in changed["model.export_adapter_dir"]
    path = tmp_path / "lever.yaml"
    path.write_text(yaml.safe_dump(lever_config(base, tmp_path, args, lever, 0)))
    with pytest.raises(SystemExit) as done:
        memalpha(["fit", "--config", str(path), "--print_config"])
    assert done.value.code in (0, None)
    printed = flat(yaml.safe_load(capsys.readouterr().out))
    for key, value in LEVERS[lever].items():
        assert printed[key] == value


def scores_of(accuracy: dict[str, float]) -> dict:
    return {"s": {k: {"accuracy": v} for k, v in accuracy.items()}}


SCORES = {
    "start": scores_of({"a": 0.5, "b": 0.5, "c": 0.0}),
    "seeds": {"0": {"grpo": scores_of({"a": 1.0, "b": 0.5, "c": 0.0}),
                    "sft_continued": scores_of({"a": 0.5, "b": 0.5, "c": 0.5}),
                    "lever_x": scores_of({"a": 1.0, "b": 0.5, "c": 0.5})}},
}


def test_each_lever_is_paired_with_grpo_sft_continued_and_the_start():
    compared = lever_comparisons(SCORES, ("accuracy",))
    assert list(compared) == ["lever_x - grpo", "lever_x - sft_continued", "lever_x - start",
                              "grpo - start", "sft_continued - start"]
    # lever - grpo: differences 0, 0, 0.5: mean 1/6, sample sd sqrt(1/12), half width t(2) sd / sqrt(3)
    got = compared["lever_x - grpo"]["accuracy"]["pooled"]
    assert math.isclose(got["mean"], 1 / 6) and got["n"] == 3
    assert math.isclose(got["half_width"], T2 * math.sqrt(1 / 12) / math.sqrt(3), rel_tol=1e-6)
    # lever - sft_continued: differences 0.5, 0, 0
    assert math.isclose(compared["lever_x - sft_continued"]["accuracy"]["pooled"]["mean"], 1 / 6)


def test_report_check_passes_on_its_own_summary_and_fails_on_a_changed_number(tmp_path, capsys):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps(SCORES))
    summary = {"comparisons": lever_comparisons(SCORES)}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(summary))
    assert main(["--scores", str(scores), "--summary", str(good), "--check"]) == 0
    summary["comparisons"]["lever_x - grpo"]["accuracy"]["pooled"]["mean"] += 0.01
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(summary))
    assert main(["--scores", str(scores), "--summary", str(bad), "--check"]) == 1
    assert "DIFFER" in capsys.readouterr().out


def test_the_committed_summary_is_rebuilt_from_the_committed_scores(capsys):
    # experiments/results/grpo_levers.json from .../grpo_levers/instance_scores.json
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt intervals match" in out and "seeds, bootstrap" in out


def test_the_committed_headline_over_seeds():
    from memalpha_lab.control_arms_report import read_json
    from memalpha_lab.grpo_levers_report import SUMMARY_PATH

    # issue 39: over 3 seeds the lever's fact-recall gain over SFT continued is +0.132 [-0.231, +0.495]
    level = read_json(SUMMARY_PATH)["comparisons"][
        "lever_extractive_instances_4 - sft_continued"
    ]["fact_recall"]
    assert level["seed_level"]["seeds"] == [0, 1, 2]
    t = level["seed_level"]["t"]
    assert [round(t[k], 3) for k in ("mean", "low", "high")] == [0.132, -0.231, 0.495]
    # the instance-level interval excludes 0, the seed-level one not
    assert level["pooled"]["low"] > 0 > t["low"]


def test_the_report_covers_every_lever_run_validated_in_the_folder(tmp_path):
    from memalpha_lab.levers import lever_runs

    for name in ("seed1_lever_extractive_reader", "seed0_lever_lr_1e-3", "seed0_lever_extractive_reader",
                 "seed0_lever_unknown", "seed0_grpo", "seed2_lever_group_8"):
        (tmp_path / "validate" / name).mkdir(parents=True)
        (tmp_path / "validate" / name / "validation.json").write_text("{}")
    (tmp_path / "validate" / "seed3_lever_group_8").mkdir()  # not validated yet
    assert lever_runs(tmp_path) == [
        (0, "extractive_reader"),
        (0, "lr_1e-3"),
        (1, "extractive_reader"),
        (2, "group_8"),
    ]
