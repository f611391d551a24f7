"""GRPOModule: the LoRA/QLoRA memory-agent policy trained with GRPO under Lightning.

One rollout round (``build_experience``) runs the agent on a few instances, turns
the rewards into group-relative advantages and cuts the turn samples into
mini-batches; ``training_step`` takes one mini-batch per optimiser step, splits it
into micro-batches, and does the clipped GRPO update with a k3 KL penalty to the
reference (the same base weights with the adapters disabled).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from memalpha.adapters import export_adapter
from memalpha.data import Instance
from memalpha.grpo import group_advantages
from memalpha.grpo_step import LossSettings, accumulate_grpo_gradients, response_logprobs
from memalpha.policy import LoraSettings, load_policy
from memalpha.reader import LocalReader, OpenAIReader, Reader
from memalpha.rewards import LLMContentJudge, RewardWeights, RuleContentJudge
from memalpha.rollout import RolloutOutput, RolloutRecord, RolloutSettings, rollout_seed, run_rollouts
from memalpha.validation_report import summarise_records, write_validation_report


class GRPOModule(LightningModule):
    """Memory-agent policy trained with GRPO.

    Args:
        model: ``smollm2-135m-instruct`` (the embedded default), a local folder, or a hub id such as ``Qwen/Qwen3-4B``.
        load_precision: Base weights as ``fp32``, ``bf16`` or 4-bit ``nf4`` (QLoRA through bitsandbytes).
        compute_dtype: Compute dtype of the NF4 layers (``bfloat16`` on GPUs, ``float32`` on CPU).
        lora: LoRA adapter shape (rank, alpha, dropout, target modules; ``all-linear`` for every linear layer).
        gradient_checkpointing: Recompute activations in backward to save memory (about one more
            forward pass of time). Without it the policy pass computes the prompt prefix that a
            mini-batch shares (the system prompt) once; with it, once per sequence.
        share_prefix: Compute the prompt tokens that rows of a batch share once and reuse their
            key/value cache: the system prompt every turn starts with, and prompts a group repeats
            (generation, reference and policy passes). Off runs every row in full; the results agree
            up to float rounding, so this is only for comparisons.
        adapter_path: A PEFT adapter folder to start from instead of a fresh adapter.
        rollout: How the agent generates (group size, lengths, sampling, call format, memory view).
        reader: ``local`` (the policy's base weights, adapters off) or ``openai`` (an OpenAI-compatible endpoint).
        reader_max_new_tokens: Answer length cap of the reader.
        reader_temperature: Reader sampling temperature (0 = greedy; the paper's vLLM reader used 0.7).
        reader_top_k_entries: BM25 entries retrieved per memory list for each question (official 20).
        reader_prompt_tokens: Reader prompt budget; retrieved entries shrink one by one until it fits.
        reader_batch_size: Questions per local reader ``generate`` call.
        openai_base_url: Endpoint of the ``openai`` reader, e.g. ``http://127.0.0.1:8000/v1``.
        openai_model: Model name sent to the endpoint.
        openai_api_key_env: Environment variable holding the endpoint's API key.
        openai_max_concurrency: Parallel requests to the endpoint.
        openai_timeout_s: Per-request timeout.
        openai_max_retries: Retries (with exponential backoff) before a question scores 0.
        beta: Weight of the compression reward r3 (paper 0.05).
        gamma: Weight of the content-validity reward r4 (scripts 0.1).
        content_judge: r4 judge: ``rule`` (deterministic checks) or ``llm`` (the reader judges, paper style).
        metric_overrides: ``data_source`` -> metric name, overriding the default registry mapping.
        advantage_scale: ``group`` (divide by group std), ``batch`` (by batch std) or ``none`` (Dr. GRPO).
        clip_low: Lower PPO clip (ratio >= 1 - clip_low).
        clip_high: Upper PPO clip (ratio <= 1 + clip_high; > clip_low is DAPO's clip-higher).
        kl_coef: Weight of the k3 KL penalty to the reference (official script 0.001; 0 skips the reference pass).
        loss_agg: ``token-mean``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (Dr. GRPO).
        ppo_epochs: Passes over each round's samples (official 1).
        num_mini_batches: Optimiser steps per pass over a round's samples (official 1).
        micro_batch_size: Samples per forward/backward; gradients accumulate over a mini-batch.
        learning_rate: AdamW learning rate (official 1e-6 for full fine-tuning; LoRA wants more).
        weight_decay: AdamW weight decay (official 0.01).
        warmup_ratio: Share of ``trainer.max_steps`` spent warming the LR up linearly, constant after (official 0.05).
        grad_clip: Max global gradient norm (official 1.0; 0 disables).
        optimizer: ``adamw`` or ``paged_adamw_8bit`` (bitsandbytes; saves optimiser memory on GPU).
        log_text_every_n_steps: Every N optimiser steps one rollout (chunks' responses, tool results,
            final memory) goes to TensorBoard as text (0 disables).
        export_adapter_dir: Where the final adapter is saved as a PEFT folder (default: ``<log_dir>/adapter``).
        seed: Seed of rollout sampling and memory ids.
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        load_precision: Literal["fp32", "bf16", "nf4"] = "fp32",
        compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16",
        lora: LoraSettings = LoraSettings(),  # noqa: B008 - a value object; jsonargparse shows its fields
        gradient_checkpointing: bool = False,
        share_prefix: bool = True,
        adapter_path: str | None = None,
        rollout: RolloutSettings = RolloutSettings(),  # noqa: B008 - a value object, never mutated
        reader: Literal["local", "openai"] = "local",
        reader_max_new_tokens: int = 64,
        reader_temperature: float = 0.0,
        reader_top_k_entries: int = 20,
        reader_prompt_tokens: int = 4096,
        reader_batch_size: int = 8,
        openai_base_url: str = "http://127.0.0.1:8000/v1",
        openai_model: str = "Qwen/Qwen3-32B",
        openai_api_key_env: str = "OPENAI_API_KEY",
        openai_max_concurrency: int = 8,
        openai_timeout_s: float = 60.0,
        openai_max_retries: int = 3,
        beta: float = 0.05,
        gamma: float = 0.1,
        content_judge: Literal["rule", "llm"] = "rule",
        metric_overrides: dict[str, str] | None = None,
        advantage_scale: Literal["group", "batch", "none"] = "group",
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        kl_coef: float = 0.001,
        loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean",
        ppo_epochs: int = 1,
        num_mini_batches: int = 1,
        micro_batch_size: int = 4,
        learning_rate: float = 1e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.05,
        grad_clip: float = 1.0,
        optimizer: Literal["adamw", "paged_adamw_8bit"] = "adamw",
        log_text_every_n_steps: int = 10,
        export_adapter_dir: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if ppo_epochs < 1 or num_mini_batches < 1 or micro_batch_size < 1:
            raise ValueError("ppo_epochs, num_mini_batches and micro_batch_size must be >= 1")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the adapter only, never the frozen base
        # Lightning's CLI stores the raw config as hparams (dicts), so keep the typed settings here.
        self.lora_settings = LoraSettings(**lora) if isinstance(lora, dict) else lora
        self.rollout_settings = RolloutSettings(**rollout) if isinstance(rollout, dict) else rollout
        self.loss_settings = LossSettings(
            clip_low=clip_low,
            clip_high=clip_high,
            kl_coef=kl_coef,
            loss_agg=loss_agg,
            micro_batch_size=micro_batch_size,
            temperature=self.rollout_settings.temperature,
            max_len=self.rollout_settings.max_new_tokens,
            share_prefix=share_prefix,
        )
        self.weights = RewardWeights(beta=beta, gamma=gamma)
        self.policy = None
        self.tokenizer = None
        self.reader: Reader | None = None
        self.content_judge = None
        self._val_records: list[RolloutRecord] = []
        self._step_start = time.perf_counter()

    # ----------------------------------------------------------------- setup
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        hp = self.hparams
        self.policy, self.tokenizer = load_policy(
            hp.model,
            precision=hp.load_precision,
            lora=self.lora_settings,
            compute_dtype=hp.compute_dtype,
            gradient_checkpointing=hp.gradient_checkpointing,
            adapter_path=hp.adapter_path,
            device=self.device,
        )
        if hp.reader == "local":
            self.reader = LocalReader(
                self.policy,
                self.tokenizer,
                max_new_tokens=hp.reader_max_new_tokens,
                temperature=hp.reader_temperature,
                top_k_entries=hp.reader_top_k_entries,
                prompt_budget_tokens=hp.reader_prompt_tokens,
                batch_size=hp.reader_batch_size,
            )
        else:
            self.reader = OpenAIReader(
                hp.openai_base_url,
                hp.openai_model,
                api_key_env=hp.openai_api_key_env,
                max_concurrency=hp.openai_max_concurrency,
                timeout_s=hp.openai_timeout_s,
                max_retries=hp.openai_max_retries,
                temperature=hp.reader_temperature,
                max_tokens=hp.reader_max_new_tokens,
                top_k_entries=hp.reader_top_k_entries,
                prompt_budget_tokens=hp.reader_prompt_tokens,
            )
        self.content_judge = (
            RuleContentJudge() if hp.content_judge == "rule" else LLMContentJudge(self.reader)
        )

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if hp.optimizer == "paged_adamw_8bit":
            import bitsandbytes as bnb

            optimizer = bnb.optim.PagedAdamW8bit(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
        else:
            optimizer = torch.optim.AdamW(params, lr=hp.learning_rate, weight_decay=hp.weight_decay)
        max_steps = self.trainer.max_steps if self.trainer is not None and self.trainer.max_steps > 0 else 0
        warmup = max(1, math.ceil(hp.warmup_ratio * max_steps)) if hp.warmup_ratio > 0 and max_steps else 0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1))
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---------------------------------------------------- checkpoint content
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {f"policy.{name}" for name, p in self.policy.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    # ----------------------------------------------------------- experience
    def _rollouts(self, instances: Sequence[Instance], *, seed: int, greedy: bool) -> RolloutOutput:
        hp = self.hparams
        return run_rollouts(
            instances,
            self.policy,
            self.tokenizer,
            self.reader,
            self.rollout_settings,
            self.weights,
            self.content_judge,
            seed=seed,
            do_sample=not greedy,
            group_size=1 if greedy else None,
            metric_overrides=hp.metric_overrides,
            share_prefix=hp.share_prefix,
        )

    @torch.no_grad()
    def build_experience(self, instances: Sequence[Instance], round_index: int) -> list[dict[str, Any]]:
        """One rollout round: rollouts, advantages, reference/old log-probs, mini-batches x ppo_epochs."""
        hp = self.hparams
        seed = rollout_seed(hp.seed, "round", round_index, self.global_rank)
        out = self._rollouts(instances, seed=seed, greedy=False)
        samples = out.samples
        if not samples:
            raise RuntimeError(
                f"rollout round {round_index} produced no samples from {len(instances)} instances"
            )
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        group_ids = torch.tensor([s.group_id for s in samples])
        advantages = group_advantages(rewards, group_ids, scale=hp.advantage_scale)
        prompts = [s.prompt_ids for s in samples]
        responses = [s.response_ids for s in samples]

        start = time.perf_counter()
        logprob_kwargs = {
            "temperature": self.rollout_settings.temperature,
            "micro_batch_size": hp.micro_batch_size,
            "pad_id": self.tokenizer.pad_token_id,
            "share_prefix": hp.share_prefix,
        }
        ref_logps = old_logps = None
        if hp.kl_coef > 0:
            with self.policy.disable_adapter():
                ref_logps = response_logprobs(self.policy, prompts, responses, **logprob_kwargs)
        if hp.ppo_epochs * hp.num_mini_batches > 1:
            old_logps = response_logprobs(self.policy, prompts, responses, **logprob_kwargs)
        logprob_s = time.perf_counter() - start

        metrics = self._rollout_metrics(out, rewards, group_ids)
        metrics["perf/ref_old_logprob_s"] = logprob_s
        text = self._rollout_text(out.records[0]) if self._should_log_text() else None

        batches: list[dict[str, Any]] = []
        order = torch.arange(len(samples))
        for epoch in range(hp.ppo_epochs):
            if epoch > 0:
                generator = torch.Generator().manual_seed(rollout_seed(seed, "epoch", epoch))
                order = torch.randperm(len(samples), generator=generator)
            for part in torch.tensor_split(order, min(hp.num_mini_batches, len(samples))):
                idx = part.tolist()
                batches.append(
                    {
                        "prompt_ids": [prompts[i] for i in idx],
                        "response_ids": [responses[i] for i in idx],
                        "advantages": advantages[idx],
                        "old_logps": None if old_logps is None else [old_logps[i] for i in idx],
                        "ref_logps": None if ref_logps is None else [ref_logps[i] for i in idx],
                        "metrics": metrics if not batches else {},
                        "text": text if not batches else None,
                    }
                )
        return batches

    def _should_log_text(self) -> bool:
        every = self.hparams.log_text_every_n_steps
        return every > 0 and self.global_rank == 0 and self.global_step % every == 0

    def _rollout_metrics(
        self, out: RolloutOutput, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> dict[str, float]:
        samples, records = out.samples, out.records
        zero_std = []
        for g in group_ids.unique():
            member = rewards[group_ids == g]
            zero_std.append(float(member.numel() < 2 or member.std(unbiased=False) < 1e-6))
        calls = sum(s.num_calls for s in samples)
        lengths = [len(s.response_ids) for s in samples]
        total_s = out.rollout_s + out.reader_s
        return {
            "train/reward": rewards.mean().item(),
            "train/reward_std": rewards.std(unbiased=False).item(),
            "train/frac_reward_zero_std": sum(zero_std) / len(zero_std),
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
            "perf/rollout_s": out.rollout_s,
            "perf/reader_s": out.reader_s,
            "perf/gen_tokens_per_s": out.generated_tokens / out.rollout_s if out.rollout_s > 0 else 0.0,
            "perf/rollout_total_s": total_s,
        }

    @staticmethod
    def _rollout_text(record: RolloutRecord) -> str:
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

    # --------------------------------------------------------------- training
    def training_step(self, dataloader_iter: Iterator) -> None:
        """One optimiser step on one mini-batch (fetched here so rollouts always use the latest weights)."""
        batch, _, _ = next(dataloader_iter)
        hp = self.hparams
        start = time.perf_counter()
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        n = len(batch["prompt_ids"])
        device = self.device
        resp_lens = [len(r) for r in batch["response_ids"]]
        tokens = torch.tensor(float(sum(resp_lens)), device=device)
        if (
            self.trainer.world_size > 1
        ):  # token-mean over all ranks: DDP averages gradients, so scale by world
            tokens = self.trainer.strategy.reduce(tokens, reduce_op="mean")
        normaliser = max(tokens.item(), 1.0)
        seq_normaliser = float(n)
        if self.trainer.world_size > 1:
            seq_normaliser = self.trainer.strategy.reduce(
                torch.tensor(seq_normaliser, device=device), reduce_op="mean"
            ).item()
        optimizer.zero_grad(set_to_none=True)
        metrics, finite = accumulate_grpo_gradients(
            self.policy,
            batch,
            self.loss_settings,
            pad_id=self.tokenizer.pad_token_id,
            token_normaliser=normaliser,
            seq_normaliser=seq_normaliser,
            backward=self.manual_backward,
            grad_scale=float(self.trainer.scaler.get_scale()) if self.trainer.scaler is not None else 1.0,
        )

        if self.trainer.world_size > 1:  # every rank must agree to skip, or DDP ranks diverge
            flag = torch.tensor(float(finite), device=device)
            finite = self.trainer.strategy.reduce(flag, reduce_op="min").item() > 0.5
        grad_norm = torch.tensor(float("nan"))
        if finite:
            if hp.grad_clip > 0:
                params = [p for p in self.policy.parameters() if p.requires_grad]
                grad_norm = torch.nn.utils.clip_grad_norm_(params, hp.grad_clip)
            optimizer.step()
            scheduler.step()
        else:
            optimizer.zero_grad(set_to_none=True)
        train_s = time.perf_counter() - start

        logged = {f"train/{key}": value for key, value in metrics.items() if key != "tokens"}
        logged.update(
            {
                "train/grad_norm": float(grad_norm),
                "train/skipped_nonfinite": float(not finite),
                "perf/train_s": train_s,
                "lr": optimizer.param_groups[0]["lr"],
            }
        )
        logged.update(batch["metrics"])
        self.log_dict(logged, on_step=True, on_epoch=False, batch_size=n)
        now = time.perf_counter()
        self.log("step_s", now - self._step_start, prog_bar=True, on_step=True, batch_size=n)
        self._step_start = now
        if "train/reward" in batch["metrics"]:
            self.log(
                "reward",
                batch["metrics"]["train/reward"],
                prog_bar=True,
                on_step=True,
                batch_size=n,
                logger=False,
            )
        if batch["text"] is not None:
            self._log_text("rollout/sample", batch["text"])

    def _log_text(self, tag: str, text: str) -> None:
        for logger in self.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(tag, text, global_step=self.global_step)

    def on_train_end(self) -> None:
        target = self.hparams.export_adapter_dir or os.path.join(self.trainer.log_dir or ".", "adapter")
        if self.global_rank == 0:
            export_adapter(self.policy, self.tokenizer, target)
            rank_zero_info(f"memalpha: adapter saved to {target}")

    # ------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        self._val_records = []

    def validation_step(self, batch: list[Instance], batch_idx: int) -> None:
        seed = rollout_seed(self.hparams.seed, "validation", batch_idx)
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
        self.log_dict(
            {
                "val/accuracy": overall["accuracy"],
                "val/memory_tokens": overall["memory_tokens"],
                "val/compression": overall["compression"],
                "val/tool_success": overall["tool_success"],
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
            print(table, flush=True)
