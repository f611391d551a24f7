"""One GRPO step, free of Lightning: every trainer and benchmark calls these functions.

Read top to bottom, a step is::

    round_ = collect_round(agent, instances, update, scoring, ranks, seed=..., where=...)
        rollouts (the memory agent: memorise chunk by chunk -> answer -> rewards)
        -> the reader-failure gate (``ReaderGate``) and, with a vLLM engine, the sampler checks
        -> score_samples: group advantages, reference / old log-probs, mini-batches
    for batch in round_.batches:
        result = train_minibatch(policy, batch, update, scoring, ranks, optimisation, max_response_len=...)
            loss (micro-batch by micro-batch) -> gradients -> clip -> optimiser step

:class:`~memalpha.train.module.GRPOModule` runs them from its Lightning hooks (one mini-batch per
``training_step``), the single-turn trainer (:mod:`memalpha_lab.single_turn`) runs
:func:`score_samples` and :func:`train_minibatch` on its own samples, and the benchmarks under
``experiments/`` time the same calls. What differs between processes of a data-parallel run
(averages over ranks, agreeing to skip a step) goes through :class:`Ranks`; :class:`OneProcess`
is the stand-in outside Lightning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from memalpha.agent.progress import Phase, PhaseHook, report
from memalpha.agent.reading import Reading, read_instances
from memalpha.agent.rollout import GenerateFn, RolloutOutput, TurnSample, run_rollouts
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import Instance
from memalpha.grpo.batch import GRPOBatch, cut_minibatches
from memalpha.grpo.credit import BROADCAST, CreditScheme
from memalpha.grpo.settings import UpdateSettings
from memalpha.grpo.update import first_nonfinite, optimizer_step
from memalpha.lm.core.reference import reference_weights
from memalpha.lm.scoring.logprobs import response_logprobs
from memalpha.lm.scoring.spec import ScoringSpec
from memalpha.reader.base import Reader
from memalpha.train.actor import accumulate_grpo_gradients
from memalpha.train.engine_sync import EngineSync, check_versions, sampler_logprob_gap
from memalpha.train.round_report import round_metrics
from memalpha.train.step_faults import ReaderFailures, ReaderGate

if TYPE_CHECKING:  # annotations only: the agent's reward settings and judges
    from memalpha.agent.content_judges import ContentJudge
    from memalpha.agent.reward_settings import RewardSettings

Clock = Callable[[str], AbstractContextManager]
"""Around each stage of a step (``rollout``, ``logprobs``, ``gradients``, ``optimizer``): a
benchmark's timer or profiler label."""


def no_clock(stage: str) -> AbstractContextManager:
    """The clock of a step nobody times."""
    return nullcontext()


class Ranks(Protocol):
    """The calls of a step that differ across the processes of a data-parallel run; each is a
    collective there, so every rank makes the same calls in the same order."""

    @property
    def world_size(self) -> int: ...

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over the ranks."""
        ...

    def agree_on_nonfinite(self, problem: str | None) -> str | None:
        """What any rank found non-finite before its backward, else None."""
        ...

    def all_finite(self, finite: bool) -> bool:
        """Whether every rank's loss was finite."""
        ...


class OneProcess:
    """:class:`Ranks` of a run in one process: every value is its own mean and agreement."""

    world_size = 1

    def mean_over_ranks(self, value: float) -> float:
        return value

    def agree_on_nonfinite(self, problem: str | None) -> str | None:
        return problem

    def all_finite(self, finite: bool) -> bool:
        return finite


ONE_PROCESS = OneProcess()


