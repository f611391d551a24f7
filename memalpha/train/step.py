"""One GRPO step's round and its skip policy, free of Lightning: every trainer and benchmark calls
these functions; the update loop they feed is :mod:`memalpha.grpo.update`.

Read top to bottom, a step is::

    round_ = collect_round(agent, instances, update, logprob_spec, ranks, seed=..., where=...)
        rollouts (the memory agent: memorise chunk by chunk -> answer -> rewards)
        -> the reader-failure gate (``ReaderGate``) and, with a vLLM engine, the sampler's drift check
        -> score_samples: the credit scheme's advantages, reference / old log-probs, mini-batches
    for batch in round_.batches:
        result = train_minibatch(micro_batch_scorer(policy, logprob_spec), batch, update, ranks,
                                 optimisation, max_response_len=...)      # memalpha.grpo.update
            loss (micro-batch by micro-batch) -> gradients -> clip -> optimiser step

:class:`GRPOStep` is that loop one optimiser step at a time, with what a run carries from step to
step (the round's unserved mini-batches, the reader gate's count) and the step's skip policy: a
stream that has served its rounds, a round the reader gate refused, a round with a non-finite
value. :class:`~memalpha.train.module.GRPOModule` calls :meth:`GRPOStep.train_next` from its
``training_step`` and logs what it returns; the single-turn trainer (:mod:`memalpha_lab.single_turn`)
runs :func:`score_samples` and :func:`~memalpha.grpo.update.train_minibatch` on its own samples, and
the benchmarks under ``experiments/`` time the same calls. What differs between processes of a
data-parallel run (averages over ranks, agreeing to skip a step) goes through
:class:`~memalpha.grpo.update.Ranks`; :data:`~memalpha.grpo.update.ONE_PROCESS` is the stand-in
outside Lightning.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch

from memalpha.agent.progress import Phase, PhaseHook, show_nothing
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, RolloutOutput, RolloutRecord, TurnSample
from memalpha.data.schema import Instance
from memalpha.grpo.advantages import advantage_shares, flat_group_share
from memalpha.grpo.batch import GRPOBatch, cut_minibatches
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import (
    ONE_PROCESS,
    Clock,
    Optimisation,
    Ranks,
    first_nonfinite,
    no_clock,
    sum_over_ranks,
    train_minibatch,
)
from memalpha.lm.core.modes import reference_weights
from memalpha.lm.logprobs.per_token import micro_batch_scorer, response_logprobs
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.reader.settings import ReaderSettings
from memalpha.seeding import stable_seed
from memalpha.train.engine_sync import EngineSync
from memalpha.train.step_faults import ReaderFailureError, ReaderFailures, over_the_limit

MAX_SKIPPED_ROUNDS_IN_A_ROW = 3
"""Rounds skipped in a row for their reader's failures after which the run stops: a reader that
stays down would otherwise roll out rounds without end."""


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


def round_metrics(
    out: RolloutOutput, rewards: torch.Tensor, compared: tuple[torch.Tensor, Sequence]
) -> dict[str, float]:
    """Reward, reward spread, response, tool-call, reward-term, memory, fact-recall, reader-failure,
    timing and compute metrics of one round; docs/quickstart.md's table of logged metrics says what
    each one means.

    ``rewards`` are the ``[N]`` per-sample rewards ``R_t`` of ``out.samples``; ``compared`` the
    rewards the credit scheme compares and each one's group
    (:class:`~memalpha.grpo.credit.CreditScheme`), whose flat groups give
    ``train/frac_reward_zero_std``. ``reader/questions`` counts the answers after earlier turns of
    per-chunk credit too; those alone are ``reader/turn_questions``.
    """
    samples, records = out.samples, out.records
    calls = sum(s.num_calls for s in samples)
    lengths = [len(s.response_ids) for s in samples]
    recalls = [r.fact_recall for r in records if r.fact_recall is not None]
    known = {"train/fact_recall": sum(recalls) / len(recalls)} if recalls else {}
    per_turn = {}
    if samples and all(s.turn_reward is not None for s in samples):
        per_turn = {
            "train/turn_reward": sum(s.turn_reward for s in samples) / len(samples),
            "reader/turn_questions": float(sum(len(r.turn_questions) for r in records)),
        }
    return {
        **known,
        "train/reward": rewards.mean().item(),
        "train/reward_std": rewards.std(unbiased=False).item(),
        "train/frac_reward_zero_std": flat_group_share(*compared),
        "train/response_length": sum(lengths) / len(lengths),
        "train/truncated_ratio": sum(s.truncated for s in samples) / len(samples),
        "train/tool_calls_per_turn": calls / len(samples),
        "train/tool_success": sum(s.num_successful_calls for s in samples) / calls if calls else 0.0,
        "rewards/r1_accuracy": sum(r.r1 for r in records) / len(records),
        "rewards/r2_tool": sum(s.r2 for s in samples) / len(samples),
        "rewards/r3_compression": sum(r.r3 for r in records) / len(records),
        "rewards/r4_content": sum(s.r4 for s in samples) / len(samples),
        "memory/tokens": sum(r.memory_tokens for r in records) / len(records),
        "reader/failures": float(sum(r.reader_failures for r in records)),
        "reader/failed_calls": float(out.reader_failed_calls),
        "perf/rollout_s": out.rollout_s,
        "perf/reader_s": out.reader_s,
        "perf/rewards_s": out.rewards_s,
        "perf/gen_tokens_per_s": out.generated_tokens / out.rollout_s if out.rollout_s > 0 else 0.0,
        "perf/rollout_total_s": out.rollout_s + out.reader_s,
        "perf/rollouts": float(len(records)),
        "perf/turn_samples": float(len(samples)),
        "perf/generated_tokens": float(out.generated_tokens),
        "reader/questions": float(sum(len(r.questions) + len(r.turn_questions) for r in records)),
        **per_turn,
    }


def reward_term_shares(
    out: RolloutOutput, compared: tuple[torch.Tensor, Sequence], weights: RewardSettings
) -> dict[str, float]:
    """``advantage/share_r1`` .. ``share_r4``: the share of the round's advantages each reward term
    carries (:func:`~memalpha.grpo.advantages.advantage_shares`). Each compared value is split into
    ``r2_t``, ``beta * r3``, ``gamma * r4_t`` and the rest, the accuracy term (``w * r1``, or the
    turn's credited accuracy under per-turn credit). A low or negative ``share_r2`` says the update
    does not follow tool success (docs/metrics_and_rewards.md, "What the advantages follow")."""
    values, labels = compared
    values = torch.as_tensor(values, dtype=torch.float64)
    samples = out.samples
    r2 = torch.tensor([s.r2 for s in samples], dtype=torch.float64)
    r4 = weights.gamma * torch.tensor([s.r4 for s in samples], dtype=torch.float64)
    # a sample's rollout_id is its record's position (records come in rollout order)
    r3 = weights.beta * torch.tensor([out.records[s.rollout_id].r3 for s in samples], dtype=torch.float64)
    shares = advantage_shares(values, labels, {"r1": values - r2 - r3 - r4, "r2": r2, "r3": r3, "r4": r4})
    return {f"advantage/share_{name}": share for name, share in shares.items()}


def rollout_text(record: RolloutRecord) -> str:
    """One rollout as markdown: each chunk's response, reward and tool results, then the final memory."""
    lines = [
        f"### instance `{record.instance_id}` ({record.data_source}), rollout {record.rollout_index}",
        "",
    ]
    for turn in record.turns:
        lines.append(f"**chunk {turn['chunk_index']}** reward {turn.get('reward', 0):.3f}")
        lines.append("```\n" + turn["response"] + "\n```")
        lines.append("results: " + json.dumps(turn["results"], ensure_ascii=False))
        lines.append("")
    lines.append("**final memory**")
    lines.append("```json\n" + json.dumps(record.memory, indent=2, ensure_ascii=False) + "\n```")
    lines.append(f"r1 {record.r1:.3f}, r3 {record.r3:.3f}, memory tokens {record.memory_tokens}")
    return "\n".join(lines)


@dataclass
class Samples:
    """A round's samples, row-aligned: what the update needs of the rollouts (``turn_rewards``
    and ``turn_index`` for per-turn credit: each row's per-chunk reward and chunk index)."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: torch.Tensor
    group_ids: torch.Tensor
    turn_rewards: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None

    @classmethod
    def of(cls, samples: Sequence[TurnSample]) -> Samples:
        """The memory agent's turn samples."""
        per_turn = all(s.turn_reward is not None for s in samples)
        return cls(
            [s.prompt_ids for s in samples], [s.response_ids for s in samples],
            torch.tensor([s.reward for s in samples], dtype=torch.float32),
            torch.tensor([s.group_id for s in samples]),
            torch.tensor([s.turn_reward for s in samples], dtype=torch.float32) if per_turn else None,
            torch.tensor([s.chunk_index for s in samples]),
        )

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class Scored:
    """A round's mini-batches in training order (none when ``nonfinite``), and its metrics."""

    batches: list[GRPOBatch]
    metrics: dict[str, float] = field(default_factory=dict)
    nonfinite: str | None = None


@dataclass
class Round:
    """A collected round: its rollouts, mini-batches (none when ``nonfinite`` or ``refused``),
    metrics, its first rollout as text (when asked), what was non-finite (None: all was finite), and
    whether the reader-failure gate refused it (``reader.on_failed_round: skip``)."""

    out: RolloutOutput
    batches: list[GRPOBatch]
    metrics: dict[str, float]
    text: str | None = None
    nonfinite: str | None = None
    refused: bool = False


def score_samples(
    policy,
    samples: Samples,
    update: UpdateSettings,
    logprob_spec: LogprobSpec,
    *,
    round_samples: int,
    seed: int,
    sampler_gap: Callable[[Callable[[], list[torch.Tensor]]], dict[str, float]] | None = None,
    clock: Clock = no_clock,
    on_phase: PhaseHook = show_nothing,
    where: str = "the round",
) -> Scored:
    """Rewards -> advantages (``update.credit``'s scheme) -> reference / old log-probs -> the round's
    mini-batches.

    The reference pass runs only with ``update.kl_coef > 0`` (under ``update.kl_reference``'s
    weights: :func:`~memalpha.lm.core.modes.reference_weights`); the old-policy pass only when
    the round feeds several optimiser steps. ``sampler_gap`` (given the trainer's log-probs of the
    samples) adds the metrics of a sampler outside this process. ``round_samples`` is the round's
    size over all ranks; ``seed`` reshuffles later PPO epochs. A NaN or an infinity in the rewards
    or the log-probs leaves the round without mini-batches, named in ``nonfinite``. A rank with fewer
    samples than the round's optimiser steps stops the run, naming ``where``.
    """
    steps_per_epoch = update.mini_batches_per_epoch(round_samples)
    needs_old_logps = update.needs_old_logps(round_samples)
    if steps_per_epoch > len(samples):
        raise RuntimeError(
            f"this rank has {len(samples)} samples in {where}, fewer than the {steps_per_epoch}"
            " optimiser steps the round takes; raise model.update.mini_batch_size or lower"
            " model.update.num_mini_batches"
        )
    if first_nonfinite({"rewards": samples.rewards, "turn rewards": samples.turn_rewards}) is not None:
        return Scored([], {}, "rewards")
    on_phase(Phase("logprobs"))
    prompts, responses = samples.prompt_ids, samples.response_ids
    metrics: dict[str, float] = {}
    start = time.perf_counter()
    ref_logps = old_logps = None
    with clock("logprobs"):
        if update.kl_coef > 0:
            with reference_weights(policy):
                ref_logps = response_logprobs(policy, prompts, responses, logprob_spec)
        if needs_old_logps:
            old_logps = response_logprobs(policy, prompts, responses, logprob_spec)
    metrics["perf/ref_old_logprob_s"] = time.perf_counter() - start
    if sampler_gap is not None:
        def trainer_logps() -> list[torch.Tensor]:
            if old_logps is not None:
                return old_logps
            return response_logprobs(policy, prompts, responses, logprob_spec)

        metrics.update(sampler_gap(trainer_logps))
    problem = first_nonfinite({"reference log-probs": ref_logps, "old log-probs": old_logps})
    if problem is not None:
        return Scored([], metrics, problem)
    batch = GRPOBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=update.credit_scheme.advantages(
            samples.rewards, samples.turn_rewards, samples.group_ids, samples.turn_index,
            scale=update.advantage_scale,
        ),
        old_logps=old_logps,
        ref_logps=ref_logps,
    )
    return Scored(cut_minibatches(batch, steps_per_epoch, update.ppo_epochs, seed), metrics)


