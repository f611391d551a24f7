"""`memalpha fit --config configs/qlora_4090.yaml` for 2 steps on a random-weight Qwen3-4B (GPU).

Run (on a GPU; experiments/gpu/gpu_check.sh runs it as its ``fit`` stage):
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/gpu/gpu_fit_check.py [--tokenizer .device/tok]
Run (CPU, the same script on a tiny random model and a shrunk config, as tests/test_gpu_fit_check.py does):
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/gpu/gpu_fit_check.py --tiny --out /tmp/fit.json

Time and memory depend only on shapes, so a random-weight model of Qwen3-4B's shape
(``experiments/lab/memalpha_lab/qlora_4090.py``'s, built on the GPU in seconds) stands in for the real one,
and synthetic instances (``memalpha data synth``) whose chunks fill ~6k-token prompts stand in for the
Mem-α data. Everything else is the config's: NF4 + LoRA r 32 on all linear layers, 8 rollouts,
2048 new tokens a turn, the reader on the 4-bit base, micro-batches of 2, paged 8-bit AdamW. Only
the data's size is cut (``--instances`` per step, ``--chunks`` per instance) so that two steps fit
a short lease. The process is capped to 24 GiB (``torch.cuda.set_per_process_memory_fraction``).

The JSON (``--out``) is written when the model is built and again after every step (status
``running``), so a check killed at its time limit keeps the steps it finished. Each step holds
its seconds; its phases (``sampling``, ``reader``, ``rewards``, ``logprobs``, ``update``, as the
step reports them to its progress bar, which this script replaces with :class:`PhaseBar`), each
with seconds and peak memory (PyTorch's peaks and the driver's ``mem_get_info`` polled during
the phase: :mod:`phase_clock`); and the module's own ``perf/`` metrics of the step. The ``record``
block (:mod:`gpu_record`) names the GPU, the clean commit (the script refuses a dirty tree
without ``--allow-dirty``), the versions and the backends that sampled for the policy and the
reader.

``--tiny`` runs on the CPU: a one-layer Qwen3-shaped model (the tokenizer's vocabulary), 2
rollouts of 8 tokens, ~150-token chunks, torch AdamW; the config's structure is otherwise kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch.callbacks import Callback

from memalpha.allocator import prefer_expandable_segments
from memalpha.data.synthetic import generate_synthetic
from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path
from memalpha.train.lightning_cli import run_lightning_cli
from memalpha.train.progress_bar import StepProgressBar
from memalpha_lab.common import RESULTS_DIR, command_line, machine_info, print_table, write_json
from memalpha_lab.gpu_record import GpuRecord, add_arguments
from memalpha_lab.qlora_4090 import GPU_CAP_BYTES, QWEN3_4B, build_random_model_dir, scaled_shape
from memalpha_lab.tree_state import DirtyTree

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = RESULTS_DIR / "gpu_fit_check.json"
PERF_KEYS = (
    "perf/rollout_s",
    "perf/reader_s",
    "perf/rewards_s",
    "perf/ref_old_logprob_s",
    "perf/train_s",
    "step_s",
)
"""The module's logged timings of a step (``memalpha/train/module.py``, ``step.py``)."""


class FitRun:
    """The running check: its record, its report so far and where it goes."""

    def __init__(self, record: GpuRecord, report: dict[str, Any], out: Path, machine: dict[str, Any]) -> None:
        self.record, self.report, self.out, self.machine = record, report, out, machine
        self.steps: list[dict[str, Any]] = []
        self.step_start = 0.0

    def write(self, status: str) -> Path:
        """The report with its steps, the record and ``status``, written atomically to ``out``."""
        self.report.update(status=status, steps=self.steps, record=self.record.as_dict())
        if self.steps:
            for key in ("peak_allocated_gib", "peak_reserved_gib", "device_used_peak_gib"):
                values = [s[key] for s in self.steps if s[key] is not None]
                self.report[key] = max(values) if values else None
            worst = [v for v in (self.report["peak_reserved_gib"], self.report["device_used_peak_gib"]) if v]
            fits = status in ("ok", "running") and max(worst, default=0) <= GPU_CAP_BYTES / 2**30
            self.report["fits_24gib"] = fits if worst else None
        return write_json(self.report, self.out, machine=self.machine)


