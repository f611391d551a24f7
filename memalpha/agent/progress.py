"""Phase reports: what a step is doing while it runs, for whoever shows progress.

The code that does a step's work calls a :data:`PhaseHook` with a :class:`Phase` as each phase
starts: :meth:`memalpha.agent.rollout.Agent.rollouts` reports ``sampling`` (once per chunk index),
``reader`` and ``rewards``; :class:`memalpha.train.module.GRPOModule` adds ``logprobs`` and
``update``. The hook is an argument that defaults to :func:`show_nothing`, so these layers know nothing of the
display (the progress bar of :mod:`memalpha.train.progress_bar`) and a run without one pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PHASES = ("sampling", "reader", "rewards", "logprobs", "update")
"""The phases of a GRPO step, in the order they run (validation runs the first three)."""


@dataclass(frozen=True)
class Phase:
    """A phase that starts now.

    Args:
        name: One of :data:`PHASES`.
        index: ``sampling``: the chunk index being sampled, counted from 1.
        total: ``sampling``: the chunks of the round's longest instance; ``reader``: the questions.
        tokens_per_s: ``sampling``: tokens generated per second over the round's chunks so far
            (None before the first chunk has finished).
    """

    name: str
    index: int | None = None
    total: int | None = None
    tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.name not in PHASES:
            raise ValueError(f"phase must be one of {list(PHASES)}, got {self.name!r}")

    def describe(self) -> str:
        """The phase in a few words: ``sampling chunk 2/4, 310 tok/s``, ``reader, 16 questions``."""
        if self.name == "sampling":
            text = f"sampling chunk {self.index}/{self.total}"
            if self.tokens_per_s is None:
                return text
            return f"{text}, {self.tokens_per_s:.{1 if self.tokens_per_s < 10 else 0}f} tok/s"
        if self.name == "reader" and self.total is not None:
            return f"reader, {self.total} questions"
        return self.name


PhaseHook = Callable[[Phase], None]
"""Called with each :class:`Phase` as it starts."""


def show_nothing(phase: Phase) -> None:
    """The hook of a caller that shows no progress."""
