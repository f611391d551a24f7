"""memalpha_lab.cpu_budget.CpuBudget, the decisive study's stop for arm B (docs/results.md, amendment 1):
a real ``memalpha sft`` run on the tiny model, configured the way the study configures B, stops at the
first optimiser step whose CPU seconds reach the budget, exports its adapter, and when resumed from a
checkpoint counts the seconds its earlier process saved. The CPU clock is replaced by one that ticks
10 s per optimiser step, so the step it stops at is exact; the real clock is checked on its own."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml
from lightning.pytorch import Callback
from test_sft import _sft_config, demo_file  # noqa: F401  (the fixture)
from test_training import scalars, version_dirs

from memalpha.cli import main
from memalpha_lab import cpu_budget
from memalpha_lab.arm_configs import replayed_config
from memalpha_lab.cpu_budget import CpuBudget, process_cpu_s

CLOCK = {"t": 0.0}


class Tick(Callback):
    """Advances the fake CPU clock by 10 s at the end of every optimiser step (before CpuBudget reads it:
    callbacks run in the configured order)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        CLOCK["t"] += 10.0


@pytest.fixture
def fake_clock(monkeypatch):
    monkeypatch.setattr(cpu_budget, "process_cpu_s", lambda: CLOCK["t"])
    return CLOCK


def budgeted_config(tmp_path, model_dir, demos, max_steps: int, seconds: float):
    """The test's SFT config with the study's stop: no max_time, CpuBudget after the checkpoint callback."""
    path = _sft_config(tmp_path, model_dir, demos, max_steps=max_steps)
    config = yaml.safe_load(path.read_text())
    config["trainer"]["max_time"] = None
    config["trainer"]["val_check_interval"] = None
    config["trainer"]["limit_val_batches"] = 0
    config["trainer"]["callbacks"] += [{"class_path": "test_cpu_budget.Tick"},
                                       {"class_path": "memalpha_lab.cpu_budget.CpuBudget",
                                        "init_args": {"seconds": seconds}}]
    path.write_text(yaml.safe_dump(config))
    return path


def logged_steps(run_dir) -> dict[int, float]:
    points: dict[int, float] = {}
    for log_dir in version_dirs(run_dir):
        points.update(scalars(log_dir).get("cpu_budget/spent_s", {}))
    return points


def test_sft_stops_at_the_first_step_that_reaches_the_budget(tmp_path, tiny_model_dir, demo_file, fake_clock):  # noqa: F811
    fake_clock["t"] = 0.0
    config = budgeted_config(tmp_path, tiny_model_dir, demo_file, max_steps=50, seconds=35.0)
    main(["sft", "--config", str(config)])
    # 10, 20, 30 CPU s after steps 1-3 are under 35; step 4 reaches 40 and is the last
    assert logged_steps(tmp_path) == {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()  # ended as finished


def test_a_resumed_run_adds_the_seconds_its_checkpoint_saved(tmp_path, tiny_model_dir, demo_file, fake_clock):  # noqa: F811
    fake_clock["t"] = 0.0
    config = budgeted_config(tmp_path, tiny_model_dir, demo_file, max_steps=2, seconds=35.0)
    main(["sft", "--config", str(config)])  # stopped by max_steps at 20 CPU s, saved in last.ckpt
    fake_clock["t"] = 5.0  # the new process's own seconds (its loading) before the first resumed step
    main(["sft", "--config", str(config), "--trainer.max_steps", "50",
          "--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt")])
    # resumed: 20 saved + 15 after step 3 reaches 35: step 3 is the last
    assert logged_steps(tmp_path) == {0: 10.0, 1: 20.0, 2: 35.0}


def test_resuming_with_another_budget_is_refused(tmp_path, tiny_model_dir, demo_file, fake_clock):  # noqa: F811
    fake_clock["t"] = 0.0
    config = budgeted_config(tmp_path, tiny_model_dir, demo_file, max_steps=1, seconds=35.0)
    main(["sft", "--config", str(config)])
    other = budgeted_config(tmp_path, tiny_model_dir, demo_file, max_steps=50, seconds=99.0)
    with pytest.raises(ValueError, match="saved with a budget of 35.0 CPU s, this run has 99.0"):
        main(["sft", "--config", str(other),
              "--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt")])


def test_a_budget_stopped_run_replayed_to_its_steps_gives_the_same_adapter(
    tmp_path, tiny_model_dir, demo_file, fake_clock  # noqa: F811
):
    """A lost arm B is trained again to the steps its CPU budget stopped it at (replayed_config: StepCount
    in CpuBudget's place, max_steps and so the schedule unchanged): the same weights, byte for byte."""
    fake_clock["t"] = 0.0
    config = budgeted_config(tmp_path, tiny_model_dir, demo_file, max_steps=50, seconds=25.0)
    main(["sft", "--config", str(config)])  # 10, 20, 30 CPU s: stops after step 3 of 50
    weights = tmp_path / "run" / "adapter" / "adapter_model.safetensors"
    budgeted = weights.read_bytes()
    replay = replayed_config(yaml.safe_load(config.read_text()), 3)
    assert [c["class_path"].rsplit(".", 1)[1] for c in replay["trainer"]["callbacks"]][-1] == "StepCount"
    replay["model"]["export_adapter_dir"] = str(tmp_path / "replay")
    replay["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(tmp_path / "replay_checkpoints")
    config.write_text(yaml.safe_dump(replay))
    main(["sft", "--config", str(config)])
    assert (tmp_path / "replay" / "adapter_model.safetensors").read_bytes() == budgeted
    replay["trainer"]["callbacks"][-1]["init_args"]["steps"] = 2
    config.write_text(yaml.safe_dump(replay))
    main(["sft", "--config", str(config)])
    assert (tmp_path / "replay" / "adapter_model.safetensors").read_bytes() != budgeted  # a step fewer
    with pytest.raises(ValueError, match="0 CpuBudget callbacks in the config, expected one"):
        replayed_config(replay, 3)


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan"), float("inf"), True, "10"])
def test_the_budget_must_be_a_positive_number(seconds):
    with pytest.raises(ValueError, match="CpuBudget: seconds must be a positive number"):
        CpuBudget(seconds)


def test_process_cpu_seconds_count_this_process_and_its_finished_children():
    before = process_cpu_s()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    code = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert process_cpu_s() - before >= 0.45
