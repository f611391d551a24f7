"""Scripts of ``experiments/`` run the way a shell runs them, in a child process, and watched there
(tests import no script: tests/test_no_experiment_imports.py).

From a test, :func:`run_script` runs ``python SCRIPT ARGS`` once; :func:`run_probed` runs one or
more scripts in one child process, with probes on the product's functions::

    python tests/script_probe.py SPEC.json

The spec lists the runs (each a script, its arguments and the environment variables it sets or,
with null, removes), the probes of :data:`PROBES` to put in place first, and the file ``seen``
where what each run did goes. Each run executes its script as ``__main__``
(:func:`runpy.run_path`) with the script's folder first on ``sys.path`` and ``sys.argv`` its
command line, as ``python SCRIPT ARGS`` would; its exit status (a ``SystemExit``'s code, 0 when it
returns, 1 when it raises, with the traceback on its stderr), its stdout and stderr, and what the
probes saw during it are recorded, and the next run starts. The runs share the process, so the
imports are paid once; each run starts from fresh script globals, the product's modules are the
same ones throughout (as in one long-lived process).

Probes:

- ``step``: counts the calls of :mod:`memalpha.train.step`'s reference weights and response
  log-probs, and of :mod:`memalpha.grpo.update`'s accumulated GRPO gradients and optimiser step;
  records whether the policy held the frozen reference adapter at each reference pass, and each
  :func:`memalpha.lm.sampling.generation.generate` call's backend, folding and caller
  (``announce_as``).
- ``restored``: whether the functions and switches a benchmark swaps while it times a path
  (``generation._hf_generate``, ``logprobs.streams_head``, ...) are the originals again after the run.
- ``writes``: every report :func:`memalpha_lab.common.write_json` writes, as written then.
"""

from __future__ import annotations

import io
import json
import os
import runpy
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
TAIL = 20_000
"""The last characters of a run's stdout and stderr that are kept."""


class Run(NamedTuple):
    """One script run: the script (relative to the repository), its arguments, its environment changes."""

    script: str
    args: Sequence[Any] = ()
    env: dict[str, str | None] | None = None


