"""experiments/bench/bench_answer_agent.py: an arm's figures from a validation report, checked against
hand-computed numbers, and its bad command lines refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import script_module

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "experiments" / "bench" / "bench_answer_agent.py"


def question(score: float) -> dict:
    return {"score": score}


def test_an_arms_figures_pool_the_stored_answers_and_average_over_instances():
    report = {"records": [
        {"instance_id": "a", "memory_tokens": 100,
         "questions": [question(1.0), question(0.0), question(1.0)]},
        {"instance_id": "b", "memory_tokens": 300, "questions": [question(0.0), question(0.5)]},
    ]}
    stored = {("a", 0): True, ("a", 1): True, ("a", 2): False, ("b", 0): False, ("b", 1): True}
    figures = script_module(SCRIPT).arm_figures(report, stored)
    assert figures["instances"] == 2
    assert figures["accuracy"]["mean"] == pytest.approx((2 / 3 + 0.25) / 2)
    assert figures["memory_tokens"]["mean"] == pytest.approx(200.0)
    # stored: a's first two (1.0, 0.0: 0.5 of them) and b's second (0.5): per instance 0.5 and 0.5
    assert figures["stored_answered"]["mean"] == pytest.approx(0.5)
    assert (figures["stored_score_sum"], figures["stored_questions"]) == (1.5, 3)


def test_an_instance_without_a_stored_answer_is_left_out_of_the_stored_mean():
    report = {"records": [
        {"instance_id": "a", "memory_tokens": 10, "questions": [question(1.0)]},
        {"instance_id": "b", "memory_tokens": 10, "questions": [question(0.0)]},
    ]}
    figures = script_module(SCRIPT).arm_figures(report, {("a", 0): True, ("b", 0): False})
    assert figures["stored_answered"]["n"] == 1 and figures["stored_answered"]["mean"] == 1.0
    assert (figures["stored_score_sum"], figures["stored_questions"]) == (1.0, 1)


@pytest.mark.parametrize("args, named", [
    (["--lengths", "32,x"], "--lengths"),
    (["--held-out", "0"], "--held-out"),
])
def test_bad_command_lines_are_refused_naming_the_option(args, named):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120, check=False)
    assert done.returncode == 2 and named in done.stderr.strip().splitlines()[-1]
