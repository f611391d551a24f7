"""The settings group of the vLLM rollout engine (``rollout.vllm``; docs/vllm_engine.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args
from urllib.parse import urlparse

VllmDtype = Literal["float32", "bfloat16", "float16", "auto"]
VLLM_DTYPES: tuple[str, ...] = get_args(VllmDtype)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""


def lora_rank_for_server(rank: int) -> int:
    """The smallest ``--max-lora-rank`` value vLLM accepts that holds an adapter of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is over the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")


@dataclass
class VllmSettings:
    """How the ``vllm`` rollout engine reaches its server (used only with ``rollout.backend: vllm``).

    Args:
        url: Root of a running vLLM OpenAI-compatible server started with ``--enable-lora``,
            runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and
            ``--logprobs-mode processed_logprobs``, e.g. ``http://10.0.0.2:8000`` (another GPU or
            machine; it must read the adapter folders memalpha writes under ``adapter_dir``).
            null = memalpha starts one on 127.0.0.1 from ``venv`` and stops it with the run.
        venv: The virtual environment whose ``bin/python`` runs a started server (``make
            vllm-env`` builds ``.venv-vllm``). Checked before any weight loads: the folder, its
            python and the ``vllm`` package in it.
        port: The port a started server listens on at 127.0.0.1 (null = a free port the system
            picks; rank ``r`` of a data-parallel run takes ``port + r``). A taken port stops the
            run before any weight loads. Ignored with ``url``.
        log_file: Where a started server's output goes (null = ``vllm_server.log`` in the run's
            log folder).
        adapter_dir: Where each synced adapter version is exported for the server to load (null =
            ``vllm_adapters`` in the run's log folder).
        dtype: Weights' dtype on the server (``float32`` on CPU; ``bfloat16`` on a GPU).
        max_model_len: Prompt plus response tokens the server accepts (null =
            ``rollout.max_prompt_tokens + rollout.max_new_tokens``).
        max_lora_rank: The server's ``--max-lora-rank`` (null = the policy's ``lora.r`` rounded
            up to a value vLLM accepts).
        cpu_kv_cache_gb: KV-cache size of a CPU server in GiB (``VLLM_CPU_KVCACHE_SPACE``).
        extra_args: More command-line arguments for a started server, e.g.
            ``["--gpu-memory-utilization", "0.3"]``.
        start_timeout_s: Seconds a started server may take until ``/health`` answers.
        request_timeout_s: Per-request timeout of generation and adapter requests.
        max_retries: Retries (with backoff) of a request that could not connect, timed out or got
            a 5xx reply, before the round stops with an error.
        max_concurrency: Generation requests in flight at once (one request per prompt; the
            server batches them).
        max_logprob_gap: The run stops when ``rollout/sampler_logprob_gap`` (mean absolute
            difference between the server's and the trainer's log-probs of the sampled tokens) is
            above this: the server is not sampling from the policy being trained.
    """

    url: str | None = None
    venv: str = ".venv-vllm"
    port: int | None = None
    log_file: str | None = None
    adapter_dir: str | None = None
    dtype: VllmDtype = "float32"
    max_model_len: int | None = None
    max_lora_rank: int | None = None
    cpu_kv_cache_gb: int = 1
    extra_args: list[str] = field(default_factory=list)
    start_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    max_retries: int = 2
    max_concurrency: int = 64
    max_logprob_gap: float = 0.05

    def __post_init__(self) -> None:
        if self.url is not None:
            parsed = urlparse(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(
                    f"rollout.vllm.url must be an http(s) URL such as http://127.0.0.1:8000, got {self.url!r}"
                )
        if not self.venv:
            raise ValueError("rollout.vllm.venv must name a virtual environment folder, got ''")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError(f"rollout.vllm.port must be in [1, 65535] or null, got {self.port}")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"rollout.vllm.dtype must be one of {list(VLLM_DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"rollout.vllm.max_model_len must be >= 2 or null, got {self.max_model_len}")
        if self.max_lora_rank is not None and self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(
                "rollout.vllm.max_lora_rank must be one of "
                f"{list(VLLM_LORA_RANKS)} or null, got {self.max_lora_rank}"
            )
        if self.cpu_kv_cache_gb < 1:
            raise ValueError(f"rollout.vllm.cpu_kv_cache_gb must be >= 1, got {self.cpu_kv_cache_gb}")
        if not all(isinstance(arg, str) for arg in self.extra_args):
            raise ValueError(f"rollout.vllm.extra_args must be a list of strings, got {self.extra_args!r}")
        for name in ("start_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rollout.vllm.{name} must be > 0, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"rollout.vllm.max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"rollout.vllm.max_concurrency must be >= 1, got {self.max_concurrency}")
        if not self.max_logprob_gap > 0:
            raise ValueError(f"rollout.vllm.max_logprob_gap must be > 0, got {self.max_logprob_gap}")
