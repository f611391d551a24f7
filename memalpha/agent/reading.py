"""The trained agent in use: it memorises instances and the reader answers from its memories,
with no reward and nothing kept for an update.

:func:`read_instances` is the one loop behind ``memalpha predict`` (one call per batch of
instances) and the Python API (:mod:`memalpha.inference.memory_agent`: a chunk, a text, an
instance): one greedy rollout per instance through
:meth:`~memalpha.agent.rollout.Agent.memorise_and_answer`, the reading that validation's and
training's rollouts take too (fresh prompts, the tools executed on the memory, the reader's
answers). A turn keeps only its log entry (the response and every call with its result), never its
token ids, so what a long input costs in memory is its turns' text.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.agent.fact_recall import memory_fact_recall
from memalpha.agent.progress import PhaseHook, show_nothing
from memalpha.agent.rollout import Agent, make_token_counter, start_rollouts
from memalpha.data.schema import Instance
from memalpha.memory.store import Memory


@dataclass
class Reading:
    """What the agent made of one instance.

    ``chunks`` counts the instance's chunks; ``turns`` holds one entry per chunk
    (:func:`~memalpha.agent.rollout.turn_log`: the response and each call with its arguments,
    status and reason; none for a baseline, which takes no turn); ``questions`` one per question of the
    instance (question, the reader's ``instruction``, ``gold``, ``prediction``, ``score`` and
    ``error``; a failed answer has its ``error`` and no score). ``fact_recall`` is the share of the
    instance's gold facts the memory holds (None when it knows none).
    """

    instance_id: str
    data_source: str
    chunks: int
    memory: Memory
    turns: list[dict[str, Any]]
    questions: list[dict[str, Any]]
    reader_failures: int
    fact_recall: float | None

    @property
    def accuracy(self) -> float | None:
        """The mean score of the questions; None without questions or when an answer failed (a
        fault is never a score)."""
        if not self.questions or self.reader_failures:
            return None
        return sum(q["score"] for q in self.questions) / len(self.questions)

    def record(self) -> dict[str, Any]:
        """The reading as plain JSON values (the memory as :meth:`~memalpha.memory.store.Memory.to_dict`
        writes it, the format of a memory file)."""
        return {
            "instance_id": self.instance_id,
            "data_source": self.data_source,
            "chunks": self.chunks,
            "memory": self.memory.to_dict(),
            "memory_tokens": self.memory.total_tokens(),
            "turns": self.turns,
            "questions": self.questions,
            "accuracy": self.accuracy,
            "reader_failures": self.reader_failures,
            "fact_recall": self.fact_recall,
        }


def read_instances(
    agent: Agent,
    instances: Sequence[Instance],
    *,
    seed: int,
    memories: Sequence[Memory | None] | None = None,
    greedy: bool = True,
    on_phase: PhaseHook = show_nothing,
) -> list[Reading]:
    """One rollout of ``agent`` per instance, together: memorise its chunks, then answer its questions.

    Instance ``i`` starts from a copy of ``memories[i]`` (the caller's memory is left as it was),
    or, where that is None, from the memory a validation rollout of it starts from
    (:func:`~memalpha.agent.rollout.start_rollouts`). ``greedy`` decodes without sampling (as
    validation does) with the agent's sampler (its policy here, or a vLLM server). Questions are
    answered by the agent's reader (one batch for all instances) and scored with its reward settings'
    metrics; instances without questions need no reader. ``on_phase`` hears ``sampling`` at each chunk
    index and ``reader`` before the answers. A baseline (the agent's ``rollout.baseline``) stores the
    chunks as it says instead (:mod:`memalpha.agent.baselines`; no turn is taken).
    """
    starts = list(memories) if memories is not None else [None] * len(instances)
    if len(starts) != len(instances):
        raise ValueError(f"{len(starts)} memories for {len(instances)} instances")
    rollouts = start_rollouts(instances, 1, agent.rollout, make_token_counter(agent.tokenizer), seed)
    for rollout, memory in zip(rollouts, starts):
        if memory is not None:
            rollout.memory = copy.deepcopy(memory)
    answers = agent.memorise_and_answer(
        rollouts, seed=seed, do_sample=not greedy, on_phase=on_phase, keep_samples=False
    ).answers
    readings = []
    for rollout, result in zip(rollouts, answers):
        questions = [{**q, "score": None if q["error"] is not None else q["score"]} for q in result.questions]
        readings.append(
            Reading(
                instance_id=rollout.instance.instance_id,
                data_source=rollout.instance.data_source,
                chunks=len(rollout.instance.chunks),
                memory=rollout.memory,
                turns=rollout.turns,
                questions=questions,
                reader_failures=result.failures,
                fact_recall=memory_fact_recall(rollout.instance.metadata, rollout.memory),
            )
        )
    return readings