@torch.no_grad()
def collect_round(
    agent: Agent,
    instances: Sequence[Instance],
    update: UpdateSettings,
    logprob_spec: LogprobSpec,
    ranks: Ranks = ONE_PROCESS,
    *,
    seed: int,
    where: str,
    engine: EngineSync | None = None,
    reader_gate: ReaderGate | None = None,
    on_phase: PhaseHook = show_nothing,
    clock: Clock = no_clock,
    with_text: bool = False,
) -> Round:
    """A round, on every rank alike: the agent's rollouts of ``instances`` (memorise chunk by
    chunk, answer, reward), the reader-failure gate, then its mini-batches (:func:`score_samples`).

    With ``engine`` (``rollout.backend: vllm``; the agent's sampler is its server's, which syncs the
    adapter and refuses samples of another adapter version) a sampler whose log-probs drift from the
    trainer's stops the round (``rollout.vllm.max_logprob_gap``). ``reader_gate`` refuses a round
    whose reader answers failed (summed over the ranks, so every rank decides alike). ``where``
    names the round in errors (``rollout round 3``); ``ranks`` makes the size of the round, and so
    the number of its optimiser steps, the same on every rank. ``with_text`` adds its first rollout
    as text (:func:`rollout_text`).
    """
    with clock("rollout"):
        out = agent.rollouts(instances, seed=seed, on_phase=on_phase, credit=update.credit_scheme)
    samples = out.samples
    if not samples:
        raise RuntimeError(f"{where} produced no samples")
    # the round's samples summed over the ranks (update.mini_batch_size is global, as verl's), so
    # every rank takes the same number of steps; a collective, before any rank can leave early
    round_samples = sum_over_ranks(ranks, len(samples))
    rows = Samples.of(samples)
    compared = update.credit_scheme.compared(rows.rewards, rows.turn_rewards, rows.group_ids, rows.turn_index)
    metrics = round_metrics(out, rows.rewards, compared) | reward_term_shares(out, compared, agent.reward)
    text = rollout_text(out.records[0]) if with_text else None
    mine = ReaderFailures.of(out.records)  # summed over the ranks, so every rank's gate decides alike
    failures = replace(
        mine, failed=sum_over_ranks(ranks, mine.failed), questions=sum_over_ranks(ranks, mine.questions)
    )
    if reader_gate is not None and not reader_gate.answered(failures, where):
        return Round(out, [], {**metrics, "train/skipped_reader_round": 1.0}, text=text, refused=True)
    metrics["train/skipped_reader_round"] = 0.0

    def sampler_gap(trainer_logps: Callable[[], list[torch.Tensor]]) -> dict[str, float]:
        # the server sampled: was it the policy being trained?
        gap = engine.sampler_gap([s.sampler_logprobs for s in samples], trainer_logps(), where)
        return {"rollout/sampler_logprob_gap": gap}

    scored = score_samples(
        agent.policy, rows, update, logprob_spec, round_samples=round_samples, seed=seed, clock=clock,
        on_phase=on_phase, sampler_gap=None if engine is None else sampler_gap, where=where,
    )
    return Round(out, scored.batches, {**metrics, **scored.metrics}, text, scored.nonfinite)