@dataclass
class Agent:
    """The memory agent a round rolls out: the policy and its tokenizer, the reader that answers
    from the memories it writes, how it generates and how it is rewarded."""

    policy: Any
    tokenizer: Any
    reader: Reader
    rollout: RolloutSettings
    reward: RewardSettings
    content_judge: ContentJudge | None = None
    share_prefix: bool = True

    def rollouts(
        self, instances: Sequence[Instance], *, seed: int, greedy: bool = False,
        sampler: GenerateFn | None = None, on_phase: PhaseHook | None = None,
        credit: CreditScheme = BROADCAST,
    ) -> RolloutOutput:
        """Memorise, answer, reward (:func:`~memalpha.agent.rollout.run_rollouts`): a group of
        ``rollout.group_size`` rollouts per instance (one when ``greedy``, as validation does),
        sampled by ``sampler`` (a server's generate function) or in this process; ``credit`` says
        where each turn's accuracy comes from (``update.credit``'s scheme)."""
        return run_rollouts(
            instances, self.policy, self.tokenizer, self.reader, self.rollout, self.reward,
            self.content_judge,
            seed=seed, do_sample=not greedy, group_size=1 if greedy else None,
            share_prefix=self.share_prefix, sampler=sampler, on_phase=on_phase, credit=credit,
        )

    def read(
        self, instances: Sequence[Instance], *, seed: int, sampler: GenerateFn | None = None,
        on_phase: PhaseHook | None = None,
    ) -> list[Reading]:
        """Memorise each instance greedily and answer its questions, no reward
        (:func:`~memalpha.agent.reading.read_instances`): what ``memalpha predict`` records."""
        return read_instances(
            instances, self.policy, self.tokenizer, self.reader, self.rollout, self.reward, seed=seed,
            sampler=sampler, on_phase=on_phase, share_prefix=self.share_prefix,
        )


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
    metrics, what was non-finite (None: all was finite), and whether the reader-failure gate
    refused it (``reader.on_failed_round: skip``)."""

    out: RolloutOutput
    batches: list[GRPOBatch]
    metrics: dict[str, float]
    nonfinite: str | None = None
    refused: bool = False


def global_samples(count: int, ranks: Ranks) -> int:
    """The round's samples summed over the ranks (``update.mini_batch_size`` is global, as verl's),
    so every rank takes the same number of steps; a collective, before any rank can leave early."""
    return round(ranks.mean_over_ranks(float(count)) * ranks.world_size)


def score_samples(
    policy,
    samples: Samples,
    update: UpdateSettings,
    scoring: ScoringSpec,
    *,
    round_samples: int,
    seed: int,
    sampler_gap: Callable[[Callable[[], list[torch.Tensor]]], dict[str, float]] | None = None,
    clock: Clock = no_clock,
    on_phase: PhaseHook | None = None,
) -> Scored:
    """Rewards -> advantages (``update.credit``'s scheme) -> reference / old log-probs -> the round's
    mini-batches.

    The reference pass runs only with ``update.kl_coef > 0`` (under ``update.kl_reference``'s
    weights: :func:`~memalpha.lm.core.reference.reference_weights`); the old-policy pass only when
    the round feeds several optimiser steps. ``sampler_gap`` (given the trainer's log-probs of the
    samples) adds the metrics of a sampler outside this process. ``round_samples`` is the round's
    size over all ranks; ``seed`` reshuffles later PPO epochs. A NaN or an infinity in the rewards
    or the log-probs leaves the round without mini-batches, named in ``nonfinite``.
    """
    if first_nonfinite({"rewards": samples.rewards, "turn rewards": samples.turn_rewards}) is not None:
        return Scored([], {}, "rewards")
    report(on_phase, Phase("logprobs"))
    prompts, responses = samples.prompt_ids, samples.response_ids
    metrics: dict[str, float] = {}
    start = time.perf_counter()
    ref_logps = old_logps = None
    with clock("logprobs"):
        if update.kl_coef > 0:
            with reference_weights(policy):
                ref_logps = response_logprobs(policy, prompts, responses, scoring)
        if update.needs_old_logps(round_samples):
            old_logps = response_logprobs(policy, prompts, responses, scoring)
    metrics["perf/ref_old_logprob_s"] = time.perf_counter() - start
    if sampler_gap is not None:
        def trainer_logps() -> list[torch.Tensor]:
            if old_logps is not None:
                return old_logps
            return response_logprobs(policy, prompts, responses, scoring)

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
    steps_per_epoch = update.mini_batches_per_epoch(round_samples)
    return Scored(cut_minibatches(batch, steps_per_epoch, update.ppo_epochs, seed), metrics)


@torch.no_grad()
def collect_round(
    agent: Agent,
    instances: Sequence[Instance],
    update: UpdateSettings,
    scoring: ScoringSpec,
    ranks: Ranks = ONE_PROCESS,
    *,
    seed: int,
    where: str,
    engine: EngineSync | None = None,
    reader_gate: ReaderGate | None = None,
    on_phase: PhaseHook | None = None,
    clock: Clock = no_clock,
) -> Round:
    """A round, on every rank alike: the agent's rollouts of ``instances`` (memorise chunk by
    chunk, answer, reward), the reader-failure gate, then its mini-batches (:func:`score_samples`).

    With ``engine`` (``rollout.backend: vllm``) the server samples, its adapter synced to the policy
    first; samples of another adapter version stop the round, and so does a sampler whose log-probs
    drift from the trainer's (``rollout.vllm.max_logprob_gap``). ``reader_gate`` refuses a round
    whose reader answers failed (summed over the ranks, so every rank decides alike). ``where``
    names the round in errors (``rollout round 3``); ``ranks`` makes the size of the round, and so
    the number of its optimiser steps, the same on every rank.
    """
    sampler = None if engine is None else engine.generator(agent.policy, agent.tokenizer)
    with clock("rollout"):
        out = agent.rollouts(
            instances, seed=seed, sampler=sampler, on_phase=on_phase,
            credit=update.credit_scheme,
        )
    samples = out.samples
    if not samples:
        raise RuntimeError(f"{where} produced no samples")
    if engine is not None:
        check_versions([s.adapter_version for s in samples], engine.policy_version, where)
    round_samples = global_samples(len(samples), ranks)
    steps_per_epoch = update.mini_batches_per_epoch(round_samples)
    if steps_per_epoch > len(samples):
        raise RuntimeError(
            f"this rank has {len(samples)} samples in {where}, fewer than the {steps_per_epoch}"
            " optimiser steps the round takes; raise model.update.mini_batch_size or lower"
            " model.update.num_mini_batches"
        )
    rows = Samples.of(samples)
    compared = update.credit_scheme.compared(rows.rewards, rows.turn_rewards, rows.group_ids, rows.turn_index)
    metrics = round_metrics(out, rows.rewards, compared)
    failures = ReaderFailures.of(out.records).summed(ranks)
    if reader_gate is not None and not reader_gate.answered(failures, where):
        return Round(out, [], {**metrics, "train/skipped_reader_round": 1.0}, refused=True)
    metrics["train/skipped_reader_round"] = 0.0

    def sampler_gap(trainer_logps: Callable[[], list[torch.Tensor]]) -> dict[str, float]:
        gap = sampler_logprob_gap([s.sampler_logprobs for s in samples], trainer_logps())
        engine.check_gap(gap, where)  # the server sampled: was it the policy being trained?
        return {"rollout/sampler_logprob_gap": gap}

    scored = score_samples(
        agent.policy, rows, update, scoring, round_samples=round_samples, seed=seed, clock=clock,
        on_phase=on_phase, sampler_gap=None if engine is None else sampler_gap,
    )
    return Round(out, scored.batches, {**metrics, **scored.metrics}, scored.nonfinite)


@dataclass
class Optimisation:
    """How a mini-batch's gradients become a step: the optimiser over ``params``, its schedule
    (None: stepped elsewhere, e.g. once per round), the clipping norm, the ``backward`` to call
    (Lightning's ``manual_backward`` in the module) and a mixed-precision grad scaler's current
    scale (1: none; with a scaler, ``check_grad_norm`` is False and the scaler skips overflows)."""

    optimizer: Any
    params: list[torch.nn.Parameter]
    grad_clip: float
    scheduler: Any = None
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward
    grad_scale: float = 1.0
    check_grad_norm: bool = True


@dataclass
class StepResult:
    """A trained mini-batch: the loss metrics, the gradient norm before clipping (NaN when the
    loss was non-finite) and what was non-finite (None: the optimiser stepped)."""

    metrics: dict[str, float]
    grad_norm: float
    problem: str | None


def train_minibatch(
    policy,
    batch: GRPOBatch,
    update: UpdateSettings,
    scoring: ScoringSpec,
    ranks: Ranks,
    optimisation: Optimisation,
    *,
    max_response_len: int,
    clock: Clock = no_clock,
) -> StepResult:
    """One optimiser step on one mini-batch: the clipped GRPO loss micro-batch by micro-batch
    (:func:`~memalpha.train.actor.accumulate_grpo_gradients`), its gradients, then clip and step
    (:func:`~memalpha.grpo.update.optimizer_step`), or drop them when a rank's loss or the
    gradient norm is non-finite.

    The loss is normalised by the mini-batch's response tokens and rows averaged over the ranks:
    data parallelism averages gradients, so the global token mean needs the mean count.
    ``max_response_len`` is the response cap (the constant of ``seq-mean-token-sum-norm``).
    """
    token_normaliser = max(ranks.mean_over_ranks(float(batch.response_tokens)), 1.0)
    seq_normaliser = ranks.mean_over_ranks(float(len(batch)))
    optimisation.optimizer.zero_grad(set_to_none=True)
    with clock("gradients"):
        metrics, finite = accumulate_grpo_gradients(
            policy, batch, update, scoring, max_response_len=max_response_len,
            token_normaliser=token_normaliser, seq_normaliser=seq_normaliser, backward=optimisation.backward,
            grad_scale=optimisation.grad_scale,
        )
    grad_norm, problem = apply_gradients(optimisation, ranks, finite, clock)
    return StepResult(metrics, grad_norm, problem)


def apply_gradients(
    optimisation: Optimisation, ranks: Ranks, finite: bool, clock: Clock = no_clock
) -> tuple[float, str | None]:
    """Clip and step (:func:`~memalpha.grpo.update.optimizer_step`) the gradients a backward left,
    unless a rank's loss (``finite`` False on any rank) or the gradient norm is non-finite: then
    they are dropped. ``(gradient norm before clipping, what was non-finite or None)``; GRPO's
    mini-batches and SFT's batches end here alike."""
    finite = ranks.all_finite(finite)  # every rank must agree to skip, or data-parallel ranks diverge
    with clock("optimizer"):
        grad_norm = optimizer_step(
            optimisation.optimizer, optimisation.params, finite=finite, grad_clip=optimisation.grad_clip,
            scheduler=optimisation.scheduler, check_grad_norm=optimisation.check_grad_norm,
        )
    if not finite:
        return grad_norm, "loss"
    if optimisation.check_grad_norm and not math.isfinite(grad_norm):
        return grad_norm, "grad norm"
    return grad_norm, None
