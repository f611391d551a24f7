"""Stop a training run when its process has used a given number of CPU seconds (issue 39's
decisive study, amendment in docs/results.md: arm B is matched to arm A's CPU seconds, not its wall
time, because two processes sharing two cores with other work get unequal shares of the wall clock).

:class:`CpuBudget` is a Lightning callback a config names under ``trainer.callbacks``::

    - class_path: memalpha_lab.cpu_budget.CpuBudget
      init_args: {seconds: 1360.1}

After every training batch (one optimiser step: the memalpha modules optimise by hand, one step a
batch) it compares the CPU seconds spent so far with ``seconds`` and, once they are reached, sets
``trainer.should_stop`` (the way Lightning's own ``Timer`` ends a run at ``max_time``); the run then
ends as a finished one (its adapter exported, its last checkpoint written by the checkpoint
callback). The run can overshoot by the one step during which the budget is crossed.

CPU seconds are :func:`process_cpu_s`: user plus system seconds of this process and its waited-for
children, from its start, so model loading counts, as it does in the experiment's compute ledger
(:mod:`memalpha_lab.compute`, which measures a whole ``memalpha`` subprocess the same way). The
callback's state (the seconds spent up to a checkpoint) is saved in the checkpoint, so a run
resumed from ``last.ckpt`` adds the seconds of its earlier processes; seconds spent after the last
checkpoint by a process that was killed are not counted (the resumed run may train that much
longer).
"""

from __future__ import annotations

import math
import resource
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from memalpha_lab.compute import children_cpu_s


def process_cpu_s() -> float:
    """User plus system CPU seconds of this process and its finished (waited-for) children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu_s()


class CpuBudget(Callback):
    """Stop training once the run has spent ``seconds`` CPU seconds (over all its processes, when
    resumed from a checkpoint that saved this callback's state)."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds <= 0:
            raise ValueError(f"CpuBudget: seconds must be a positive number of CPU seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.earlier_s = 0.0  # CPU seconds of the processes before the checkpoint this run resumed from

    def spent_s(self) -> float:
        """CPU seconds the run has spent: its earlier processes' plus this one's."""
        return self.earlier_s + process_cpu_s()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        spent = self.spent_s()
        pl_module.log("cpu_budget/spent_s", spent, on_step=True, on_epoch=False, batch_size=1)
        if spent >= self.seconds and not trainer.should_stop:
            trainer.should_stop = True
            print(f"CpuBudget: {spent:.1f} CPU s spent of {self.seconds:.1f}; stopping after step "
                  f"{trainer.global_step}", flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {"spent_s": self.spent_s(), "seconds": self.seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["seconds"]
        if abs(float(saved) - self.seconds) > 1e-6:
            raise ValueError(f"CpuBudget: the checkpoint was saved with a budget of {saved} CPU s, this run "
                             f"has {self.seconds}; resume with the same budget")
        self.earlier_s = float(state_dict["spent_s"])


class StepCount(Callback):
    """Stop training after ``steps`` training batches: a run a :class:`CpuBudget` stopped, trained again
    to the same step (its schedule, which ``trainer.max_steps`` sets, unchanged), so that it gives the
    same adapter without the budget's dependence on the machine's speed."""

    def __init__(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"StepCount: steps must be a positive number of steps, got {steps!r}")
        self.steps = steps
        self.done = 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.done += 1
        if self.done >= self.steps:
            trainer.should_stop = True
