"""experiments/studies/answer_study.py: the plan's rule, ``--check``'s rebuild of a committed summary
against hand-computed intervals, and its bad command lines and foreign products refused in one line
before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import script_module

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "experiments" / "studies" / "answer_study.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'experiments' / 'lab'}"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, check=False)


@pytest.mark.parametrize(("low", "high", "said"), [
    (0.01, 0.2, "shown: GRPO beats SFT continued"),
    (-0.2, -0.01, "SFT continued beats GRPO"),
    (-0.1, 0.1, "not shown"),
    (0.0, 0.3, "not shown"),  # an interval that touches 0 holds it
])
def test_the_plans_rule(low, high, said):
    assert script_module(SCRIPT).verdict({"low": low, "high": high}) == said


def summary(values: list[float], primary: dict, secondary: dict) -> dict:
    return {"seeds": {str(i): {"grpo_minus_sft_continued": v, "grpo_minus_start": v + 0.1,
                               "sft_continued_minus_start": 0.1} for i, v in enumerate(values)},
            "primary": primary, "secondary": secondary}


def test_check_rebuilds_the_intervals_over_seeds(tmp_path):
    # A - B of 3 seeds: 0.1, 0.2, 0.3; mean 0.2, sd 0.1, t(0.975, 2) = 4.302653: half width
    # 4.302653 * 0.1 / sqrt(3) = 0.248414; A - start is 0.1 more each (mean 0.3, the same width);
    # B - start is 0.1 on every seed (no spread: the interval is the point)
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    right = {"grpo_minus_sft_continued": {"mean": 0.2, "low": 0.2 - half, "high": 0.2 + half},
             "verdict": "not shown"}
    secondary = {"grpo_minus_start": {"mean": 0.3, "low": 0.3 - half, "high": 0.3 + half},
                 "sft_continued_minus_start": {"mean": 0.1, "low": 0.1, "high": 0.1}}
    out = tmp_path / "answer_study.json"
    out.write_text(json.dumps(summary([0.1, 0.2, 0.3], right, secondary)))
    assert script_module(SCRIPT).check(out) == 0
    wrong = {**right, "verdict": "shown: GRPO beats SFT continued"}
    out.write_text(json.dumps(summary([0.1, 0.2, 0.3], wrong, secondary)))
    assert script_module(SCRIPT).check(out) == 1
    moved = {**right, "grpo_minus_sft_continued": {**right["grpo_minus_sft_continued"], "mean": 0.21}}
    out.write_text(json.dumps(summary([0.1, 0.2, 0.3], moved, secondary)))
    assert script_module(SCRIPT).check(out) == 1
    shifted = {**secondary, "grpo_minus_start": {**secondary["grpo_minus_start"], "low": 0.0}}
    out.write_text(json.dumps(summary([0.1, 0.2, 0.3], right, shifted)))
    assert script_module(SCRIPT).check(out) == 1


@pytest.mark.parametrize(("args", "said"), [
    (["--stage", "train"], "--stage: invalid choice: 'train'"),
    (["--held-out", "0"], "--held-out must be >= 1"),
    (["--seeds", "1,1"], "--seeds must not repeat a seed"),
])
def test_bad_command_lines_stop_in_one_line(args, said):
    done = run_script(*args)
    assert done.returncode == 2
    assert said in done.stderr


def test_a_checkout_of_another_product_is_refused(tmp_path):
    missing = "0" * 40  # no checkout holds it, shallow clones included
    done = run_script("--product-commit", missing, "--run-dir", str(tmp_path / "run"))
    assert done.returncode != 0
    assert f"answer_study: --product-commit {missing}: this checkout's memalpha/ and configs/" in done.stderr
    assert not (tmp_path / "run").exists()


def test_each_arm_takes_its_seed_for_every_source_of_randomness(tmp_path, monkeypatch):
    study = script_module(SCRIPT)
    ran = []
    monkeypatch.setattr(study, "memalpha", lambda argv, log, who: ran.append(argv))
    monkeypatch.setattr(study, "children_cpu_s", lambda: 0.0)
    args = study.parse_args(["--run-dir", str(tmp_path / "run")])
    start = {"sft": tmp_path / "sft", "data": tmp_path / "data"}
    for seed in (3, 4):
        (tmp_path / "run" / "arms" / f"grpo_seed{seed}").mkdir(parents=True)  # where fit logs A
        study.trained_b(args, start, seed, study.trained_a(args, start, seed)[1])
        for arm in ("grpo", "sft_continued"):
            config = yaml.safe_load((tmp_path / "run" / "configs" / f"{arm}_seed{seed}.yaml").read_text())
            # the committed run's B arms kept data.seed 0: seeds that stopped at one step were one adapter
            assert (config["seed_everything"], config["model"]["seed"], config["data"]["seed"]) == (seed,) * 3
    assert [argv[0] for argv in ran] == ["fit", "sft", "fit", "sft"]
