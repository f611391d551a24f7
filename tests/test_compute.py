"""The compute record of experiments (issue 39, item 2): the per-round counts the GRPO module logs
(memalpha/train/step.py, `round_metrics`), and experiments/lab/memalpha_lab/compute.py, which sums them from
TensorBoard and measures each stage's wall and CPU seconds around its subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memalpha_lab.compute import (
    boot_id,
    measured,
    stage_record,
    stage_seconds,
    training_compute,
    training_counts,
    validation_counts,
)


def test_a_round_logs_its_rollouts_samples_tokens_and_reader_questions():
    import torch

    from memalpha.agent.rollout import RolloutOutput, RolloutRecord, TurnSample
    from memalpha.train.step import round_metrics

    def record(name: str, questions: int) -> RolloutRecord:
        return RolloutRecord(name, "synth_personal", 0, [], {}, 10, 100, [{"score": 1.0}] * questions)

    samples = [TurnSample(0, g, 0, [1], [2], False, 0, 0) for g in (0, 0, 1)]
    out = RolloutOutput(
        samples, [record("a", 3), record("b", 4)], rollout_s=2.0, reader_s=0.5, generated_tokens=17
    )
    metrics = round_metrics(out, rewards := torch.tensor([1.0, 0.0, 1.0]), (rewards, torch.tensor([0, 0, 1])))
    assert metrics["perf/rollouts"] == 2 and metrics["perf/turn_samples"] == 3
    assert metrics["perf/generated_tokens"] == 17 and metrics["reader/questions"] == 7


def test_training_counts_sum_the_rounds_and_say_what_was_not_logged():
    series = {"step_s": {0: 10.0, 1: 12.5}, "perf/rollouts": {0: 16.0, 1: 16.0},
              "perf/generated_tokens": {0: 900.0, 1: 1100.0}, "reader/questions": {0: 64.0, 1: 64.0}}
    counts = training_counts(series, sampled=True)
    assert counts == {"optimiser_steps": 2, "train_s": 22.5, "rollouts": 32, "turn_samples": None,
                      "tokens_sampled": 2000, "reader_calls": 128}
    sft = training_counts({"step_s": {0: 1.0, 1: 1.0, 2: 1.0}}, sampled=False)
    assert (
        sft["optimiser_steps"] == 3 and sft["rollouts"] == sft["tokens_sampled"] == sft["reader_calls"] == 0
    )
    old = training_counts({"step_s": {0: 1.0}}, sampled=True)  # a GRPO run logged before the counts existed
    assert old["rollouts"] is None and old["tokens_sampled"] is None and old["reader_calls"] is None


def test_training_compute_reads_the_tensorboard_events(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    for step in range(3):
        writer.add_scalar("step_s", 2.0 + step, step)
        writer.add_scalar("perf/rollouts", 16.0, step)
        writer.add_scalar("perf/turn_samples", 32.0, step)
        writer.add_scalar("perf/generated_tokens", 100.0 * (step + 1), step)
        writer.add_scalar("reader/questions", 64.0, step)
    writer.close()
    assert training_compute(tmp_path, sampled=True) == {
        "optimiser_steps": 3, "train_s": 9.0, "rollouts": 48, "turn_samples": 96, "tokens_sampled": 600,
        "reader_calls": 192}


def burn(seconds: float) -> None:
    """A child process that spends about ``seconds`` of CPU."""
    code = f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_measured_records_the_childrens_cpu_and_sums_every_attempt(tmp_path):
    assert stage_seconds(tmp_path, "fit_x") is None
    with measured(tmp_path, "fit_x"):
        burn(0.3)
    with pytest.raises(RuntimeError), measured(tmp_path, "fit_x"):  # a failed attempt still counts
        burn(0.2)
        raise RuntimeError("killed")
    seconds = stage_seconds(tmp_path, "fit_x")
    assert (
        seconds["attempts"] == 2
        and 0.45 <= seconds["cpu_s"] < 5
        and seconds["wall_s"] >= seconds["cpu_s"] * 0.5
    )
    import json

    attempts = json.loads((tmp_path / "compute" / "fit_x.json").read_text())
    assert [a["finished"] for a in attempts] == [True, False] and attempts[0]["cpu_s"] >= 0.25
    record = stage_record(tmp_path, "fit_x", {"rollouts": 4})
    assert record["rollouts"] == 4 and record["cpu_s"] == seconds["cpu_s"] and record["attempts"] == 2
    assert stage_record(tmp_path, "fit_y", {})["cpu_s"] is None


def test_validation_counts_its_rollouts_turns_and_questions():
    records = [{"turns": [{}, {}], "questions": [{}] * 4}, {"turns": [{}], "questions": [{}] * 3}]
    assert validation_counts(records) == {"rollouts": 2, "turn_samples": 3, "reader_calls": 7}


def test_the_report_shows_recorded_compute_and_marks_the_rest(capsys):
    from memalpha_lab.control_arms_report import print_compute, run_compute

    runs = {"seed0_grpo": {"train_s": 380.4, "steps": 8,
                           "compute": {"train": {"cpu_s": 700.0, "rollouts": 32, "tokens_sampled": None,
                                                 "reader_calls": 128}}}}
    assert run_compute(runs) == [{"run": "seed0_grpo", "seed": 0, "arm": "grpo", "train_s": 380.4, "steps": 8,
                                  "cpu_s": 700.0, "rollouts": 32, "reader_calls": 128}]
    print_compute(runs)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert "700" in row and "128" in row and row.count("not recorded") == 1


def test_an_attempt_killed_with_the_experiment_marks_the_next_one(tmp_path):
    """An attempt whose experiment process dies records nothing but leaves its marker; the next
    attempt is recorded as coming after an unrecorded one, and the stage's seconds are not complete."""
    from memalpha_lab.compute import running_marker, unrecorded_attempt

    with measured(tmp_path, "fit_x"):
        assert running_marker(tmp_path, "fit_x").is_file()  # held while the attempt runs
    assert not unrecorded_attempt(tmp_path, "fit_x") and stage_seconds(tmp_path, "fit_x")["complete"]
    running_marker(tmp_path, "fit_x").touch()  # what a killed experiment leaves
    assert unrecorded_attempt(tmp_path, "fit_x")
    with measured(tmp_path, "fit_x"):
        pass
    assert not unrecorded_attempt(tmp_path, "fit_x")
    seconds = stage_seconds(tmp_path, "fit_x")
    assert seconds["attempts"] == 2 and seconds["complete"] is False
    assert seconds["boots"] == [boot_id()]  # both attempts on this machine


def test_the_machines_a_stage_ran_on_are_its_attempts_boot_ids(tmp_path):
    (tmp_path / "compute").mkdir()
    attempts = [{"wall_s": 1.0, "cpu_s": 1.0, "finished": False, "ended": "t"},  # recorded before boot ids
                {"wall_s": 1.0, "cpu_s": 1.0, "finished": False, "ended": "t", "boot": "b"},
                {"wall_s": 1.0, "cpu_s": 1.0, "finished": True, "ended": "t", "boot": "a"}]
    (tmp_path / "compute" / "fit_x.json").write_text(json.dumps(attempts))
    assert stage_seconds(tmp_path, "fit_x")["boots"] == [None, "a", "b"]
