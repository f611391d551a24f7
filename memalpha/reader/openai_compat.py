"""Reader backend for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, OpenAI, ...).

Requests go out concurrently (``max_concurrency`` threads, stdlib HTTP only). A request
that times out, cannot connect, loses its connection, gets a 5xx/429 reply, or returns a
malformed body (not JSON, no ``choices``) is retried up to ``max_retries`` times, waiting
:func:`~memalpha.lm.core.http_post.backoff_delay` before each retry. What still fails after the retries
becomes a failed :class:`ReaderAnswer` (scored 0, counted against ``reader.max_failed_share``). A
reply that refuses the request itself (a 4xx other than 429: a bad key, a model the server does not
serve, a prompt over its context) would be refused again for every question: it raises
:class:`ReaderRequestRefused` with one line, as does anything else that goes wrong here.

The API key is read from the environment variable ``api_key_env`` at request time (never
stored in configs); without it no ``Authorization`` header is sent, which local vLLM
servers accept.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memalpha.lm.core.http_post import RefusedRequestError, RetryableRequestError, backoff_delay, post_json
from memalpha.reader.base import Conversation, Reader, ReaderAnswer, ReaderSampling
from memalpha.reader.options import OpenAISettings, RetrievalSettings
from memalpha.reader.question_instructions import QuestionInstructions
from memalpha.templates.loader import PromptTemplates

logger = logging.getLogger(__name__)


class ReaderRequestRefused(RuntimeError):
    """The reader's server refused a request itself (a 4xx other than 429): a setting is wrong."""


CHARS_PER_TOKEN_ESTIMATE = 3.0
"""Without a tokenizer, prompt length is estimated as characters / 3 (an overestimate for
English under GPT/Qwen tokenizers, so budgets err on the safe side)."""


class OpenAIReader(Reader):
    """Reader served over HTTP by an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        endpoint: the endpoint and its request options (:class:`~memalpha.reader.options.OpenAISettings`):
            ``base_url`` (the root, e.g. ``http://localhost:8000/v1``; ``/chat/completions`` is
            appended), ``model`` (the name the server expects), ``api_key_env`` (the environment
            variable holding the API key), ``max_concurrency`` (simultaneous requests),
            ``timeout_s`` (per-request socket timeout), ``max_retries`` (retries after the first
            attempt for timeouts, refused or dropped connections, 5xx/429 and malformed replies),
            ``backoff_s`` (ceiling of the first backoff, doubling with every retry; see
            :func:`~memalpha.lm.core.http_post.backoff_delay`) and ``backoff_max_s`` (where the
            ceiling stops doubling).
        retrieval: what reaches the prompt; see :class:`~memalpha.reader.base.Reader` (``None``:
            :class:`~memalpha.reader.options.RetrievalSettings`'s defaults).
        temperature, max_tokens: sampling settings sent with each request, with ``top_p`` 1 and
            thinking off (``chat_template_kwargs``, vLLM) (paper: temperature 0.7); a
            :class:`~memalpha.reader.base.ReaderSampling` given to :meth:`chat` replaces them for its call.
        tokenizer: a tokenizer name/path for exact prompt budgets; ``None`` estimates.
        extra_body: more JSON fields merged into every request.
        sleep: waits between attempts (tests pass a recorder instead of :func:`time.sleep`).
        question_instructions, templates: see :class:`~memalpha.reader.base.Reader`.
    """

    def __init__(
        self,
        endpoint: OpenAISettings,
        retrieval: RetrievalSettings | None = None,
        temperature: float = 0.7,
        max_tokens: int = 256,
        tokenizer: str | None = None,
        extra_body: dict[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        question_instructions: QuestionInstructions | None = None,
        templates: PromptTemplates | None = None,
    ) -> None:
        super().__init__(
            retrieval=retrieval, question_instructions=question_instructions, templates=templates
        )
        self.endpoint = endpoint
        self.url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self.sleep = sleep
        self.rng = random.Random()
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self._tokenizer = None
        if tokenizer is not None:
            from memalpha.lm.core.embedded import load_tokenizer

            self._tokenizer = load_tokenizer(tokenizer)

    # -- token counting -------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        if self._tokenizer is not None:
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])
        return math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)

    def conversation_tokens(self, conversation: Conversation) -> int:
        if self._tokenizer is not None and getattr(self._tokenizer, "chat_template", None):
            from memalpha.reader.local import chat_prompt_text

            return self.count_tokens(chat_prompt_text(self._tokenizer, conversation))
        return super().conversation_tokens(conversation)

    # -- HTTP -----------------------------------------------------------------------------
    def request_body(
        self, conversation: Conversation, sampling: ReaderSampling | None = None
    ) -> dict[str, Any]:
        """The JSON body of one request; ``sampling`` replaces the temperature and ``max_tokens``
        where it sets them (``extra_body`` is merged last and wins over both)."""
        temperature = (
            self.temperature if sampling is None or sampling.temperature is None else sampling.temperature
        )
        max_tokens = (
            self.max_tokens if sampling is None or sampling.max_tokens is None else sampling.max_tokens
        )
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": conversation,
            "temperature": temperature,
            "top_p": 1.0,
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        body.update(self.extra_body)
        return body

    def _post_once(self, payload: bytes) -> str:
        headers = {}
        key = os.environ.get(self.endpoint.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        raw = post_json(self.url, payload, timeout_s=self.endpoint.timeout_s, headers=headers)
        try:
            data = json.loads(raw)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise RetryableRequestError(f"malformed reply from {self.url}: {raw[:200]!r}") from exc
        if not isinstance(content, str):
            raise RetryableRequestError(
                f"malformed reply from {self.url}: message content is {type(content).__name__}"
            )
        return content

    def _ask(self, conversation: Conversation, sampling: ReaderSampling | None = None) -> ReaderAnswer:
        payload = json.dumps(self.request_body(conversation, sampling)).encode("utf-8")
        endpoint = self.endpoint
        attempts = endpoint.max_retries + 1
        last_error = ""
        for attempt in range(attempts):
            if attempt:
                self.sleep(backoff_delay(attempt, endpoint.backoff_s, endpoint.backoff_max_s, self.rng))
            try:
                return ReaderAnswer(text=self._post_once(payload), ok=True, error=None)
            except RetryableRequestError as exc:
                last_error = str(exc)
                logger.info("reader request attempt %d/%d failed: %s", attempt + 1, attempts, exc)
            except RefusedRequestError as exc:
                raise ReaderRequestRefused(
                    f"the reader at {self.url} refused a request: {exc} (model.reader.openai.*)"
                ) from exc
        return ReaderAnswer(text="", ok=False, error=f"gave up after {attempts} attempts: {last_error}")

    def chat(
        self, conversations: Sequence[Conversation], sampling: ReaderSampling | None = None
    ) -> list[ReaderAnswer]:
        """Reply to each conversation, ``sampling`` (if given) in every request's body."""
        if len(conversations) == 1 or self.endpoint.max_concurrency == 1:
            return [self._ask(c, sampling) for c in conversations]
        with ThreadPoolExecutor(max_workers=min(self.endpoint.max_concurrency, len(conversations))) as pool:
            return list(pool.map(lambda c: self._ask(c, sampling), conversations))
