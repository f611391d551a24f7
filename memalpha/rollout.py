"""The memory agent loop: n rollouts per instance, chunk by chunk, batched across rollouts.

For chunk index i, every live rollout (instances with fewer chunks have dropped out)
gets a *fresh* prompt: system prompt with its own rendered memory and the call
format's tool block, plus the chunk (SPEC §2). One batched ``generate`` serves them
all; each response is parsed and executed on its own rollout's memory. Then the reader
answers every question of every rollout from its final memory in one batch, and the
rewards of SPEC §4 are computed per turn.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memalpha.data import Instance
from memalpha.memory import Memory
from memalpha.metrics import score_answers
from memalpha.policy import generate
from memalpha.prompts import memorise_messages
from memalpha.reader import Reader
from memalpha.rewards import RewardWeights, TurnCalls, rollout_rewards
from memalpha.tools import CallFormat, execute_call, get_call_format


class RolloutError(ValueError):
    """An instance cannot be rolled out as configured (for example a chunk over the prompt budget)."""


@dataclass
class RolloutSettings:
    """How the memory agent generates.

    Args:
        group_size: Rollouts per instance (GRPO's group size ``n``; official 8).
        max_new_tokens: Response cap per chunk turn (official 2048).
        max_prompt_tokens: Prompt budget per turn; the visible memory shrinks (k halves) to fit (official ~6k).
        temperature: Sampling temperature (official 1.0); also used for the training log-probs.
        top_p: Nucleus sampling threshold (1.0 = off).
        top_k: Top-k sampling (0 = off).
        call_format: Tool-call format the agent writes: ``qwen`` (✿FUNCTION✿/✿ARGS✿, the official
            Mem-alpha-4B format) or ``hermes`` (``<tool_call>{...}</tool_call>``, Qwen2.5/3 native).
        memory_view_k: Most recent entries per list shown while memorising (official 5).
        core_token_limit: Core memory cap in tokens; longer text is cut with a marker (official 512).
        generation_batch_size: Max prompts per ``generate`` call (None = all live rollouts at once).
        chat_template_kwargs: Extra arguments for the chat template, e.g. ``{"enable_thinking": false}`` for Qwen3.
    """

    group_size: int = 8
    max_new_tokens: int = 2048
    max_prompt_tokens: int = 6144
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    call_format: str = "qwen"
    memory_view_k: int = 5
    core_token_limit: int = 512
    generation_batch_size: int | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnSample:
    """One chunk turn: a GRPO training sample."""

    group_id: int
    rollout_id: int
    chunk_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    truncated: bool
    num_calls: int
    num_successful_calls: int
    r2: float = 0.0
    r4: float = 0.0
    reward: float = 0.0


@dataclass
class RolloutRecord:
    """Everything one rollout did, for logging and validation tables."""

    instance_id: str
    data_source: str
    rollout_index: int
    turns: list[dict[str, Any]]
    memory: dict[str, Any]
    memory_tokens: int
    chunk_tokens: int
    questions: list[dict[str, Any]]
    r1: float = 0.0
    r3: float = 0.0
    reader_failures: int = 0


@dataclass
class RolloutOutput:
    samples: list[TurnSample]
    records: list[RolloutRecord]
    rollout_s: float
    reader_s: float
    generated_tokens: int


def make_token_counter(tokenizer) -> Callable[[str], int]:
    """Count tokens of a text the way the policy sees it (no special tokens)."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def rollout_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (independent of Python's hash randomisation)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def build_turn_prompt(
    tokenizer,
    memory: Memory,
    chunk: str,
    call_format: CallFormat,
    settings: RolloutSettings,
    where: str,
) -> list[int]:
    """Token ids of one turn's prompt; halves the visible memory until the budget holds."""
    k = settings.memory_view_k
    while True:
        messages = memorise_messages(
            memory.render_memorise(k), chunk, call_format, response_token_limit=settings.max_new_tokens
        )
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **settings.chat_template_kwargs
        )
        if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        if len(ids) <= settings.max_prompt_tokens:
            return list(ids)
        if k == 0:
            raise RolloutError(
                f"{where}: the prompt needs {len(ids)} tokens with no memory entries shown, over "
                f"max_prompt_tokens={settings.max_prompt_tokens}; raise the budget or use smaller chunks"
            )
        k //= 2


