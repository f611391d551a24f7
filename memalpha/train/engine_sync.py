"""The ``vllm`` rollout engine of a training run, as a Lightning callback: its server, on-policy
adapter sync, and the checks.

:class:`EngineSync` owns the engine's whole lifecycle. Before any weight loads (``setup``) it checks
that the named server can start (:func:`~memalpha.lm.sampling.vllm_server.check_launchable`: the
venv, its python and ``vllm``, the port; or that the server at ``rollout.vllm.url`` answers). The
server starts at the first rollout (or when the ``engine`` reader needs it), the trained adapter is
synced into it before the first generation of every round (every optimiser step that trained bumps
:attr:`EngineSync.policy_version`), and it stops with the run, also when the run fails. Two checks
guard against a sync that failed silently: :func:`check_versions` (every generation's adapter
version, checked by the sampler itself) and :meth:`EngineSync.sampler_gap` (the server's log-probs
against the trainer's, checked by the step).
docs/vllm_engine.md describes both.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from memalpha.agent.rollout import GenerateFn
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.lm.core.adapters import export_adapter
from memalpha.lm.core.embedded import resolve_model_path
from memalpha.lm.sampling.generation import resolve_eos_ids
from memalpha.lm.sampling.vllm_engine import SampledGeneration, VllmEngine
from memalpha.lm.sampling.vllm_server import VllmServer, VllmServerError, check_launchable, health_ok
from memalpha.lm.sampling.vllm_settings import lora_rank_for_server
from memalpha.seeding import stable_seed


class StaleSamplesError(RuntimeError):
    """A round was sampled with another adapter version than the one being trained."""


class SamplerDriftError(RuntimeError):
    """The server's log-probs of the sampled tokens are too far from the trainer's."""


def check_versions(versions: Sequence[int | None], policy_version: int, where: str) -> None:
    """Raise :class:`StaleSamplesError` unless every sample was drawn with ``policy_version``."""
    stale = sorted({v for v in versions if v != policy_version}, key=lambda v: -1 if v is None else v)
    if stale:
        shown = ", ".join("base model" if v is None else str(v) for v in stale)
        raise StaleSamplesError(
            f"{where} was sampled with adapter version {shown} but the policy is at version "
            f"{policy_version}: the vLLM server's adapter sync is behind; refusing stale samples"
        )


def sampler_logprob_gap(sampler: Sequence[Sequence[float]], trainer: Sequence[torch.Tensor]) -> float:
    """Mean over all tokens of ``|sampler log-prob - trainer log-prob|``, in float64 (0.0 for no tokens)."""
    if len(sampler) != len(trainer):
        raise ValueError(f"{len(sampler)} sampled responses but {len(trainer)} trainer log-prob rows")
    total, count = 0.0, 0
    for row, (server_row, trainer_row) in enumerate(zip(sampler, trainer)):
        if len(server_row) != trainer_row.numel():
            raise ValueError(
                f"response {row}: {len(server_row)} sampled "
                f"log-probs but {trainer_row.numel()} from the trainer"
            )
        diff = torch.tensor(list(server_row), dtype=torch.float64) - trainer_row.detach().double().cpu()
        total += float(diff.abs().sum())
        count += len(server_row)
    return total / count if count else 0.0


class EngineSync(Callback):
    """The vLLM server of one run and the adapter versions it serves.

    Args:
        settings: the rollout settings (``settings.vllm`` says how to reach the server).
        model: the policy's base model (embedded name, folder or hub id), served as the base.
        lora_rank: the policy's LoRA rank (the server's ``--max-lora-rank`` unless set).
        log_dir: the run's log folder (default place of the server log and adapter folders); under
            Lightning, the trainer's, set at ``setup``.
        tag: makes adapter names unique on a shared server (default: random; under Lightning, a
            seed of the clock and the rank).
    """

    def __init__(
        self,
        settings: RolloutSettings,
        model: str,
        lora_rank: int,
        log_dir: str | Path = ".",
        tag: str | None = None,
    ) -> None:
        self.settings = settings
        self.vllm = settings.vllm
        self.model = model
        self.lora_rank = lora_rank
        self.log_dir = Path(log_dir)
        self.tag = tag or uuid.uuid4().hex[:8]
        self.port = self.vllm.port
        self.policy_version = 0
        self.engine: VllmEngine | None = None
        self._step_at_start: int | None = None

    # ------------------------------------------------------------ the run's hooks
    def setup(self, trainer, pl_module, stage: str) -> None:
        """Before any weight loads: the run's log folder, a tag and port of this rank, and whether
        the server can start at all (one line naming the option when it cannot)."""
        self.log_dir = Path(trainer.log_dir or ".")  # a collective under DDP: every rank asks
        self.tag = f"{stable_seed(time.time_ns())}-rank{trainer.global_rank}"
        self.port = None if self.vllm.port is None else self.vllm.port + trainer.local_rank
        if self.vllm.url is not None:
            base_url = self.vllm.url.rstrip("/").removesuffix("/v1")
            if not health_ok(base_url, timeout_s=min(30.0, self.vllm.start_timeout_s)):
                raise VllmServerError(
                    f"rollout.vllm.url: no healthy vLLM server at {base_url} (GET /health failed)"
                )
        else:
            check_launchable(self.vllm.venv, self.port)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """A step whose optimiser stepped changed the adapter: the server is one version behind."""
        if self._step_at_start is not None and trainer.global_step != self._step_at_start:
            self.policy_changed()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A started server must not outlive its run, also when the run fails (for a run inside a
        longer-lived process; at interpreter exit it is stopped anyway)."""
        self.close()

    # ------------------------------------------------------------ the server
    @property
    def adapter_dir(self) -> Path:
        return Path(self.vllm.adapter_dir) if self.vllm.adapter_dir else self.log_dir / "vllm_adapters"

    @property
    def log_file(self) -> Path:
        return Path(self.vllm.log_file) if self.vllm.log_file else self.log_dir / "vllm_server.log"

    def start(self) -> VllmEngine:
        """The engine, started (or connected) at the first call."""
        if self.engine is None:
            vllm = self.vllm
            if vllm.url is not None:
                server = VllmServer.connect(vllm.url, timeout_s=vllm.start_timeout_s)
            else:
                server = VllmServer.launch(
                    resolve_model_path(self.model),
                    venv=vllm.venv,
                    log_file=self.log_file,
                    dtype=vllm.dtype,
                    max_model_len=vllm.max_model_len
                    or self.settings.max_prompt_tokens + self.settings.max_new_tokens,
                    max_lora_rank=vllm.max_lora_rank or lora_rank_for_server(self.lora_rank),
                    cpu_kv_cache_gb=vllm.cpu_kv_cache_gb,
                    extra_args=vllm.extra_args,
                    start_timeout_s=vllm.start_timeout_s,
                    port=self.port,
                )
            self.engine = VllmEngine(
                server,
                adapter_prefix=f"memalpha-{self.tag}",
                timeout_s=vllm.request_timeout_s,
                max_retries=vllm.max_retries,
                max_concurrency=vllm.max_concurrency,
            )
        return self.engine

    def policy_changed(self) -> None:
        """An optimiser step changed the adapter: the server is one version behind until the next sync."""
        self.policy_version += 1

    def sync(self, policy, tokenizer) -> None:
        """Export the adapter and load it into the server when the server is behind the policy."""
        engine = self.start()
        if engine.adapter_version == self.policy_version:
            return
        folder = export_adapter(policy, tokenizer, self.adapter_dir / f"v{self.policy_version}")
        previous = engine.adapter_version
        engine.sync(self.policy_version, folder)
        if previous is not None:  # unloaded from the server: its folder is not needed any more
            shutil.rmtree(self.adapter_dir / f"v{previous}", ignore_errors=True)

    def generator(self, policy, tokenizer) -> GenerateFn:
        """A generate function of the server with the policy's adapter as it is now (synced first),
        stopping at the end-of-sequence tokens ``generate`` would stop at."""
        self.sync(policy, tokenizer)
        return partial(self.start().generate, eos_token_id=resolve_eos_ids(policy, tokenizer, None))

    def sampler(self, policy, tokenizer) -> GenerateFn:
        """The agent's generate function for the whole run: every call first syncs the policy's
        current adapter into the server (nothing to do within a round), and refuses samples of
        another adapter version (:func:`check_versions`)."""

        def generate(prompt_ids: list[list[int]], **options) -> SampledGeneration:
            out = self.generator(policy, tokenizer)(prompt_ids, **options)
            where = f"a batch of {len(prompt_ids)} prompts"
            check_versions([out.adapter_version], self.policy_version, where)
            return out

        return generate

    def sampler_gap(
        self, sampler: Sequence[Sequence[float]], trainer: Sequence[torch.Tensor], where: str
    ) -> float:
        """:func:`sampler_logprob_gap` of the server's and the trainer's log-probs of the round
        ``where`` names, checked (:meth:`check_gap`)."""
        gap = sampler_logprob_gap(sampler, trainer)
        self.check_gap(gap, where)
        return gap

    def check_gap(self, gap: float, where: str) -> None:
        """Stop the run (:class:`SamplerDriftError`) when ``gap`` is over ``rollout.vllm.max_logprob_gap``."""
        if not gap <= self.vllm.max_logprob_gap:
            raise SamplerDriftError(
                f"{where}: rollout/sampler_logprob_gap {gap:.4g} is over rollout.vllm.max_logprob_gap "
                f"{self.vllm.max_logprob_gap:g}: the vLLM server is not sampling from the policy being "
                f"trained (adapter version {self.policy_version}; server log "
                f"{self.log_file if self.vllm.url is None else self.vllm.url})"
            )

    def close(self) -> None:
        """Stop a started server (nothing for one given by URL)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
