"""Same results before and after a change: two runs of the same command on the same seed compared
value by value (issue 31's check of a restructure).

Run:  .venv/bin/python -m memalpha_lab.compare_runs BEFORE_DIR AFTER_DIR
          [--out PATH] [--tolerance 1e-6]

Each directory is a run's output folder (a TensorBoard ``save_dir``). Compared:

* every TensorBoard scalar the two share, step by step, except timings (tags under ``perf/`` and
  any whose last part ends in ``_s`` or names seconds or tokens per second: they measure the
  machine, not the run); a tag present on one side only is listed as added or removed;
* every ``validation*.json`` at the same relative path (the report ``memalpha fit`` writes at a
  validation step and the one ``memalpha validate`` writes), number by number and text by text,
  down to each question's prediction; keys present on one side only are listed, not failed.

A value is ``equal`` when the two agree exactly, ``rounding`` when they differ by at most
``--tolerance`` relative to the larger (float reduction order), ``differs`` otherwise. Prints a
table per tag and report, and writes the JSON ``experiments/results/compare_runs.json`` (``--out``).
Exit status 1 when anything shared differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from memalpha_lab.common import RESULTS_DIR, command_line, machine_info, print_table, write_json

TIMING_WORDS = ("seconds", "tokens_per_s", "tok_per_s", "per_second")


def is_timing(tag: str) -> bool:
    """Whether a scalar measures the machine rather than the run."""
    last = tag.rsplit("/", 1)[-1]
    return tag.startswith("perf/") or last.endswith("_s") or any(word in last for word in TIMING_WORDS)


def verdict(before: float, after: float, tolerance: float) -> str:
    """``equal``, ``rounding`` (within ``tolerance`` relative to the larger magnitude) or ``differs``."""
    if before == after or (math.isnan(before) and math.isnan(after)):
        return "equal"
    scale = max(abs(before), abs(after), 1e-30)
    return "rounding" if abs(before - after) <= tolerance * scale else "differs"


def worst(verdicts: list[str]) -> str:
    order = ("equal", "rounding", "differs")
    return max(verdicts, key=order.index) if verdicts else "equal"


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """``{relative_dir/tag: {step: value}}`` of every event file's scalars under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    for events_dir in sorted({p.parent for p in folder.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
        acc.Reload()
        prefix = events_dir.relative_to(folder).as_posix()
        for tag in acc.Tags()["scalars"]:
            scalars[f"{prefix}:{tag}"] = {e.step: e.value for e in acc.Scalars(tag)}
    return scalars


def compare_scalars(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]],
                    tolerance: float) -> dict[str, Any]:
    rows = []
    shared = sorted(set(before) & set(after))
    for key in shared:
        if is_timing(key.split(":", 1)[1]):
            continue
        steps = sorted(set(before[key]) & set(after[key]))
        verdicts = [verdict(before[key][s], after[key][s], tolerance) for s in steps]
        if set(before[key]) != set(after[key]):
            verdicts.append("differs")
        gap = max((abs(before[key][s] - after[key][s]) for s in steps), default=0.0)
        rows.append({"tag": key, "steps": len(steps), "max_abs_difference": gap, "verdict": worst(verdicts)})
    timing = sorted(k for k in shared if is_timing(k.split(":", 1)[1]))
    return {
        "rows": rows,
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "timing_skipped": timing,
    }


def compare_values(before: Any, after: Any, path: str, tolerance: float, out: dict[str, list]) -> None:
    """Walk two JSON values; note each leaf's verdict and each one-sided key."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            where = f"{path}.{key}" if path else str(key)
            if key not in after:
                out["removed"].append(where)
            elif key not in before:
                out["added"].append(where)
            else:
                compare_values(before[key], after[key], where, tolerance, out)
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            out["differs"].append(f"{path} (length {len(before)} -> {len(after)})")
        for index, (b, a) in enumerate(zip(before, after)):
            compare_values(b, a, f"{path}[{index}]", tolerance, out)
    elif (
        isinstance(before, (int, float)) and isinstance(after, (int, float)) and not isinstance(before, bool)
    ):
        out[verdict(float(before), float(after), tolerance)].append(path)
    elif before == after:
        out["equal"].append(path)
    else:
        out["differs"].append(path)


def compare_reports(before_dir: Path, after_dir: Path, tolerance: float) -> list[dict[str, Any]]:
    rows = []
    names = sorted({p.relative_to(before_dir).as_posix() for p in before_dir.rglob("validation*.json")}
                   | {p.relative_to(after_dir).as_posix() for p in after_dir.rglob("validation*.json")})
    for name in names:
        b, a = before_dir / name, after_dir / name
        if not (b.exists() and a.exists()):
            rows.append(
                {"report": name, "verdict": "differs", "missing": "before" if not b.exists() else "after"}
            )
            continue
        out: dict[str, list] = {"equal": [], "rounding": [], "differs": [], "added": [], "removed": []}
        compare_values(json.loads(b.read_text()), json.loads(a.read_text()), "", tolerance, out)
        verdicts = (["differs"] if out["differs"] else []) + (["rounding"] if out["rounding"] else [])
        rows.append(
            {
                "report": name,
                "values": len(out["equal"]) + len(out["rounding"]) + len(out["differs"]),
                "equal": len(out["equal"]),
                "rounding": out["rounding"][:20],
                "differs": out["differs"][:20],
                "added": out["added"][:20],
                "removed": out["removed"][:20],
                "verdict": worst(verdicts),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--tolerance", type=float, default=1e-6, help="relative difference still called rounding"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "compare_runs.json")
    args = parser.parse_args(argv)
    for side in (args.before, args.after):
        if not side.is_dir():
            parser.error(f"{side}: not a directory")
    scalars = compare_scalars(read_scalars(args.before), read_scalars(args.after), args.tolerance)
    reports = compare_reports(args.before, args.after, args.tolerance)
    print_table(
        ("scalar", "steps", "max |difference|", "verdict"),
        [[r["tag"], r["steps"], r["max_abs_difference"], r["verdict"]] for r in scalars["rows"]],
        floats=9,
    )
    for side in ("added", "removed"):
        if scalars[side]:
            print(f"scalars {side}: {', '.join(scalars[side])}")
    print_table(("report", "values", "equal", "rounding", "differs", "verdict"),
                [[r["report"], r.get("values", 0), r.get("equal", 0), len(r.get("rounding", [])),
                  len(r.get("differs", [])), r["verdict"]] for r in reports])
    for r in reports:
        for side in ("differs", "added", "removed"):
            if r.get(side):
                print(f"{r['report']} {side}: {', '.join(r[side][:8])}{' ...' if len(r[side]) > 8 else ''}")
    overall = worst([r["verdict"] for r in scalars["rows"]] + [r["verdict"] for r in reports])
    print(f"overall: {overall}")
    report = {"benchmark": "compare_runs", "command": command_line(), "before": str(args.before),
              "after": str(args.after), "tolerance": args.tolerance, "scalars": scalars, "reports": reports,
              "overall": overall}
    print(f"wrote {write_json(report, args.out, machine=machine_info())}")
    return 1 if overall == "differs" else 0


if __name__ == "__main__":
    sys.exit(main())
