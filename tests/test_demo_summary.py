"""The table ``make demo`` ends with, from the three stages' validation reports."""

from __future__ import annotations

import json
import math

import pytest

from memalpha_lab.demo_summary import format_rows, main, summary_rows

T3 = 3.182446  # t(0.975, 3 degrees of freedom)


def _report(path, accuracy, tool_success, records=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    overall = {"accuracy": accuracy, "tool_success": tool_success, "memory_tokens": 10.0, "compression": 0.9,
               "mean_reward": accuracy + tool_success, "instances": 16, "questions": 32}
    path.write_text(json.dumps({"summary": {"overall": overall, "per_source": {}}, "records": list(records)}))


def _record(instance, scores, statuses, reward):
    """One rollout of ``instance``: its questions' scores, one turn with those call statuses and reward."""
    return {"data_source": "synth", "instance_id": instance, "questions": [{"score": x} for x in scores],
            "turns": [{"results": [{"status": st} for st in statuses], "reward": reward}],
            "memory_tokens": 5, "r3": 1.0}


# four held-out instances at three stages
BASE = [_record("a", [0, 0], [], 0.0), _record("b", [0, 0], ["error"], 0.0),
        _record("c", [0, 0], ["ok", "error"], 0.5), _record("d", [1, 0], ["ok"], 1.0)]
SFT = [_record("a", [1, 0], ["ok"], 1.0), _record("b", [0, 1], ["ok"], 1.0),
       _record("c", [1, 1], ["ok", "ok"], 1.5), _record("d", [1, 0], ["ok"], 1.0)]
GRPO = [
    _record("a", [1, 0], ["ok"], 1.0),
    _record("b", [1, 1], ["ok"], 1.5),
    _record("c", [1, 0], ["ok", "ok"], 1.0),
    _record("d", [1, 0], ["ok"], 1.0),
    _record("e", [1, 1], ["ok"], 2.0),
]


def _stage(accuracy, tool_success, records):
    overall = {"accuracy": accuracy, "tool_success": tool_success, "memory_tokens": 5.0, "compression": 1.0,
               "mean_reward": 1.0, "instances": len(records)}
    return {"summary": {"overall": overall}, "records": records}


def test_each_stage_carries_its_paired_interval_against_the_stage_before():
    rows = summary_rows({"base": _stage(0.125, 0.5, BASE), "sft": _stage(0.625, 1.0, SFT),
                         "grpo": _stage(0.7, 1.0, GRPO)})
    assert rows[0]["vs_previous"] is None
    sft = rows[1]["vs_previous"]
    # accuracy per instance 0, 0, 0, 0.5 -> 0.5, 0.5, 1, 0.5: changes 0.5, 0.5, 1, 0; mean 0.5,
    # sample variance (0 + 0 + 0.25 + 0.25) / 3 = 1/6, half width t(3) * sqrt(1/6 / 4)
    assert sft["accuracy"]["mean"] == pytest.approx(0.5) and sft["accuracy"]["n"] == 4
    assert sft["accuracy"]["half_width"] == pytest.approx(T3 * math.sqrt(1 / 24), rel=1e-5)
    assert sft["accuracy"]["low"] == pytest.approx(0.5 - T3 * math.sqrt(1 / 24), rel=1e-5)
    # tool success 0 (no call), 0, 0.5, 1 -> 1, 1, 1, 1: changes 1, 1, 0.5, 0; mean 0.625,
    # variance (0.140625 * 2 + 0.015625 + 0.390625) / 3 = 0.229167
    assert sft["tool_success"]["mean"] == pytest.approx(0.625)
    assert sft["tool_success"]["half_width"] == pytest.approx(T3 * math.sqrt(0.6875 / 3 / 4), rel=1e-5)
    # mean reward changes 1, 1, 1, 0: mean 0.75, variance 0.25
    assert sft["mean_reward"]["mean"] == pytest.approx(0.75)
    assert sft["mean_reward"]["half_width"] == pytest.approx(T3 * math.sqrt(0.25 / 4), rel=1e-5)
    # GRPO against SFT on the four shared instances (e is GRPO's only): accuracy changes 0, 0.5, -0.5, 0
    grpo = rows[2]["vs_previous"]
    assert grpo["accuracy"]["n"] == 4 and grpo["accuracy"]["mean"] == pytest.approx(0.0)
    assert grpo["accuracy"]["high"] == pytest.approx(T3 * math.sqrt((0.25 + 0.25) / 3 / 4), rel=1e-5)
    assert grpo["tool_success"]["half_width"] == 0.0  # no change anywhere
    table = format_rows(rows)
    assert "change [95% CI]" in table.splitlines()[0]
    assert f"+0.500 [{0.5 - T3 * math.sqrt(1 / 24):+.2f}, {0.5 + T3 * math.sqrt(1 / 24):+.2f}]" in table
    assert "+0.000 [-0.65, +0.65]" in table and table.splitlines()[2].split()[3] == "-"


def test_without_records_a_row_has_no_interval():
    rows = summary_rows({"base": _stage(0.0, 0.0, []), "sft": _stage(0.2, 0.9, [])})
    assert rows[1]["vs_previous"] is None and " - " in format_rows(rows).splitlines()[-1] + " "


def test_summary_rows_in_stage_order_from_the_last_grpo_validation(tmp_path, capsys):
    run = tmp_path / "runs" / "tiny_cpu"
    _report(run / "base" / "validation.json", 0.0, 0.0, BASE)
    _report(run / "sft" / "validation.json", 0.2, 0.9, SFT)
    _report(run / "grpo" / "validation_step2.json", 0.1, 0.5)
    _report(run / "grpo" / "validation_step10.json", 0.25, 0.95, GRPO)  # the last step, not the last name
    out = tmp_path / "runs" / "demo_summary.json"
    assert main([str(run), str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["stage"] for r in rows] == ["base", "sft", "grpo"]
    assert set(rows[0]) == {
        "stage", "accuracy", "tool_success", "memory_tokens", "compression", "mean_reward", "instances",
        "vs_previous",
    }
    assert rows[2]["accuracy"] == 0.25 and rows[2]["tool_success"] == 0.95
    assert rows[0]["vs_previous"] is None and rows[1]["vs_previous"]["mean_reward"]["mean"] == pytest.approx(
        0.75
    )
    assert set(rows[2]["vs_previous"]["accuracy"]) == {"mean", "half_width", "low", "high", "n"}
    table = capsys.readouterr().out
    assert "base" in table and "grpo" in table and "0.950" in table
    assert "paired over" not in table and "the 4 held-out instances both hold" in table


def test_a_missing_stage_is_one_line_and_status_1(tmp_path, capsys):
    run = tmp_path / "run"
    _report(run / "base" / "validation.json", 0.0, 0.0)
    assert main([str(run), str(tmp_path / "summary.json")]) == 1
    assert "sft" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_the_demo_refuses_arguments_and_a_folder_without_the_configs(tmp_path, monkeypatch, capsys):
    from memalpha_lab.demo import main as demo_main

    with pytest.raises(SystemExit, match="takes no arguments"):
        demo_main(["--fast"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny_cpu").mkdir(parents=True)
    with pytest.raises(SystemExit, match="configs/tiny_cpu.yaml not found; run it from the repository root"):
        demo_main([])
    assert (tmp_path / "runs" / "tiny_cpu").is_dir()  # nothing was cleared
