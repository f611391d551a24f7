"""A loopback OpenAI-compatible chat-completions server over a local HF model, for the tests.

Serves ``POST /v1/chat/completions`` (non-streaming, ``n = 1``), ``GET /v1/models`` and
``GET /health`` on 127.0.0.1 with the standard library's threaded HTTP server. Requests
that arrive together are answered in one batched generation: a single worker thread
collects up to ``max_batch`` waiting requests (waiting at most ``batch_wait_s`` for more)
and generates those with equal sampling settings as one batch through
:class:`~memalpha.reader.local.LocalReader`.

It lets the tests run memalpha's ``openai`` reader end to end on a CPU with no vLLM install
(``tests/faulty_server.py`` injects faults through :meth:`ChatCompletionServer.intercept`).
Users serve a reader with an inference engine (``vllm serve``; docs/real_model.md); this
server is not part of the memalpha package. By hand::

    python -m memalpha_lab.reader_server --model smollm2-135m-instruct --port 8000

With an API key (``api_key``, or ``--api-key-env NAME`` on the command line) every request
must carry ``Authorization: Bearer <key>``; others get HTTP 401.
:meth:`~ChatCompletionServer.start` after :meth:`~ChatCompletionServer.stop` serves again on the
same port.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memalpha.reader.local import LocalGeneration, LocalReader

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_BODY_BYTES = 16 * 1024 * 1024
STOP_POLL_S = 0.05
"""How often a background server checks whether :meth:`ChatCompletionServer.stop` was called
(the standard library's default of 0.5 s would make every stop, and every test, that much slower)."""


class RequestError(ValueError):
    """A client error: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    enable_thinking: bool


@dataclass
class _Job:
    messages: list[dict[str, str]]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: LocalGeneration | None = None


def parse_request(
    body: dict[str, Any], default_max_tokens: int
) -> tuple[list[dict[str, str]], SamplingParams]:
    """Validate a chat-completions request body; raise :class:`RequestError` naming the field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("field 'messages' must be a non-empty list")
    clean: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant"):
            raise RequestError(f"messages[{i}].role must be system, user or assistant, got {role!r}")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string")
        clean.append({"role": role, "content": content})
    if body.get("stream"):
        raise RequestError("field 'stream': streaming is not supported by this server")
    if body.get("n", 1) != 1:
        raise RequestError("field 'n': only n = 1 is supported")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max_tokens))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"field 'max_tokens' must be a positive integer, got {max_tokens!r}")
    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    top_p = body.get("top_p", 1.0)
    top_p = 1.0 if top_p is None else top_p
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(f"field 'temperature' must be a number >= 0, got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise RequestError(f"field 'top_p' must be in (0, 1], got {top_p!r}")
    seed = body.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise RequestError(f"field 'seed' must be an integer, got {seed!r}")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise RequestError("field 'chat_template_kwargs' must be an object")
    thinking = bool(template_kwargs.get("enable_thinking", False))
    params = SamplingParams(int(max_tokens), float(temperature), float(top_p), seed, thinking)
    return clean, params


class ChatCompletionServer:
    """Threaded loopback HTTP server answering chat completions with a :class:`LocalReader`.

    Args:
        reader: generates the replies (its model, tokenizer and batch size are used).
        model_name: the name reported by ``/v1/models`` and in replies.
        port: TCP port on 127.0.0.1; 0 picks a free one (see :attr:`port`).
        max_batch: most requests generated together.
        batch_wait_s: how long the worker waits for more requests to fill a batch.
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
    """

    def __init__(
        self,
        reader: LocalReader,
        model_name: str = "local",
        port: int = 0,
        max_batch: int = 8,
        batch_wait_s: float = 0.01,
        api_key: str | None = None,
    ) -> None:
        self.reader = reader
        self.model_name = model_name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._api_key = api_key
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = self._listen(port)
        self._port = int(self._httpd.server_address[1])
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------
    def _listen(self, port: int) -> ThreadingHTTPServer:
        httpd = ThreadingHTTPServer((HOST, port), self._handler_class())
        httpd.daemon_threads = True
        return httpd

    @property
    def port(self) -> int:
        """The TCP port, kept across :meth:`stop` and :meth:`start`."""
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, e.g. ``http://127.0.0.1:8000/v1``."""
        return f"http://{HOST}:{self.port}/v1"

    def start(self) -> ChatCompletionServer:
        """Serve in background threads (listening on the same port again after :meth:`stop`); returns self."""
        if self._httpd is None:
            self._httpd = self._listen(self._port)
        worker = threading.Thread(target=self._work, name="chat-server-worker", daemon=True)
        http = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": STOP_POLL_S},
            name="chat-server-http",
            daemon=True,
        )
        self._threads = [worker, http]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (new connections are refused) and join the threads; does nothing when stopped."""
        with self._lock:
            httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def __enter__(self) -> ChatCompletionServer:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (the command-line entry point)."""
        assert self._httpd is not None
        worker = threading.Thread(target=self._work, name="chat-server-worker", daemon=True)
        worker.start()
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()
            self._jobs.put(None)

    def intercept(self, handler: BaseHTTPRequestHandler) -> bool:
        """Whether ``handler``'s authorised chat request was answered here, before it is parsed;
        this server answers none (a subclass may: ``tests/faulty_server.py``)."""
        return False

    def _authorised(self, header: str | None) -> bool:
        if self._api_key is None:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self._api_key}".encode())

    # -- generation -----------------------------------------------------------------------
    def submit(self, messages: list[dict[str, str]], params: SamplingParams) -> LocalGeneration:
        """Queue one conversation for the batching worker and wait for its reply."""
        job = _Job(messages, params)
        self._jobs.put(job)
        job.done.wait()
        assert job.result is not None
        return job.result

    def _work(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            stop = False
            while len(batch) < self.max_batch:
                try:
                    job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                batch.append(job)
            groups: dict[SamplingParams, list[_Job]] = {}
            for job in batch:
                groups.setdefault(job.params, []).append(job)
            for params, jobs in groups.items():
                self._run_group(params, jobs)
            if stop:
                return

    def _run_group(self, params: SamplingParams, jobs: list[_Job]) -> None:
        try:
            results = self.reader.generate(
                [j.messages for j in jobs],
                max_new_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                seed=params.seed,
                enable_thinking=params.enable_thinking,
            )
        except Exception as exc:  # a server answers a failed generation with HTTP 500:
            # the traceback stays in this server's log, and the client counts each 500 as a failed
            # answer against reader.max_failed_share, over which a round or a validation stops
            logger.exception("chat server generation failed")
            results = [LocalGeneration("", 0, 0, False, f"{type(exc).__name__}: {exc}") for _ in jobs]
        for job, result in zip(jobs, results):
            job.result = result
            job.done.set()

    # -- HTTP -----------------------------------------------------------------------------
    def completion_body(self, result: LocalGeneration) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.text},
                    "finish_reason": "length" if result.truncated else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("%s - %s", self.address_string(), format % args)

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                self._send_raw(status, json.dumps(payload).encode("utf-8"))

            def _send_raw(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    logger.debug("client closed the connection before the reply")

            def _error(self, status: int, message: str, kind: str) -> None:
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path in ("/health", "/v1/health"):
                    self._send(200, {"status": "ok"})
                elif path in ("/v1/models", "/models"):
                    if not server._authorised(self.headers.get("Authorization")):
                        self._error(401, "missing or wrong API key", "authentication_error")
                        return
                    self._send(
                        200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]}
                    )
                else:
                    self._error(404, f"no route {self.path}", "not_found")

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path not in ("/v1/chat/completions", "/chat/completions"):
                    self._error(404, f"no route {self.path}", "not_found")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > MAX_BODY_BYTES:
                    self._error(
                        400, f"request body must be 1..{MAX_BODY_BYTES} bytes", "invalid_request_error"
                    )
                    return
                raw = self.rfile.read(length)
                if not server._authorised(self.headers.get("Authorization")):
                    self._error(401, "missing or wrong API key", "authentication_error")
                    return
                if server.intercept(self):
                    return
                try:
                    messages, params = parse_request(json.loads(raw), server.reader.max_new_tokens)
                except (RequestError, ValueError) as exc:
                    self._error(400, str(exc), "invalid_request_error")
                    return
                result = server.submit(messages, params)
                if result.error is not None:
                    self._error(500, result.error, "server_error")
                    return
                self._send(200, server.completion_body(result))

        return Handler


