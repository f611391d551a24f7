"""experiments/bench/bench_locomo.py run as a script on a tiny random model and a LoCoMo-shaped file of
four conversations named as Memory-R1's split names them: the test split alone is validated, each arm
in a process of its own, and its bad command lines are refused."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_training import nonzero_adapter, write_config

REPO = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "data" / "locomo_small.json"


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "experiments" / "bench" / "bench_locomo.py"), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def split_data(tmp_path_factory) -> Path:
    """The fixture's two conversations as conv-26 and conv-30 (train, validation) and two test ones."""
    first, second = json.loads(FIXTURE.read_text(encoding="utf-8"))
    named = []
    for name, record in (("conv-26", first), ("conv-30", second), ("conv-41", first), ("conv-42", second)):
        named.append({**copy.deepcopy(record), "sample_id": name})
    path = tmp_path_factory.mktemp("locomo") / "locomo10.json"
    path.write_text(json.dumps(named), encoding="utf-8")
    return path


def test_the_test_split_is_scored_per_arm_with_the_issues_figures(split_data, tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir)
    adapter = nonzero_adapter(tmp_path, tiny_model_dir)
    out = tmp_path / "bench_locomo.json"
    ran = bench("--data", str(split_data), "--arms", "empty,raw_chunks,demo", "--config", str(config),
                "--demo-adapter", str(adapter), "--run-dir", str(tmp_path / "run"), "--out", str(out))
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["settings"]["conversations"] == ["conv-41", "conv-42"]
    assert result["settings"]["sessions"] == {"conv-41": 2, "conv-42": 2}
    written = json.loads((tmp_path / "run" / "locomo_test.json").read_text())
    assert [c["sample_id"] for c in written] == ["conv-41", "conv-42"]  # the others are never read
    for arm in ("empty", "raw_chunks", "demo"):  # one conversation a batch: a killed arm resumes at it
        as_run = yaml.safe_load((tmp_path / "run" / "validate" / f"test_{arm}" / "config.yaml").read_text())
        assert as_run["data"]["val_batch_size"] == 1
    arms = result["arms"]
    empty, raw, demo = arms["empty"], arms["raw_chunks"], arms["demo"]
    assert empty["memory_tokens"] == 0 and empty["turns"] == 0 and empty["entries_per_session"] == 0
    assert raw["memory_share"] == pytest.approx(1.0) and raw["entries_per_session"] == 1.0  # a chunk each
    assert raw["per_category"]["all_but_adversarial"]["questions"] == 5 + 4  # fx-1's and fx-2's
    assert raw["per_category"]["adversarial"]["questions"] == 2 + 1
    assert demo["turns"] == 4 and 0.0 <= demo["ok_call_share"] <= demo["call_share"] <= 1.0
    assert set(demo["targets_met"]) == {"ok_call_share", "entries_per_session", "memory_share",
                                        "f1_at_least_raw_chunks"}
    change = demo["f1_minus_raw_chunks"]
    assert change["n"] == 2 and change["over"] == "conversations" and "f1_minus_raw_chunks" not in raw
    for figures in arms.values():
        assert figures["f1"] == figures["per_category"]["all_but_adversarial"]["locomo_f1"]
    assert "F1 - raw chunks [95 %]" in ran.stdout
    # the validation split is conv-30 alone: the change's interval is over its questions
    ran = bench("--data", str(split_data), "--split", "validation", "--arms", "raw_chunks,empty", "--config",
                str(config), "--run-dir", str(tmp_path / "run"), "--out", str(out))
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["settings"]["conversations"] == ["conv-30"]
    change = result["arms"]["empty"]["f1_minus_raw_chunks"]
    assert change["over"] == "questions" and change["n"] == 4  # fx-2's non-adversarial questions


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "empty,summaries"], "--arms: each one of"),
        (["--arms", "recipe"], "--arms recipe and answer need --recipe-adapter"),
    ],
)
def test_bad_command_lines_are_refused(split_data, args, message):
    ran = bench("--data", str(split_data), *args)
    assert ran.returncode == 2 and message in ran.stderr


def test_a_file_without_the_split_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps([{"sample_id": "conv-26", "conversation": {}}]))
    ran = bench("--data", str(path), "--arms", "empty", "--run-dir", str(tmp_path / "run"))
    assert ran.returncode != 0 and "lacks ['conv-30']: is it LoCoMo's locomo10.json?" in ran.stderr
