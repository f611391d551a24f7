"""GRPOModule: the LoRA/QLoRA memory-agent policy trained with GRPO under Lightning.

The module holds the Lightning hooks and nothing of the step itself: ``training_step`` calls
:meth:`~memalpha.train.step.GRPOStep.train_next` (free of Lightning: the round, its mini-batches, the skip
policy) and logs what it returns. Its other jobs are callbacks of their own, which
:meth:`GRPOModule.configure_callbacks` hands to the trainer: the vLLM engine's lifecycle
(:class:`~memalpha.train.engine_sync.EngineSync`, with ``rollout.backend: vllm``) and validation's
report (:class:`~memalpha.train.validation_report.ValidationReporter`). The step's unserved
mini-batches go into the checkpoint with every rank's own, so a resumed run trains exactly what the
interrupted one would have. docs/architecture.md, "One training step", walks through a step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from memalpha.agent.answering import AnswerAgent
from memalpha.agent.progress import Phase
from memalpha.agent.prompt_budget import check_prompt_budget
from memalpha.agent.reading import read_instances
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, RolloutOutput
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.memory_records import MEMORY
from memalpha.data.schema import DataValidationError, Instance, question_evidence
from memalpha.grpo.batch import GRPOBatch
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.lm.core.adapters import load_reference_adapter
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME, load_tokenizer, resolve_model_path
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.lm.sampling.backend import announce_backends
from memalpha.reader.settings import ReaderSettings
from memalpha.seeding import stable_seed
from memalpha.train.agent_factory import build_agent
from memalpha.train.engine_sync import EngineSync
from memalpha.train.policy_module import PolicyModule, typed
from memalpha.train.predict_writer import PredictionWriter
from memalpha.train.settings_loader import AgentSettings, TrainingSettings
from memalpha.train.step import GRPOStep, ReaderGate
from memalpha.train.step_faults import phase_out_of_memory
from memalpha.train.validation_report import ValidationReporter, describe_backends

EXPERIENCE_KEY = "memalpha_experience"
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
        self.reward_settings: RewardSettings = typed(RewardSettings, reward)
        self.update_settings: UpdateSettings = typed(UpdateSettings, update)
        self.agent_settings = AgentSettings(  # the rules between the groups: one line each, before any load
            model, self.lm_settings, self.lora_settings, self.rollout_settings, self.reader_settings,
            self.reward_settings,
        )  # fmt: skip
        TrainingSettings(self.agent_settings, adapter_path, self.update_settings)
        self.logprob_spec: LogprobSpec | None = None  # how log-probs are computed, set with the policy
        self.agent: Agent | AnswerAgent | None = None  # the policy, its reader and settings; set with it
        self.engine = (  # rollout.backend: vllm: the server, checked at setup, started at the first rollout
            EngineSync(self.rollout_settings, model, self.lora_settings.r)
            if self.rollout_settings.backend == "vllm"
            else None
        )
        self.grpo_step = GRPOStep(
            self.update_settings, ReaderGate(self.reader_settings), engine=self.engine, seed=seed,
            log_text_every=log_text_every_n_steps,
        )
        self.validation_report = ValidationReporter(self.reader_settings.max_failed_share)
        self._step_start = time.perf_counter()
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
        if self.rollout_settings.trains == "answer":
            if stage == "predict":
                raise ValueError(
                    "rollout.trains: answer trains the answer agent; memalpha predict answers with a trained "
                    "one as reader.adapter_path"
                )
            for source, instances in splits:
                for index, instance in enumerate(instances):
                    if MEMORY not in instance.metadata:
                        raise DataValidationError(
                            source, "no memory: rollout.trains: answer reads memories an agent wrote (the "
                            "memories layout: memalpha predict outputs)", index=index,
                            instance_id=instance.instance_id, field="memory",
                        )
            return  # the reader's k_reduction fits each answer prompt to its budget
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
            self.logprob_spec = LogprobSpec(
                temperature=self.rollout_settings.temperature,
                micro_batch_size=self.update_settings.micro_batch_size,
                pad_id=self.tokenizer.pad_token_id,
                share_prefix=self.lm_settings.share_prefix,
            )
            sampler = None if self.engine is None else self.engine.sampler(self.policy, self.tokenizer)
            self.agent = build_agent(
                self.agent_settings, self.policy, self.tokenizer, sampler=sampler,
                engine_endpoint=self._engine_endpoint(),
            )
            self.grpo_step.agent, self.grpo_step.logprob_spec = self.agent, self.logprob_spec
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

    def _engine_endpoint(self) -> tuple[str, str, str] | None:
        """Where ``reader.kind: engine`` sends its questions: the engine's server, base model."""
        if self.reader_settings.kind != "engine":
            return None
        server = self.engine.start().server
        return server.base_url + "/v1", server.served_name, resolve_model_path(self.hparams.model)

    def configure_callbacks(self):
        """The module's jobs that are callbacks of their own: validation's report, with
        ``rollout.backend: vllm`` the engine's lifecycle, and when predicting the
        :class:`~memalpha.train.predict_writer.PredictionWriter` of ``data.predict.output``."""
        callbacks: list[Callback] = [self.validation_report]
        if self.engine is not None:
            callbacks.append(self.engine)
        if self._trainer is not None and self.trainer.state.fn == TrainerFn.PREDICTING:
            callbacks.append(PredictionWriter())
        return callbacks

    # ---------------------------------------------------- checkpoint content
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep only the adapter weights, and add every rank's unserved mini-batches.

        Lightning calls this on every rank and writes rank 0's dictionary, so under data
        parallelism the ranks' buffers are gathered first (a collective: every rank takes part).
        """
        super().on_save_checkpoint(checkpoint)
        mine = [batch.state_dict() for batch in self.grpo_step.experience]
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1:
            per_rank: list[Any] = [None] * world
            torch.distributed.all_gather_object(per_rank, mine)
        else:
            per_rank = [mine]
        checkpoint[EXPERIENCE_KEY] = {"per_rank": per_rank}
        checkpoint[SKIPPED_ROUNDS_KEY] = self.grpo_step.reader_gate.skipped_in_a_row

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore this rank's unserved mini-batches (dropped, with a warning, if the world size changed)."""
        super().on_load_checkpoint(checkpoint)
        self.grpo_step.reader_gate.skipped_in_a_row = int(checkpoint.get(SKIPPED_ROUNDS_KEY, 0))
        per_rank = checkpoint.get(EXPERIENCE_KEY, {}).get("per_rank", [])
        world = self.trainer.world_size if self._trainer is not None else 1
        rank = self.global_rank
        if len(per_rank) == world:
            self.grpo_step.experience = [GRPOBatch(**state) for state in per_rank[rank]]
        else:
            self.grpo_step.experience = []
            if any(per_rank):
                rank_zero_warn(
                    f"the checkpoint holds unserved mini-batches of {len(per_rank)} ranks but this run has "
                    f"{world}; they are dropped and training continues with the next round"
                )

    # ----------------------------------------------------------- phases
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

    def training_step(self, dataloader_iter: Iterator) -> None:
        """One optimiser step on one mini-batch (:meth:`~memalpha.train.step.GRPOStep.train_next`; a new round
        is rolled out, with the latest weights, when none is left), then its metrics logged.

        A step skipped for a non-finite value still logs ``train/skipped_nonfinite`` (1) and
        counts towards ``optimizer.max_consecutive_nonfinite``; it does not count towards
        ``trainer.max_steps`` (Lightning counts optimiser steps). A round with too many failed
        reader answers stops the run or is skipped (``reader.on_failed_round``); running out of
        memory stops it naming the phase (:mod:`memalpha.train.step_faults`). When the stream has
        served its ``data.epochs`` rounds the step trains nothing and stops the run. Under
        ``optimizer.schedule_unit: round`` the learning rate moves once a round is spent, after the
        step is logged (the logged rate is the one the round trained with).
        """
        self._step_start = time.perf_counter()  # step_s: this step's own seconds, not a load or a validation
        scheduler = self.lr_schedulers()
        per_round = self.optimizer_settings.schedule_unit == "round"
        with self._out_of_memory_names_the_phase(f"global step {self.global_step + 1}"):
            step = self.grpo_step.train_next(
                dataloader_iter, self.optimisation(None if per_round else scheduler), self,
                global_step=self.global_step, rank=self.global_rank, on_phase=self._enter_phase,
                count_nonfinite=self.count_nonfinite,
            )
        if step.stream_ended:  # every rank ends here
            self.trainer.should_stop = True
            return
        n = step.samples
        logged = {**step.metrics, "lr": self.optimizers().param_groups[0]["lr"], **step.round_metrics}
        self.log_dict(logged, on_step=True, on_epoch=False, batch_size=n)
        self.log("step_s", time.perf_counter() - self._step_start, prog_bar=True, on_step=True, batch_size=n)
        for name in ("reward", "tool_success"):  # on a round's first step
            if f"train/{name}" in step.round_metrics:
                value = step.round_metrics[f"train/{name}"]
                self.log(name, value, prog_bar=True, on_step=True, batch_size=n, logger=False)
        if step.text is not None:
            self._log_text("rollout/sample", step.text)
        if per_round and step.round_spent:
            scheduler.step()

    def _log_text(self, tag: str, text: str) -> None:
        for logger in self.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(tag, text, global_step=self.global_step)

    # ------------------------------------------------------------- validation
    def validation_step(self, batch: list[Instance], batch_idx: int) -> RolloutOutput:
        """One greedy rollout per instance; the :class:`~memalpha.train.validation_report.ValidationReporter`
        collects what it returns."""
        resumed = self.validation_report.resumed(batch_idx, batch)  # a killed `memalpha validate` ran it
        if resumed is not None:
            return resumed
        seed = stable_seed(self.hparams.seed, "validation", batch_idx)
        where = f"validation batch {batch_idx} at global step {self.global_step}"
        with self._out_of_memory_names_the_phase(where):
            return self.agent.rollouts(
                batch, seed=seed, do_sample=False, group_size=1, on_phase=self._enter_phase
            )

    # ------------------------------------------------------------- prediction
    def predict_step(self, batch: list[Instance], batch_idx: int) -> list[dict[str, Any]]:
        """``memalpha predict``: read a batch of instances greedily (the agent memorises each,
        the reader answers its questions) and return one record per instance, which the
        :class:`~memalpha.train.predict_writer.PredictionWriter` appends to ``data.predict.output``.
        Memory ids are seeded by ``model.seed`` and the instance alone, so a resumed or
        re-batched run writes the same records."""
        with self._out_of_memory_names_the_phase(f"predict batch {batch_idx}"):
            readings = read_instances(self.agent, batch, seed=self.hparams.seed, on_phase=self._enter_phase)
        return [reading.record() for reading in readings]
