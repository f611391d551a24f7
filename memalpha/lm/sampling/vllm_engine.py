"""Sampling through a vLLM server: token ids in, the sampled token ids and their log-probs out.

:meth:`VllmEngine.generate` takes the inputs of :func:`memalpha.lm.sampling.generation.generate` and
returns a :class:`SampledGeneration`, a :class:`~memalpha.lm.sampling.generation.Generation` that also
holds each kept token's log-prob as the server sampled it and the adapter version it was
sampled with. Prompts go to ``/v1/completions`` as token ids, one request per prompt (each with
its own seed, so the identical prompts of a GRPO group draw different samples; the server
batches the requests), and the response token ids come back as the server sampled them
(``return_token_ids``), so training sees exactly the sampled tokens: nothing is decoded and
re-tokenised. Responses are cut after their first end-of-sequence token and ``truncated`` set
as :func:`~memalpha.lm.sampling.generation.generate` does.

Adapters are loaded at run time (:meth:`VllmEngine.sync`): each version gets a new name, the
previous one is unloaded, and samples carry the version they were drawn with. A request that
cannot reach the server is retried ``max_retries`` times; then, or at once when the started
server has exited, :class:`VllmEngineError` stops the round: no sample is ever made up.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memalpha.lm.core.http_post import RefusedRequestError, RetryableRequestError, backoff_delay, post_json
from memalpha.lm.sampling.generation import Generation, check_sampling, trim_at_eos
from memalpha.lm.sampling.vllm_server import VllmServer, VllmServerError
from memalpha.seeding import stable_seed

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "token_id:"
"""How the server names a token in its log-prob entries with ``return_tokens_as_token_ids``."""


class VllmEngineError(RuntimeError):
    """A generation or adapter request failed, or the server's reply breaks what memalpha checks."""


@dataclass
class SampledGeneration(Generation):
    """A :class:`~memalpha.lm.sampling.generation.Generation` sampled by a server.

    ``response_logprobs[i][t]`` is the server's log-prob of ``response_ids[i][t]`` (after the
    temperature; the raw distribution when greedy); ``adapter_version`` the adapter version the
    samples were drawn with (None: the base model).
    """

    response_logprobs: list[list[float]]
    adapter_version: int | None


