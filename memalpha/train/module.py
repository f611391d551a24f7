"""GRPOModule: the LoRA/QLoRA memory-agent policy trained with GRPO under Lightning.

The step itself is :mod:`memalpha.train.step`, free of Lightning; this module is its glue.
``training_step`` owns the experience buffer: when it is empty the next
:class:`~memalpha.train.datamodule.InstanceRound` is collected
(:func:`~memalpha.train.step.collect_round`), and every step trains one of the round's
mini-batches (:func:`~memalpha.train.step.train_minibatch`). Unserved mini-batches go into the
checkpoint with every rank's own, so a resumed run trains exactly what the interrupted one would
have. docs/architecture.md, "One training step", walks through a step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from memalpha.agent.progress import Phase
from memalpha.agent.prompt_budget import check_prompt_budget
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import RolloutRecord
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import Instance, question_evidence
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME, load_tokenizer, resolve_model_path
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.lm.core.reference import load_reference_adapter
from memalpha.lm.sampling.backend import announce_backends
from memalpha.lm.scoring.spec import ScoringSpec
from memalpha.reader.base import Reader
from memalpha.reader.settings import ReaderSettings
from memalpha.seeding import stable_seed
from memalpha.train.engine_sync import EngineSync
from memalpha.train.policy_module import PolicyModule, typed
from memalpha.train.predict_writer import PredictionWriter
from memalpha.train.round_report import rollout_text
from memalpha.train.step import Agent, collect_round, train_minibatch
from memalpha.train.step_faults import (
    ReaderFailureError,
    ReaderFailures,
    ReaderGate,
    phase_out_of_memory,
    validation_refusal,
)
from memalpha.train.validation_report import (
    describe_backends,
    scoring_settings,
    summarise_records,
    write_validation_report,
)

EXPERIENCE_KEY = "memalpha_experience"
VALIDATION_SECONDS = ("policy_s", "reader_s", "policy_cpu_s", "reader_cpu_s")
"""A validation report's ``seconds``: wall and process CPU seconds of the policy's turns and the reader."""
SKIPPED_ROUNDS_KEY = "memalpha_reader_skipped_rounds"


class GRPOModule(PolicyModule):
    """Memory-agent policy trained with GRPO.

    Args:
        model: ``smollm2-135m-instruct`` (the embedded default), a local folder, or a hub id such as
            ``Qwen/Qwen3-4B``.
        adapter_path: A PEFT adapter folder to start from instead of a fresh adapter.
        lm: How the base model is loaded and run (precision, NF4 compute dtype, gradient
            checkpointing, shared-prefix computation).
        lora: LoRA adapter shape (rank, alpha, dropout, target modules; ``all-linear`` for every linear
            layer).
        rollout: How the agent generates (group size, lengths, sampling, call format, memory view).
        reader: Who answers the questions from memory (the local base weights or an OpenAI-compatible
            endpoint).
        reward: The reward's weights, content judge and per-source answer metrics.
        update: Advantages, the clipped loss with KL, PPO epochs, mini- and micro-batches.
        optimizer: Optimiser, learning rate, warm-up and gradient clipping.
        log_text_every_n_steps: Every N optimiser steps one rollout (chunks' responses, tool results,
            final memory) goes to TensorBoard as text (0 disables).
        export_adapter_dir: Where the final adapter is saved as a PEFT folder (default:
            ``<log_dir>/adapter``).
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
            raise ValueError(
                f"log_text_every_n_steps must be >= 0 (0 disables), got {log_text_every_n_steps}"
            )
        self.save_hyperparameters()
        self._init_policy(lm, lora, optimizer)
        self.rollout_settings: RolloutSettings = typed(RolloutSettings, rollout)
        self.reader_settings: ReaderSettings = typed(ReaderSettings, reader)
        if self.reader_settings.kind == "engine" and self.rollout_settings.backend != "vllm":
            raise ValueError(
                "reader.kind: engine answers from the rollout backend's vLLM server:"
                " set rollout.backend: vllm"
            )
        self.reward_settings: RewardSettings = typed(RewardSettings, reward)
        if self.reader_settings.kind == "extractive" and self.reward_settings.content_judge == "llm":
            raise ValueError(
                "reward.content_judge: llm asks the reader, and reader.kind: extractive has no model "
                "to judge with: use content_judge: rule or a language-model reader"
            )
        self.update_settings: UpdateSettings = typed(UpdateSettings, update)
        self.reader: Reader | None = None
        self.content_judge = None
        self.scoring: ScoringSpec | None = None  # how log-probs are computed, set with the policy
        self.experience: list[GRPOBatch] = []  # this rank's unserved mini-batches of the current round
        self._val_records: list[RolloutRecord] = []
        self._val_seconds = dict.fromkeys(VALIDATION_SECONDS, 0.0)
        self._step_start = time.perf_counter()
        self.engine_sync: EngineSync | None = None  # rollout.backend: vllm (started at the first rollout)
        self.reader_gate = ReaderGate(self.reader_settings)  # refuses rounds of failed reader answers
        self._phase = "sampling"  # the phase of the step now running (named if it runs out of memory)
        self.backends: dict[str, str] = {}  # the decoding backend of the policy and the local reader

    # ----------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        """Check the DataModule's instances against the prompt budget, with the policy's tokenizer
        only, and, for a credit scheme that pays turn by turn, that every training
        question knows its evidence chunks: Lightning sets the DataModule up first and loads the
        model after this (``configure_model``), so a chunk that cannot fit or a question without
        evidence stops the run before the model costs anything."""
        datamodule = getattr(self.trainer, "datamodule", None)
        splits = datamodule.loaded_splits() if hasattr(datamodule, "loaded_splits") else []
        if not splits:
            return
        tokenizer = self.tokenizer or load_tokenizer(self.hparams.model)
        full_core = stage == "predict"  # no memory the agent writes may stop a prediction half-way
        for source, instances in splits:
            check_prompt_budget(instances, tokenizer, self.rollout_settings, source, full_core=full_core)
        if stage == "fit" and self.update_settings.credit_scheme.needs_evidence:
            for source, instances in splits:
                if source.startswith(("data.train_path", "synthetic train")):
                    for index, instance in enumerate(instances):
                        question_evidence(instance, file=source, index=index)

    def configure_model(self) -> None:
        if self._predicts_nothing():
            return
        if self.load_policy():
            if self.update_settings.kl_reference == "start" and self.hparams.adapter_path:
                load_reference_adapter(self.policy, self.hparams.adapter_path)
            backend = self.rollout_settings.backend
            self.reader = self.reader_settings.build(
                self.policy, self.tokenizer, self.rollout_settings.templates, self._engine_endpoint(),
                backend=backend,
            )
            self.content_judge = self.reward_settings.build_content_judge(self.reader)
            self.scoring = ScoringSpec(
                temperature=self.rollout_settings.temperature,
                micro_batch_size=self.update_settings.micro_batch_size,
                pad_id=self.tokenizer.pad_token_id,
                share_prefix=self.lm_settings.share_prefix,
            )
            self.backends = announce_backends(
                self.policy, backend, reader_samples_here=self.reader_settings.kind == "local"
            )
            if self.global_rank == 0:  # the run's record of what sampled (a failed capture stops it)
                self._log_text("run/backends", describe_backends(self.backends))

    def _predicts_nothing(self) -> bool:
        """Whether this is ``memalpha predict`` in one process with every instance recorded already
        (a finished run started again): then no model needs to load."""
        trainer = self._trainer
        if trainer is None or trainer.state.fn != TrainerFn.PREDICTING or trainer.world_size != 1:
            return False
        return not getattr(trainer.datamodule, "predict_pending", True)

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
        checkpoint[SKIPPED_ROUNDS_KEY] = self.reader_gate.skipped_in_a_row

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore this rank's unserved mini-batches (dropped, with a warning, if the world size changed)."""
        super().on_load_checkpoint(checkpoint)
        self.reader_gate.skipped_in_a_row = int(checkpoint.get(SKIPPED_ROUNDS_KEY, 0))
        per_rank = checkpoint.get(EXPERIENCE_KEY, {}).get("per_rank", [])
        world = self.trainer.world_size if self._trainer is not None else 1
        rank = self.global_rank
        if len(per_rank) == world:
            self.experience = [GRPOBatch(**state) for state in per_rank[rank]]
        else:
            self.experience = []
            if any(per_rank):
                rank_zero_warn(
                    f"the checkpoint holds unserved mini-batches of {len(per_rank)} ranks but this run has "
                    f"{world}; they are dropped and training continues with the next round"
                )

    # ----------------------------------------------------------- experience
    def _engine_sync(self) -> EngineSync | None:
        """The vLLM server of ``rollout.backend: vllm`` (made at the first call), else None."""
        if self.rollout_settings.backend != "vllm":
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

    def _engine_endpoint(self) -> tuple[str, str, str] | None:
        """Where ``reader.kind: engine`` sends its questions: the engine's server, base model."""
        if self.reader_settings.kind != "engine":
            return None
        server = self._engine_sync().start().server
        return server.base_url + "/v1", server.served_name, resolve_model_path(self.hparams.model)

    def configure_callbacks(self):
        """With ``rollout.backend: vllm``, :class:`EngineShutdown`; when predicting, the
        :class:`~memalpha.train.predict_writer.PredictionWriter` of ``data.predict.output``."""
        callbacks: list[Callback] = [EngineShutdown()] if self.rollout_settings.backend == "vllm" else []
        if self._trainer is not None and self.trainer.state.fn == TrainerFn.PREDICTING:
            callbacks.append(PredictionWriter())
        return callbacks

    def teardown(self, stage: str) -> None:
        if self.engine_sync is not None:
            self.engine_sync.close()
            self.engine_sync = None

    def agent(self) -> Agent:
        """The memory agent of this module's policy, reader and settings."""
        return Agent(
            self.policy, self.tokenizer, self.reader, self.rollout_settings, self.reward_settings,
            self.content_judge, share_prefix=self.lm_settings.share_prefix,
        )

    def _enter_phase(self, phase: Phase) -> None:
        self._phase = phase.name
        bar = self._trainer.progress_bar_callback if self._trainer is not None else None
        show = getattr(bar, "show_phase", None)
        if show is not None:
            show(phase)

    def _out_of_memory_names_the_phase(self, where: str):
        """Running out of memory inside the block stops the run with one line naming the phase."""
        return phase_out_of_memory(lambda: self._phase, where, self.device)

    # --------------------------------------------------------------- training
    def schedule_rounds(self) -> tuple[int | None, int | None]:
        """The run's rounds (``data.epochs``) and, without ``update.mini_batch_size``, the fixed
        optimiser steps of a round, for ``optimizer.schedule_unit: round``."""
        datamodule = getattr(self.trainer, "datamodule", None)
        rounds = datamodule.total_rounds() if hasattr(datamodule, "total_rounds") else None
        update = self.update_settings
        return (
            rounds,
            None if update.mini_batch_size is not None else update.ppo_epochs * update.num_mini_batches,
        )

    def _end_round(self, scheduler) -> None:
        """Under ``optimizer.schedule_unit: round`` the learning rate moves once a round is spent."""
        if self.optimizer_settings.schedule_unit == "round" and not self.experience:
            scheduler.step()

    def training_step(self, dataloader_iter: Iterator) -> None:
        """One optimiser step on one mini-batch; a new round is rolled out (with the latest weights) when none
        is left.

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
            collected = collect_round(
                self.agent(), round_.instances, self.update_settings, self.scoring, self,
                seed=stable_seed(self.hparams.seed, "round", round_.index, self.global_rank),
                where=f"rollout round {round_.index} (global step {self.global_step})",
                engine=self._engine_sync(), reader_gate=self.reader_gate, on_phase=self._enter_phase,
            )
            self.experience, round_metrics_ = collected.batches, collected.metrics
            problem = collected.nonfinite
            every = self.hparams.log_text_every_n_steps
            if every > 0 and self.global_rank == 0 and self.global_step % every == 0:
                text = rollout_text(collected.out.records[0])
            if collected.refused:  # every rank refused it alike (the failures were summed over the ranks)
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
        self._enter_phase(Phase("update"))
        start = time.perf_counter()
        scheduler = self.lr_schedulers()
        per_round = self.optimizer_settings.schedule_unit == "round"
        result = train_minibatch(
            self.policy, batch, self.update_settings, self.scoring, self,
            self.optimisation(None if per_round else scheduler),
            max_response_len=self.rollout_settings.max_new_tokens,
        )
        self.count_nonfinite(result.problem)
        if result.problem is None and self.engine_sync is not None:
            self.engine_sync.policy_changed()  # the next round's server sync exports this adapter
        logged = {f"train/{key}": value for key, value in result.metrics.items() if key != "tokens"}
        logged.update(
            {
                "train/grad_norm": result.grad_norm,
                "train/skipped_nonfinite": float(result.problem is not None),
                "perf/train_s": time.perf_counter() - start,
            }
        )
        self._log_step(logged, round_metrics_, text, len(batch))
        self._end_round(scheduler)  # after logging: the logged lr is the one the round trained with

    def _log_step(
        self, logged: dict[str, float], round_metrics_: dict[str, float], text: str | None, n: int
    ) -> None:
        """Log a step's metrics, the learning rate, its round's metrics (on a round's first step) and text."""
        logged = {**logged, "lr": self.optimizers().param_groups[0]["lr"], **round_metrics_}
        self.log_dict(logged, on_step=True, on_epoch=False, batch_size=n)
        self.log("step_s", time.perf_counter() - self._step_start, prog_bar=True, on_step=True, batch_size=n)
        for name in ("reward", "tool_success"):  # on a round's first step
            if f"train/{name}" in round_metrics_:
                value = round_metrics_[f"train/{name}"]
                self.log(name, value, prog_bar=True, on_step=True, batch_size=n, logger=False)
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
        self._val_seconds = dict.fromkeys(VALIDATION_SECONDS, 0.0)

    def validation_step(self, batch: list[Instance], batch_idx: int) -> None:
        seed = stable_seed(self.hparams.seed, "validation", batch_idx)
        where = f"validation batch {batch_idx} at global step {self.global_step}"
        sync = self._engine_sync()
        with self._out_of_memory_names_the_phase(where):
            out = self.agent().rollouts(
                batch, seed=seed, greedy=True, on_phase=self._enter_phase,
                sampler=None if sync is None else sync.generator(self.policy, self.tokenizer),
            )
        self._val_records.extend(out.records)
        for name, value in (("policy_s", out.rollout_s), ("reader_s", out.reader_s),
                            ("policy_cpu_s", out.rollout_cpu_s), ("reader_cpu_s", out.reader_cpu_s)):
            self._val_seconds[name] += value

    def on_validation_epoch_end(self) -> None:
        records, seconds = self._val_records, [self._val_seconds]
        if self.trainer.world_size > 1:
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, (records, self._val_seconds))
            records = [r for part, _ in gathered for r in part]
            seconds = [s for _, s in gathered]
        summary = {
            **summarise_records(records),
            "backends": self.backends,
            "seconds": {name: sum(s[name] for s in seconds) for name in VALIDATION_SECONDS},
            "settings": scoring_settings(
                self.hparams.model, self.reader_settings, self.reward_settings,
                self.rollout_settings.templates,
            ),
        }
        overall = summary["overall"]
        where = f"validation at global step {self.global_step}"
        refusal = validation_refusal(ReaderFailures.of(records), self.reader_settings.max_failed_share, where)
        if refusal is not None:  # a reader outage is no score: the report says so, nothing is logged
            summary["invalid"] = refusal
        else:
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
        if refusal is not None:  # every rank: the records were gathered, so all refuse alike
            raise ReaderFailureError(refusal)

    # ------------------------------------------------------------- prediction
    def predict_step(self, batch: list[Instance], batch_idx: int) -> list[dict[str, Any]]:
        """``memalpha predict``: read a batch of instances greedily (the agent memorises each,
        the reader answers its questions) and return one record per instance, which the
        :class:`~memalpha.train.predict_writer.PredictionWriter` appends to ``data.predict.output``.
        Memory ids are seeded by ``model.seed`` and the instance alone, so a resumed or
        re-batched run writes the same records."""
        sync = self._engine_sync()
        with self._out_of_memory_names_the_phase(f"predict batch {batch_idx}"):
            readings = self.agent().read(
                batch, seed=self.hparams.seed, on_phase=self._enter_phase,
                sampler=None if sync is None else sync.generator(self.policy, self.tokenizer),
            )
        return [reading.record() for reading in readings]


class EngineShutdown(Callback):
    """Stops the run's vLLM server when ``fit`` or ``validate`` fails: Lightning calls a module's
    ``teardown`` only when the run ends normally, and a started server must not outlive its run
    (for a run inside a longer-lived process; at interpreter exit it is stopped anyway)."""

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        sync = getattr(pl_module, "engine_sync", None)
        if sync is not None:
            sync.close()
            pl_module.engine_sync = None
