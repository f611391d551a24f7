"""Scripted policies: fixed tool-call replies standing in for the policy's generation, to audit the reward.

A scripted policy decides, per chunk turn, which calls to write; :class:`ScriptedSampler` turns
that into the ``Generation`` the rollout expects from a model (the ``sampler`` argument of
:meth:`memalpha.agent.rollout.Agent.rollouts`), so the real prompts, parsing, execution, reader and
reward run on the scripted text. Four policies bracket what a reward should order
(``experiments/studies/scripted_policies.py``, ``tests/test_scripted_policies.py``):

``content_free``  deletes the (empty) core memory every turn: no memory at all;
``generic``       inserts one fixed sentence that says nothing of the chunk, every turn;
``copy``          inserts the whole chunk, wrapper included, into the episodic list;
``oracle``        inserts each fact the chunk tells (``metadata["notes"]`` of the synthetic
                  tasks), worded as the oracle demonstrations word them (:mod:`memalpha.agent.oracle_demos`).

Read them with :class:`~memalpha.reader.extractive.ExtractiveReader` (``reader.kind: extractive``),
which answers every question with the memory retrieved for it, so a question scores when its
gold answer is in the retrieved memory: a reader without a model, the most any reader could
find there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from memalpha.agent.oracle_demos import note_contents
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, RolloutOutput
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import Instance
from memalpha.lm.sampling.generation import Generation
from memalpha.memory.store import CORE, EPISODIC, SEMANTIC
from memalpha.reader.base import Reader
from memalpha.seeding import stable_seed
from memalpha.tools.formats import CallFormat, get_call_format
from memalpha.tools.schemas import DELETE, INSERT

Calls = list[tuple[str, dict[str, Any]]]
ScriptedPolicy = Callable[[Instance, int, random.Random], Calls]
"""``(instance, chunk index, seeded rng) -> the turn's calls`` as ``(tool, arguments)`` pairs."""

GENERIC_TEXT = "The user shared some new information with me today."


def content_free(instance: Instance, chunk_index: int, rng: random.Random) -> Calls:
    """Delete the core memory, which stays empty: a call that changes nothing."""
    return [(DELETE, {"memory_type": CORE})]


def generic(instance: Instance, chunk_index: int, rng: random.Random) -> Calls:
    """Insert :data:`GENERIC_TEXT`, whatever the chunk says (from the second turn on a repeat)."""
    return [(INSERT, {"memory_type": SEMANTIC, "content": GENERIC_TEXT})]


def copy_chunk(instance: Instance, chunk_index: int, rng: random.Random) -> Calls:
    """Insert the whole chunk, as it was shown, into the episodic list."""
    return [(INSERT, {"memory_type": EPISODIC, "content": instance.chunks[chunk_index]})]


def oracle(instance: Instance, chunk_index: int, rng: random.Random) -> Calls:
    """Insert each fact of the chunk into its list (an event with its date), one call per fact."""
    notes = instance.metadata.get("notes")
    if not isinstance(notes, list) or len(notes) != len(instance.chunks):
        raise ValueError(f"instance {instance.instance_id!r} has no notes per chunk: no oracle policy")
    return [
        (INSERT, {"memory_type": kind, "content": text})
        for kind, text in note_contents(notes[chunk_index], rng)
    ]


POLICIES: dict[str, ScriptedPolicy] = {
    "content_free": content_free,
    "generic": generic,
    "copy": copy_chunk,
    "oracle": oracle,
}


class ScriptedSampler:
    """A generate function (``Agent(sampler=...)``) that answers each prompt with ``policy``'s calls.

    Each prompt is matched to its instance and chunk by finding the chunk's text in the decoded
    prompt: every memorising prompt holds its chunk verbatim, after the memory view (which may hold
    earlier chunks, copied), so the chunk that ends last is the one being read; the reply is the calls
    rendered in ``call_format``, tokenised, plus the end token. The rng of a turn is seeded by ``seed``, the
    instance and the chunk, so a rollout's text does not depend on the batch it is in.
    """

    def __init__(
        self,
        policy: ScriptedPolicy,
        instances: Sequence[Instance],
        tokenizer,
        call_format: CallFormat,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.call_format = call_format
        self.seed = seed
        self._chunks = [
            (chunk, instance, index) for instance in instances for index, chunk in enumerate(instance.chunks)
        ]

    def locate(self, prompt_text: str) -> tuple[Instance, int]:
        """The instance and chunk index of the chunk that ends last in ``prompt_text`` (the longer
        of two that end at the same place)."""
        found = [
            (prompt_text.rfind(chunk) + len(chunk), len(chunk), instance, index)
            for chunk, instance, index in self._chunks
            if chunk in prompt_text
        ]
        if not found:
            raise ValueError(f"no scripted instance's chunk is in the prompt {prompt_text[-200:]!r}")
        _end, _length, instance, index = max(found, key=lambda item: item[:2])
        return instance, index

    def reply(self, instance: Instance, chunk_index: int) -> str:
        """The policy's calls for one turn, rendered as the agent would write them."""
        rng = random.Random(stable_seed(self.seed, "scripted", instance.instance_id, chunk_index))
        return self.call_format.render_calls(self.policy(instance, chunk_index, rng))

    def __call__(self, prompts: Sequence[Sequence[int]], **_sampling: Any) -> Generation:
        responses = []
        for prompt in prompts:
            text = self.reply(*self.locate(self.tokenizer.decode(prompt)))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            responses.append(ids + [self.tokenizer.eos_token_id])
        return Generation(
            prompt_ids=[list(p) for p in prompts], response_ids=responses, truncated=[False] * len(prompts)
        )


class _NoModel:
    """What the rollout asks of a model when a sampler generates: a train/eval switch."""

    training = False

    def eval(self) -> _NoModel:
        return self

    def train(self, mode: bool = True) -> _NoModel:
        return self


def run_scripted(
    policy: str | ScriptedPolicy,
    instances: Sequence[Instance],
    tokenizer,
    reader: Reader,
    settings: RolloutSettings,
    weights: RewardSettings,
    *,
    seed: int = 0,
) -> RolloutOutput:
    """One rollout per instance with ``policy`` (a name of :data:`POLICIES` or a function) writing
    every turn, through the real rollout: prompts, parsing, execution, ``reader`` and the reward
    of ``weights`` with its own content judge."""
    chosen = POLICIES[policy] if isinstance(policy, str) else policy
    sampler = ScriptedSampler(chosen, instances, tokenizer, get_call_format(settings.call_format), seed)
    agent = Agent(_NoModel(), tokenizer, reader, settings, weights, weights.build_content_judge(reader),
                  sampler=sampler)
    return agent.rollouts(instances, seed=seed, do_sample=False, group_size=1)


def reward_terms(out: RolloutOutput) -> dict[str, float | None]:
    """Means of one round: r1, r3 and fact recall over rollouts, r2, r4 and R over turns
    (fact recall None when no instance knows its facts)."""
    records, samples = out.records, out.samples
    recalls = [r.fact_recall for r in records if r.fact_recall is not None]
    return {
        "r1": sum(r.r1 for r in records) / len(records),
        "r2": sum(s.r2 for s in samples) / len(samples),
        "r3": sum(r.r3 for r in records) / len(records),
        "r4": sum(s.r4 for s in samples) / len(samples),
        "R": sum(s.reward for s in samples) / len(samples),
        "fact_recall": sum(recalls) / len(recalls) if recalls else None,
    }
