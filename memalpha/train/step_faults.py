"""Faults of a training step that must stop it rather than become a reward: a reader that failed too
many of a round's answers (:class:`ReaderFailures` counts them, :class:`ReaderFailureError` stops the
run; the round's gate is :class:`memalpha.train.step.ReaderGate`: a reader that is down would score
every answer 0, and GRPO would train on that), and running out of memory in any phase
(:class:`StepOutOfMemory`: one line naming the phase, the memory held and the settings that lower that
phase's memory).
Both are raised before the step's optimiser update, so the last checkpoint is the one the run
wrote before (docs/metrics_and_rewards.md, "Faults").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.agent.rollout import RolloutRecord
from memalpha.lm.core.out_of_memory import is_out_of_memory, memory_held

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