RUN: FitRun | None = None
"""The check that runs (set by :func:`main` on the imported module ``gpu_fit_check``: the config
names the callbacks by that import path, so ``__main__`` has a variable of its own)."""


class PhaseBar(StepProgressBar):
    """memalpha's step progress bar that also starts a phase of the record's clock at each phase
    the step reports (the module hands its phases to the progress bar's ``show_phase``)."""

    def show_phase(self, phase) -> None:
        trainer = self._trainer
        if RUN is not None and trainer is not None and trainer.training:
            RUN.record.clock.enter(phase.name)
        super().show_phase(phase)


class StepRecorder(Callback):
    """Each optimiser step's seconds, phases, peaks and logged ``perf/`` metrics; the JSON after each."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        clock = RUN.record.clock
        clock.end()  # the load (or the last step's tail)
        clock.set_step(trainer.global_step + 1)
        clock.enter("step_other")  # until the step reports its first phase
        RUN.step_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        clock = RUN.record.clock
        clock.end()
        seconds = time.perf_counter() - RUN.step_start
        phases = clock.by_name(clock.step)
        logged = {key: float(value) for key, value in trainer.callback_metrics.items() if key in PERF_KEYS}

        def peak(key: str) -> float | None:
            values = [row[key] for row in phases.values() if row[key] is not None]
            return max(values) if values else None

        step = {
            "step": trainer.global_step,
            "seconds": seconds,
            "phases": phases,
            "logged": logged,
            "peak_allocated_gib": peak("peak_allocated_gib"),
            "peak_reserved_gib": peak("peak_reserved_gib"),
            "device_used_peak_gib": peak("device_used_peak_gib"),
        }
        RUN.steps.append(step)
        print(
            f"[gpu_fit_check] step {step['step']}: {seconds:.1f} s ("
            + ", ".join(f"{name} {row['seconds']:.1f}" for name, row in phases.items())
            + ")",
            flush=True,
        )
        RUN.write("running")


def write_instances(
    folder: Path, tokenizer, *, count: int, chunks: int, chunk_tokens: int, seed: int
) -> Path:
    """Synthetic training instances whose chunks hold about ``chunk_tokens`` tokens each."""
    probe = generate_synthetic(1, split="train", seed=seed, num_chunks=1, chunk_words=400)[0]
    tokens_per_word = len(tokenizer(probe.chunks[0], add_special_tokens=False)["input_ids"]) / 400
    words = int(chunk_tokens / max(tokens_per_word, 0.5))
    instances = generate_synthetic(count, split="train", seed=seed, num_chunks=chunks, chunk_words=words)
    path = folder / "train.jsonl"
    path.write_text(
        "".join(json.dumps(instance.to_dict()) + "\n" for instance in instances), encoding="utf-8"
    )
    return path


def shrink_for_cpu(config: dict[str, Any]) -> dict[str, Any]:
    """``--tiny``: the config's structure on a CPU in seconds (what changes is listed in the report)."""
    overrides = {
        "trainer": {"accelerator": "cpu", "enable_model_summary": False},
        "model": {
            "lm": {"compute_dtype": "float32", "gradient_checkpointing": False},
            "rollout": {
                "group_size": 2,
                "max_new_tokens": 8,
                "max_prompt_tokens": 2048,
                "generation_batch_size": 2,
            },
            "reader": {"max_new_tokens": 4, "batch_size": 2, "retrieval": {"prompt_tokens": 1024}},
            "update": {"micro_batch_size": 2},
            "optimizer": {"name": "adamw"},
        },
    }
    merge(config, overrides)
    return overrides


def merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    """Set ``extra``'s keys in ``base``, nested dictionaries key by key."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def fit_config(
    folder: Path, args: argparse.Namespace, train: Path, model_dir: Path
) -> tuple[Path, dict[str, Any]]:
    """configs/qlora_4090.yaml with this check's overrides, written into ``folder``; returns its path
    and the overrides (for the report)."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "qlora_4090.yaml").read_text(encoding="utf-8"))
    overrides: dict[str, Any] = {
        "trainer": {"max_steps": args.steps, "limit_val_batches": 0},
        "data": {"load": {"chunk_tokens": args.chunk_tokens}, "instances_per_step": args.instances},
    }
    merge(config, overrides)
    if args.tiny:
        merge(overrides, shrink_for_cpu(config))
    trainer = config["trainer"]
    trainer["logger"]["init_args"]["save_dir"] = str(folder / "runs")
    trainer["callbacks"][0]["init_args"]["dirpath"] = str(folder / "checkpoints")
    trainer["callbacks"] += [
        {"class_path": "gpu_fit_check.PhaseBar"},
        {"class_path": "gpu_fit_check.StepRecorder"},
    ]
    config["model"]["model"] = str(model_dir)
    config["data"]["train_path"] = str(train)
    path = folder / "qlora_4090_check.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path, overrides


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--tokenizer", default="smollm2-135m-instruct", help="tokenizer folder or the embedded name"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--instances", type=int, default=1, help="instances per step (the config: 4)")
    parser.add_argument("--chunks", type=int, default=1, help="chunks per instance")
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="tokens per chunk (default 5000: prompts of ~6k; --tiny: 150)",
    )
    parser.add_argument("--tiny", action="store_true", help="CPU: a tiny random model and a shrunk config")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.chunk_tokens is None:
        args.chunk_tokens = 150 if args.tiny else 5000
    if not args.tiny and not torch.cuda.is_available():
        parser.error("this check runs configs/qlora_4090.yaml, which needs a GPU (--tiny runs a CPU version)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    try:
        record = GpuRecord.start(allow_dirty=args.allow_dirty)
    except DirtyTree as refusal:
        print(refusal, file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    machine = machine_info()
    if torch.cuda.is_available() and not args.tiny:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, GPU_CAP_BYTES / total))
    tokenizer = load_tokenizer(str(resolve_model_path(args.tokenizer)))
    shape = scaled_shape(0.03, len(tokenizer)) if args.tiny else QWEN3_4B
    report: dict[str, Any] = {
        "benchmark": "gpu_fit_check",
        "command": command_line(),
        "tiny": args.tiny,
        "config": "configs/qlora_4090.yaml",
        "gpu_cap_gib": GPU_CAP_BYTES / 2**30,
        "instances_per_step": args.instances,
        "chunks": args.chunks,
        "chunk_tokens": args.chunk_tokens,
        "shape": shape,
    }
    import gpu_fit_check  # the module the config's callbacks are imported from

    run = gpu_fit_check.RUN = FitRun(record, report, args.out, machine)
    status = "ok"
    with record, tempfile.TemporaryDirectory(prefix="memalpha-gpu-fit-") as tmp:
        folder = Path(tmp)
        with record.clock.phase("build_model"), torch.device("cuda" if not args.tiny else "cpu"):
            report["base_parameters"] = build_random_model_dir(folder / "model", shape, tokenizer)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        train = write_instances(
            folder,
            tokenizer,
            count=args.instances * args.steps,
            chunks=args.chunks,
            chunk_tokens=args.chunk_tokens,
            seed=0,
        )
        config_path, report["overrides"] = fit_config(folder, args, train, folder / "model")
        run.write("loading")
        record.clock.enter("load")  # ended by the first step's start
        start = time.perf_counter()
        try:
            cli = run_lightning_cli(["fit", "--config", str(config_path)])
            report["global_step"] = cli.trainer.global_step
        except torch.cuda.OutOfMemoryError as exc:
            status = "out_of_memory"
            report["error"] = str(exc).splitlines()[0]
        except SystemExit as exc:  # the CLI's own one-line errors (printed above)
            status, report["error"] = "failed", f"memalpha fit exited with {exc.code}"
        except Exception as exc:  # noqa: BLE001 - the report says what stopped the check, then it fails
            status = "failed"
            report["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        record.clock.end()
        report["wall_seconds"] = time.perf_counter() - start
    if status == "ok" and len(run.steps) < args.steps:
        status = "incomplete"
    path = run.write(status)
    print_table(
        ("step", "seconds", *(name for name in ("sampling", "reader", "update"))),
        [
            [
                s["step"],
                s["seconds"],
                *(s["phases"].get(n, {}).get("seconds") for n in ("sampling", "reader", "update")),
            ]
            for s in run.steps
        ],
    )
    print(
        f"status: {status}; backends: "
        + ", ".join(
            f"{who} {b['backend']} (captured {b['captured']})"
            for who, b in report["record"]["backends"].items()
        )
    )
    print(f"wrote {path}")
    if status != "ok":
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    prefer_expandable_segments()  # before anything touches CUDA (memalpha/allocator.py)
    main()
