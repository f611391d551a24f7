"""The table ``make demo`` ends with, from the three stages' validation reports."""

from __future__ import annotations

import json

from memalpha.train.demo_summary import main


def _report(path, accuracy, tool_success):
    path.parent.mkdir(parents=True, exist_ok=True)
    overall = {"accuracy": accuracy, "tool_success": tool_success, "memory_tokens": 10.0, "compression": 0.9,
               "mean_reward": accuracy + tool_success, "instances": 16, "questions": 32}
    path.write_text(json.dumps({"summary": {"overall": overall, "per_source": {}}, "records": []}))


def test_summary_rows_in_stage_order_from_the_last_grpo_validation(tmp_path, capsys):
    run = tmp_path / "runs" / "tiny_cpu"
    _report(run / "base" / "validation.json", 0.0, 0.0)
    _report(run / "sft" / "validation.json", 0.2, 0.9)
    _report(run / "grpo" / "validation_step2.json", 0.1, 0.5)
    _report(run / "grpo" / "validation_step10.json", 0.25, 0.95)  # the last step, not the last name
    out = tmp_path / "runs" / "demo_summary.json"
    assert main([str(run), str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["stage"] for r in rows] == ["base", "sft", "grpo"]
    assert set(rows[0]) == {"stage", "accuracy", "tool_success", "memory_tokens", "compression", "mean_reward", "instances"}
    assert rows[2]["accuracy"] == 0.25 and rows[2]["tool_success"] == 0.95
    table = capsys.readouterr().out
    assert "base" in table and "grpo" in table and "0.950" in table


def test_a_missing_stage_is_one_line_and_status_1(tmp_path, capsys):
    run = tmp_path / "run"
    _report(run / "base" / "validation.json", 0.0, 0.0)
    assert main([str(run), str(tmp_path / "summary.json")]) == 1
    assert "sft" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_memalpha_demo_refuses_arguments_and_a_folder_without_the_configs(tmp_path, monkeypatch, capsys):
    import pytest

    from memalpha.cli import main as cli_main

    with pytest.raises(SystemExit, match="takes no arguments"):
        cli_main(["demo", "--fast"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny_cpu").mkdir(parents=True)
    with pytest.raises(SystemExit, match="configs/tiny_cpu.yaml not found; run it from the repository root"):
        cli_main(["demo"])
    assert (tmp_path / "runs" / "tiny_cpu").is_dir()  # nothing was cleared
