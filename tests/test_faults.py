"""Faults during `memalpha fit` on a tiny model: a kill anywhere, SIGTERM, a checkpoint that cannot be
written.

Each faulty run is a real process (``fault_probe.py``) that dies or stops at a chosen point;
the run resumed from its ``last.ckpt`` must then log, step for step, what an uninterrupted
run logs. The random-kill loop of ``experiments/checks/kill_resume.py`` does the same at random times.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_training import scalars, version_dirs, write_config

from memalpha.cli import main

TESTS = Path(__file__).resolve().parent
STEPS = 3
COMPARED = (
    "train/reward", "train/loss", "train/kl", "rewards/r1_accuracy", "memory/tokens", "lr", "train/grad_norm",
)


def probe(config: Path, at: str, signal_name: str = "KILL") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(TESTS / "fault_probe.py"), "--at", at, "--signal", signal_name, "--",
         "fit", "--config", str(config)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )


def merged_scalars(tmp_path: Path) -> dict[str, dict[int, float]]:
    merged: dict[str, dict[int, float]] = {}
    for log_dir in version_dirs(tmp_path):
        for tag, points in scalars(log_dir).items():
            merged.setdefault(tag, {}).update(points)
    return merged


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir):
    """The uninterrupted run every faulty one is compared with."""
    tmp_path = tmp_path_factory.mktemp("straight")
    main(["fit", "--config", str(write_config(tmp_path, tiny_model_dir, max_steps=STEPS))])
    return scalars(version_dirs(tmp_path)[0])


def assert_resumes_like_straight(tmp_path: Path, config: Path, straight: dict, saved_step: int) -> None:
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == saved_step
    main(["fit", "--config", str(config), "--ckpt_path", str(ckpt)])
    assert not list(ckpt.parent.glob(".*.tmp")), "the next save removes a killed write's temporary file"
    resumed = scalars(version_dirs(tmp_path)[-1])
    for tag in COMPARED:
        after = {step: value for step, value in resumed[tag].items() if step >= saved_step}
        assert set(after) == set(range(saved_step, STEPS)), (tag, sorted(resumed[tag]))
        for step, value in after.items():
            assert value == pytest.approx(straight[tag][step], rel=1e-4, abs=1e-6), (tag, step)


@pytest.mark.parametrize("phase", ["rollout", "optimizer", "checkpoint"])
def test_sigkill_anywhere_then_resume_equals_the_uninterrupted_run(phase, tmp_path, tiny_model_dir, straight):
    config = write_config(tmp_path, tiny_model_dir, max_steps=STEPS)
    # the 2nd rollout / optimiser step belongs to step 1; the 2nd checkpoint write is step 2's
    done = probe(config, f"{phase}:2")
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    ckpt_dir = tmp_path / "run" / "checkpoints"
    if phase == "checkpoint":
        assert len(list(ckpt_dir.glob(".last.ckpt.*.tmp"))) == 1, "the killed write left its half file aside"
    assert_resumes_like_straight(tmp_path, config, straight, saved_step=1)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, tiny_model_dir, straight):
    config = write_config(tmp_path, tiny_model_dir, max_steps=STEPS)
    data = yaml.safe_load(config.read_text())
    data["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] = 100  # only SIGTERM saves
    config.write_text(yaml.safe_dump(data))
    done = probe(config, "rollout:2", "TERM")  # arrives while step 1 is in flight; step 1 completes
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SIGTERM: saved" in done.stderr + done.stdout
    assert_resumes_like_straight(tmp_path, config, straight, saved_step=2)


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, max_steps=STEPS)
    done = probe(config, "full:2")  # step 2's write meets a 4 KiB file-size limit (EFBIG)
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert last_line == (
        f"memalpha fit: error: cannot write checkpoint {ckpt}: "
        "File too large; the previous checkpoint there is intact"
    ), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert torch.load(ckpt, weights_only=False)["global_step"] == 1
    assert not list(ckpt.parent.glob(".*.tmp"))


def test_a_run_stopped_after_its_last_step_exports_its_adapter_when_resumed(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, max_steps=1)
    data = yaml.safe_load(config.read_text())
    data["trainer"]["limit_val_batches"] = 0
    adapter = tmp_path / "adapter"
    data["model"]["export_adapter_dir"] = str(adapter)
    config.write_text(yaml.safe_dump(data))
    main(["fit", "--config", str(config)])
    assert (adapter / "adapter_config.json").is_file()
    shutil.rmtree(adapter)  # what a SIGTERM in the last step leaves: its checkpoint, no adapter
    main(["fit", "--config", str(config), "--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt")])
    assert (adapter / "adapter_config.json").is_file(), "the resumed run, with nothing left to train, exports"
