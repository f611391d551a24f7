"""The pre-registered decisive experiment (experiments/lab/memalpha_lab/decisive_plan.py,
decisive_report.py): the verdict
rule on every side of its thresholds, the guard, the t interval over seeds it reads against a hand-computed
one, the arms' configs and held-out set, the --check rebuild on small made-up files, and
experiments/studies/decisive.py run as its command line: its options' checks, and the configs and summary
it writes when it resumes a run folder whose every stage is done."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memalpha_lab.decisive_plan import (
    TRAIN_DATA_SEED_BASE,
    VAL_DATA_SEED,
    collect_scores,
    guarded_values,
    held_out_config,
    recipe_config,
)
from memalpha_lab.decisive_report import GUARD_LIMIT, decide, guard, main, rebuild, verdict_of
from memalpha_lab.recipe_configs import load_yaml

REPO = Path(__file__).resolve().parent.parent
T4 = 2.776445  # the 0.975 quantile of Student's t with 4 degrees of freedom


@pytest.mark.parametrize(("low", "high", "guard_passed", "expected"), [
    (0.01, 0.2, True, "GRPO beats"),
    (0.01, 0.2, False, "not shown"),  # above 0 but the guard fails
    (0.0, 0.2, True, "not shown"),  # touching 0 is holding it
    (-0.1, 0.2, True, "not shown"),
    (-0.2, -0.01, True, "GRPO is worse"),
    (-0.2, -0.01, False, "GRPO is worse"),
    (-0.2, 0.0, True, "not shown"),
])
def test_the_rule_maps_the_interval_to_exactly_one_verdict(low, high, guard_passed, expected):
    assert verdict_of({"low": low, "high": high}, guard_passed, complete=True) == expected
    assert verdict_of({"low": low, "high": high}, guard_passed, complete=False) == "pending"


def run(accuracy: list[float], share: float) -> dict:
    """A made-up InstanceScores of one source over instances i0, i1, ..."""
    return {"s": {f"i{k}": {"accuracy": v, "fact_recall": v, "tool_success": 1.0, "memory_share": share}
                  for k, v in enumerate(accuracy)}}


def scores(changes: list[float], share: float = 0.3) -> dict:
    """Seeds 0.. whose grpo run is its sft_continued run plus ``changes[seed]`` on both instances."""
    base = [0.25, 0.5]
    return {"start": run(base, 0.3), "seeds": {
        str(s): {"grpo": run([b + c for b in base], share), "sft_continued": run(base, 0.3)}
        for s, c in enumerate(changes)}}


def test_decide_reads_the_t_interval_over_the_seeds_mean_changes():
    changes = [0.1, 0.2, 0.05, 0.15, 0.1]
    decision = decide(scores(changes), [0, 1, 2, 3, 4])
    mean = sum(changes) / 5
    sd = math.sqrt(sum((c - mean) ** 2 for c in changes) / 4)
    t = decision["t_over_seeds"]
    assert (
        t["mean"] == pytest.approx(mean)
        and t["low"] == pytest.approx(mean - T4 * sd / math.sqrt(5), abs=1e-6)
    )
    assert decision["verdict"] == "GRPO beats" and decision["seeds_done"] == [0, 1, 2, 3, 4]
    assert decide(scores([0.1, -0.2, 0.05, 0.15, 0.1]), [0, 1, 2, 3, 4])["verdict"] == "not shown"
    assert decide(scores([-0.1, -0.2, -0.05, -0.15, -0.1]), [0, 1, 2, 3, 4])["verdict"] == "GRPO is worse"
    assert decide(scores(changes[:4]), [0, 1, 2, 3, 4])["verdict"] == "pending"  # seed 4 missing


def test_a_policy_that_copies_its_input_fails_the_guard_and_cannot_win():
    copying = scores([0.1, 0.2, 0.05, 0.15, 0.1], share=0.9)
    held = guard(copying)
    assert not held["passed"] and held["per_seed"]["0"] == pytest.approx(0.9) and held["limit"] == GUARD_LIMIT
    assert decide(copying, [0, 1, 2, 3, 4])["verdict"] == "not shown"
    assert guard(scores([0.1, 0.2], share=0.5))["passed"]  # at the limit passes


def test_memory_share_is_memory_over_input_tokens_per_instance():
    records = [
        {
            "data_source": "s",
            "instance_id": "a",
            "memory_tokens": 30,
            "chunk_tokens": 120,
            "r3": 0.0,
            "turns": [{"results": [{"status": "ok"}], "reward": 1.0}],
            "questions": [{"score": 1.0, "gold": "x"}],
            "memory": {},
        }
    ]
    values = guarded_values(records)
    assert values["s"]["a"]["memory_share"] == pytest.approx(0.25) and values["s"]["a"]["accuracy"] == 1.0


PLAN = argparse.Namespace(recipe="extractive_instances_4", steps=8, val=96, questions=4, lr0=None,
                          train_data_seed_base=TRAIN_DATA_SEED_BASE)
"""The settings of the pre-registered plan that the configs read (decisive.py's defaults)."""


def test_arm_configs_use_the_recipe_its_own_stream_and_the_new_held_out_set(tmp_path, capsys):
    from memalpha.cli import main as memalpha

    base = load_yaml(REPO / "configs" / "tiny_cpu.yaml")
    config = recipe_config(base, tmp_path / "run", PLAN, 3)
    assert config["model"]["reader"]["kind"] == "extractive" and config["data"]["instances_per_step"] == 4
    assert config["data"]["seed"] == 3913 and config["seed_everything"] == 3 and config["model"]["seed"] == 3
    assert config["model"]["adapter_path"] == str(tmp_path / "run" / "sft" / "adapter")
    assert config["trainer"]["max_steps"] == 8 and config["trainer"]["limit_val_batches"] == 0
    held_out = held_out_config(base, tmp_path / "run", PLAN, VAL_DATA_SEED)
    assert held_out["data"]["seed"] == 3900 and held_out["data"]["synthetic"]["val"] == 96
    assert held_out["data"]["synthetic"]["questions"] == 4 and held_out["model"]["reader"]["kind"] == "local"
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as done:
        memalpha(["fit", "--config", str(path), "--print_config"])
    assert done.value.code in (0, None)
    assert yaml.safe_load(capsys.readouterr().out)["data"]["seed"] == 3913


def decisive(*args: str) -> subprocess.CompletedProcess:
    return study("decisive.py", *args)


def study(script: str, *args: str) -> subprocess.CompletedProcess:
    """``experiments/studies/<script> args`` as a user runs it, from the repository, in a session of its
    own: past the timeout it is killed with any ``memalpha`` command it started."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, f"experiments/studies/{script}", *args]
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_the_held_out_seed_must_be_new(tmp_path):
    (tmp_path / "run").mkdir()  # were the seed accepted, the script would stop here: the folder exists
    for taken in ("3912", "0"):  # seed 2's training stream; the demonstrations' data seed
        done = decisive("--val-data-seed", taken, "--run-dir", str(tmp_path / "run"), "--out",
                        str(tmp_path / "out.json"))
        assert done.returncode == 2 and f"--val-data-seed {taken} must differ" in done.stderr
    accepted = decisive("--val-data-seed", "3901", "--run-dir", str(tmp_path / "run"), "--out",
                        str(tmp_path / "out.json"))
    assert accepted.returncode == 1 and "pass --reuse" in accepted.stderr


def done_stages(run: Path, runs: tuple[str, ...], source: str = "s") -> None:
    """A study's run folder whose start and ``runs`` (``seed<S>_<arm>``) are done: the demonstrations, the
    start's TensorBoard folder, every adapter and a made-up validation report of each (one instance of
    ``source``)."""
    record = {"data_source": source, "instance_id": "a", "memory_tokens": 10, "chunk_tokens": 100, "r3": 0.0,
              "turns": [], "questions": [{"score": 1.0, "gold": "x"}], "memory": {}}
    (run / "demos").mkdir(parents=True)
    (run / "demos" / "val.jsonl").write_text("")
    (run / "sft" / "start").mkdir(parents=True)  # the start's TensorBoard folder
    for name in ("sft/adapter", *(f"arms/{r}/adapter" for r in runs)):
        (run / name).mkdir(parents=True)
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            (run / name / file).write_text("")
    for name in ("start", *runs):
        (run / "validate" / name).mkdir(parents=True)
        (run / "validate" / name / "validation.json").write_text(json.dumps({"records": [record]}))


def done_run_folder(run: Path) -> None:
    """A run folder holding every stage's output of seed 3 (adapters, made-up validation reports, arm
    A's TensorBoard step times), and no compute ledger."""
    from torch.utils.tensorboard import SummaryWriter

    done_stages(run, ("seed3_grpo", "seed3_sft_continued"))
    writer = SummaryWriter(str(run / "arms" / "seed3_grpo"))
    for step, seconds in enumerate((190.0, 190.5)):
        writer.add_scalar("step_s", seconds, step)
    writer.close()


