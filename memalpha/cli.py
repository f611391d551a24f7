"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands through
:class:`~memalpha.train.lightning_cli.MemAlphaCLI` (a ``LightningCLI`` over
:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.datamodule.RolloutDataModule`);
``memalpha sft`` is Lightning's ``fit`` over :class:`~memalpha.train.sft_module.SFTModule` and
:class:`~memalpha.train.demo_datamodule.DemoDataModule` (the cold start from demonstrations).
``memalpha data ...`` holds the dataset tools, all in :mod:`memalpha.commands.data` (synth,
inspect, convert start without importing Lightning; ``demos`` writes oracle demonstrations for a
training config, ``distill`` demonstrations from recorded trajectories). ``memalpha demo`` runs the cold-start
demo's commands (:data:`DEMO_STAGES`) in one process.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# `memalpha demo` (what `make demo` runs; docs/cold_start.md): these commands, in one process.
DEMO_OUTPUTS = ("runs/demos", "runs/sft_tiny_cpu", "runs/tiny_cpu", "runs/demo_summary.json")
_TINY = ["--config", "configs/tiny_cpu.yaml"]
DEMO_STAGES: tuple[list[str], ...] = (
    ["data", "demos", *_TINY, "--out", "runs/demos/train.jsonl", "--count", "24"],
    ["data", "demos", *_TINY, "--out", "runs/demos/val.jsonl", "--split", "test", "--count", "2"],
    ["validate", *_TINY, "--trainer.logger.init_args.version", "base"],
    ["sft", "--config", "configs/sft_tiny_cpu.yaml"],
    [
        "validate",
        *_TINY,
        "--model.adapter_path",
        "runs/sft_tiny_cpu/adapter",
        "--trainer.logger.init_args.version",
        "sft",
    ],
    [
        "fit",
        *_TINY,
        "--model.adapter_path",
        "runs/sft_tiny_cpu/adapter",
        "--trainer.logger.init_args.version",
        "grpo",
    ],
)


def run_demo(args: list[str]) -> None:
    """``memalpha demo``: clear the demo's outputs, run :data:`DEMO_STAGES` one after another in
    this process (printing each as the command it is; one interpreter start instead of six), then
    the before/after table of :mod:`memalpha.train.demo_summary`."""
    if args:
        raise SystemExit(
            f"memalpha demo: error: takes no arguments, got {args}; edit configs/tiny_cpu.yaml instead"
        )
    for config in ("configs/tiny_cpu.yaml", "configs/sft_tiny_cpu.yaml"):
        if not Path(config).is_file():
            raise SystemExit(f"memalpha demo: error: {config} not found; run it from the repository root")
    for output in map(Path, DEMO_OUTPUTS):
        if output.is_dir():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
    for stage in DEMO_STAGES:
        print(f"\n$ memalpha {' '.join(stage)}", flush=True)
        run(list(stage))
    from memalpha.train.demo_summary import main as summary_main

    print("\n$ python -m memalpha.train.demo_summary runs/tiny_cpu runs/demo_summary.json", flush=True)
    status = summary_main(["runs/tiny_cpu", "runs/demo_summary.json"])
    if status:
        raise SystemExit(status)


def run(argv: list[str] | None = None):
    """Run the command and return the ``MemAlphaCLI`` (``None`` for ``memalpha data`` and ``prompts``); for
    Python callers."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "demo":
        run_demo(args[1:])
        return None
    if args and args[0] == "prompts":
        from memalpha.templates.official import main as prompts_main

        prompts_main(args[1:])
        return None
    if args and args[0] == "data":
        from memalpha.commands.data import main as data_main

        data_main(args[1:])
        return None
    if args and args[0] == "sft":
        from memalpha.train.lightning_cli import run_sft_cli

        return run_sft_cli(args[1:])
    from memalpha.train.lightning_cli import run_lightning_cli

    return run_lightning_cli(argv)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: returns nothing, so the process exits 0 on success. The CUDA
    allocator's setting is made here, before anything touches CUDA (memalpha/allocator.py)."""
    from memalpha.allocator import prefer_expandable_segments

    prefer_expandable_segments()
    run(argv)


if __name__ == "__main__":
    main()
