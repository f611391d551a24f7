"""Demonstrations from recorded trajectories: a stronger agent's memorising turns, for a cold start.

A teacher's traces (memalpha's own validation records of a better policy, or the official
Mem-α-4B recorded responses, ``docs/cold_start.md``) hold each chunk turn's reply but not the
prompt it answered. :func:`replay_trajectory` rebuilds it: it walks the instance chunk by chunk
as a rollout does (the prompt from :func:`~memalpha.agent.rollout.turn_prompt` under the
training config's settings, from a memory seeded as the recorded one) and executes each
recorded reply with memalpha's parser and executor, so the next prompt shows the memory the
teacher had built. Only turns whose calls all succeeded become demonstrations; every other turn
is counted under a reason (no call, a failed or malformed call, a truncated reply, a reply over
the token budget) and still executes, so the memory stays the teacher's.

When the teacher wrote in another call format (``source_format``), its parsed calls are written
again in the training format; otherwise the reply is kept verbatim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from memalpha.agent.rollout import make_token_counter, turn_prompt
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.demo_files import Demonstration
from memalpha.data.schema import Instance
from memalpha.memory.store import Memory
from memalpha.tools.executor import execute_response
from memalpha.tools.formats import get_call_format

DROP_REASONS = ("no_call", "failed_call", "truncated", "over_budget")


@dataclass
class RecordedTurn:
    """One recorded chunk turn: which chunk, the reply as the teacher wrote it, whether it was cut."""

    chunk_index: int
    response: str
    truncated: bool = False


@dataclass
class DistillStats:
    """How many recorded turns became demonstrations, and why the others did not."""

    turns: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def add(self, other: DistillStats) -> None:
        self.turns += other.turns
        self.kept += other.kept
        self.dropped.update(other.dropped)

    def describe(self) -> str:
        reasons = ", ".join(
            f"{self.dropped[r]} {r.replace('_', ' ')}" for r in DROP_REASONS if self.dropped[r]
        )
        return f"kept {self.kept} of {self.turns} recorded turns" + (
            f" (dropped: {reasons})" if reasons else ""
        )


def replay_trajectory(
    instance: Instance,
    turns: Sequence[RecordedTurn],
    tokenizer,
    settings: RolloutSettings,
    *,
    memory_seed: int,
    source: str,
    source_format: str | None = None,
    metadata: dict | None = None,
) -> tuple[list[Demonstration], Memory, DistillStats]:
    """The demonstrations of one recorded rollout, the memory its replies build, and the counts.

    ``turns`` must name chunks of ``instance`` in increasing order (a recorded rollout may stop
    early). ``source_format`` is the call format the replies are written in (default: the
    training format ``settings.call_format``).
    """
    target = get_call_format(settings.call_format)
    written = get_call_format(source_format) if source_format else target
    count_tokens = make_token_counter(tokenizer)
    memory = Memory(token_counter=count_tokens, core_token_limit=settings.core_token_limit, seed=memory_seed)
    demos: list[Demonstration] = []
    stats = DistillStats()
    previous = -1
    for turn in turns:
        where = f"instance {instance.instance_id!r}, chunk {turn.chunk_index}"
        if not previous < turn.chunk_index < len(instance.chunks):
            raise ValueError(
                f"{where}: recorded turns must name the instance's chunks "
                f"(0-{len(instance.chunks) - 1}) in increasing order"
            )
        previous = turn.chunk_index
        messages, _ = turn_prompt(
            tokenizer, memory, instance.chunks[turn.chunk_index], target, settings, where=where
        )
        outcome = execute_response(memory, turn.response, written, settings.repair)
        stats.turns += 1
        if outcome.attempts == 0:
            stats.dropped["no_call"] += 1
            continue
        if outcome.successes < outcome.attempts:
            stats.dropped["failed_call"] += 1
            continue
        if turn.truncated:
            stats.dropped["truncated"] += 1
            continue
        response = (
            turn.response
            if written is target
            else target.render_calls([(call.name, call.arguments) for call in outcome.parsed.calls])
        )
        if count_tokens(response) + 1 > settings.max_new_tokens:
            stats.dropped["over_budget"] += 1
            continue
        stats.kept += 1
        demos.append(
            Demonstration(
                messages=messages,
                response=response,
                metadata={
                    **(metadata or {}),
                    "source": source,
                    "instance_id": instance.instance_id,
                    "data_source": instance.data_source,
                    "chunk_index": turn.chunk_index,
                    "call_format": target.name,
                },
            )
        )
    return demos, memory, stats
