"""python -m memalpha_lab.compare_runs: the before/after comparison of two runs on the same seed."""

from __future__ import annotations

import json

from memalpha_lab.compare_runs import compare_reports, compare_scalars, is_timing, main, verdict


def test_timings_are_told_apart_from_results():
    assert is_timing("perf/rewards_s") and is_timing("train/step_s") and is_timing("train/tokens_per_s")
    assert not is_timing("train/reward") and not is_timing("val/accuracy") and not is_timing("train/kl")


def test_verdicts():
    assert verdict(0.25, 0.25, 1e-6) == "equal"
    assert verdict(1.0, 1.0 + 5e-7, 1e-6) == "rounding"
    assert verdict(1.0, 1.0 + 2e-6, 1e-6) == "differs"
    assert verdict(0.0, 1e-3, 1e-6) == "differs"


def test_scalars_compare_shared_tags_and_list_the_rest():
    before = {"v0:train/reward": {1: 1.0, 2: 1.5}, "v0:perf/step_s": {1: 3.0}, "v0:train/old": {1: 0.0}}
    after = {"v0:train/reward": {1: 1.0, 2: 1.25}, "v0:perf/step_s": {1: 9.0}, "v0:train/new": {1: 0.0}}
    result = compare_scalars(before, after, 1e-6)
    assert result["rows"] == [
        {"tag": "v0:train/reward", "steps": 2, "max_abs_difference": 0.25, "verdict": "differs"}
    ]
    assert result["added"] == ["v0:train/new"] and result["removed"] == ["v0:train/old"]
    assert result["timing_skipped"] == ["v0:perf/step_s"]


def test_reports_compare_every_leaf(tmp_path):
    before, after = tmp_path / "b", tmp_path / "a"
    for side, prediction, extra in ((before, "Paris", {}), (after, "Lyon", {"fact_recall": 0.5})):
        (side / "v0").mkdir(parents=True)
        report = {
            "summary": {"accuracy": 0.5, **extra},
            "records": [{"questions": [{"prediction": prediction}]}],
        }
        (side / "v0" / "validation.json").write_text(json.dumps(report))
    (row,) = compare_reports(before, after, 1e-6)
    assert row["verdict"] == "differs" and row["differs"] == ["records[0].questions[0].prediction"]
    assert row["added"] == ["summary.fact_recall"] and row["equal"] == 1


def test_identical_folders_pass_and_a_changed_one_fails(tmp_path):
    for name in ("b", "a", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "validation.json").write_text(
            json.dumps({"accuracy": 0.25 if name != "c" else 0.5})
        )
    assert main([str(tmp_path / "b"), str(tmp_path / "a"), "--out", str(tmp_path / "same.json")]) == 0
    assert main([str(tmp_path / "b"), str(tmp_path / "c"), "--out", str(tmp_path / "changed.json")]) == 1
