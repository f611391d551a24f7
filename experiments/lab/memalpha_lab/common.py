"""Shared output conventions of the benchmarks in ``experiments/``.

Every benchmark prints a fixed-width table on stdout and writes one JSON report under
``experiments/results/``. The report carries a ``machine`` block (torch version and threads,
CPU count, load average before and after, git commit) because the numbers mean little
without it: the development machines are shared, so a busy load average explains a slow run.
JSON files are written atomically (a ``.tmp`` sibling renamed into place), so an interrupted
run never leaves half a report behind.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Self

from memalpha.atomic_file import write_atomically
from memalpha_lab import tree_state

REPO_ROOT = Path(__file__).resolve().parents[3]
RESULTS_DIR = REPO_ROOT / "experiments" / "results"


def commit_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding the benchmark: the
    state ``experiments/gpu/gpu_check.sh`` checked once at its start where it set
    :data:`~memalpha_lab.tree_state.STATE_ENV`, else git's, else the stamp's of a copy carried
    without ``.git`` (:func:`~memalpha_lab.tree_state.tree_state`)."""
    state = tree_state.checked_state(allow_dirty=True, repo=repo)  # recorded here, refused elsewhere
    return {"commit": state["commit"], "dirty": state["dirty"]}


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: software versions, threads, CPUs, GPU, load, commit."""
    import torch

    info: dict[str, Any] = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": load_average(),
        "cuda": torch.cuda.is_available(),
        **commit_state(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "total_memory_gib": round(props.total_memory / 2**30, 2)}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], floats: int = 2) -> str:
    """A plain fixed-width table: text left-aligned, numbers right-aligned, floats to ``floats`` places."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.{floats}f}"
        return "" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(row[c], (int, float)) or row[c] is None for row in rows) if rows else False
        for c in range(len(headers))
    ]
    widths = [max([len(h)] + [len(r[c]) for r in cells]) for c, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if numeric[c] else v.ljust(w) for c, (v, w) in enumerate(zip(values, widths))
        )

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    return "\n".join(s.rstrip() for s in out)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], floats: int = 2) -> None:
    print(format_table(headers, rows, floats), flush=True)


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`memalpha.atomic_file.write_atomically`): a
    reader, or a crash, sees the old file or the new one, never half of one. Returns the path."""
    write_atomically(path, [text])
    return Path(path)


def write_json(
    report: dict[str, Any], path: str | os.PathLike, *, machine: dict[str, Any] | None = None
) -> Path:
    """Write ``report`` (plus a ``machine`` block) as indented JSON, atomically; returns the path.

    ``machine`` defaults to :func:`machine_info` taken now; pass the one taken at the start of
    the run to keep its load average, a ``load_average_end`` is added either way.
    """
    machine = dict(machine if machine is not None else machine_info())
    machine["load_average_end"] = load_average()
    payload = {**report, "machine": machine}
    return write_text_atomically(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def load_records(path: Path) -> list[dict[str, Any]]:
    """The per-rollout records of a ``memalpha validate`` report (``validation.json``)."""
    return json.loads(path.read_text(encoding="utf-8"))["records"]


def command_line() -> str:
    """The command that ran this benchmark, for the report (relative script path)."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(REPO_ROOT)
    except ValueError:
        pass
    return " ".join([".venv/bin/python", str(script), *sys.argv[1:]])


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc``; falls back to the lifetime peak)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return lifetime_peak_rss_bytes()


def lifetime_peak_rss_bytes() -> int:
    """Peak resident set size of this process since it started (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class RssSampler:
    """Peak RSS over a stretch of code, sampled by a background thread.

    ``with RssSampler() as s: ...`` then ``s.peak_bytes``. Sampling every ``interval_s`` can
    miss a spike shorter than the interval; the lifetime peak from ``getrusage`` cannot, but
    it never goes down, so it only bounds the first phase that reaches it.
    """

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, current_rss_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self.peak_bytes = current_rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_bytes = max(self.peak_bytes, current_rss_bytes())


class Stopwatch:
    """``with Stopwatch(sync) as w: ...`` then ``w.seconds``; ``sync`` (e.g. CUDA synchronise)
    runs at both ends."""

    def __init__(self, sync=None) -> None:
        self.sync = sync
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Self:
        if self.sync is not None:
            self.sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sync is not None:
            self.sync()
        self.seconds = time.perf_counter() - self._start


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def tiny_model_folder(path: str | os.PathLike, *, tokenizer: Any = None, hidden: int = 32, layers: int = 2,
                      seed: int = 0, initializer_range: float = 0.02) -> str:
    """Save a tiny random Llama with the embedded model's tokenizer (or ``tokenizer``) to ``path``.

    For experiments and tests about the machinery (faults, memory growth, the loss) rather than
    about learning: a step takes about a second on a CPU, and every part of a real run (chat
    template, tool-call parsing, reader, checkpoints) runs as it does for the embedded model. A
    larger ``initializer_range`` gives peaked next-token distributions that a few optimiser
    steps can visibly move; the default gives near-uniform ones. Returns the folder.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tokenizer is None:
        from memalpha.lm.core.embedded import load_tokenizer, materialise_embedded_model

        tokenizer = load_tokenizer(str(materialise_embedded_model()))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        initializer_range=initializer_range, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tiny_fit_config(run_dir: Path, model_dir: str, *, steps: int, val_every: int, train_instances: int = 8,
                    val_instances: int = 2, **model_options: Any) -> Path:
    """``configs/tiny_cpu.yaml`` shrunk for :func:`tiny_model_folder`'s model (about a second a
    step): logs and a checkpoint after every step under ``run_dir``, validation every
    ``val_every`` steps; ``model_options`` set more ``model`` keys. Returns the config's path."""
    import yaml

    config = yaml.safe_load((REPO_ROOT / "configs" / "tiny_cpu.yaml").read_text())
    config["trainer"].update(max_steps=steps, val_check_interval=val_every, limit_val_batches=1,
                             enable_progress_bar=False)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(run_dir), name="tb", version=None)
    config["trainer"]["callbacks"][0]["init_args"].update(
        dirpath=str(run_dir / "checkpoints"), every_n_train_steps=1
    )
    config["model"].update(model=model_dir, **model_options)
    config["model"]["reader"].update(max_new_tokens=6)
    config["model"]["rollout"].update(group_size=2, max_new_tokens=12, max_prompt_tokens=2048)
    config["model"]["update"].update(micro_batch_size=4)
    config["data"].setdefault("synthetic", {}).update(
        train=train_instances, val=val_instances, chunks=2, questions=2, chunk_words=30
    )
    config["data"].update(instances_per_step=2, val_batch_size=val_instances)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
