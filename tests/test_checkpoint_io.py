"""Checkpoint writes are atomic: a crash or a kill mid-write leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from memalpha.train.checkpoint_io import AtomicCheckpointIO, atomic_torch_save


class _ExplodesWhenPickled:
    def __reduce__(self):
        raise RuntimeError("disk on fire")


def test_exception_mid_write_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="disk on fire"):
        AtomicCheckpointIO().save_checkpoint(
            {"step": 2, "w": torch.zeros(1000), "bad": _ExplodesWhenPickled()}, path
        )
    loaded = torch.load(path, weights_only=False)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["last.ckpt"], "temporary file left behind"


def test_sigkill_during_writes_never_leaves_a_truncated_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 0, "w": torch.zeros(4)}, path)
    writer = textwrap.dedent(
        f"""
        import sys, torch
        from memalpha.train.checkpoint_io import atomic_torch_save
        step = 0
        while True:
            step += 1
            big = torch.full((3_000_000,), float(step))   # ~12 MB per write
            print("writing", step, flush=True)
            atomic_torch_save({{"step": step, "w": big}}, {str(path)!r})
        """
    )
    for delay in (0.2, 0.5):
        proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("writing")
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        loaded = torch.load(path, weights_only=False)
        expected = torch.full_like(loaded["w"], float(loaded["step"]))
        assert loaded["step"] == 0 or torch.equal(loaded["w"], expected)
        for leftover in tmp_path.glob(".last.ckpt.*"):
            leftover.unlink()  # a killed writer may leave its temp file; the checkpoint itself is intact
