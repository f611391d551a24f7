"""``make demo`` (docs/cold_start.md): the cold-start recipe on the embedded default, in one process.

    python -m memalpha_lab.demo      (from the repository root)

Clears the demo's outputs (:data:`DEMO_OUTPUTS`), then runs :data:`DEMO_STAGES`, ``memalpha``
commands only, one after another through :func:`memalpha.cli.run` (printing each as the command it
is; one interpreter start instead of seven). The last, ``memalpha compare``, prints the
before/after table and writes it to ``runs/demo_summary.json``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from memalpha.allocator import prefer_expandable_segments
from memalpha.cli import run

DEMO_OUTPUTS = ("runs/demos", "runs/sft_tiny_cpu", "runs/tiny_cpu", "runs/demo_summary.json")
_TINY = ["--config", "configs/tiny_cpu.yaml"]
DEMO_STAGES: tuple[list[str], ...] = (
    ["data", "demos", *_TINY, "--out", "runs/demos/train.jsonl", "--count", "24"],
    ["data", "demos", *_TINY, "--out", "runs/demos/val.jsonl", "--split", "test", "--count", "2"],
    ["validate", *_TINY, "--trainer.logger.init_args.version", "base"],
    ["sft", "--config", "configs/sft_tiny_cpu.yaml"],
    ["validate", *_TINY, "--model.adapter_path", "runs/sft_tiny_cpu/adapter",
     "--trainer.logger.init_args.version", "sft"],
    ["fit", *_TINY, "--model.adapter_path", "runs/sft_tiny_cpu/adapter",
     "--trainer.logger.init_args.version", "grpo"],
    ["compare", "runs/tiny_cpu/base", "runs/tiny_cpu/sft", "runs/tiny_cpu/grpo", "--labels", "base,sft,grpo",
     "--out", "runs/demo_summary.json"],
)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        raise SystemExit(f"memalpha_lab.demo: error: takes no arguments, got {args}; "
                         "edit configs/tiny_cpu.yaml instead")
    for config in ("configs/tiny_cpu.yaml", "configs/sft_tiny_cpu.yaml"):
        if not Path(config).is_file():
            raise SystemExit(f"memalpha_lab.demo: error: {config} not found; run it from the repository root")
    prefer_expandable_segments()
    for output in map(Path, DEMO_OUTPUTS):
        if output.is_dir():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
    for stage in DEMO_STAGES:
        print(f"\n$ memalpha {' '.join(stage)}", flush=True)
        run(list(stage))


if __name__ == "__main__":
    main()
