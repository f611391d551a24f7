"""experiments/gpu/gpu_fit_check.py end to end on the CPU (``--tiny``): the same script the GPU check
runs, on a one-layer random model with the config shrunk, writing its JSON after every step."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from memalpha.lab import tree_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "gpu"))
import gpu_fit_check


@pytest.fixture
def writes(monkeypatch):
    """Every report the check writes, as written (a copy of each)."""
    seen: list[dict] = []
    original = gpu_fit_check.write_report

    def keep(report, out, machine):
        seen.append(copy.deepcopy(report))
        return original(report, out, machine)

    monkeypatch.setattr(gpu_fit_check, "write_report", keep)
    monkeypatch.delenv(tree_state.STATE_ENV, raising=False)
    return seen


def test_the_tiny_fit_writes_its_report_after_each_of_two_steps(tmp_path, writes):
    out = tmp_path / "gpu_fit_check.json"
    gpu_fit_check.main(["--tiny", "--allow-dirty", "--out", str(out)])
    statuses = [(w["status"], len(w["steps"])) for w in writes]
    assert statuses == [("loading", 0), ("running", 1), ("running", 2), ("ok", 2)]
    after_first = writes[1]["steps"][0]
    assert after_first["step"] == 1 and after_first["seconds"] > 0
    report = json.loads(out.read_text())
    assert report["status"] == "ok" and report["tiny"] is True and report["global_step"] == 2
    for step in report["steps"]:
        phases = step["phases"]
        for name in ("sampling", "reader", "rewards", "logprobs", "update"):
            assert phases[name]["runs"] >= 1 and phases[name]["seconds"] >= 0
        assert step["logged"]["perf/reader_s"] == pytest.approx(phases["reader"]["seconds"], abs=0.5)
        assert {"peak_allocated_gib", "peak_reserved_gib", "device_used_peak_gib"} <= set(step)
    record = report["record"]
    assert record["allow_dirty"] is True and record["commit"]
    assert record["backends"]["sampling"]["backend"] is not None
    assert {"build_model", "load", "sampling", "reader", "update"} <= set(record["phase_totals"])


def test_the_fit_check_refuses_a_dirty_tree_in_one_line(tmp_path, monkeypatch, capsys, writes):
    def refuse(allow_dirty=False, **kwargs):
        raise tree_state.DirtyTree("refusing to run: the tree has uncommitted changes to 1 file(s) (a.py)")

    monkeypatch.setattr(gpu_fit_check.GpuRecord, "start", refuse)
    with pytest.raises(SystemExit) as stopped:
        gpu_fit_check.main(["--tiny", "--out", str(tmp_path / "x.json")])
    assert stopped.value.code == 3 and writes == []
    assert capsys.readouterr().err.strip().startswith("refusing to run: the tree has uncommitted changes")
