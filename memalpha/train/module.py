"""GRPOModule: the LoRA/QLoRA memory-agent policy trained with GRPO under Lightning.

``training_step`` owns the experience buffer. When it is empty, the step takes the next
:class:`~memalpha.train.datamodule.InstanceRound` from the DataModule's stream and rolls it
out with the current policy (:func:`~memalpha.agent.rollout.run_rollouts`); the rewards become
group-relative advantages, the reference (and, for several steps per round, old-policy)
log-probs are computed once, and :func:`~memalpha.grpo.batch.cut_minibatches` cuts the round
into the mini-batches of its optimiser steps. Every step then trains one mini-batch: the
micro-batched clipped GRPO update with a k3 KL penalty to the reference (the same base weights
with the adapters disabled, or the frozen starting adapter: ``update.kl_reference``). Unserved mini-batches go into the checkpoint with every rank's
own, so a resumed run trains exactly what the interrupted one would have. A round whose rewards
or reference/old log-probs hold a NaN or an infinity is dropped whole (on every rank) and its
step skipped, as is a step whose loss or gradient norm is non-finite (``docs/metrics_and_rewards.md``).

Before any model loads (:meth:`GRPOModule.setup`) every loaded instance's chunks are checked
against the prompt budget (:func:`~memalpha.agent.prompt_budget.check_prompt_budget`). While a
step runs its phases go to the progress bar, when it shows them
(:class:`~memalpha.train.progress_bar.StepProgressBar`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_warn

from memalpha.agent.progress import Phase, PhaseHook, report
from memalpha.agent.prompt_budget import check_prompt_budget
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import RolloutOutput, RolloutRecord, RolloutSettings, run_rollouts
from memalpha.data.schema import Instance
from memalpha.grpo.advantages import group_advantages
from memalpha.grpo.batch import GRPOBatch, cut_minibatches
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import first_nonfinite
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME, load_tokenizer, resolve_model_path
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.lm.core.reference import load_reference_adapter, reference_weights
from memalpha.lm.sampling.backend import announce, choose_backend
from memalpha.lm.sampling.generation import generate
from memalpha.lm.scoring.logprobs import response_logprobs
from memalpha.lm.scoring.spec import ScoringSpec
from memalpha.reader.base import Reader
from memalpha.reader.settings import ReaderSettings
from memalpha.seeding import stable_seed
from memalpha.train.actor import accumulate_grpo_gradients
from memalpha.train.datamodule import InstanceRound
from memalpha.train.engine_sync import EngineShutdown, EngineSync, check_versions, sampler_logprob_gap
from memalpha.train.policy_module import PolicyModule, typed
from memalpha.train.round_report import rollout_text, round_metrics
from memalpha.train.step_faults import (
    ReaderFailures,
    SkippedRounds,
    check_reader_failures,
    phase_out_of_memory,
)
from memalpha.train.validation_report import summarise_records, write_validation_report

EXPERIENCE_KEY = "memalpha_experience"
SKIPPED_ROUNDS_KEY = "memalpha_reader_skipped_rounds"


class RoundExperience(NamedTuple):
    """A rolled-out round: its mini-batches in training order (none when ``nonfinite`` or
    ``refused``), its metrics, sometimes one rollout as text, what was non-finite (None when all
    was finite), and whether it was refused for its reader's failures (``reader.on_failed_round: skip``)."""

    batches: list[GRPOBatch]
    metrics: dict[str, float]
    text: str | None
    nonfinite: str | None
    refused: bool = False


