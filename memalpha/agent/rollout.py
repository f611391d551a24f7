"""The memory agent loop: n rollouts per instance, chunk by chunk, batched across rollouts.

:meth:`Agent.rollouts` reads in three phases, each a function of its own:

1. :func:`memorise_chunks`: for chunk index ``i`` every live rollout gets a *fresh* prompt
   (system prompt with the call format's tool block and its own rendered memory, plus the
   chunk; ``docs/method.md``); one batched ``generate`` serves them all, and each response is
   parsed and executed on its own rollout's memory.
2. :func:`answer_questions`: the reader answers every question of every rollout from its final
   memory in one batch, and the answers are scored per data source.
3. :func:`assign_rewards`: the reward ``R_t`` of ``docs/metrics_and_rewards.md`` for every turn.

Each phase, and each chunk index of the first, is reported as it starts to an optional
:data:`~memalpha.agent.progress.PhaseHook` (what the progress bar shows).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memalpha.agent.answer_metrics import MEMALPHA_ANSWERS, AnswerStyle, score_answers
from memalpha.agent.baselines import BaselineSettings, cut_full_text, stored_memory
from memalpha.agent.content_judges import ContentJudge
from memalpha.agent.fact_recall import memory_fact_recall, questions_stored
from memalpha.agent.memorise_prompts import chat_prompt_ids, memorise_messages, render_memorise
from memalpha.agent.progress import Phase, PhaseHook, show_nothing
from memalpha.agent.reward_math import TurnCalls, per_chunk_totals, rollout_rewards
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.memory_records import MEMORY
from memalpha.data.schema import DataValidationError, Instance, question_evidence
from memalpha.grpo.credit import BROADCAST, CreditScheme
from memalpha.lm.sampling.generation import Generation, sampler_for
from memalpha.lm.sampling.vllm_engine import SampledGeneration
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader
from memalpha.seeding import stable_seed
from memalpha.tools.executor import SUCCESS_STATUSES, ToolResult, execute_call
from memalpha.tools.formats import CallFormat, ParseError

GenerateFn = Callable[..., Generation]
"""Generates like :func:`memalpha.lm.sampling.generation.generate` without its model and tokenizer
arguments (the ``vllm`` engine's bound :meth:`~memalpha.lm.sampling.vllm_engine.VllmEngine.generate`)."""


class RolloutError(ValueError):
    """An instance cannot be rolled out as configured (for example a chunk over the prompt budget)."""


@dataclass
class TurnSample:
    """One chunk turn: a GRPO training sample.

    ``response_ids`` are the *trained* tokens: the sampled response up to the first token that
    reaches into its call format's result marker (:meth:`~memalpha.tools.formats.CallFormat.trained_length`;
    all of it, end token included, when it has none). The tokens after that are cut from the
    sample rather than masked, which trains exactly what a mask would (docs/metrics_and_rewards.md,
    "Trained tokens"). ``truncated`` and the turn's calls describe the whole response.
    With a generation server (``rollout.backend: vllm``) ``sampler_logprobs`` holds the server's
    log-prob of every trained token and ``adapter_version`` the adapter version it sampled with.
    ``reward`` is ``R_t`` with the final accuracy broadcast; ``turn_reward``, when the turns were
    scored one by one (``update.credit: per_chunk`` or ``hindsight``), is ``R_t`` with the accuracy
    credited to this turn instead (docs/metrics_and_rewards.md, "Credit").
    """

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
    turn_reward: float | None = None
    adapter_version: int | None = None
    sampler_logprobs: list[float] | None = None


@dataclass
class RolloutRecord:
    """Everything one rollout did, for logging and validation tables. ``fact_recall`` is the share
    of the instance's gold facts in the final memory (:mod:`memalpha.agent.fact_recall`), None
    for an instance that knows none. ``turn_questions`` holds the answers the reader gave from the
    memory after each earlier turn (``update.credit: per_chunk``; each with its ``chunk_index``),
    and ``reader_failures`` counts the failed ones too."""

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
    fact_recall: float | None = None
    turn_questions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RolloutOutput:
    """One round: its turn samples, one record per rollout, timings (wall seconds, and the process's CPU
    seconds of the policy's turns and of the reader, which a busy machine does not inflate;
    ``rewards_s``: assigning the rewards, content judgements included), and ``reader_failed_calls``,
    the requests to the reader
    (and to a separate judge reader) that failed during the round: answers, answer judgements and
    content judgements alike."""

    samples: list[TurnSample]
    records: list[RolloutRecord]
    rollout_s: float
    reader_s: float
    generated_tokens: int
    reader_failed_calls: int = 0
    rewards_s: float = 0.0
    rollout_cpu_s: float = 0.0
    reader_cpu_s: float = 0.0


def make_token_counter(tokenizer) -> Callable[[str], int]:
    """Count tokens of a text the way the policy sees it (no special tokens)."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def turn_prompt(
    tokenizer,
    memory: Memory,
    chunk: str,
    call_format: CallFormat,
    settings: RolloutSettings,
    where: str,
) -> tuple[list[dict[str, str]], list[int]]:
    """One memorising turn's chat messages and their templated token ids (generation prompt added).

    The visible memory shrinks (``k`` halves, down to 0) until the ids fit ``settings.max_prompt_tokens``.
    """
    k = settings.memory_view_k
    while True:
        view = render_memorise(memory, k, settings.templates)
        messages = memorise_messages(
            view, chunk, call_format, response_token_limit=settings.stated_limit,
            detail=settings.prompt_profile, templates=settings.templates,
        )
        ids = chat_prompt_ids(tokenizer, messages, settings.chat_template_kwargs)
        if len(ids) <= settings.max_prompt_tokens:
            return messages, ids
        if k == 0:
            raise RolloutError(
                f"{where}: the prompt needs {len(ids)} tokens with no memory entries shown, over "
                f"rollout.max_prompt_tokens={settings.max_prompt_tokens}; raise it or cut smaller chunks"
            )
        k //= 2


@dataclass
class Rollout:
    """One rollout of one instance while it runs: its memory, and what each chunk turn did
    (``snapshots``: the memory after each turn but the last, kept when the reader answers after
    every turn)."""

    rollout_id: int
    group_id: int
    index: int
    instance: Instance
    memory: Memory
    samples: list[TurnSample] = field(default_factory=list)
    calls: list[TurnCalls] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[Memory] = field(default_factory=list)


@dataclass
class RolloutAnswers:
    """The reader's scored answers to one rollout's questions; ``failures`` counts the questions
    that scored 0 because the reader's answer or its judgement failed (their ``error`` is set).
    Under a credit scheme that pays turn by turn, ``turn_accuracy[k]`` is its ``A_k``
    (:meth:`~memalpha.grpo.credit.CreditScheme.turn_accuracy`); the answers the reader gave from the
    memory after earlier turns, when the scheme asks them, are recorded in ``turn_questions``."""

    scores: list[float]
    questions: list[dict[str, Any]]
    failures: int
    turn_accuracy: list[float] | None = None
    turn_questions: list[dict[str, Any]] = field(default_factory=list)



@dataclass
class Answered:
    """What :meth:`Agent.memorise_and_answer` leaves: each rollout's scored answers (in rollout
    order), the tokens its turns generated, and the phases' wall and CPU seconds, and the requests
    to the reader (and a separate judge) that failed."""

    answers: list[RolloutAnswers]
    generated_tokens: int
    rollout_s: float
    rollout_cpu_s: float
    reader_s: float
    reader_cpu_s: float
    reader_failed_calls: int

def start_rollouts(
    instances: Sequence[Instance], group_size: int, settings: RolloutSettings, count_tokens, seed: int
) -> list[Rollout]:
    """``group_size`` rollouts per instance, each with an empty memory seeded for its memory ids, or
    with the memory an instance of the ``memories`` layout holds (:func:`first_memory`)."""
    pairs = [
        (group_id, instance, index)
        for group_id, instance in enumerate(instances)
        for index in range(group_size)
    ]
    return [
        Rollout(
            rollout_id=rollout_id,
            group_id=group_id,
            index=index,
            instance=instance,
            memory=first_memory(
                instance, count_tokens, settings, stable_seed(seed, instance.instance_id, index)
            ),
        )
        for rollout_id, (group_id, instance, index) in enumerate(pairs)
    ]


def first_memory(
    instance: Instance, count_tokens: Callable[[str], int], settings: RolloutSettings, seed: int
) -> Memory:
    """The memory a rollout of ``instance`` starts from: a copy of the one a ``memories`` instance
    holds (memories an agent wrote, :mod:`memalpha.data.memory_records`: no chunk to read, so the
    reader answers from it as it is, whatever reader a validation names), else an empty one whose
    entry ids ``seed`` seeds."""
    if MEMORY in instance.metadata:
        return Memory.from_dict(dict(instance.metadata[MEMORY]), token_counter=count_tokens)
    return Memory(token_counter=count_tokens, core_token_limit=settings.core_token_limit, seed=seed)


def memorise_chunks(
    rollouts: Sequence[Rollout],
    sample: GenerateFn,
    tokenizer,
    settings: RolloutSettings,
    *,
    seed: int,
    do_sample: bool,
    share_prefix: bool,
    on_phase: PhaseHook = show_nothing,
    keep_snapshots: bool = False,
    keep_samples: bool = True,
) -> int:
    """Phase 1: every rollout reads its instance chunk by chunk and writes its memory.

    For chunk index ``i`` the live rollouts (instances with fewer chunks have dropped out) get
    one batched call of ``sample`` (the policy in this process through ``settings.backend``,
    :func:`~memalpha.lm.sampling.generation.sampler_for`, or a vLLM server; :attr:`Agent.sampler`);
    each response is parsed and executed on its own rollout's memory, and the turn is appended to
    the rollout (a :class:`TurnSample`, its calls, a log entry). ``on_phase`` hears ``sampling`` as
    each chunk index starts, with the tokens per second so far. ``keep_snapshots`` keeps a copy of
    each memory after every turn but the last (:attr:`Rollout.snapshots`). Without
    ``keep_samples`` (inference: no reward, no update) a turn keeps only its log entry, not its
    token ids and calls. Returns the number of generated tokens.
    """
    call_format = settings.format
    generated_tokens = 0
    chunks = max((len(r.instance.chunks) for r in rollouts), default=0)
    start = time.perf_counter()
    repair = settings.repair
    for chunk_index in range(chunks):
        elapsed = time.perf_counter() - start
        rate = generated_tokens / elapsed if chunk_index and elapsed > 0 else None
        on_phase(Phase("sampling", chunk_index + 1, chunks, rate))
        live = [r for r in rollouts if chunk_index < len(r.instance.chunks)]
        prompts = [
            turn_prompt(
                tokenizer,
                r.memory,
                r.instance.chunks[chunk_index],
                call_format,
                settings,
                where=f"instance {r.instance.instance_id!r}, chunk {chunk_index}",
            )[1]
            for r in live
        ]
        generation = sample(
            prompts,
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            do_sample=do_sample,
            seed=stable_seed(seed, "chunk", chunk_index),
            batch_size=settings.generation_batch_size,
            share_prefix=share_prefix,
        )
        sampled = generation if isinstance(generation, SampledGeneration) else None
        generated_tokens += generation.num_generated_tokens
        for j, rollout in enumerate(live):
            response_ids = generation.response_ids[j]
            text = tokenizer.decode(response_ids, skip_special_tokens=True)
            parsed = call_format.parse(text, repair)
            trained = call_format.trained_length(response_ids, tokenizer) if keep_samples else None
            results = [execute_call(rollout.memory, call, repair) for call in parsed.calls]
            if keep_snapshots and chunk_index < len(rollout.instance.chunks) - 1:
                rollout.snapshots.append(copy.deepcopy(rollout.memory))
            truncated, prompt_tokens = generation.truncated[j], len(generation.prompt_ids[j])
            log = turn_log(chunk_index, text, truncated, results, parsed.errors, prompt_tokens)
            rollout.turns.append(log)
            if trained is None:  # no samples kept (inference)
                continue
            rollout.calls.append(
                TurnCalls(
                    results=results,
                    parse_errors=list(parsed.errors),
                    chunk=rollout.instance.chunks[chunk_index],
                )
            )
            rollout.samples.append(
                TurnSample(
                    group_id=rollout.group_id,
                    rollout_id=rollout.rollout_id,
                    chunk_index=chunk_index,
                    prompt_ids=generation.prompt_ids[j],
                    response_ids=response_ids[:trained],
                    truncated=truncated,
                    num_calls=len(results) + len(parsed.errors),
                    num_successful_calls=sum(r.status in SUCCESS_STATUSES for r in results),
                    adapter_version=sampled.adapter_version if sampled else None,
                    sampler_logprobs=sampled.response_logprobs[j][:trained] if sampled else None,
                )
            )
    return generated_tokens


def store_baseline(
    rollouts: Sequence[Rollout], baseline: BaselineSettings, reader: Reader | None, tokenizer
) -> None:
    """Phase 1 of a baseline (:mod:`memalpha.agent.baselines`): each rollout's memory holds its
    instance's chunks as ``baseline.kind`` stores them, no turn taken; a ``full_text`` memory is cut
    to ``reader``'s prompt budget for its instance's questions (uncut without questions or reader)."""
    for rollout in rollouts:
        instance = rollout.instance
        memory = stored_memory(baseline.kind, instance.chunks, rollout.memory)
        if baseline.kind == "full_text" and reader is not None and instance.questions:
            asked = [qa.question for qa in instance.questions]
            memory = cut_full_text(memory, asked, instance.data_source, reader, tokenizer)
        rollout.memory = memory


def turn_log(
    chunk_index: int, response: str, truncated: bool, results: Sequence[ToolResult],
    errors: Sequence[ParseError], prompt_tokens: int,
) -> dict[str, Any]:
    """A turn as records show it: its chunk index, its prompt's tokens, the response, whether it was
    cut at ``rollout.max_new_tokens``, and every call in order, executed (``tool``, ``arguments``,
    ``status``, ``reason``) then unreadable (``tool`` and ``arguments`` None, ``status`` error)."""
    return {
        "chunk_index": chunk_index,
        "prompt_tokens": prompt_tokens,
        "response": response,
        "truncated": truncated,
        "results": [
            {
                "tool": r.call.name if r.call else None,
                "arguments": r.call.arguments if r.call else None,
                "status": r.status,
                "reason": r.reason,
            }
            for r in results
        ]
        + [{"tool": None, "arguments": None, "status": "error", "reason": e.reason} for e in errors],
    }


def answer_questions(
    rollouts: Sequence[Rollout],
    reader: Reader,
    *,
    judge: Reader | None = None,
    metric_overrides: dict[str, str] | None = None,
    style: AnswerStyle = MEMALPHA_ANSWERS,
    credit: CreditScheme = BROADCAST,
    top_k: int | None = None,
) -> list[RolloutAnswers]:
    """Phase 2: the reader answers every question of every rollout from its final memory, scored.

    All questions go to the reader as one batch, each after its source's instruction (the
    reader's table); answers are scored per data source in one call each, so the LLM-judged
    sources send their judgements as one batch (``judge``, default the reader). A question's
    record keeps the bare question and, apart, the ``instruction`` the reader got before it, and
    the question's ``metadata`` when it has any (LoCoMo's category), which its metric may read.
    ``style`` (``reward.metric_style``'s :class:`~memalpha.agent.answer_metrics.AnswerStyle`) says how answers
    are compared with their golds. ``credit`` (``update.credit``'s scheme) fills in
    :attr:`RolloutAnswers.turn_accuracy`; a scheme that
    :attr:`~memalpha.grpo.credit.CreditScheme.asks_after_turns` has the reader answer, in the same
    batch, the questions answerable after every turn but the last from the memory then
    (:attr:`Rollout.snapshots`). A final answer's record says where its evidence ends
    (``evidence_chunk``, when the instance knows it) and whether the final memory holds its answer
    (``stored``, when the instance names each question's fact:
    :func:`~memalpha.agent.fact_recall.questions_stored`), so a wrong answer from a memory that holds
    it is told apart from a memory that lost it. ``top_k`` retrieves that many entries per list in
    place of the reader's own (a baseline's, :attr:`~memalpha.agent.baselines.BaselineSettings.answer_top_k`).
    """
    asked = credit.asks_after_turns
    items, owners, sources = [], [], []  # owners: (rollout, turn or None for the final memory, qa)
    evidence = [question_evidence(r.instance) if credit.needs_evidence else [] for r in rollouts]
    for i, rollout in enumerate(rollouts):
        for qa in rollout.instance.questions:
            items.append((rollout.memory, qa.question))
            owners.append((i, None, qa))
            sources.append(rollout.instance.data_source)
        for k, memory in enumerate(rollout.snapshots if asked else []):
            for qa, last in zip(rollout.instance.questions, evidence[i]):
                if last <= k:
                    items.append((memory, qa.question))
                    owners.append((i, k, qa))
                    sources.append(rollout.instance.data_source)
    answers = reader.answer(items, sources, top_k) if items else []
    by_source: dict[str, list[int]] = {}
    for n, source in enumerate(sources):
        by_source.setdefault(source, []).append(n)
    item_scores = [0.0] * len(items)
    item_errors = [answer.error for answer in answers]
    for source, ns in by_source.items():
        qas = [owners[n][2] for n in ns]
        scored, judge_errors = score_answers(
            source,
            [answers[n].text for n in ns],
            [qa.answer for qa in qas],
            questions=[qa.question for qa in qas],
            judge=judge or reader,
            overrides=metric_overrides,
            ok=[answers[n].ok for n in ns],
            style=style,
            metadata=[qa.metadata for qa in qas],
        )
        for n, value, judge_error in zip(ns, scored, judge_errors):
            item_scores[n] = value
            item_errors[n] = item_errors[n] or judge_error
    results = [RolloutAnswers(scores=[], questions=[], failures=0) for _ in rollouts]
    turn_sums = [[0.0] * len(r.snapshots) for r in rollouts]
    where = [known_evidence(r.instance) for r in rollouts]
    stored = [questions_stored(r.instance.metadata, r.memory) for r in rollouts]
    for (i, k, qa), source, answer, score, error in zip(owners, sources, answers, item_scores, item_errors):
        result = results[i]
        result.failures += error is not None
        record = {
            "question": qa.question,
            "instruction": reader.instruction_for(source),
            "gold": qa.answer,
            "prediction": answer.text,
            "score": score,
            "error": error,
            **({"metadata": qa.metadata} if qa.metadata else {}),
        }
        if k is None:
            q = len(result.questions)
            if where[i] is not None:
                record["evidence_chunk"] = where[i][q]
            if stored[i] is not None:
                record["stored"] = stored[i][q]
            result.scores.append(score)
            result.questions.append(record)
        else:
            turn_sums[i][k] += score
            result.turn_questions.append({"chunk_index": k, **record})
    for result, sums, last, rollout in zip(results, turn_sums, evidence, rollouts):
        result.turn_accuracy = credit.turn_accuracy(result.scores, sums, last, len(rollout.calls))
    return results


def known_evidence(instance: Instance) -> list[int] | None:
    """The chunk after which each question of ``instance`` is answerable, when its metadata says
    (:func:`~memalpha.data.schema.question_evidence`); None when it does not."""
    if "evidence_chunks" not in instance.metadata:
        return None
    try:
        return question_evidence(instance)
    except DataValidationError:  # evidence in a form credit cannot use: the record just says nothing
        return None


def assign_rewards(
    rollouts: Sequence[Rollout],
    answers: Sequence[RolloutAnswers],
    weights: RewardSettings,
    content_judge: ContentJudge | None,
    count_tokens: Callable[[str], int],
) -> tuple[list[TurnSample], list[RolloutRecord]]:
    """Phase 3: each turn's reward ``R_t`` onto its sample, and one record per rollout."""
    chunk_tokens_of: dict[str, int] = {}
    records: list[RolloutRecord] = []
    samples: list[TurnSample] = []
    for rollout, answered in zip(rollouts, answers):
        instance = rollout.instance
        if instance.instance_id not in chunk_tokens_of:
            chunk_tokens_of[instance.instance_id] = sum(count_tokens(c) for c in instance.chunks)
        chunk_tokens = chunk_tokens_of[instance.instance_id]
        memory_tokens = rollout.memory.total_tokens()
        reward = rollout_rewards(
            answered.scores, rollout.calls, memory_tokens, chunk_tokens, weights, content_judge
        )
        turn_rewards = (
            None if answered.turn_accuracy is None
            else per_chunk_totals(answered.turn_accuracy, reward.r2, reward.r3, reward.r4, weights)
        )
        for t, sample in enumerate(rollout.samples):
            sample.r2, sample.r4, sample.reward = reward.r2[t], reward.r4[t], reward.total[t]
            rollout.turns[t].update(r2=reward.r2[t], r4=reward.r4[t], reward=reward.total[t])
            if turn_rewards is not None:
                sample.turn_reward = turn_rewards[t]
                rollout.turns[t].update(turn_accuracy=answered.turn_accuracy[t], turn_reward=turn_rewards[t])
        samples.extend(rollout.samples)
        records.append(
            RolloutRecord(
                instance_id=instance.instance_id,
                data_source=instance.data_source,
                rollout_index=rollout.index,
                turns=rollout.turns,
                memory=rollout.memory.to_dict(),
                memory_tokens=memory_tokens,
                chunk_tokens=chunk_tokens,
                questions=answered.questions,
                r1=reward.r1,
                r3=reward.r3,
                reader_failures=answered.failures,
                fact_recall=memory_fact_recall(instance.metadata, rollout.memory),
                turn_questions=answered.turn_questions,
            )
        )
    return samples, records


def reader_questions(instance: Instance, asked: bool) -> int:
    """The questions the reader answers for one rollout of ``instance``: each once from the final memory
    and, when ``asked`` after every turn, again after every earlier turn from its evidence chunk on."""
    if not asked:
        return len(instance.questions)
    turns = len(instance.chunks)
    return len(instance.questions) + sum(turns - 1 - last for last in question_evidence(instance))


@dataclass
class Agent:
    """The memory agent a round rolls out: the policy and its tokenizer, the reader that answers
    from the memories it writes, how it generates (``rollout``) and how it is rewarded
    (``reward``, ``content_judge``). ``sampler`` generates its turns: the policy in this process
    through ``rollout.backend`` unless given (a vLLM server's, for ``rollout.backend: vllm``).
    A baseline (``rollout.baseline``) stores the chunks in its place and the policy takes no turn
    (:mod:`memalpha.agent.baselines`)."""

    policy: Any
    tokenizer: Any
    reader: Reader
    rollout: RolloutSettings
    reward: RewardSettings
    content_judge: ContentJudge | None = None
    share_prefix: bool = True
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
        judge_reader: Reader | None = None,
        on_phase: PhaseHook = show_nothing,
        credit: CreditScheme = BROADCAST,
    ) -> RolloutOutput:
        """``group_size`` rollouts for every instance (default ``rollout.group_size``; validation
        takes one, greedy): memorise the chunks, answer the questions, assign the rewards. Returns
        the turn samples and one record per rollout.

        ``group_id`` of a sample is the instance's position in ``instances``. ``share_prefix`` lets
        each ``generate`` call compute the prompt tokens its rows share once
        (:class:`~memalpha.lm.core.prompt_sharing.PromptSharing`). The answer metric of each source
        comes from ``reward.metric_overrides`` first; answers are compared in
        ``reward.answer_style``; ``judge_reader`` judges answers instead of the reader. ``on_phase``
        hears each phase as it starts (:mod:`memalpha.agent.progress`). ``credit`` (the
        ``update.credit`` scheme) says where each turn's accuracy comes from
        (:func:`answer_questions`).
        """
        count_tokens = make_token_counter(self.tokenizer)
        size = self.rollout.group_size if group_size is None else group_size
        if self.rollout.baseline.kind is not None and size != 1:
            raise ValueError(
                f"rollout.baseline.kind {self.rollout.baseline.kind} learns nothing: one rollout per"
                f" instance, not {size}"
            )
        rollouts = start_rollouts(instances, size, self.rollout, count_tokens, seed)
        done = self.memorise_and_answer(
            rollouts, seed=seed, do_sample=do_sample, judge_reader=judge_reader, on_phase=on_phase,
            credit=credit,
        )
        on_phase(Phase("rewards"))
        start = time.perf_counter()
        samples, records = assign_rewards(
            rollouts, done.answers, self.reward, self.content_judge, count_tokens
        )
        return RolloutOutput(
            samples=samples,
            records=records,
            rollout_s=done.rollout_s,
            reader_s=done.reader_s,
            generated_tokens=done.generated_tokens,
            reader_failed_calls=done.reader_failed_calls,
            rewards_s=time.perf_counter() - start,
            rollout_cpu_s=done.rollout_cpu_s,
            reader_cpu_s=done.reader_cpu_s,
        )

    def memorise_and_answer(
        self,
        rollouts: Sequence[Rollout],
        *,
        seed: int,
        do_sample: bool,
        judge_reader: Reader | None = None,
        on_phase: PhaseHook = show_nothing,
        credit: CreditScheme = BROADCAST,
        keep_samples: bool = True,
    ) -> Answered:
        """The reading every caller shares (:meth:`rollouts` for training and validation,
        :func:`~memalpha.agent.reading.read_instances` for ``memalpha predict`` and the Python API):
        each rollout memorises its instance chunk by chunk (:func:`memorise_chunks`; a baseline stores
        the chunks instead, :func:`store_baseline`), then the reader answers its questions from the
        final memory (:func:`answer_questions`). ``keep_samples`` keeps each turn's token ids for an
        update. Rollouts without questions need no reader; questions without one stop here."""
        baseline = self.rollout.baseline
        asked = credit.asks_after_turns  # the reader reads the memory after every turn
        start, cpu = time.perf_counter(), time.process_time()
        if baseline.kind is None:
            generated_tokens = memorise_chunks(
                rollouts, self.sampler, self.tokenizer, self.rollout, seed=seed, do_sample=do_sample,
                share_prefix=self.share_prefix, on_phase=on_phase, keep_snapshots=asked,
                keep_samples=keep_samples,
            )
        else:
            store_baseline(rollouts, baseline, self.reader, self.tokenizer)
            generated_tokens = 0
        rollout_s, rollout_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        questions = sum(reader_questions(r.instance, asked) for r in rollouts)
        if questions and self.reader is None:
            raise ValueError("these instances have questions: give a reader to answer them")
        if questions:
            on_phase(Phase("reader", total=questions))
        readers = {id(r): r for r in (self.reader, judge_reader) if r is not None}.values()
        failures_before = sum(r.failures for r in readers)
        start, cpu = time.perf_counter(), time.process_time()
        answers = answer_questions(
            rollouts, self.reader, judge=judge_reader, metric_overrides=self.reward.metric_overrides,
            style=self.reward.answer_style, credit=credit, top_k=baseline.answer_top_k,
        )
        return Answered(
            answers=answers,
            generated_tokens=generated_tokens,
            rollout_s=rollout_s,
            rollout_cpu_s=rollout_cpu_s,
            reader_s=time.perf_counter() - start,
            reader_cpu_s=time.process_time() - cpu,
            reader_failed_calls=sum(r.failures for r in readers) - failures_before,
        )
