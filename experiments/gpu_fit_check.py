"""`memalpha fit --config configs/qlora_4090.yaml` for a few steps on a random-weight Qwen3-4B (GPU).

Run (on a GPU; experiments/gpu_check.sh runs it as its ``fit`` stage):
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/gpu_fit_check.py [--tokenizer .device/tok]

Time and memory depend only on shapes, so a random-weight model of Qwen3-4B's shape
(``experiments/bench_scale.py``'s, built on the GPU in seconds) stands in for the real one, and
synthetic instances (``memalpha data synth``) whose chunks fill ~6k-token prompts stand in for the
Mem-α data. Everything else is the config's: NF4 + LoRA r 32 on all linear layers, 8 rollouts,
2048 new tokens a turn, the reader on the 4-bit base, micro-batches of 2, paged 8-bit AdamW. Only
the data's size is cut (``--instances`` per step, ``--chunks`` per instance) so that two steps fit
a short lease. The process is capped to 24 GiB (``torch.cuda.set_per_process_memory_fraction``);
the report holds each step's seconds, PyTorch's peak reserved memory and the driver's view of
the device (``torch.cuda.mem_get_info``, which also counts the paged optimiser's unified memory).
Writes ``experiments/results/gpu_fit_check.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import yaml
from _common import RESULTS_DIR, command_line, gib, machine_info, print_table, write_json
from bench_scale import GPU_CAP_BYTES, QWEN3_4B, build_random_model_dir
from lightning.pytorch.callbacks import Callback

from memalpha.data.synthetic import generate_synthetic
from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path
from memalpha.train.lightning_cli import run_lightning_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = RESULTS_DIR / "gpu_fit_check.json"


STEPS: list[dict[str, float]] = []
"""What :class:`StepClock` measured (read through the imported module ``gpu_fit_check``: the
config names the callback by that import path, so ``__main__`` has a list of its own)."""

PARTIAL: dict[str, Any] = {}
"""``out`` and ``report`` of the running check: after every step :class:`StepClock` writes the
report so far (status ``running``), so a check killed at its time limit keeps its finished steps."""


class StepClock(Callback):
    """Seconds and device memory of every optimiser step (one ``training_step`` is one step)."""

    def __init__(self) -> None:
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        STEPS.append({
            "step": trainer.global_step,
            "seconds": time.perf_counter() - self._start,
            "peak_allocated_gib": gib(torch.cuda.max_memory_allocated()),
            "peak_reserved_gib": gib(torch.cuda.max_memory_reserved()),
            "device_used_gib": gib(total - free),
        })
        print(f"[gpu_fit_check] step {STEPS[-1]['step']}: " + ", ".join(f"{k} {v:.2f}" for k, v in STEPS[-1].items()
                                                                  if k != "step"), flush=True)
        if PARTIAL:
            write_json({**PARTIAL["report"], "status": "running", "steps": STEPS}, PARTIAL["out"],
                       machine=machine_info())


def write_instances(folder: Path, tokenizer, *, count: int, chunks: int, chunk_tokens: int, seed: int) -> Path:
    """Synthetic training instances whose chunks hold about ``chunk_tokens`` tokens each."""
    probe = generate_synthetic(1, split="train", seed=seed, num_chunks=1, chunk_words=400)[0]
    tokens_per_word = len(tokenizer(probe.chunks[0], add_special_tokens=False)["input_ids"]) / 400
    words = int(chunk_tokens / max(tokens_per_word, 0.5))
    instances = generate_synthetic(count, split="train", seed=seed, num_chunks=chunks, chunk_words=words)
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(instance.to_dict()) + "\n" for instance in instances), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct", help="tokenizer folder or the embedded name")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--instances", type=int, default=1, help="instances per step (the config: 4)")
    parser.add_argument("--chunks", type=int, default=2, help="chunks per instance")
    parser.add_argument("--chunk-tokens", type=int, default=5000, help="tokens per chunk (prompts of ~6k)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this check runs configs/qlora_4090.yaml, which needs a GPU")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, GPU_CAP_BYTES / total))
    tokenizer = load_tokenizer(str(resolve_model_path(args.tokenizer)))
    report: dict[str, Any] = {"benchmark": "gpu_fit_check", "command": command_line(), "steps": [],
                              "config": "configs/qlora_4090.yaml", "gpu_cap_gib": gib(GPU_CAP_BYTES),
                              "instances_per_step": args.instances, "chunks": args.chunks,
                              "chunk_tokens": args.chunk_tokens}
    status = "ok"
    with tempfile.TemporaryDirectory(prefix="memalpha-gpu-fit-") as tmp:
        folder = Path(tmp)
        with torch.device("cuda"):  # random init on the GPU: seconds instead of minutes
            report["base_parameters"] = build_random_model_dir(folder / "model", QWEN3_4B, tokenizer)
        torch.cuda.empty_cache()
        train = write_instances(folder, tokenizer, count=args.instances * args.steps, chunks=args.chunks,
                                chunk_tokens=args.chunk_tokens, seed=0)
        config = yaml.safe_load((REPO_ROOT / "configs" / "qlora_4090.yaml").read_text(encoding="utf-8"))
        trainer = config["trainer"]
        trainer.update(max_steps=args.steps, limit_val_batches=0)
        trainer["logger"]["init_args"]["save_dir"] = str(folder / "runs")
        trainer["callbacks"][0]["init_args"]["dirpath"] = str(folder / "checkpoints")
        trainer["callbacks"].append({"class_path": "gpu_fit_check.StepClock"})
        config["model"]["model"] = str(folder / "model")
        config["data"].update(train_path=str(train), instances_per_step=args.instances)
        config["data"].setdefault("load", {})["chunk_tokens"] = args.chunk_tokens
        config_path = folder / "qlora_4090_check.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        report["overrides"] = {"trainer": {"max_steps": args.steps, "limit_val_batches": 0},
                               "data": {"load": {"chunk_tokens": args.chunk_tokens},
                                        "instances_per_step": args.instances}}
        import gpu_fit_check  # the module the config's callback is imported from

        gpu_fit_check.PARTIAL.update(out=args.out, report=report)
        start = time.perf_counter()
        try:
            cli = run_lightning_cli(["fit", "--config", str(config_path)])
            report["global_step"] = cli.trainer.global_step
        except torch.cuda.OutOfMemoryError as exc:
            status = "out_of_memory"
            report["error"] = str(exc).splitlines()[0]
        report["wall_seconds"] = time.perf_counter() - start
    steps = gpu_fit_check.STEPS
    report["status"] = status
    report["steps"] = steps
    if steps:
        report["peak_reserved_gib"] = max(s["peak_reserved_gib"] for s in steps)
        report["device_used_gib"] = max(s["device_used_gib"] for s in steps)
        report["fits_24gib"] = status == "ok" and max(report["peak_reserved_gib"], report["device_used_gib"]) <= 24
    print_table(("step", "seconds", "peak alloc GiB", "peak reserved GiB", "device used GiB"),
                [[s["step"], s["seconds"], s["peak_allocated_gib"], s["peak_reserved_gib"], s["device_used_gib"]]
                 for s in steps])
    print(f"status: {status}")
    print(f"wrote {write_json(report, args.out, machine=machine_info())}")
    return report


if __name__ == "__main__":
    main()
