"""The trained agent in use: it memorises instances and the reader answers from its memories,
with no reward and nothing kept for an update.

:func:`read_instances` is the one loop behind ``memalpha predict`` (one call per batch of
instances) and the Python API (:mod:`memalpha.inference.memory_agent`: a chunk, a text, an
instance): the rollout's own :func:`~memalpha.agent.rollout.memorise_chunks` (fresh prompts, the
tools executed on the memory) and :func:`~memalpha.agent.rollout.answer_questions`, one greedy
rollout per instance. A turn keeps only its log entry (the response and every call with its
result), never its token ids, so what a long input costs in memory is its turns' text.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.agent.fact_recall import memory_fact_recall
from memalpha.agent.progress import Phase, PhaseHook, report
from memalpha.agent.rollout import (
    Agent,
    Rollout,
    answer_questions,
    first_memory,
    make_token_counter,
    memorise_chunks,
    store_baseline,
)
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import Instance
from memalpha.memory.store import Memory
from memalpha.seeding import stable_seed


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


def start_memory(instance: Instance, tokenizer, settings: RolloutSettings, seed: int) -> Memory:
    """The memory an instance starts from, as a validation rollout of it
    (:func:`~memalpha.agent.rollout.first_memory`)."""
    ids = stable_seed(seed, instance.instance_id, 0)
    return first_memory(instance, make_token_counter(tokenizer), settings, ids)


def read_instances(
    agent: Agent,
    instances: Sequence[Instance],
    *,
    seed: int,
    memories: Sequence[Memory | None] | None = None,
    greedy: bool = True,
    on_phase: PhaseHook | None = None,
) -> list[Reading]:
    """One rollout of ``agent`` per instance, together: memorise its chunks, then answer its questions.

    Instance ``i`` starts from a copy of ``memories[i]`` (the caller's memory is left as it was),
    or, where that is None, from :func:`start_memory`. ``greedy`` decodes without sampling (as
    validation does) with the agent's sampler (its policy here, or a vLLM server). Questions are
    answered by the agent's reader (one batch for all instances) and scored with its reward settings'
    metrics; instances without questions need no reader. ``on_phase`` hears ``sampling`` at each chunk
    index and ``reader`` before the answers. A baseline (the agent's ``rollout.baseline``) stores the
    chunks as it says instead (:mod:`memalpha.agent.baselines`; no turn is taken).
    """
    tokenizer, settings, weights, reader = agent.tokenizer, agent.rollout, agent.reward, agent.reader
    baseline = settings.baseline
    starts = list(memories) if memories is not None else [None] * len(instances)
    if len(starts) != len(instances):
        raise ValueError(f"{len(starts)} memories for {len(instances)} instances")
    rollouts = [
        Rollout(
            rollout_id=i, group_id=i, index=0, instance=instance,
            memory=start_memory(instance, tokenizer, settings, seed) if m is None else copy.deepcopy(m),
        )
        for i, (instance, m) in enumerate(zip(instances, starts))
    ]  # fmt: skip
    if baseline.kind is None:
        memorise_chunks(
            rollouts, agent.sampler, tokenizer, settings, seed=seed, do_sample=not greedy,
            share_prefix=agent.share_prefix, on_phase=on_phase, keep_samples=False,
        )
    else:
        store_baseline(rollouts, baseline, reader, tokenizer)
    asked = [r for r in rollouts if r.instance.questions]
    answers: dict[int, Any] = {}
    if asked:
        if reader is None:
            raise ValueError("these instances have questions: give a reader to answer them")
        report(on_phase, Phase("reader", total=sum(len(r.instance.questions) for r in asked)))
        answered = answer_questions(
            asked, reader, metric_overrides=weights.metric_overrides, style=weights.answer_style,
            top_k=baseline.answer_top_k,
        )
        answers = {r.rollout_id: a for r, a in zip(asked, answered)}
    readings = []
    for rollout in rollouts:
        result = answers.get(rollout.rollout_id)
        questions = [] if result is None else [
            {**q, "score": None if q["error"] is not None else q["score"]} for q in result.questions
        ]
        readings.append(
            Reading(
                instance_id=rollout.instance.instance_id,
                data_source=rollout.instance.data_source,
                chunks=len(rollout.instance.chunks),
                memory=rollout.memory,
                turns=rollout.turns,
                questions=questions,
                reader_failures=0 if result is None else result.failures,
                fact_recall=memory_fact_recall(rollout.instance.metadata, rollout.memory),
            )
        )
    return readings
