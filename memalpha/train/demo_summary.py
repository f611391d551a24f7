"""The table ``make demo`` ends with: the same held-out instances before SFT, after SFT, after GRPO.

    python -m memalpha.train.demo_summary [RUN_DIR]     (default runs/tiny_cpu)

Reads the validation report of each stage (``base/validation.json``, ``sft/validation.json``
and the last ``grpo/validation_step*.json`` under ``RUN_DIR``), prints one row per stage and
the GRPO steps' reward spread and gradient norm (``docs/cold_start.md``), and writes the rows
to ``runs/demo_summary.json``: a list of ``{stage, accuracy, tool_success, memory_tokens,
compression, mean_reward, instances}``. Exits with status 1 and one line when a report is
missing or unreadable.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from memalpha.train.validation_report import format_columns, write_json_atomically

STAGES = ("base", "sft", "grpo")
COLUMNS = ("stage", "instances", "accuracy", "tool_success", "memory_tokens", "compression", "mean_reward")
GRPO_SCALARS = ("train/frac_reward_zero_std", "train/grad_norm", "train/reward", "train/reward_std")


def stage_report(run_dir: Path, stage: str) -> Path:
    """The validation report of ``stage``: ``validation.json``, or for ``grpo`` the last step's."""
    folder = run_dir / stage
    if stage != "grpo":
        return folder / "validation.json"
    steps = sorted(folder.glob("validation_step*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not steps:
        raise FileNotFoundError(f"{folder}: no validation_step*.json (did the GRPO run validate?)")
    return steps[-1]


def stage_row(stage: str, report: Path) -> dict[str, Any]:
    try:
        overall = json.loads(report.read_text(encoding="utf-8"))["summary"]["overall"]
    except (OSError, ValueError, KeyError) as exc:
        raise FileNotFoundError(f"{report}: not a readable validation report ({exc})") from exc
    return {
        "stage": stage,
        "accuracy": overall["accuracy"],
        "tool_success": overall["tool_success"],
        "memory_tokens": overall["memory_tokens"],
        "compression": overall["compression"],
        "mean_reward": overall.get("mean_reward", 0.0),
        "instances": overall["instances"],
    }


def event_scalars(folder: Path, tags: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the ``tags`` present in the TensorBoard events under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    present = acc.Tags()["scalars"]
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in tags if tag in present}


def grpo_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """The GRPO run's per-step reward spread and gradient norm from its TensorBoard events."""
    return event_scalars(run_dir / "grpo", GRPO_SCALARS)


def format_rows(rows: list[dict[str, Any]]) -> str:
    cells = [COLUMNS] + [
        (
            row["stage"],
            str(row["instances"]),
            f"{row['accuracy']:.3f}",
            f"{row['tool_success']:.3f}",
            f"{row['memory_tokens']:.1f}",
            f"{row['compression']:.3f}",
            f"{row['mean_reward']:.3f}",
        )
        for row in rows
    ]
    return format_columns(cells)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0]) if args else Path("runs/tiny_cpu")
    out = Path(args[1]) if len(args) > 1 else Path("runs/demo_summary.json")
    try:
        rows = [stage_row(stage, stage_report(run_dir, stage)) for stage in STAGES]
    except FileNotFoundError as exc:
        print(f"demo summary: error: {exc}", file=sys.stderr)
        return 1
    write_json_atomically(out, rows)
    print("\nThe same held-out validation instances before SFT, after SFT and after GRPO:\n")
    print(format_rows(rows))
    scalars = grpo_scalars(run_dir)
    if scalars:
        print("\nGRPO steps (from TensorBoard):")
        for step in sorted(scalars.get("train/grad_norm", {})):
            values = ", ".join(f"{tag.split('/')[1]} {scalars[tag][step]:.3f}" for tag in GRPO_SCALARS if step in scalars.get(tag, {}))
            print(f"  step {step}: {values}")
    print(f"\n(written to {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
