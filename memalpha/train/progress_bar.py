"""StepProgressBar: a progress bar counting optimiser steps and showing what the step is doing.

Lightning's bars count batches of an epoch. memalpha's train stream has no epochs and a step
takes seconds to minutes, so this bar (the default of ``memalpha fit`` and ``memalpha sft``)
counts optimiser steps (``trainer.global_step``) against the run's length, and its description
says which phase of the step runs now, as :mod:`memalpha.agent.progress` reports it::

    step 2: sampling chunk 2/4, 310 tok/s   25%|██▌       | 1/4 steps [01:21<04:03,
        reward=0.512, tool_success=0.938, step_s=81.02]

``memalpha predict``'s bar counts the chunks the agent has read of this rank's instances
(within a batch, the chunks before the one being sampled), with the instances written as postfix.

The postfix holds the last step's values (what the module logs with ``prog_bar=True``: the
round's mean reward, its tool-call success and the step's seconds). During validation the
validation bar shows the phases in the same way. On a terminal the running bar is redrawn every
second, so its clock moves through a phase that takes minutes; written to a file it is drawn only
when something changes.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

from memalpha.agent.progress import Phase

FIRST = ("reward", "tool_success", "step_s")
"""Postfix values shown first, in this order; the others follow."""

STEPS_FORMAT = (
    "{desc} {percentage:3.0f}%|{bar:10}| {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}{postfix}]"
)
OPEN_FORMAT = "{desc} {n_fmt} steps [{elapsed}{postfix}]"
CHUNKS_FORMAT = (
    "{desc} {percentage:3.0f}%|{bar:10}| {n_fmt}/{total_fmt} chunks [{elapsed}<{remaining}{postfix}]"
)
BATCHES_FORMAT = "{desc} {percentage:3.0f}%|{bar:10}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
DESCRIPTION_WIDTH = 40
"""Descriptions are padded to this width, so the bar stays put while the phases change."""


TICK_S = 1.0
"""Seconds between redraws of the running bar on a terminal."""


def run_steps(trainer: Any, module: Any) -> int | None:
    """Optimiser steps the run takes: ``trainer.max_steps``, or fewer when ``data.epochs`` ends it
    first and the module knows its rounds and the steps of each; None when nothing bounds it."""
    bounds = [trainer.max_steps] if trainer.max_steps is not None and trainer.max_steps > 0 else []
    schedule = getattr(module, "schedule_rounds", None)
    try:
        rounds, per_round = schedule() if schedule is not None else (None, None)
    except ValueError:  # a module without rounds (SFT)
        rounds, per_round = None, None
    if rounds is not None and per_round is not None:
        bounds.append(rounds * per_round)
    return min(bounds) if bounds else None


class StepProgressBar(TQDMProgressBar):
    """Lightning's ``TQDMProgressBar`` counting optimiser steps, with the running phase as description.

    Takes ``TQDMProgressBar``'s arguments (``refresh_rate``, ``process_position``, ``leave``).
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._ticking: threading.Event | None = None
        self._chunks_done = self._instances_done = 0  # memalpha predict's
        self._batch_chunks: list[int] = []

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_ticking": None}  # a thread's event does not pickle (ddp_spawn)

    # ---------------------------------------------------------------- clock
    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self._ticking is None and self.is_enabled and trainer.is_global_zero and _on_terminal():
            self._ticking = threading.Event()
            threading.Thread(
                target=self._tick, args=(self._ticking,), name="memalpha-progress", daemon=True
            ).start()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._stop_ticking()
        super().teardown(trainer, pl_module, stage)

    def _stop_ticking(self) -> None:
        if self._ticking is not None:
            self._ticking.set()
            self._ticking = None

    def _tick(self, stopped: threading.Event) -> None:
        """Redraw the running bar every :data:`TICK_S` (its elapsed time and estimate) until stopped."""
        while not stopped.wait(TICK_S):
            trainer = self._trainer
            if trainer is None:
                continue
            evaluating = trainer.validating or trainer.sanity_checking
            bar = self._val_progress_bar if evaluating else self._train_progress_bar
            if trainer.predicting:
                bar = self._predict_progress_bar
            if bar is not None and not bar.disable:
                bar.refresh()

    # ------------------------------------------------------------- training
    def init_train_tqdm(self):
        bar = super().init_train_tqdm()
        bar.bar_format = OPEN_FORMAT
        return bar

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        total = run_steps(trainer, trainer.lightning_module)
        bar.reset()
        bar.total = total
        bar.bar_format = STEPS_FORMAT if total is not None else OPEN_FORMAT
        bar.initial = bar.n = trainer.global_step  # a resumed run: the rate counts this run's steps only
        self._describe(bar, f"step {trainer.global_step + 1}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self._train_progress_bar
        if bar is None or not self.is_enabled:
            return
        bar.n = trainer.global_step
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        self._describe(bar, f"step {trainer.global_step} done")

    def on_train_end(self, *_: Any) -> None:
        if self._train_progress_bar is not None:
            self.train_progress_bar.close()

    # ----------------------------------------------------------- validation
    def init_validation_tqdm(self):
        bar = super().init_validation_tqdm()
        bar.bar_format = BATCHES_FORMAT
        return bar

    def init_sanity_tqdm(self):
        bar = super().init_sanity_tqdm()
        bar.bar_format = BATCHES_FORMAT
        return bar

    # ------------------------------------------------------------- prediction
    def init_predict_tqdm(self):
        bar = super().init_predict_tqdm()
        bar.bar_format = CHUNKS_FORMAT
        return bar

    def on_predict_start(self, trainer, pl_module) -> None:
        super().on_predict_start(trainer, pl_module)
        self._chunks_done, self._instances_done, self._batch_chunks = 0, 0, []
        bar = self.predict_progress_bar
        bar.total = predict_chunks(trainer)
        self._describe(bar, self.predict_description)

    def on_predict_batch_start(
        self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_chunks = [len(instance.chunks) for instance in batch]

    def on_predict_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._chunks_done += sum(self._batch_chunks)
        self._instances_done += len(self._batch_chunks)
        bar = self._predict_progress_bar
        if bar is not None and not bar.disable:
            bar.n = self._chunks_done
            bar.set_postfix({"instances": self._instances_done}, refresh=False)
            self._describe(bar, self.predict_description)

    # --------------------------------------------------------------- phases
    def show_phase(self, phase: Phase) -> None:
        """A :data:`~memalpha.agent.progress.PhaseHook`: the phase goes into the description of
        the bar that runs (the training bar, or the validation bar while validating)."""
        trainer = self._trainer
        if trainer is None or not self.is_enabled:
            return
        if trainer.predicting:
            bar, label = self._predict_progress_bar, self.predict_description
            if bar is not None and phase.name == "sampling" and phase.index is not None:
                bar.n = self._chunks_done + sum(min(n, phase.index - 1) for n in self._batch_chunks)
        elif trainer.validating or trainer.sanity_checking:
            bar, label = self._val_progress_bar, self.validation_description
        elif trainer.training:
            bar, label = self._train_progress_bar, f"step {trainer.global_step + 1}"
        else:
            return
        if bar is not None and not bar.disable:
            self._describe(bar, f"{label}: {phase.describe()}")

    def _describe(self, bar, text: str) -> None:
        if not bar.disable:
            bar.set_description_str(text.ljust(DESCRIPTION_WIDTH), refresh=True)

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        """Lightning's progress-bar values, the last step's reward, tool success and seconds first."""
        metrics = super().get_metrics(trainer, pl_module)
        return {**{key: metrics[key] for key in FIRST if key in metrics}, **metrics}

    # --------------------------------------------------------------- errors
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Close the bars, so an error message starts on a line of its own."""
        self._stop_ticking()
        for bar in (self._val_progress_bar, self._train_progress_bar, self._predict_progress_bar):
            if bar is not None and not bar.disable:
                bar.close()


def predict_chunks(trainer: Any) -> int | None:
    """The chunks of the instances this rank predicts (its sampler's share of the loader's
    instances), or None when the loader does not say."""
    loaders = trainer.predict_dataloaders
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    try:
        return sum(len(loader.dataset[i].chunks) for loader in loaders for i in loader.sampler)
    except (AttributeError, TypeError):
        return None


def _on_terminal() -> bool:
    """Whether the bars (drawn on ``sys.stdout``) go to a terminal."""
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())
