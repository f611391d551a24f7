"""Run a ``memalpha`` command in this process and hit it with a fault at a chosen point.

    python tests/fault_probe.py --at PHASE:N [--signal KILL|TERM] -- fit --config CONFIG ...

The fault strikes at the N-th occurrence (counted from 1) of PHASE:

- ``rollout``: right after a round's rollouts are generated, before any update uses them;
- ``optimizer``: right after an optimiser step has changed the weights in memory, before the
  scheduler steps and before anything is saved;
- ``checkpoint``: inside a checkpoint write, once half of its bytes are on disk;
- ``full``: a checkpoint write meets a file-size limit the kernel enforces (``RLIMIT_FSIZE``),
  as on a full disk: the write fails with ``EFBIG``. No signal is sent.

The signal is sent by the process to itself (``os.kill``), so ``KILL`` ends it there and then,
with no cleanup of any kind, as a crash or the OOM killer would; ``TERM`` goes through the
handlers a scheduler's preemption would meet. The fault tests in ``test_faults.py`` and the
random-kill loop in ``experiments/checks/kill_resume.py`` use it.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import signal
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

PHASES = ("rollout", "optimizer", "checkpoint", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", required=True, help="PHASE:N with PHASE one of " + ", ".join(PHASES))
    parser.add_argument("--signal", default="KILL", choices=("KILL", "TERM"))
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the memalpha command, after --")
    opts = parser.parse_args()
    phase, _, count = opts.at.partition(":")
    if phase not in PHASES or not count.isdigit() or int(count) < 1:
        parser.error(f"--at must be PHASE:N with PHASE in {PHASES} and N >= 1, got {opts.at!r}")
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    arm(phase, int(count), getattr(signal, f"SIG{opts.signal}"))

    from memalpha.cli import main as memalpha_main

    memalpha_main(command)


def arm(phase: str, n: int, signum: int) -> None:
    """Install the fault for the N-th occurrence of ``phase``."""
    seen = 0

    def nth() -> bool:
        nonlocal seen
        seen += 1
        return seen == n

    def strike() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signum)

    if phase == "rollout":
        from memalpha.agent.rollout import Agent

        generate = Agent.rollouts

        def rollouts_then_fault(*args, **kwargs):
            out = generate(*args, **kwargs)
            if nth():
                strike()
            return out

        Agent.rollouts = rollouts_then_fault
    elif phase == "optimizer":

        def after_step(optimizer, args, kwargs) -> None:
            if nth():
                strike()

        register_optimizer_step_post_hook(after_step)
    else:
        save = torch.save

        def faulty_save(obj, f, *args, **kwargs):
            if not nth():
                return save(obj, f, *args, **kwargs)
            if phase == "checkpoint":
                buffer = io.BytesIO()
                save(obj, buffer, *args, **kwargs)
                data = buffer.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                strike()
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            limits = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
            try:
                return save(obj, f, *args, **kwargs)
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, limits)

        torch.save = faulty_save


if __name__ == "__main__":
    main()
