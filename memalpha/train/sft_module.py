"""SFTModule: supervised fine-tuning of the LoRA/QLoRA policy on demonstrations (``memalpha sft``).

The cold start before GRPO (``docs/cold_start.md``): the same policy loading, LoRA shape and
optimiser as :class:`~memalpha.train.module.GRPOModule`, a token-mean negative log-likelihood
of the response tokens (:mod:`memalpha.train.sft_loss`), and the adapter exported at the end as the
PEFT folder that ``memalpha fit --model.adapter_path`` starts from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from memalpha.grpo.settings import OptimizerSettings
from memalpha.grpo.update import apply_gradients
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.train.demo_datamodule import TokenizedDemo
from memalpha.train.policy_module import PolicyModule
from memalpha.train.sft_loss import accumulate_sft_gradients, sft_eval


class SFTModule(PolicyModule):
    """The memory-agent policy trained on demonstrations with token cross-entropy.

    Args:
        model: ``smollm2-135m-instruct`` (the embedded default), a local folder, or a hub id.
        adapter_path: A PEFT adapter folder to continue from instead of a fresh adapter.
        lm: How the base model is loaded and run (precision, gradient checkpointing, prefix sharing).
        lora: LoRA adapter shape; keep it equal to the GRPO run's, which loads this adapter.
        optimizer: Optimiser, learning rate, warm-up and gradient clipping.
        micro_batch_size: Demonstrations per forward/backward; gradients accumulate over a step's batch.
        export_adapter_dir: Where the final adapter is saved as a PEFT folder (default:
            ``<log_dir>/adapter``).
        seed: Seed of the LoRA initialisation.
    """

    def __init__(
        self,
        model: str = EMBEDDED_MODEL_NAME,
        adapter_path: str | None = None,
        lm: LMSettings = LMSettings(),  # noqa: B008 - value objects; jsonargparse shows their fields
        lora: LoraSettings = LoraSettings(),  # noqa: B008
        optimizer: OptimizerSettings = OptimizerSettings(learning_rate=5e-4, weight_decay=0.0),  # noqa: B008
        micro_batch_size: int = 2,
        export_adapter_dir: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.save_hyperparameters()
        self._init_policy(lm, lora, optimizer)
        self._val_sums = [0.0, 0.0, 0.0]
        self._step_start = time.perf_counter()

    def configure_model(self) -> None:
        if self.policy is None:
            torch.manual_seed(self.hparams.seed)
            self.load_policy()
            self.logprob_spec = LogprobSpec(
                micro_batch_size=self.hparams.micro_batch_size, pad_id=self.tokenizer.pad_token_id,
                share_prefix=self.lm_settings.share_prefix,
            )

    def training_step(self, dataloader_iter: Iterator) -> None:
        """One optimiser step on the next batch, fetched here so the stream's saved position never runs ahead
        of training (Lightning prefetches a batch for ``training_step(batch, batch_idx)``)."""
        batch, _, _ = next(dataloader_iter)
        start = time.perf_counter()
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        prompts = [demo.prompt_ids for demo in batch]
        responses = [demo.response_ids for demo in batch]
        tokens = self.mean_over_ranks(float(sum(len(r) for r in responses)))  # DDP averages gradients
        optimizer.zero_grad(set_to_none=True)
        metrics, finite = accumulate_sft_gradients(
            self.policy,
            prompts,
            responses,
            self.logprob_spec,
            token_normaliser=max(tokens, 1.0),
            backward=self.manual_backward,
        )
        grad_norm, problem = apply_gradients(self.optimisation(scheduler), self, finite)
        self.count_nonfinite(problem)  # a non-finite loss or norm skipped the step
        train_s = time.perf_counter() - start
        now = time.perf_counter()
        self.log_dict(
            {
                "train/loss": metrics["loss"],
                "train/token_accuracy": metrics["token_accuracy"],
                "train/grad_norm": grad_norm,
                "train/skipped_nonfinite": float(problem is not None),
                "perf/tokens_per_s": metrics["tokens"] / train_s if train_s > 0 else 0.0,
                "perf/train_s": train_s,
                "lr": optimizer.param_groups[0]["lr"],
            },
            on_step=True,
            on_epoch=False,
            batch_size=len(batch),
        )
        self.log("step_s", now - self._step_start, prog_bar=True, on_step=True, batch_size=len(batch))
        self.log("loss", metrics["loss"], prog_bar=True, on_step=True, batch_size=len(batch), logger=False)
        self._step_start = now

    def on_validation_epoch_start(self) -> None:
        self._val_sums = [0.0, 0.0, 0.0]

    def validation_step(self, batch: list[TokenizedDemo], batch_idx: int) -> None:
        nll, hits, tokens = sft_eval(
            self.policy,
            [demo.prompt_ids for demo in batch],
            [demo.response_ids for demo in batch],
            self.logprob_spec,
        )
        for index, value in enumerate((nll, hits, tokens)):
            self._val_sums[index] += value

    def on_validation_epoch_end(self) -> None:
        sums = torch.tensor(self._val_sums, dtype=torch.float64, device=self.device)
        if self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        nll, hits, tokens = sums.tolist()
        if tokens > 0:
            self.log_dict(
                {"val/loss": nll / tokens, "val/token_accuracy": hits / tokens},
                rank_zero_only=True,
                batch_size=1,
            )