def completion_body(
    prompt: Sequence[int],
    *,
    model: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    do_sample: bool,
    seed: int,
    eos_ids: Sequence[int],
) -> dict[str, Any]:
    """The ``/v1/completions`` request for one token-id prompt (greedy: temperature 0)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "max_tokens": int(max_new_tokens),
        "stop_token_ids": [int(t) for t in eos_ids],
        "logprobs": 0,  # the sampled token's own log-prob only
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "seed": int(seed),
        "n": 1,
    }
    if do_sample:
        body.update(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
    else:
        body.update(temperature=0.0, top_p=1.0, top_k=0)
    return body


def parse_completion(
    data: Any, prompt: Sequence[int], eos_ids: Sequence[int], max_new_tokens: int
) -> tuple[list[int], list[float], bool]:
    """One completion reply as ``(response_ids, logprobs, truncated)``, cut after the first eos.

    Raises :class:`VllmEngineError` when the reply is not one choice with token ids and their
    log-probs, when the server saw another prompt than the one sent (a BOS added, say), when
    the log-prob entries name other tokens than ``token_ids``, or when the server stopped for
    a reason the trainer would not (no eos of ``eos_ids`` ended a response shorter than
    ``max_new_tokens``).
    """
    try:
        (choice,) = data["choices"]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = choice["logprobs"]
        values = [float(v) for v in logprobs["token_logprobs"]]
        named = list(logprobs["tokens"])
        prompt_seen = choice.get("prompt_token_ids")
    except (KeyError, TypeError, ValueError) as exc:
        raise VllmEngineError(
            f"malformed completion reply ({type(exc).__name__}: {exc}): {str(data)[:200]}"
        ) from None
    if prompt_seen is not None and [int(t) for t in prompt_seen] != list(prompt):
        raise VllmEngineError(
            f"the server generated from another prompt than the {len(prompt)} token ids sent "
            f"({len(prompt_seen)} ids, first {prompt_seen[:3]} vs {list(prompt[:3])})"
        )
    if len(values) != len(token_ids) or named != [f"{TOKEN_PREFIX}{t}" for t in token_ids]:
        raise VllmEngineError(
            f"the reply's log-prob entries ({len(values)}) do "
            f"not name its {len(token_ids)} token ids one by one"
        )
    kept, truncated = trim_at_eos(token_ids, eos_ids)
    if truncated and len(token_ids) < max_new_tokens:
        raise VllmEngineError(
            f"the server stopped a response after {len(token_ids)} of {max_new_tokens} tokens without an "
            f"end-of-sequence token of {list(eos_ids)} (finish_reason {choice.get('finish_reason')!r}, "
            f"stop_reason {choice.get('stop_reason')!r})"
        )
    return kept, values[: len(kept)], truncated


class VllmEngine:
    """Client of one vLLM server: generation with token ids, and versioned adapter sync.

    Args:
        server: the server (started by memalpha or given by URL).
        adapter_prefix: served adapter names are ``<prefix>-v<version>``; make it unique per run
            when several runs share a server.
        timeout_s, max_retries, max_concurrency: see
            :class:`~memalpha.lm.sampling.vllm_settings.VllmSettings`.
        sleep: waits between attempts (tests pass a recorder): the first retry waits up to 1 s, each
            later one up to twice as long, at most 30 s (:func:`~memalpha.lm.core.http_post.backoff_delay`).
    """

    def __init__(
        self,
        server: VllmServer,
        *,
        adapter_prefix: str = "memalpha",
        timeout_s: float = 600.0,
        max_retries: int = 2,
        max_concurrency: int = 64,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.server = server
        self.adapter_prefix = adapter_prefix
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.sleep = sleep
        self.adapter_version: int | None = None  # the version generate samples with (None: base model)
        self.loaded: dict[int, str] = {}  # version -> served name, as loaded on the server
        self._rng = random.Random()

    # ------------------------------------------------------------------ HTTP
    def _post(self, path: str, body: dict[str, Any]) -> bytes:
        """POST with retries; a server that has exited stops it at once, with its log's last lines."""
        payload = json.dumps(body).encode("utf-8")
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(backoff_delay(attempt, 1.0, 30.0, self._rng))
            self._check_alive()
            try:
                return post_json(self.server.base_url + path, payload, timeout_s=self.timeout_s)
            except RefusedRequestError as exc:
                raise VllmEngineError(str(exc)) from None
            except RetryableRequestError as exc:
                last = str(exc)
                logger.info("vLLM request attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, exc)
        self._check_alive()
        raise VllmEngineError(f"{self.server.describe()} failed {self.max_retries + 1} attempts: {last}")

    def _check_alive(self) -> None:
        try:
            self.server.check_alive()
        except VllmServerError as exc:
            raise VllmEngineError(str(exc)) from None

    # ------------------------------------------------------------ generation
    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        max_new_tokens: int,
        eos_token_id: int | list[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        do_sample: bool = True,
        seed: int | None = None,
        batch_size: int | None = None,
        share_prefix: bool = True,
    ) -> SampledGeneration:
        """Sample a response for every token-id prompt with the current adapter (the base model
        before the first :meth:`sync`). Arguments as :func:`memalpha.lm.sampling.generation.generate`'s
        (``eos_token_id`` is required: the trainer's eos ids, sent as ``stop_token_ids``); ``batch_size`` and
        ``share_prefix`` are accepted and ignored (the server batches and caches prefixes itself).
        Prompt ``i`` is sampled with seed ``stable_seed(seed, i)``.
        """
        del batch_size, share_prefix
        check_sampling(max_new_tokens, do_sample, temperature)
        eos_ids = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        version = self.adapter_version
        model = self.loaded[version] if version is not None else self.server.served_name
        base_seed = 0 if seed is None else seed
        bodies = [
            completion_body(
                prompt, model=model, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                top_k=top_k, do_sample=do_sample, seed=stable_seed(base_seed, i), eos_ids=eos_ids,
            )
            for i, prompt in enumerate(prompt_ids)
        ]  # fmt: skip

        def one(i: int) -> tuple[list[int], list[float], bool]:
            raw = self._post("/v1/completions", bodies[i])
            try:
                data = json.loads(raw)
            except ValueError:
                raise VllmEngineError(f"malformed completion reply (not JSON): {raw[:200]!r}") from None
            return parse_completion(data, prompt_ids[i], eos_ids, max_new_tokens)

        if len(bodies) <= 1 or self.max_concurrency == 1:
            results = [one(i) for i in range(len(bodies))]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(bodies))) as pool:
                results = list(pool.map(one, range(len(bodies))))
        return SampledGeneration(
            prompt_ids=[list(p) for p in prompt_ids],
            response_ids=[r[0] for r in results],
            truncated=[r[2] for r in results],
            response_logprobs=[r[1] for r in results],
            adapter_version=version,
        )

    # --------------------------------------------------------------- adapters
    def sync(self, version: int, adapter_dir: str | Path) -> str:
        """Load the PEFT folder ``adapter_dir`` as adapter version ``version`` and sample with it
        from now on; the versions loaded before are unloaded. Returns the served name."""
        if self.adapter_version is not None and version <= self.adapter_version:
            raise ValueError(
                f"adapter version {version} is not newer than the loaded version {self.adapter_version}"
            )
        name = f"{self.adapter_prefix}-v{version}"
        self._post(
            "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(adapter_dir).resolve())}
        )
        previous = dict(self.loaded)
        self.loaded[version] = name
        self.adapter_version = version
        for old_version, old_name in previous.items():
            self._post("/v1/unload_lora_adapter", {"lora_name": old_name})
            del self.loaded[old_version]
        return name

    def close(self) -> None:
        """Stop the server if memalpha started it."""
        self.server.close()
