"""Faults of a training step that must stop it rather than become a reward: a reader that failed too
many of a round's answers (:class:`ReaderGate`: a reader that is down would score every answer 0,
and GRPO would train on that), and running out of memory in any phase (:class:`StepOutOfMemory`:
one line naming the phase, the memory held and the settings that lower that phase's memory).
Both are raised before the step's optimiser update, so the last checkpoint is the one the run
wrote before (docs/metrics_and_rewards.md, "Faults").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.agent.rollout import RolloutRecord
from memalpha.lm.core.out_of_memory import is_out_of_memory, memory_held
from memalpha.reader.settings import ReaderSettings

MAX_SKIPPED_ROUNDS_IN_A_ROW = 3
"""Rounds skipped in a row for their reader's failures after which the run stops: a reader that
stays down would otherwise roll out rounds without end."""

LOWER_MEMORY_SETTINGS: dict[str, tuple[str, ...]] = {
    "sampling": (
        "model.rollout.generation_batch_size", "model.rollout.max_new_tokens",
        "model.rollout.max_prompt_tokens",
    ),
    "reader": (
        "model.reader.batch_size", "model.reader.retrieval.prompt_tokens", "model.reader.max_new_tokens"
    ),
    "rewards": ("model.reader.batch_size", "model.reader.retrieval.prompt_tokens"),
    "logprobs": ("model.update.micro_batch_size", "model.rollout.max_new_tokens"),
    "update": ("model.update.micro_batch_size", "model.lm.gradient_checkpointing: true"),
}
"""Per phase of a step (:data:`memalpha.agent.progress.PHASES`), the settings that lower its memory."""


class ReaderFailureError(RuntimeError):
    """Too many of a round's reader answers failed for the round to be trained on."""


class StepOutOfMemory(RuntimeError):
    """A phase of a training or validation step ran out of memory."""


@dataclass(frozen=True)
class ReaderFailures:
    """A round's failed questions (answer or judgement), its questions, and the first failure's error."""

    failed: int
    questions: int
    first_error: str | None

    @property
    def share(self) -> float:
        """``failed / questions`` (0 for a round without questions)."""
        return self.failed / self.questions if self.questions else 0.0

    @classmethod
    def of(cls, records: Sequence[RolloutRecord]) -> ReaderFailures:
        """Count the failures in a round's rollout records."""
        return cls.of_questions([q for r in records for q in [*r.questions, *r.turn_questions]])

    @classmethod
    def of_questions(cls, questions: Sequence[Mapping[str, Any]]) -> ReaderFailures:
        """Count the failures in question records (each with its ``error``, None when answered)."""
        errors = [q.get("error") for q in questions]
        first = next((error for error in errors if error is not None), None)
        failed = sum(error is not None for error in errors)
        return cls(failed=failed, questions=len(errors), first_error=first)

    def summed(self, ranks) -> ReaderFailures:
        """The counts summed over the ranks of a data-parallel run (:class:`~memalpha.grpo.update.Ranks`;
        a collective), this rank's first error kept."""
        world = ranks.world_size
        return ReaderFailures(
            failed=round(ranks.mean_over_ranks(float(self.failed)) * world),
            questions=round(ranks.mean_over_ranks(float(self.questions)) * world),
            first_error=self.first_error,
        )


def over_the_limit(failures: ReaderFailures, max_share: float, where: str) -> str:
    """``<where>: F of Q reader answers failed (S%, over reader.max_failed_share=M)``."""
    return (
        f"{where}: {failures.failed} of {failures.questions} reader answers failed ({failures.share:.0%},"
        f" over reader.max_failed_share={max_share:g})"
    )


def validation_refusal(failures: ReaderFailures, max_share: float, where: str) -> str | None:
    """The one line that makes a validation invalid (its accuracy would count a reader outage as
    a bad memory), or None when few enough answers failed (``reader.max_failed_share``)."""
    if failures.share <= max_share:
        return None
    return (
        f"{over_the_limit(failures, max_share, where)}: the scores are not valid and the report says so;"
        f" first error: {failures.first_error}"
    )


@dataclass
class ReaderGate:
    """Whether a round's reader answers may be trained on: over ``reader.max_failed_share`` failed,
    the run stops (``reader.on_failed_round: stop``: :class:`ReaderFailureError`, one line with the
    share, the limit and the first error) or the round is skipped and counted; at
    :data:`MAX_SKIPPED_ROUNDS_IN_A_ROW` skipped in a row the run stops. ``skipped_in_a_row`` is part
    of a run's state (checkpointed), so a resumed run keeps counting."""

    settings: ReaderSettings
    skipped_in_a_row: int = 0

    def answered(self, failures: ReaderFailures, where: str) -> bool:
        """Whether the round (``where``: ``rollout round 3 (global step 7)``) may be trained on."""
        max_share = self.settings.max_failed_share
        if failures.share <= max_share:
            self.skipped_in_a_row = 0
            return True
        if self.settings.on_failed_round == "stop":
            raise ReaderFailureError(
                f"{over_the_limit(failures, max_share, where)}; first error: {failures.first_error}; the"
                " round was not trained on and the last checkpoint is as it was (reader.on_failed_round:"
                " skip drops such rounds instead)"
            )
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= MAX_SKIPPED_ROUNDS_IN_A_ROW:
            raise ReaderFailureError(
                f"{where}: {self.skipped_in_a_row} rounds in a row skipped for failed reader answers (the"
                f" run stops at {MAX_SKIPPED_ROUNDS_IN_A_ROW}); last error: {failures.first_error}; is the"
                " reader up?"
            )
        warnings.warn(
            f"memalpha: {where}: {failures.failed} of {failures.questions} reader answers failed; the"
            f" round is skipped ({self.skipped_in_a_row} in a row). First error: {failures.first_error}",
            stacklevel=2,
        )
        return False


def out_of_memory_line(phase: str, where: str, held: str) -> str:
    """The one line of a step that ran out of memory in ``phase``."""
    settings = LOWER_MEMORY_SETTINGS.get(phase, ())
    lower = f"; lower it with {', '.join(settings)}" if settings else ""
    return (
        f"out of memory in the {phase} phase of {where} ({held}){lower};"
        " the step was not trained on and the last checkpoint is as it was (resume with --ckpt_path)"
    )


@contextlib.contextmanager
def phase_out_of_memory(phase: Callable[[], str], where: str, device: Any) -> Iterator[None]:
    """Turn running out of memory inside the block into :class:`StepOutOfMemory`, naming the phase
    that ``phase()`` says was running and ``where`` the step."""
    try:
        yield
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        held = memory_held(device)
        raise StepOutOfMemory(out_of_memory_line(phase(), where, held)) from None
