"""The table ``make demo`` ends with: the same held-out instances before SFT, after SFT, after GRPO.

    python -m memalpha_lab.demo_summary [RUN_DIR]     (default runs/tiny_cpu)

Reads the validation report of each stage (``base/validation.json``, ``sft/validation.json``
and the last ``grpo/validation_step*.json`` under ``RUN_DIR``), prints one row per stage and
the GRPO steps' reward spread and gradient norm (``docs/cold_start.md``), and writes the rows
to ``runs/demo_summary.json``: a list of ``{stage, accuracy, tool_success, memory_tokens,
compression, mean_reward, instances, vs_previous}``. Exits with status 1 and one line when a
report is missing or unreadable.

``vs_previous`` (None for the first stage) holds, for accuracy, tool success and mean reward,
the change from the previous stage paired per held-out instance: ``{mean, half_width, low,
high, n}``, the mean over the ``n`` instances both reports hold of (this stage's instance score
- the previous stage's) and its 95 % t interval (:mod:`memalpha_lab.instance_scores`). The
stage's own columns are the report's pooled figures (accuracy over all questions, tool success
over all calls), so a row's change need not equal the difference of the two rows exactly. An
interval that holds 0 says the stages are not told apart on these instances.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from memalpha.train.validation_report import format_columns, write_json_atomically
from memalpha_lab.instance_scores import InstanceScores, instance_values, paired_change

STAGES = ("base", "sft", "grpo")
PAIRED = ("accuracy", "tool_success", "mean_reward")
COLUMNS = (
    "stage", "instances", "accuracy", "change [95% CI]", "tool_success", "change [95% CI]",
    "memory_tokens", "compression", "mean_reward", "change [95% CI]",
)
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


def read_report(report: Path) -> dict[str, Any]:
    try:
        payload = json.loads(report.read_text(encoding="utf-8"))
        payload["summary"]["overall"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FileNotFoundError(f"{report}: not a readable validation report ({exc})") from exc
    return payload


def stage_row(stage: str, report: Path | dict[str, Any]) -> dict[str, Any]:
    overall = (read_report(report) if isinstance(report, Path) else report)["summary"]["overall"]
    return {
        "stage": stage,
        "accuracy": overall["accuracy"],
        "tool_success": overall["tool_success"],
        "memory_tokens": overall["memory_tokens"],
        "compression": overall["compression"],
        "mean_reward": overall.get("mean_reward", 0.0),
        "instances": overall["instances"],
    }


def vs_previous(before: InstanceScores, after: InstanceScores) -> dict[str, dict[str, float]] | None:
    """The paired change of :data:`PAIRED` from ``before`` to ``after`` (None when they share
    fewer than two instances: no interval to give)."""
    shared = {(s, i) for s, inst in before.items() for i in inst} & {
        (s, i) for s, inst in after.items() for i in inst
    }
    if len(shared) < 2:
        return None
    return {metric: paired_change(before, after, metric) for metric in PAIRED}


def summary_rows(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per stage, in order, each with its paired change against the stage before."""
    rows, previous = [], None
    for stage, report in reports.items():
        scores = instance_values(report.get("records") or [])
        row = stage_row(stage, report)
        row["vs_previous"] = vs_previous(previous, scores) if previous is not None else None
        rows.append(row)
        previous = scores
    return rows


def format_change(change: dict[str, float] | None) -> str:
    """``+0.031 [-0.05, +0.11]``; ``-`` without one."""
    if change is None:
        return "-"
    return f"{change['mean']:+.3f} [{change['low']:+.2f}, {change['high']:+.2f}]"


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
    cells = [COLUMNS]
    for row in rows:
        change = row.get("vs_previous") or {}
        cells.append((
            row["stage"],
            str(row["instances"]),
            f"{row['accuracy']:.3f}",
            format_change(change.get("accuracy")),
            f"{row['tool_success']:.3f}",
            format_change(change.get("tool_success")),
            f"{row['memory_tokens']:.1f}",
            f"{row['compression']:.3f}",
            f"{row['mean_reward']:.3f}",
            format_change(change.get("mean_reward")),
        ))
    return format_columns(cells)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0]) if args else Path("runs/tiny_cpu")
    out = Path(args[1]) if len(args) > 1 else Path("runs/demo_summary.json")
    try:
        rows = summary_rows({stage: read_report(stage_report(run_dir, stage)) for stage in STAGES})
    except FileNotFoundError as exc:
        print(f"demo summary: error: {exc}", file=sys.stderr)
        return 1
    write_json_atomically(out, rows)
    print("\nThe same held-out validation instances before SFT, after SFT and after GRPO:\n")
    print(format_rows(rows))
    shared = next((row["vs_previous"]["accuracy"]["n"] for row in rows if row["vs_previous"]), None)
    if shared is not None:
        print(
            f"\nchange: from the stage above, the mean over the {shared} held-out instances both hold of each"
        )
        print(
            "instance's change, with its 95 % t interval; an interval holding 0 does not tell the two stages"
        )
        print("apart on these instances (docs/cold_start.md says what the demo can and cannot show).")
    scalars = grpo_scalars(run_dir)
    if scalars:
        print("\nGRPO steps (from TensorBoard):")
        for step in sorted(scalars.get("train/grad_norm", {})):
            values = ", ".join(
                f"{tag.split('/')[1]} {scalars[tag][step]:.3f}"
                for tag in GRPO_SCALARS
                if step in scalars.get(tag, {})
            )
            print(f"  step {step}: {values}")
    print(f"\n(written to {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