def script_env(changes: dict[str, str | None] | None = None) -> dict[str, str]:
    """This environment, offline, one torch thread (tiny models gain nothing from more threads, and
    on a shared, busy machine they lose a lot), with ``changes`` (None removes a variable)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_script(script: str, *args: Any, env: dict[str, str | None] | None = None,
               timeout: float = 1200) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` from the repository's root; its exit code, stdout and stderr."""
    return subprocess.run([sys.executable, script, *map(str, args)], cwd=REPO, env=script_env(env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_probed(folder: Path, runs: Iterable[Run], probes: Sequence[str] = (),
               timeout: float = 1200) -> list[dict[str, Any]]:
    """Run ``runs`` in one child process with ``probes`` in place (spec and record in ``folder``);
    per run: ``code``, ``stdout``, ``stderr`` and what the probes saw."""
    seen = folder / "seen.json"
    planned = [{"script": r.script, "args": [str(a) for a in r.args], "env": r.env or {}} for r in runs]
    spec = {"runs": planned, "probes": list(probes), "seen": str(seen)}
    spec_path = folder / "probe_spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(spec_path)], cwd=REPO,
                          env=script_env(), capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"the probe itself failed:\n{proc.stderr[-4000:]}"
    return json.loads(seen.read_text(encoding="utf-8"))["runs"]


# ----------------------------------------------------------------------------- in the child

CURRENT: dict[str, Any] = {}
"""What the probes saw during the run in progress."""


def _probe_step() -> Callable[[], None]:
    from memalpha.grpo import update
    from memalpha.lm.core.modes import has_reference_adapter
    from memalpha.lm.sampling import generation
    from memalpha.train import step

    def counting(name: str, real: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            CURRENT.setdefault("calls", Counter())[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for module, name in ((update, "accumulate_grpo_gradients"), (update, "optimizer_step"),
                         (step, "response_logprobs")):
        setattr(module, name, counting(name, getattr(module, name)))
    real_reference = step.reference_weights

    def reference_weights(policy, *args, **kwargs):
        CURRENT.setdefault("calls", Counter())["reference_weights"] += 1
        CURRENT.setdefault("reference_adapter", []).append(has_reference_adapter(policy))
        return real_reference(policy, *args, **kwargs)

    step.reference_weights = reference_weights
    real_generate = generation.generate

    def generate(*args, **kwargs):
        called = [kwargs.get(name, default) for name, default in
                  (("backend", "auto"), ("announce_as", "sampling"))]
        CURRENT.setdefault("generate", []).append(called)
        return real_generate(*args, **kwargs)

    generation.generate = generate
    return lambda: None


SWAPPED = (
    ("memalpha.lm.sampling.generation", "_hf_generate"),
    ("memalpha.lm.sampling.generation", "decode_fused"),
    ("memalpha.lm.sampling.generation", "FusedDecoder"),
    ("memalpha.lm.sampling.generation", "next_tokens"),
    ("memalpha.lm.sampling.packed_linear", "packing_available"),
    ("memalpha.lm.core.prompt_sharing", "packed_response_hidden"),
    ("memalpha.lm.logprobs.per_token", "streams_head"),
    ("memalpha.lm.logprobs.per_token", "accumulated_adapters"),
    ("memalpha.lm.core.prompt_sharing", "accumulated_adapters"),
)
"""What the benchmarks swap for a while (``restored``)."""


def _probe_restored() -> Callable[[], None]:
    import importlib

    originals = {(module, name): getattr(importlib.import_module(module), name) for module, name in SWAPPED}

    def after_run() -> None:
        CURRENT["restored"] = {
            f"{module}.{name}": getattr(sys.modules[module], name) is original
            for (module, name), original in originals.items()
        }

    return after_run


def _probe_writes() -> Callable[[], None]:
    from memalpha_lab import common

    real = common.write_json

    def write_json(report, path, **kwargs):
        written = real(report, path, **kwargs)
        CURRENT.setdefault("writes", []).append(
            {"path": str(path), "report": json.loads(json.dumps(report, default=str))}
        )
        return written

    common.write_json = write_json
    return lambda: None


PROBES: dict[str, Callable[[], Callable[[], None]]] = {
    "step": _probe_step, "restored": _probe_restored, "writes": _probe_writes,
}
"""Each puts its probe in place and returns what to do after every run."""


class _Tee:
    """Writes to a stream and keeps a copy; anything else is the stream's."""

    def __init__(self, stream) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _exit_code(stop: SystemExit) -> int:
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)  # as the interpreter does with a message
    return 1


def run_one(script: str, args: Sequence[str], env: dict[str, str | None]) -> dict[str, Any]:
    """Run ``script`` as ``__main__`` with ``args``; its exit code and output."""
    saved_env = {name: os.environ.get(name) for name in env}
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_out, saved_err = sys.stdout, sys.stderr
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    sys.argv = [script, *args]
    sys.path[0] = str((REPO / script).resolve().parent)
    sys.stdout, sys.stderr = out, err = _Tee(saved_out), _Tee(saved_err)
    try:
        runpy.run_path(str(REPO / script), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop)
    except Exception:  # noqa: BLE001 - recorded as the interpreter would show it
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout, sys.stderr = saved_out, saved_err
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {"code": code, "stdout": out.copy.getvalue()[-TAIL:], "stderr": err.copy.getvalue()[-TAIL:]}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    after = [PROBES[name]() for name in spec["probes"]]
    done = []
    for run in spec["runs"]:
        CURRENT.clear()
        result = run_one(run["script"], run["args"], run["env"])
        for step in after:
            step()
        done.append({"script": run["script"], "args": run["args"], **result, **CURRENT})
        Path(spec["seen"]).write_text(json.dumps({"runs": done}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
