"""``make demo`` (lab/memalpha_lab/demo.py) runs ``memalpha`` commands only, its before/after table is
``memalpha compare``'s, and it refuses what it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memalpha.cli import COMMANDS
from memalpha.commands.compare import format_result
from memalpha_lab.demo import DEMO_OUTPUTS, DEMO_STAGES, main

REPO = Path(__file__).resolve().parents[1]


def test_every_stage_is_a_listed_memalpha_command_and_the_last_compares_the_three():
    assert all(stage[0] in COMMANDS for stage in DEMO_STAGES)
    last = DEMO_STAGES[-1]
    assert last[:4] == ["compare", "runs/tiny_cpu/base", "runs/tiny_cpu/sft", "runs/tiny_cpu/grpo"]
    assert last[last.index("--out") + 1] == "runs/demo_summary.json"
    assert "runs/demo_summary.json" in DEMO_OUTPUTS  # cleared first


def test_the_committed_summary_is_what_compare_writes():
    summary = json.loads((REPO / "experiments" / "results" / "demo_summary.json").read_text(encoding="utf-8"))
    assert [r["label"] for r in summary["reports"]] == ["base", "sft", "grpo"]
    assert [(c["before"], c["after"]) for c in summary["changes"]] == [("base", "sft"), ("sft", "grpo")]
    assert summary["notes"] == []  # the demo's reports record their settings, and they agree
    assert "grpo - sft: mean change per instance" in format_result(summary)


def test_the_demo_refuses_arguments_and_a_folder_without_the_configs(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="takes no arguments"):
        main(["--fast"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny_cpu").mkdir(parents=True)
    with pytest.raises(SystemExit, match="configs/tiny_cpu.yaml not found; run it from the repository root"):
        main([])
    assert (tmp_path / "runs" / "tiny_cpu").is_dir()  # nothing was cleared
