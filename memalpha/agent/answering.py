"""The answer agent's rollouts: the policy answers each question of a memory an agent wrote, several
times, and each answer is rewarded by how close it is to the gold (docs/answer_agent.md).

With ``model.rollout.trains: answer`` the policy being trained is the answer agent and ``memalpha
fit`` reads memories, not chunks (the ``memories`` layout, :mod:`memalpha.data.memory_records`: what
``memalpha predict`` wrote with the frozen memory agent, as Memory-R1 trains its answerer in a stage
of its own). :meth:`AnswerAgent.rollouts` returns what the memory agent's rollouts return, so the same
GRPO step and loss train it:

* each question is shown as the reader shows it (its own retrieval, instruction and prompt budget,
  :meth:`~memalpha.reader.base.Reader.answer_conversations`, in the chat template the local reader
  uses), and ``rollout.group_size`` answers are sampled from that one prompt, at most
  ``reader.max_new_tokens`` tokens each: one group per question;
* an answer's reward is ``reward.answer_reward``: ``token_f1``, LoCoMo's token F1 against the best
  gold (LoCoMo's own score per category for LoCoMo questions), a continuous score that pays a short,
  right answer most; or ``metric``, the source's own metric, as validation scores it;
* rollout ``g`` of an instance is its questions' ``g``-th answers (one record, its ``r1`` their mean
  reward, no turns and no tool calls); each record's question carries the source metric's ``score``,
  so a validation reports the accuracy the reader would get.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memalpha.agent.answer_metrics import score_answers
from memalpha.agent.locomo_metrics import locomo_f1, token_f1
from memalpha.agent.progress import Phase, PhaseHook, show_nothing
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import GenerateFn, RolloutOutput, RolloutRecord, TurnSample, make_token_counter
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.locomo import DATA_SOURCE as LOCOMO
from memalpha.data.memory_records import MEMORY
from memalpha.data.schema import DataValidationError, Instance
from memalpha.grpo.credit import BROADCAST, CreditScheme
from memalpha.lm.sampling.generation import sampler_for
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader
from memalpha.reader.local import chat_prompt_text
from memalpha.seeding import stable_seed


def answer_reward(prediction: str, gold: Any, metadata: dict[str, Any], source: str) -> float:
    """``token_f1``'s reward of one answer: LoCoMo's token F1 against the best of the golds (LoCoMo's
    own score, category by category, for a LoCoMo question)."""
    golds = [gold] if isinstance(gold, str) else list(gold)
    if source == LOCOMO and "category" in metadata:
        return max(locomo_f1(prediction, g, metadata) for g in golds)
    return max(token_f1(prediction, g) for g in golds)


@dataclass
class AnswerAgent:
    """The answer agent a round rolls out: the policy (its active adapter is the answer agent), its
    tokenizer, ``prompts`` (the run's reader, whose prompts and question instructions it answers
    with), how it samples (``rollout``: group size, temperature; ``max_new_tokens``: the reader's
    answer cap) and how answers are scored (``reward``)."""

    policy: Any
    tokenizer: Any
    prompts: Reader
    rollout: RolloutSettings
    reward: RewardSettings
    max_new_tokens: int
    sampler: GenerateFn | None = None

    def __post_init__(self) -> None:
        if self.sampler is None:
            self.sampler = sampler_for(self.policy, self.tokenizer, self.rollout.backend)

    def rollouts(
        self,
        instances: Sequence[Instance],
        *,
        seed: int,
        do_sample: bool = True,
        group_size: int | None = None,
        on_phase: PhaseHook = show_nothing,
        credit: CreditScheme = BROADCAST,
    ) -> RolloutOutput:
        """``group_size`` answers (default ``rollout.group_size``; validation takes one, greedy) to
        every question of every instance, rewarded; one group per question. ``credit`` must be
        broadcast: an answer is one turn."""
        if credit.asks_after_turns or credit.needs_evidence:
            raise ValueError(f"update.credit {credit.name} pays turns of a memory; an answer is one turn")
        size = self.rollout.group_size if group_size is None else group_size
        count = make_token_counter(self.tokenizer)
        asked: list[tuple[int, int, Memory]] = []  # (instance, question, memory) per group
        memories = []
        for i, instance in enumerate(instances):
            if MEMORY not in instance.metadata:
                raise DataValidationError(
                    "the round's data", "no memory to answer from: rollout.trains: answer reads the "
                    "memories layout (memalpha predict outputs)", instance_id=instance.instance_id,
                    field="metadata.memory",
                )
            memory = Memory.from_dict(dict(instance.metadata[MEMORY]), token_counter=count)
            memories.append(memory)
            asked.extend((i, j, memory) for j in range(len(instance.questions)))
        sources = [instances[i].data_source for i, _, _ in asked]
        conversations = self.prompts.answer_conversations(
            [(memory, instances[i].questions[j].question) for i, j, memory in asked], sources
        )
        prompt_ids = [
            self.tokenizer(chat_prompt_text(self.tokenizer, c), add_special_tokens=False)["input_ids"]
            for c in conversations
        ]
        on_phase(Phase("sampling", 1, 1))
        start, cpu = time.perf_counter(), time.process_time()
        generation = self.sampler(
            [ids for ids in prompt_ids for _ in range(size)],
            max_new_tokens=self.max_new_tokens,
            temperature=self.rollout.temperature,
            top_p=self.rollout.top_p,
            top_k=self.rollout.top_k,
            do_sample=do_sample,
            seed=stable_seed(seed, "answers"),
            batch_size=self.rollout.generation_batch_size,
            share_prefix=True,
        )
        rollout_s, rollout_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        on_phase(Phase("rewards"))
        decode = self.tokenizer.decode
        texts = [decode(r, skip_special_tokens=True).strip() for r in generation.response_ids]
        scores = self._metric_scores(asked, instances, texts, size)
        records: list[RolloutRecord] = []
        record_of: dict[tuple[int, int], int] = {}
        for i, instance in enumerate(instances):
            for g in range(size):
                record_of[(i, g)] = len(records)
                memory = memories[i]
                records.append(RolloutRecord(
                    instance_id=instance.instance_id, data_source=instance.data_source, rollout_index=g,
                    turns=[], memory=memory.to_dict(), memory_tokens=memory.total_tokens(), chunk_tokens=0,
                    questions=[],
                ))
        samples: list[TurnSample] = []
        for q, (i, j, _) in enumerate(asked):
            qa = instances[i].questions[j]
            instruction = self.prompts.instruction_for(instances[i].data_source)
            for g in range(size):
                n = q * size + g
                reward = scores[n] if self.reward.answer_reward == "metric" else answer_reward(
                    texts[n], qa.answer, qa.metadata, instances[i].data_source
                )
                record = records[record_of[(i, g)]]
                record.questions.append({
                    "question": qa.question, "instruction": instruction, "gold": qa.answer,
                    "prediction": texts[n], "score": scores[n], "error": None, "answer_reward": reward,
                    **({"metadata": qa.metadata} if qa.metadata else {}),
                })
                samples.append(TurnSample(
                    group_id=q, rollout_id=record_of[(i, g)], chunk_index=j,
                    prompt_ids=generation.prompt_ids[n], response_ids=list(generation.response_ids[n]),
                    truncated=generation.truncated[n], num_calls=0, num_successful_calls=0, reward=reward,
                ))
        for record in records:
            rewards = [q["answer_reward"] for q in record.questions]
            record.r1 = sum(rewards) / len(rewards) if rewards else 0.0
        return RolloutOutput(
            samples=samples, records=records, rollout_s=rollout_s, reader_s=0.0,
            generated_tokens=generation.num_generated_tokens, rollout_cpu_s=rollout_cpu_s,
        )

    def _metric_scores(
        self, asked: Sequence[tuple[int, int, Memory]], instances: Sequence[Instance], texts: list[str],
        size: int,
    ) -> list[float]:
        """Every answer's score under its source's metric (``reward.metric_overrides`` first, compared in
        ``reward.metric_style``), as validation scores the reader's: one call per source."""
        out = [0.0] * len(texts)
        by_source: dict[str, list[int]] = {}
        for q, (i, _, _) in enumerate(asked):
            by_source.setdefault(instances[i].data_source, []).extend(range(q * size, (q + 1) * size))
        for source, ns in by_source.items():
            qas = [instances[asked[n // size][0]].questions[asked[n // size][1]] for n in ns]
            scored, _ = score_answers(
                source, [texts[n] for n in ns], [qa.answer for qa in qas],
                questions=[qa.question for qa in qas], judge=self.prompts,
                overrides=self.reward.metric_overrides, style=self.reward.answer_style,
                metadata=[qa.metadata for qa in qas],
            )
            for n, value in zip(ns, scored):
                out[n] = value
        return out
