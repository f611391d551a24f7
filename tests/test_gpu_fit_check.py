"""experiments/gpu/gpu_fit_check.py end to end on the CPU (``--tiny``): the same script the GPU check
runs, on a one-layer random model with the config shrunk, writing its JSON after every step.

Both runs share one child process (``script_probe.py``, its ``writes`` probe keeping a copy of
every report written): a tree the shared state calls dirty, refused in one line, then the tiny fit.
"""

from __future__ import annotations

import json

import pytest
from script_probe import Run, run_probed

from memalpha_lab import tree_state

SCRIPT = "experiments/gpu/gpu_fit_check.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-fit")
    dirty = {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True, "changed": ["a.py"],
             "untracked": 0, "source": "git"}
    (tmp / "dirty.json").write_text(json.dumps(dirty))
    refused, fit = run_probed(tmp, [
        Run(SCRIPT, ["--tiny", "--out", tmp / "refused.json"],
            env={tree_state.STATE_ENV: str(tmp / "dirty.json")}),
        Run(SCRIPT, ["--tiny", "--allow-dirty", "--out", tmp / "fit.json"], env={tree_state.STATE_ENV: None}),
    ], probes=["writes"])
    return {"refused": refused, "fit": fit, "tmp": tmp}


def test_the_tiny_fit_writes_its_report_after_each_of_two_steps(runs):
    fit, out = runs["fit"], runs["tmp"] / "fit.json"
    assert fit["code"] == 0, fit["stderr"][-3000:]
    writes = [w["report"] for w in fit["writes"] if w["path"] == str(out)]
    assert len(writes) == len(fit["writes"])  # the check writes its report and nothing else
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


def test_the_fit_check_refuses_a_dirty_tree_in_one_line(runs):
    refused = runs["refused"]
    assert refused["code"] == 3 and refused.get("writes") is None
    assert not (runs["tmp"] / "refused.json").exists()
    refusal = [line for line in refused["stderr"].splitlines() if line.startswith("refusing to run")]
    assert refusal == refused["stderr"].strip().splitlines()[-1:]  # one line, the last
    assert refusal[0].startswith("refusing to run: the tree has uncommitted changes to 1 file(s) (a.py)")