def test_a_run_whose_stages_are_done_gets_the_plans_configs_and_a_pending_verdict(tmp_path):
    """decisive.py --reuse over a run folder whose every stage of seed 3 is done runs no stage; it writes
    each stage's config from its defaults (the pre-registered plan, B's CPU budget from A's compute
    ledger: amendment 1) and the summary of what the folder holds."""
    run = tmp_path.resolve() / "run"  # the script resolves its --run-dir
    base = load_yaml(REPO / "configs" / "tiny_cpu.yaml")
    done_run_folder(run)
    (run / "compute").mkdir()
    attempts = [{"wall_s": 900.0, "cpu_s": 500.25, "finished": False, "ended": "t"},  # A spent 1,360.1 CPU s
                {"wall_s": 1500.0, "cpu_s": 859.85, "finished": True, "ended": "t"}]
    (run / "compute" / "fit_seed3_grpo.json").write_text(json.dumps(attempts))

    out = tmp_path / "results" / "decisive.json"
    done = decisive("--reuse", "--seeds", "3", "--run-dir", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not (run / "logs").exists()  # no memalpha command ran
    held_out = yaml.safe_load((run / "validate.yaml").read_text())
    assert held_out == held_out_config(base, run, PLAN, VAL_DATA_SEED)
    assert held_out["data"]["seed"] == 3900 and held_out["data"]["synthetic"]["val"] == 96
    assert yaml.safe_load((run / "demos.yaml").read_text())["data"]["seed"] == 0  # the control arms' demos
    arm_a = yaml.safe_load((run / "seed3_grpo.yaml").read_text())
    assert arm_a == recipe_config(base, run, PLAN, 3)
    arm_b = yaml.safe_load((run / "seed3_sft_continued.yaml").read_text())
    assert arm_b["trainer"]["max_time"] is None and arm_b["data"]["seed"] == 3
    assert arm_b["trainer"]["callbacks"][-1] == {"class_path": "memalpha_lab.cpu_budget.CpuBudget",
                                                 "init_args": {"seconds": 1360.1}}
    assert arm_b["model"]["adapter_path"] == str(run / "sft" / "adapter")
    summary = json.loads(out.read_text())
    assert summary["decision"]["verdict"] == "pending" and summary["settings"]["seeds"] == [0, 1, 2, 3, 4]
    assert summary["settings"]["train_data_seeds"]["3"] == 3913
    assert summary["settings"]["val_data_seed"] == 3900 and summary["settings"]["recipe"] == PLAN.recipe
    assert summary["runs"]["seed3_sft_continued"]["cpu_budget_s"] == pytest.approx(1360.1)
    assert "CpuBudget" in summary["settings"]["compute_matching"]
    scores = json.loads((out.parent / "decisive" / "instance_scores.json").read_text())
    assert set(scores["seeds"]) == {"3"} and scores["seeds"]["3"]["grpo"]["s"]["a"]["memory_share"] == 0.1
    assert "pending" in done.stdout


def refusal(run: Path, tmp_path: Path) -> str:
    """The one line decisive.py --reuse over seed 3 of ``run`` stops with (exit status 1)."""
    done = decisive("--reuse", "--seeds", "3", "--run-dir", str(run), "--out", str(tmp_path / "out.json"))
    assert done.returncode == 1
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("ledger", ["missing", "after_unrecorded", "marker_left"])
def test_b_is_refused_when_as_cpu_seconds_are_not_all_recorded(tmp_path, ledger):
    """B's budget is A's recorded CPU seconds: with no ledger, with an attempt after an unrecorded one,
    or with an unrecorded attempt's marker left, the study stops with one line naming what to move
    aside, and writes no config for B."""
    run = tmp_path.resolve() / "run"
    done_run_folder(run)
    (run / "compute").mkdir()
    attempt = {"wall_s": 1.0, "cpu_s": 1.0, "finished": True, "ended": "t"}
    if ledger == "after_unrecorded":
        unrecorded = [{**attempt, "after_unrecorded": True}]
        (run / "compute" / "fit_seed3_grpo.json").write_text(json.dumps(unrecorded))
    elif ledger == "marker_left":
        (run / "compute" / "fit_seed3_grpo.json").write_text(json.dumps([attempt]))
        (run / "compute" / "fit_seed3_grpo.running").write_text("")
    last = refusal(run, tmp_path)
    assert "does not hold every attempt of seed3_grpo's fit" in last and "move" in last
    assert not (run / "seed3_sft_continued.yaml").exists()


def test_scores_are_collected_from_every_validation_in_the_folder(tmp_path):
    record = {"data_source": "s", "instance_id": "a", "memory_tokens": 10, "chunk_tokens": 100, "r3": 0.0,
              "turns": [], "questions": [{"score": 0.0, "gold": "x"}], "memory": {}}
    for name in ("start", "seed0_grpo", "seed0_sft_continued", "seed4_grpo"):
        (tmp_path / "validate" / name).mkdir(parents=True)
        (tmp_path / "validate" / name / "validation.json").write_text(json.dumps({"records": [record]}))
    found = collect_scores(tmp_path, [0, 1])
    assert found["start"]["s"]["a"]["memory_share"] == pytest.approx(0.1)
    assert set(found["seeds"]) == {"0", "4"} and set(found["seeds"]["0"]) == {"grpo", "sft_continued"}


def test_check_passes_on_its_own_summary_and_fails_on_a_changed_number(tmp_path, capsys):
    made_up = scores([0.1, 0.2, 0.05, 0.15, 0.1])
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(made_up))
    summary = {"settings": {"seeds": [0, 1, 2, 3, 4]}, **rebuild(made_up, [0, 1, 2, 3, 4])}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(summary))
    assert main(["--scores", str(path), "--summary", str(good), "--check"]) == 0
    assert "verdict" in capsys.readouterr().out
    summary["decision"]["verdict"] = "not shown"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(summary))
    assert main(["--scores", str(path), "--summary", str(bad), "--check"]) == 1
    assert main(["--scores", str(path), "--summary", str(tmp_path / "missing.json"), "--check"]) == 1


def test_the_committed_summary_is_rebuilt_from_the_committed_scores(capsys):
    """experiments/results/decisive.json (the study's verdict) from .../decisive/instance_scores.json."""
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt numbers match" in out and "verdict" in out and "optimiser steps" in out


def test_a_killed_b_is_refused_rather_than_resumed(tmp_path):
    """B's SFT killed mid-run (its ``.running`` marker left, its adapter not exported): resuming it would
    not count the killed process's seconds after its last checkpoint, so the study stops with one line
    naming what to move aside and runs no SFT."""
    run = tmp_path.resolve() / "run"
    done_run_folder(run)
    shutil.rmtree(run / "arms" / "seed3_sft_continued" / "adapter")
    (run / "compute").mkdir()
    attempt = {"wall_s": 1.0, "cpu_s": 1.0, "finished": True, "ended": "t"}
    (run / "compute" / "fit_seed3_grpo.json").write_text(json.dumps([attempt]))
    (run / "compute" / "sft_seed3_sft_continued.running").write_text("")
    last = refusal(run, tmp_path)
    assert "seed3_sft_continued's SFT was killed" in last and "move" in last
    assert not (run / "compute" / "sft_seed3_sft_continued.json").exists()