def main(argv: list[str] | None = None) -> None:
    """``python -m memalpha_lab.reader_server --model NAME_OR_PATH [--port 8000]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or folder")
    parser.add_argument("--served-name", default=None, help="name clients use (default: --model)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--max-batch", type=int, default=8, help="requests generated together")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="default max_tokens")
    parser.add_argument(
        "--dtype", default="auto", help="torch dtype of the weights (auto, float32, bfloat16)"
    )
    parser.add_argument(
        "--api-key-env", default=None, metavar="NAME",
        help="environment variable holding the API key clients must send (default: no key needed)",
    )
    args = parser.parse_args(argv)
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            parser.error(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")

    import torch
    from transformers import AutoModelForCausalLM

    from memalpha.lm.core.attention import use_bounded_attention
    from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = resolve_model_path(args.model)
    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    use_bounded_attention(model)
    if torch.cuda.is_available():
        model = model.to("cuda")
    reader = LocalReader(
        model, load_tokenizer(path), max_new_tokens=args.max_new_tokens, batch_size=args.max_batch
    )
    server = ChatCompletionServer(
        reader, args.served_name or args.model, args.port, max_batch=args.max_batch, api_key=api_key
    )
    logger.info("serving %s at %s", args.model, server.base_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("stopped")


if __name__ == "__main__":
    main()