@dataclass
class StepLog:
    """What one :meth:`GRPOStep.train_next` leaves for the trainer to log: the step's own metrics
    (``train/*``, ``perf/train_s``), its round's metrics (on the round's first step), a rollout as
    text (when asked), the samples it trained (the logging batch size), whether the round is spent
    (a per-round learning-rate schedule moves then), and whether the stream had no round left
    (nothing was trained: the run stops)."""

    metrics: dict[str, float] = field(default_factory=dict)
    round_metrics: dict[str, float] = field(default_factory=dict)
    text: str | None = None
    samples: int = 1
    round_spent: bool = False
    stream_ended: bool = False


@dataclass
class GRPOStep:
    """One GRPO optimiser step at a time, free of Lightning, with what a run carries between steps.

    ``experience`` holds this rank's unserved mini-batches of the current round and
    ``reader_gate`` counts the rounds it skipped in a row: both are part of a checkpoint. The agent
    and ``logprob_spec`` come with the policy (the trainer sets them once it has loaded it); ``engine`` is
    the vLLM engine of ``rollout.backend: vllm`` (its sampler is the agent's). A round's seed is
    ``stable_seed(seed, "round", index, rank)``; every ``log_text_every`` optimiser steps (0: never)
    rank 0 returns a rollout of the round as text.
    """

    update: UpdateSettings
    reader_gate: ReaderGate
    agent: Agent | None = None
    logprob_spec: LogprobSpec | None = None
    engine: EngineSync | None = None
    seed: int = 0
    log_text_every: int = 0
    experience: list[GRPOBatch] = field(default_factory=list)

    def train_next(
        self,
        rounds: Iterator,
        optimisation: Optimisation,
        ranks: Ranks,
        *,
        global_step: int,
        rank: int,
        on_phase: PhaseHook = show_nothing,
        count_nonfinite: Callable[[str | None], None] = lambda problem: None,
    ) -> StepLog:
        """Train one mini-batch of the current round, rolling a new round out of ``rounds`` (an
        iterator of :class:`~memalpha.train.datamodule.InstanceRound`) when none is left.

        The skip policy: when ``rounds`` has no round left, nothing trains and the log says the
        stream ended; a round the reader gate refuses (``reader.on_failed_round: skip``) trains
        nothing and logs ``train/skipped_reader_round``; a round with a non-finite reward or
        log-prob is dropped whole on every rank at once (``ranks``) and counted with
        ``count_nonfinite``, as is every trained step's outcome (None: it trained). ``optimisation``
        is how the gradients become the step.
        """
        metrics_of_round, text = {}, None
        problem = None
        if not self.experience:
            try:
                round_, _, _ = next(rounds)
            except StopIteration:  # the last of data.epochs' rounds is trained: every rank ends here
                return StepLog(stream_ended=True)
            collected = collect_round(
                self.agent, round_.instances, self.update, self.logprob_spec, ranks,
                seed=stable_seed(self.seed, "round", round_.index, rank),
                where=f"rollout round {round_.index} (global step {global_step})",
                engine=self.engine, reader_gate=self.reader_gate, on_phase=on_phase,
                with_text=self.log_text_every > 0 and rank == 0 and global_step % self.log_text_every == 0,
            )
            self.experience, metrics_of_round = collected.batches, collected.metrics
            problem, text = collected.nonfinite, collected.text
            if collected.refused:  # every rank refused it alike (the failures were summed over the ranks)
                untrained = {"train/skipped_nonfinite": 0.0, "train/grad_norm": float("nan")}
                return StepLog(untrained, metrics_of_round, text, round_spent=True)
        problem = ranks.agree_on_nonfinite(problem)
        if problem is not None:  # every rank drops its round, so the ranks keep rolling out in step
            self.experience = []
            count_nonfinite(problem)
            skipped = {"train/skipped_nonfinite": 1.0, "train/grad_norm": float("nan")}
            return StepLog(skipped, metrics_of_round, text, round_spent=True)
        batch = self.experience.pop(0)
        on_phase(Phase("update"))
        start = time.perf_counter()
        result = train_minibatch(
            micro_batch_scorer(self.agent.policy, self.logprob_spec), batch, self.update, ranks, optimisation,
            max_response_len=self.agent.rollout.max_new_tokens,
        )
        count_nonfinite(result.problem)
        metrics = {f"train/{key}": value for key, value in result.metrics.items() if key != "tokens"}
        metrics.update(
            {
                "train/grad_norm": result.grad_norm,
                "train/skipped_nonfinite": float(result.problem is not None),
                "perf/train_s": time.perf_counter() - start,
            }
        )
        return StepLog(metrics, metrics_of_round, text, len(batch), round_spent=not self.experience)
