"""The pre-registered credit study (experiments/studies/credit_study.py,
experiments/lab/memalpha_lab/credit_report.py):
the verdict rule on the primary comparison, the per-family split, and the script run as its command line
over a run folder whose every stage of one seed is done: the configs it writes (A′ with per-chunk credit;
A and B stopped at A′'s recorded CPU seconds; the new held-out set) and its pending summary; and the
committed verdict rebuilt from the committed per-instance scores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_decisive import T4, done_stages, study

from memalpha_lab.credit_report import FAMILIES, SUMMARY_PATH, VERDICTS, decide, main, rebuild, verdict_of

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("low", "high", "guard_passed", "expected"), [
    (0.01, 0.2, True, "per-chunk GRPO beats"),
    (0.01, 0.2, False, "not shown"),
    (0.0, 0.2, True, "not shown"),
    (-0.2, -0.01, True, "per-chunk GRPO is worse"),
    (-0.2, 0.0, True, "not shown"),
])
def test_the_rule_maps_the_interval_to_exactly_one_verdict(low, high, guard_passed, expected):
    assert verdict_of({"low": low, "high": high}, guard_passed, complete=True) == expected
    assert verdict_of({"low": low, "high": high}, guard_passed, complete=False) == "pending"


def run(personal: list[float], timeline: list[float], share: float = 0.3) -> dict:
    """Made-up InstanceScores: two instances of each family."""
    def family(values):
        return {f"i{k}": {"accuracy": v, "fact_recall": v, "tool_success": 1.0, "memory_share": share}
                for k, v in enumerate(values)}
    return {"synth_personal": family(personal), "synth_timeline": family(timeline)}


def scores(changes: list[float], arms=("grpo_per_chunk", "grpo", "sft_continued")) -> dict:
    """Seed s: A′ gains ``changes[s]`` over B on timelines only; A equals B."""
    base = [0.25, 0.5]
    made = {"grpo_per_chunk": lambda c: run(base, [b + c for b in base]), "grpo": lambda c: run(base, base),
            "sft_continued": lambda c: run(base, base)}
    return {"start": run(base, base), "seeds": {str(s): {a: made[a](c) for a in arms}
                                                 for s, c in enumerate(changes)}}


def test_decide_reads_a_prime_minus_b_over_the_seeds_that_hold_all_three_arms():
    changes = [0.1, 0.2, 0.05, 0.15, 0.1]
    decision = decide(scores(changes), [0, 1, 2, 3, 4])
    pooled = [c / 2 for c in changes]  # the change is on the two timeline instances of four
    mean = sum(pooled) / 5
    sd = (sum((p - mean) ** 2 for p in pooled) / 4) ** 0.5
    assert decision["t_over_seeds"]["mean"] == pytest.approx(mean)
    assert decision["t_over_seeds"]["high"] - mean == pytest.approx(T4 * sd / 5 ** 0.5)
    assert decision["verdict"] == "per-chunk GRPO beats" and decision["seeds_done"] == [0, 1, 2, 3, 4]
    two_arms = scores(changes, arms=("grpo_per_chunk", "sft_continued"))
    assert decide(two_arms, [0, 1, 2, 3, 4])["verdict"] == "pending"  # A missing: not complete


def test_the_family_split_compares_each_family_alone():
    compared = rebuild(scores([0.1, 0.2, 0.05, 0.15, 0.1]), [0, 1, 2, 3, 4])["comparisons"]
    timeline = compared["grpo_per_chunk - grpo (synth_timeline)"]["accuracy"]["seed_level"]["t"]
    personal = compared["grpo_per_chunk - grpo (synth_personal)"]["accuracy"]["seed_level"]
    assert timeline["mean"] == pytest.approx(0.12) and timeline["low"] > 0
    assert personal is None or personal["t"]["mean"] == 0.0
    assert {f"grpo_per_chunk - sft_continued ({f})" for f in FAMILIES} <= set(compared)


def test_check_passes_on_its_own_summary_and_fails_on_a_changed_number(tmp_path, capsys):
    made_up = scores([0.1, 0.2, 0.05, 0.15, 0.1])
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(made_up))
    summary = {"settings": {"seeds": [0, 1, 2, 3, 4]}, **rebuild(made_up, [0, 1, 2, 3, 4])}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(summary))
    assert main(["--scores", str(path), "--summary", str(good), "--check"]) == 0
    summary["decision"]["verdict"] = "not shown"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(summary))
    assert main(["--scores", str(path), "--summary", str(bad), "--check"]) == 1
    capsys.readouterr()


def credit_study(*args: str) -> subprocess.CompletedProcess:
    return study("credit_study.py", *args)


def done_run_folder(run: Path) -> None:
    """Every stage's output of seed 3 (adapters, made-up validation reports), and A′'s compute ledger."""
    done_stages(run, ("seed3_grpo_per_chunk", "seed3_grpo", "seed3_sft_continued"), "synth_personal")
    (run / "compute").mkdir()
    attempts = [{"wall_s": 1500.0, "cpu_s": 1290.5, "finished": True, "ended": "t"}]
    (run / "compute" / "fit_seed3_grpo_per_chunk.json").write_text(json.dumps(attempts))


def test_a_done_seed_gets_the_plans_configs_and_a_pending_verdict(tmp_path):
    run = tmp_path.resolve() / "run"
    done_run_folder(run)
    out = tmp_path / "results" / "credit_study.json"
    done = credit_study("--reuse", "--seeds", "3", "--run-dir", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not (run / "logs").exists()  # no memalpha command ran
    held_out = yaml.safe_load((run / "validate.yaml").read_text())
    assert held_out["data"]["seed"] == 4900 and held_out["data"]["synthetic"]["val"] == 96
    assert held_out["model"]["reader"]["kind"] == "local"
    a_prime = yaml.safe_load((run / "seed3_grpo_per_chunk.yaml").read_text())
    assert a_prime["model"]["update"]["credit"] == "per_chunk" and a_prime["trainer"]["max_steps"] == 8
    assert a_prime["model"]["reader"]["kind"] == "extractive" and a_prime["data"]["seed"] == 4913
    assert a_prime["model"]["export_adapter_dir"] == str(run / "arms" / "seed3_grpo_per_chunk" / "adapter")
    budget = {"class_path": "memalpha_lab.cpu_budget.CpuBudget", "init_args": {"seconds": 1290.5}}
    arm_a = yaml.safe_load((run / "seed3_grpo.yaml").read_text())
    assert arm_a["model"]["update"]["credit"] == "broadcast" and arm_a["trainer"]["max_steps"] == 64
    assert arm_a["trainer"]["callbacks"][-1] == budget and arm_a["data"]["seed"] == 4913
    assert {k: v for k, v in arm_a["model"].items() if k not in ("update", "export_adapter_dir")} == \
        {k: v for k, v in a_prime["model"].items() if k not in ("update", "export_adapter_dir")}
    arm_b = yaml.safe_load((run / "seed3_sft_continued.yaml").read_text())
    assert arm_b["trainer"]["callbacks"][-1] == budget and arm_b["data"]["seed"] == 3
    summary = json.loads(out.read_text())
    assert summary["decision"]["verdict"] == "pending" and summary["settings"]["seeds"] == [0, 1, 2, 3, 4]
    assert summary["settings"]["val_data_seed"] == 4900
    assert summary["settings"]["train_data_seeds"]["3"] == 4913
    assert summary["runs"]["seed3_grpo"]["cpu_budget_s"] == pytest.approx(1290.5)
    scores_file = json.loads((out.parent / "credit_study" / "instance_scores.json").read_text())
    assert set(scores_file["seeds"]["3"]) == {"grpo_per_chunk", "grpo", "sft_continued"}


def test_the_committed_summary_is_rebuilt_from_the_committed_scores(capsys):
    """experiments/results/credit_study.json (the verdict) from .../credit_study/instance_scores.json."""
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt numbers match" in out and "verdict" in out
    decision = json.loads(SUMMARY_PATH.read_text())["decision"]
    assert decision["verdict"] in VERDICTS and decision["seeds_done"] == [0, 1, 2, 3, 4]  # all planned seeds