def run_rollouts(
    instances: Sequence[Instance],
    model,
    tokenizer,
    reader: Reader,
    settings: RolloutSettings,
    weights: RewardWeights,
    content_judge,
    *,
    seed: int,
    do_sample: bool = True,
    group_size: int | None = None,
    metric_overrides: dict[str, str] | None = None,
    judge_reader: Reader | None = None,
    share_prefix: bool = True,
) -> RolloutOutput:
    """Run ``group_size`` rollouts for every instance; return turn samples and per-rollout records.

    ``group_id`` of a sample is the instance's position in ``instances``. ``share_prefix`` lets
    each ``generate`` call compute the prompt tokens its rows share once (:mod:`memalpha.prefix_cache`).
    """
    n = settings.group_size if group_size is None else group_size
    call_format = get_call_format(settings.call_format)
    count_tokens = make_token_counter(tokenizer)
    start = time.perf_counter()

    rollouts = []  # (group_id, rollout_index, instance, memory)
    for group_id, instance in enumerate(instances):
        for index in range(n):
            memory = Memory(
                token_counter=count_tokens,
                core_token_limit=settings.core_token_limit,
                seed=rollout_seed(seed, instance.instance_id, index),
            )
            rollouts.append((group_id, index, instance, memory))
    turns: list[list[dict[str, Any]]] = [[] for _ in rollouts]
    turn_calls: list[list[TurnCalls]] = [[] for _ in rollouts]
    samples_of: list[list[TurnSample]] = [[] for _ in rollouts]
    generated_tokens = 0

    was_training = model.training
    model.eval()
    try:
        for chunk_index in range(max((len(inst.chunks) for inst in instances), default=0)):
            live = [i for i, (_, _, inst, _) in enumerate(rollouts) if chunk_index < len(inst.chunks)]
            prompts = [
                build_turn_prompt(
                    tokenizer,
                    rollouts[i][3],
                    rollouts[i][2].chunks[chunk_index],
                    call_format,
                    settings,
                    where=f"instance {rollouts[i][2].instance_id!r}, chunk {chunk_index}",
                )
                for i in live
            ]
            generation = generate(
                model,
                tokenizer,
                prompts,
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                do_sample=do_sample,
                seed=rollout_seed(seed, "chunk", chunk_index),
                batch_size=settings.generation_batch_size,
                share_prefix=share_prefix,
            )
            generated_tokens += generation.num_generated_tokens
            for j, i in enumerate(live):
                group_id, index, instance, memory = rollouts[i]
                response_ids = generation.response_ids[j]
                text = tokenizer.decode(response_ids, skip_special_tokens=True)
                parsed = call_format.parse(text)
                results = [execute_call(memory, call) for call in parsed.calls]
                calls = TurnCalls(results=results, parse_errors=list(parsed.errors))
                turn_calls[i].append(calls)
                successes = sum(r.status in ("ok", "skipped") for r in results)
                samples_of[i].append(
                    TurnSample(
                        group_id=group_id,
                        rollout_id=i,
                        chunk_index=chunk_index,
                        prompt_ids=generation.prompt_ids[j],
                        response_ids=response_ids,
                        truncated=generation.truncated[j],
                        num_calls=len(results) + len(parsed.errors),
                        num_successful_calls=successes,
                    )
                )
                turns[i].append(
                    {
                        "chunk_index": chunk_index,
                        "response": text,
                        "truncated": generation.truncated[j],
                        "results": [
                            {"tool": r.call.name if r.call else None, "status": r.status, "reason": r.reason}
                            for r in results
                        ]
                        + [{"tool": None, "status": "error", "reason": e.reason} for e in parsed.errors],
                    }
                )
    finally:
        model.train(was_training)
    rollout_s = time.perf_counter() - start

    start = time.perf_counter()
    items, owners = [], []
    for i, (_, _, instance, memory) in enumerate(rollouts):
        for q_index, qa in enumerate(instance.questions):
            items.append((memory, qa.question))
            owners.append((i, q_index))
    answers = reader.answer(items) if items else []
    # Score per data source in one call each, so LLM-judge sources send their judgements as one batch.
    by_source: dict[str, list[int]] = {}
    for k, (i, _) in enumerate(owners):
        by_source.setdefault(rollouts[i][2].data_source, []).append(k)
    item_scores = [0.0] * len(items)
    for source, ks in by_source.items():
        qas = [rollouts[owners[k][0]][2].questions[owners[k][1]] for k in ks]
        scored = score_answers(
            source,
            [answers[k].text for k in ks],
            [qa.answer for qa in qas],
            questions=[qa.question for qa in qas],
            judge=judge_reader or reader,
            overrides=metric_overrides,
            ok=[answers[k].ok for k in ks],
        )
        for k, value in zip(ks, scored):
            item_scores[k] = value
    scores: list[list[float]] = [[] for _ in rollouts]
    questions: list[list[dict[str, Any]]] = [[] for _ in rollouts]
    failures = [0] * len(rollouts)
    for (i, q_index), answer, score in zip(owners, answers, item_scores):
        qa = rollouts[i][2].questions[q_index]
        failures[i] += not answer.ok
        scores[i].append(score)
        questions[i].append(
            {
                "question": qa.question,
                "gold": qa.answer,
                "prediction": answer.text,
                "score": score,
                "error": answer.error,
            }
        )
    reader_s = time.perf_counter() - start

    chunk_tokens_of: dict[str, int] = {}
    records: list[RolloutRecord] = []
    samples: list[TurnSample] = []
    for i, (_, index, instance, memory) in enumerate(rollouts):
        if instance.instance_id not in chunk_tokens_of:
            chunk_tokens_of[instance.instance_id] = sum(count_tokens(c) for c in instance.chunks)
        chunk_tokens = chunk_tokens_of[instance.instance_id]
        memory_tokens = memory.total_tokens()
        reward = rollout_rewards(
            scores[i], turn_calls[i], memory_tokens, chunk_tokens, weights, content_judge
        )
        for t, sample in enumerate(samples_of[i]):
            sample.r2, sample.r4, sample.reward = reward.r2[t], reward.r4[t], reward.total[t]
            turns[i][t].update(r2=reward.r2[t], r4=reward.r4[t], reward=reward.total[t])
        samples.extend(samples_of[i])
        records.append(
            RolloutRecord(
                instance_id=instance.instance_id,
                data_source=instance.data_source,
                rollout_index=index,
                turns=turns[i],
                memory=memory.to_dict(),
                memory_tokens=memory_tokens,
                chunk_tokens=chunk_tokens,
                questions=questions[i],
                r1=reward.r1,
                r3=reward.r3,
                reader_failures=failures[i],
            )
        )
    return RolloutOutput(
        samples=samples,
        records=records,
        rollout_s=rollout_s,
        reader_s=reader_s,
        generated_tokens=generated_tokens,
    )
