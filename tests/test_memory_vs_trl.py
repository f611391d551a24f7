"""experiments/studies/memory_vs_trl.py (memalpha against TRL on the memory task, issue 46) run as its
command line over a run folder whose every stage of one seed is done: the same job on both sides (the
configs it writes), and the summary it computes from the sides' recorded steps and processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_decisive import done_stages, study


def done_run_folder(run: Path) -> None:
    """Every stage's output of seed 0: adapters, made-up validation reports and run records."""
    done_stages(run, ("seed0_memalpha", "seed0_trl"), "synth_personal")
    steps = {"memalpha": [{"step_s": 10.0, "sampling_s": 6.0, "reward": 0.5, "tokens_sampled": 100.0},
                          {"step_s": 30.0, "sampling_s": 8.0, "reward": 0.75, "tokens_sampled": 300.0}],
             "trl": [{"step_s": 100.0, "reward": 0.25, "tokens_sampled": 200.0},
                     {"step_s": 60.0, "reward": 0.5, "tokens_sampled": 120.0}]}
    for side, rss in (("memalpha", 700.0), ("trl", 900.0)):
        process = {"wall_s": 1.0, "cpu_s": 1.0, "peak_rss_mib": rss}
        (run / "arms" / f"seed0_{side}" / "run.json").write_text(json.dumps({"process": process,
                                                                            "steps": steps[side]}))


def test_a_done_seed_gets_the_same_job_on_both_sides_and_its_summary(tmp_path):
    run = tmp_path.resolve() / "run"
    done_run_folder(run)
    turns = [{"truncated": True, "results": [{"status": "error"}]},
             {"truncated": False, "results": [{"status": "ok"}, {"status": "ok"}]}]
    report = run / "validate" / "seed0_memalpha" / "validation.json"
    (record,) = json.loads(report.read_text())["records"]
    report.write_text(json.dumps({"records": [{**record, "memory_tokens": 30, "turns": turns}]}))
    out = tmp_path / "results" / "memory_vs_trl.json"
    done = study("memory_vs_trl.py", "--reuse", "--seeds", "0", "--run-dir", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not (run / "logs").exists()  # no memalpha command ran
    sides = {side: yaml.safe_load((run / f"seed0_{side}.yaml").read_text()) for side in ("memalpha", "trl")}
    for config in sides.values():
        assert config["data"]["synthetic"]["chunks"] == 1 and config["data"]["seed"] == 6910
        assert config["model"]["reader"]["kind"] == "extractive" and config["data"]["instances_per_step"] == 4
        assert config["trainer"]["max_steps"] == 6
    same = [{k: v for k, v in c["model"].items() if k != "export_adapter_dir"} for c in sides.values()]
    assert same[0] == same[1]  # one job: everything but where the adapter goes
    assert yaml.safe_load((run / "validate.yaml").read_text())["data"]["seed"] == 6900
    summary = json.loads(out.read_text())["sides"]
    assert summary["memalpha"]["median_step_s"] == 20.0 and summary["trl"]["median_step_s"] == 80.0
    assert summary["step_time_ratio"] == 0.25
    assert summary["memalpha"]["tokens_per_step_s"] == pytest.approx(10.0)  # 400 tokens in 40 s
    assert summary["trl"]["peak_rss_mib"] == 900.0
    assert summary["trl"]["reward_per_step"] == [[0.25, 0.5]]
    held_out = json.loads(out.read_text())["held_out"]
    assert set(held_out) == {"start", "seed0_memalpha", "seed0_trl"}
    assert held_out["seed0_trl"] == {"tool_success": None, "memory_tokens": 10.0, "turns_cut": None}
    assert held_out["seed0_memalpha"] == {"tool_success": 0.6667, "memory_tokens": 30.0, "turns_cut": 0.5}