class GRPOModule(PolicyModule):
    """Memory-agent policy trained with GRPO.

    Args:
        model: ``smollm2-135m-instruct`` (the embedded default), a local folder, or a hub id such as ``Qwen/Qwen3-4B``.
        adapter_path: A PEFT adapter folder to start from instead of a fresh adapter.
        lm: How the base model is loaded and run (precision, NF4 compute dtype, gradient
            checkpointing, shared-prefix computation).
        lora: LoRA adapter shape (rank, alpha, dropout, target modules; ``all-linear`` for every linear layer).
        rollout: How the agent generates (group size, lengths, sampling, call format, memory view).
        reader: Who answers the questions from memory (the local base weights or an OpenAI-compatible endpoint).
        reward: The reward's weights, content judge and per-source answer metrics.
        update: Advantages, the clipped loss with KL, PPO epochs, mini- and micro-batches.
        optimizer: Optimiser, learning rate, warm-up and gradient clipping.
        log_text_every_n_steps: Every N optimiser steps one rollout (chunks' responses, tool results,
            final memory) goes to TensorBoard as text (0 disables).
        export_adapter_dir: Where the final adapter is saved as a PEFT folder (default: ``<log_dir>/adapter``).
        seed: Seed of rollout sampling, memory ids and the reshuffles of PPO epochs.
    """

    def __init__(
        self,
        model: str = EMBEDDED_MODEL_NAME,
        adapter_path: str | None = None,
        lm: LMSettings = LMSettings(),  # noqa: B008 - value objects; jsonargparse shows their fields
        lora: LoraSettings = LoraSettings(),  # noqa: B008
        rollout: RolloutSettings = RolloutSettings(),  # noqa: B008
        reader: ReaderSettings = ReaderSettings(),  # noqa: B008
        reward: RewardSettings = RewardSettings(),  # noqa: B008
        update: UpdateSettings = UpdateSettings(),  # noqa: B008
        optimizer: OptimizerSettings = OptimizerSettings(),  # noqa: B008
        log_text_every_n_steps: int = 10,
        export_adapter_dir: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if log_text_every_n_steps < 0:
            raise ValueError(f"log_text_every_n_steps must be >= 0 (0 disables), got {log_text_every_n_steps}")
        self.save_hyperparameters()
        self._init_policy(lm, lora, optimizer)
        self.rollout_settings: RolloutSettings = typed(RolloutSettings, rollout)
        self.reader_settings: ReaderSettings = typed(ReaderSettings, reader)
        if self.reader_settings.kind == "engine" and self.rollout_settings.engine != "vllm":
            raise ValueError("reader.kind: engine answers from the rollout engine's vLLM server: set rollout.engine: vllm")
        self.reward_settings: RewardSettings = typed(RewardSettings, reward)
        if self.reader_settings.kind == "extractive" and self.reward_settings.content_judge == "llm":
            raise ValueError("reward.content_judge: llm asks the reader, and reader.kind: extractive has no model "
                             "to judge with: use content_judge: rule or a language-model reader")
        self.update_settings: UpdateSettings = typed(UpdateSettings, update)
        self.reader: Reader | None = None
        self.content_judge = None
        self.scoring: ScoringSpec | None = None  # how log-probs are computed, set with the policy
        self.experience: list[GRPOBatch] = []  # this rank's unserved mini-batches of the current round
        self._val_records: list[RolloutRecord] = []
        self._step_start = time.perf_counter()
        self.engine_sync: EngineSync | None = None  # rollout.engine: vllm (started at the first rollout)
        self.skipped_rounds = SkippedRounds()  # rounds refused for failed reader answers, in a row
        self._phase = "sampling"  # the phase of the step now running (named if it runs out of memory)

    # ----------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        """Check the DataModule's instances against the prompt budget, with the policy's tokenizer
        only: Lightning sets the DataModule up first and loads the model after this
        (``configure_model``), so a chunk that cannot fit stops the run before the model costs anything."""
        datamodule = getattr(self.trainer, "datamodule", None)
        splits = datamodule.loaded_splits() if hasattr(datamodule, "loaded_splits") else []
        if not splits:
            return
        tokenizer = self.tokenizer or load_tokenizer(self.hparams.model)
        for source, instances in splits:
            check_prompt_budget(instances, tokenizer, self.rollout_settings, source)

    def configure_model(self) -> None:
        if self.load_policy():
            if self.update_settings.kl_reference == "start" and self.hparams.adapter_path:
                load_reference_adapter(self.policy, self.hparams.adapter_path)
            lm = self.lm_settings
            self.reader = self.reader_settings.build(
                self.policy, self.tokenizer, self.rollout_settings.templates, self._engine_endpoint(),
                sampling_backend=lm.sampling_backend, fold_adapters=lm.fold_adapters_for_sampling,
            )
            self.content_judge = self.reward_settings.build_content_judge(self.reader)
            self.scoring = ScoringSpec(
                temperature=self.rollout_settings.temperature, micro_batch_size=self.update_settings.micro_batch_size,
                pad_id=self.tokenizer.pad_token_id, share_prefix=self.lm_settings.share_prefix,
            )
            if self.rollout_settings.engine != "vllm":  # the policy samples here: say how, or stop now
                announce(self.policy, choose_backend(self.policy, lm.sampling_backend, lm.fold_adapters_for_sampling))

    # ---------------------------------------------------- checkpoint content
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter weights, and add every rank's unserved mini-batches.

        Lightning calls this on every rank and writes rank 0's dictionary, so under data
        parallelism the ranks' buffers are gathered first (a collective: every rank takes part).
        """
        super().on_save_checkpoint(checkpoint)
        mine = [batch.state_dict() for batch in self.experience]
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:
            per_rank: list[Any] = [None] * world
            torch.distributed.all_gather_object(per_rank, mine)
        else:
            per_rank = [mine]
        checkpoint[EXPERIENCE_KEY] = {"per_rank": per_rank}
        checkpoint[SKIPPED_ROUNDS_KEY] = self.skipped_rounds.count

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore this rank's unserved mini-batches (dropped, with a warning, if the world size changed)."""
        super().on_load_checkpoint(checkpoint)
        self.skipped_rounds.count = int(checkpoint.get(SKIPPED_ROUNDS_KEY, 0))
        per_rank = checkpoint.get(EXPERIENCE_KEY, {}).get("per_rank", [])
        world = self.trainer.world_size if self._trainer is not None else 1
        rank = self.global_rank
        if len(per_rank) == world:
            self.experience = [GRPOBatch.from_state_dict(state) for state in per_rank[rank]]
        else:
            self.experience = []
            if any(per_rank):
                rank_zero_warn(
                    f"the checkpoint holds unserved mini-batches of {len(per_rank)} ranks but this run has "
                    f"{world}; they are dropped and training continues with the next round"
                )

    # ----------------------------------------------------------- experience
    def _engine_sync(self) -> EngineSync | None:
        """The vLLM server of ``rollout.engine: vllm`` (made at the first call), else None."""
        if self.rollout_settings.engine != "vllm":
            return None
        if self.engine_sync is None:
            self.engine_sync = EngineSync(
                self.rollout_settings,
                self.hparams.model,
                self.lora_settings.r,
                self.trainer.log_dir or ".",
                tag=f"{stable_seed(time.time_ns())}-rank{self.global_rank}",
            )
        return self.engine_sync

    def _engine(self):
        """With ``rollout.engine: vllm`` the server's generate function, its adapter synced to the policy."""
        sync = self._engine_sync()
        return None if sync is None else sync.generator(self.policy, self.tokenizer)

    def _engine_endpoint(self) -> tuple[str, str, str] | None:
        """Where ``reader.kind: engine`` sends its questions: the engine's server, base model."""
        if self.reader_settings.kind != "engine":
            return None
        server = self._engine_sync().start().server
        return server.base_url + "/v1", server.served_name, resolve_model_path(self.hparams.model)

    def configure_callbacks(self):
        """With ``rollout.engine: vllm``, :class:`~memalpha.train.engine_sync.EngineShutdown`."""
        return [EngineShutdown()] if self.rollout_settings.engine == "vllm" else []

    def teardown(self, stage: str) -> None:
        if self.engine_sync is not None:
            self.engine_sync.close()
            self.engine_sync = None

    def _rollouts(self, instances: Sequence[Instance], *, seed: int, greedy: bool) -> RolloutOutput:
        return run_rollouts(
            instances,
            self.policy,
            self.tokenizer,
            self.reader,
            self.rollout_settings,
            self.reward_settings,
            self.content_judge,
            seed=seed,
            do_sample=not greedy,
            group_size=1 if greedy else None,
            share_prefix=self.lm_settings.share_prefix,
            engine=self._engine() or self._local_sampler(),
            on_phase=self._phase_hook(),
        )

    def _local_sampler(self):
        """The policy's own ``generate`` with the backend and folding of ``model.lm``."""
        return partial(
            generate, self.policy, self.tokenizer, fold_adapters=self.lm_settings.fold_adapters_for_sampling,
            backend=self.lm_settings.sampling_backend,
        )

    def _phase_hook(self) -> PhaseHook:
        """Where the step's phases go: :meth:`_enter_phase`, which keeps the name and hands the
        phase to the progress bar's ``show_phase``, when it has one."""
        return self._enter_phase

    def _enter_phase(self, phase: Phase) -> None:
        self._phase = phase.name
        bar = self._trainer.progress_bar_callback if self._trainer is not None else None
        show = getattr(bar, "show_phase", None)
        if show is not None:
            show(phase)

    def _out_of_memory_names_the_phase(self, where: str):
        """Running out of memory inside the block stops the run with one line naming the phase."""
        return phase_out_of_memory(lambda: self._phase, lambda: where, self.device)

    @torch.no_grad()
    def experience_round(self, round_: InstanceRound) -> RoundExperience:
        """Roll a round out and turn it into mini-batches; a NaN or infinity in its rewards or in its
        reference/old log-probs leaves it without any (its samples cannot be trusted)."""
        seed = stable_seed(self.hparams.seed, "round", round_.index, self.global_rank)
        out = self._rollouts(round_.instances, seed=seed, greedy=False)
        samples = out.samples
        if not samples:
            raise RuntimeError(
                f"rollout round {round_.index} produced no samples from {len(round_.instances)} instances"
            )
        if self.engine_sync is not None:
            check_versions(
                [s.adapter_version for s in samples], self.engine_sync.policy_version, f"rollout round {round_.index}"
            )
        # the round's samples summed over ranks (update.mini_batch_size is global, as verl's), so
        # every rank takes the same number of steps; a collective, before any rank can leave early
        round_samples = round(self.mean_over_ranks(float(len(samples))) * self.trainer.world_size)
        steps_per_epoch = self.update_settings.mini_batches_per_epoch(round_samples)
        if steps_per_epoch > len(samples):
            raise RuntimeError(
                f"rank {self.global_rank} has {len(samples)} samples in round {round_.index}, fewer than the "
                f"{steps_per_epoch} optimiser steps the round takes; raise model.update.mini_batch_size"
                " or lower model.update.num_mini_batches"
            )
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        group_ids = torch.tensor([s.group_id for s in samples])
        metrics = round_metrics(out, rewards, group_ids)
        text = rollout_text(out.records[0]) if self._should_log_text() else None
        if not self._reader_answered(out.records, round_.index):
            metrics["train/skipped_reader_round"] = 1.0
            return RoundExperience([], metrics, text, None, refused=True)
        metrics["train/skipped_reader_round"] = 0.0
        if first_nonfinite({"rewards": rewards}) is not None:
            return RoundExperience([], metrics, text, "rewards")
        prompts = [s.prompt_ids for s in samples]
        responses = [s.response_ids for s in samples]

        report(self._phase_hook(), Phase("logprobs"))
        start = time.perf_counter()
        update = self.update_settings
        ref_logps = old_logps = None
        if update.kl_coef > 0:
            with reference_weights(self.policy):
                ref_logps = response_logprobs(self.policy, prompts, responses, self.scoring)
        if update.needs_old_logps(round_samples):
            old_logps = response_logprobs(self.policy, prompts, responses, self.scoring)
        metrics["perf/ref_old_logprob_s"] = time.perf_counter() - start
        if self.engine_sync is not None:  # the server sampled: was it the policy being trained?
            trainer_logps = (
                old_logps if old_logps is not None
                else response_logprobs(self.policy, prompts, responses, self.scoring)
            )
            gap = sampler_logprob_gap([s.sampler_logprobs for s in samples], trainer_logps)
            metrics["rollout/sampler_logprob_gap"] = gap
            self.engine_sync.check_gap(gap, f"rollout round {round_.index}")
        problem = first_nonfinite({"reference log-probs": ref_logps, "old log-probs": old_logps})
        if problem is not None:
            return RoundExperience([], metrics, text, problem)

        batch = GRPOBatch(
            prompt_ids=prompts,
            response_ids=responses,
            advantages=group_advantages(rewards, group_ids, scale=update.advantage_scale),
            old_logps=old_logps,
            ref_logps=ref_logps,
        )
        batches = cut_minibatches(batch, steps_per_epoch, update.ppo_epochs, seed)
        return RoundExperience(batches, metrics, text, None)

    def _reader_answered(self, records: Sequence[RolloutRecord], index: int) -> bool:
        """Whether few enough of the round's reader answers failed to train on it (summed over the
        ranks, a collective, so every rank decides alike); else stop, or skip and count
        (``reader.max_failed_share``, ``reader.on_failed_round``; :mod:`memalpha.train.step_faults`)."""
        mine = ReaderFailures.of(records)
        world = self.trainer.world_size
        failures = ReaderFailures(
            failed=round(self.mean_over_ranks(float(mine.failed)) * world),
            questions=round(self.mean_over_ranks(float(mine.questions)) * world),
            first_error=mine.first_error,
        )
        where = f"rollout round {index} (global step {self.global_step})"
        settings = self.reader_settings
        answered = check_reader_failures(failures, settings.max_failed_share, settings.on_failed_round, where)
        self.skipped_rounds.update(not answered, where, failures.first_error)
        if not answered:
            rank_zero_warn(
                f"memalpha: {where}: {failures.failed} of {failures.questions} reader answers failed;"
                f" the round is skipped ({self.skipped_rounds.count} in a row). First error: {failures.first_error}"
            )
        return answered

    def _should_log_text(self) -> bool:
        every = self.hparams.log_text_every_n_steps
        return every > 0 and self.global_rank == 0 and self.global_step % every == 0

    # --------------------------------------------------------------- training
    def schedule_rounds(self) -> tuple[int | None, int | None]:
        """The run's rounds (``data.epochs``) and, without ``update.mini_batch_size``, the fixed
        optimiser steps of a round, for ``optimizer.schedule_unit: round``."""
        datamodule = getattr(self.trainer, "datamodule", None)
        rounds = datamodule.total_rounds() if hasattr(datamodule, "total_rounds") else None
        update = self.update_settings
        return rounds, None if update.mini_batch_size is not None else update.ppo_epochs * update.num_mini_batches

    def _end_round(self, scheduler) -> None:
        """Under ``optimizer.schedule_unit: round`` the learning rate moves once a round is spent."""
        if self.optimizer_settings.schedule_unit == "round" and not self.experience:
            scheduler.step()

    def training_step(self, dataloader_iter: Iterator) -> None:
        """One optimiser step on one mini-batch; a new round is rolled out (with the latest weights) when none is left.

        A step skipped for a non-finite value still logs ``train/skipped_nonfinite`` (1) and
        counts towards ``optimizer.max_consecutive_nonfinite``; it does not count towards
        ``trainer.max_steps`` (Lightning counts optimiser steps). A round with too many failed
        reader answers stops the run or is skipped (``reader.on_failed_round``); running out of
        memory stops it naming the phase (:mod:`memalpha.train.step_faults`). When the stream has
        served its ``data.epochs`` rounds the step trains nothing and stops the run.
        """
        with self._out_of_memory_names_the_phase(f"global step {self.global_step + 1}"):
            self._training_step(dataloader_iter)

    def _training_step(self, dataloader_iter: Iterator) -> None:
        self._step_start = time.perf_counter()  # step_s: this step's own seconds, not a load or a validation
        round_metrics_, text, problem = {}, None, None
        if not self.experience:
            try:
                round_, _, _ = next(dataloader_iter)
            except StopIteration:  # the last of data.epochs' rounds is trained: every rank ends here
                self.trainer.should_stop = True
                return
            self.experience, round_metrics_, text, problem, refused = self.experience_round(round_)
            if refused:  # every rank refused it alike (the failures were summed over the ranks)
                untrained = {"train/skipped_nonfinite": 0.0, "train/grad_norm": float("nan")}
                self._log_step(untrained, round_metrics_, text, 1)
                self._end_round(self.lr_schedulers())
                return
        problem = self.agree_on_nonfinite(problem)
        if problem is not None:  # every rank drops its round, so the ranks keep rolling out in step
            self.experience = []
            self.count_nonfinite(problem)
            skipped = {"train/skipped_nonfinite": 1.0, "train/grad_norm": float("nan")}
            self._log_step(skipped, round_metrics_, text, 1)
            self._end_round(self.lr_schedulers())
            return
        batch = self.experience.pop(0)
        report(self._phase_hook(), Phase("update"))
        start = time.perf_counter()
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        n = len(batch)
        # means over all ranks: DDP averages gradients, so the global token mean needs the mean count
        normaliser = max(self.mean_over_ranks(float(batch.response_tokens)), 1.0)
        seq_normaliser = self.mean_over_ranks(float(n))
        optimizer.zero_grad(set_to_none=True)
        metrics, finite = accumulate_grpo_gradients(
            self.policy,
            batch,
            self.update_settings,
            self.scoring,
            max_response_len=self.rollout_settings.max_new_tokens,
            token_normaliser=normaliser,
            seq_normaliser=seq_normaliser,
            backward=self.manual_backward,
            grad_scale=float(self.trainer.scaler.get_scale()) if self.trainer.scaler is not None else 1.0,
        )
        per_round = self.optimizer_settings.schedule_unit == "round"
        grad_norm, problem = self.finish_step(optimizer, None if per_round else scheduler, finite)
        if problem is None and self.engine_sync is not None:
            self.engine_sync.policy_changed()  # the next round's server sync exports this adapter
        logged = {f"train/{key}": value for key, value in metrics.items() if key != "tokens"}
        logged.update(
            {
                "train/grad_norm": grad_norm,
                "train/skipped_nonfinite": float(problem is not None),
                "perf/train_s": time.perf_counter() - start,
            }
        )
        self._log_step(logged, round_metrics_, text, n)
        self._end_round(scheduler)  # after logging: the logged lr is the one the round trained with

    def _log_step(
        self, logged: dict[str, float], round_metrics_: dict[str, float], text: str | None, n: int
    ) -> None:
        """Log a step's metrics, the learning rate, its round's metrics (on a round's first step) and text."""
        logged = {**logged, "lr": self.optimizers().param_groups[0]["lr"], **round_metrics_}
        self.log_dict(logged, on_step=True, on_epoch=False, batch_size=n)
        self.log("step_s", time.perf_counter() - self._step_start, prog_bar=True, on_step=True, batch_size=n)
        if "train/reward" in round_metrics_:
            self.log("reward", round_metrics_["train/reward"], prog_bar=True, on_step=True, batch_size=n, logger=False)
            self.log(
                "tool_success", round_metrics_["train/tool_success"], prog_bar=True, on_step=True, batch_size=n,
                logger=False,
            )
        if text is not None:
            self._log_text("rollout/sample", text)

    def _log_text(self, tag: str, text: str) -> None:
        for logger in self.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(tag, text, global_step=self.global_step)

    # ------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        self._val_records = []

    def validation_step(self, batch: list[Instance], batch_idx: int) -> None:
        seed = stable_seed(self.hparams.seed, "validation", batch_idx)
        where = f"validation batch {batch_idx} at global step {self.global_step}"
        with self._out_of_memory_names_the_phase(where):
            out = self._rollouts(batch, seed=seed, greedy=True)
        self._val_records.extend(out.records)

    def on_validation_epoch_end(self) -> None:
        records = self._val_records
        if self.trainer.world_size > 1:
            gathered: list[list[RolloutRecord]] = [None] * self.trainer.world_size  # type: ignore[list-item]
            torch.distributed.all_gather_object(gathered, records)
            records = [r for part in gathered for r in part]
        summary = summarise_records(records)
        overall = summary["overall"]
        recall = {} if overall["fact_recall"] is None else {"val/fact_recall": overall["fact_recall"]}
        self.log_dict(
            {
                **recall,
                "val/accuracy": overall["accuracy"],
                "val/memory_tokens": overall["memory_tokens"],
                "val/compression": overall["compression"],
                "val/tool_success": overall["tool_success"],
                "val/reader_failures": float(overall["reader_failures"]),
            },
            sync_dist=False,
            rank_zero_only=True,
            batch_size=max(1, overall["questions"]),
        )
        log_dir = Path(self.trainer.log_dir or ".")  # a collective under DDP: every rank must ask
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            name = (
                "validation.json"
                if self.trainer.state.fn == "validate"
                else f"validation_step{self.global_step}.json"
            )
            table = write_validation_report(summary, records, log_dir / name)
            self.print(table)  # through the progress bar, which moves its bars below the table
