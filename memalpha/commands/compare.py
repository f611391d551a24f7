"""``memalpha compare``: what changed between validation reports of the same held-out set.

    memalpha compare A B [C ...] [--labels a,b,c] [--out FILE.json]

Each of ``A``, ``B``, ... is a validation report (``validation.json`` of ``memalpha validate``,
``validation_step<N>.json`` of ``fit``'s validation) or a run folder holding one. The command
prints each report's pooled figures (what wrote its memories, ``memory``: the agent or a baseline
of :mod:`memalpha.agent.baselines`, and accuracy beside memory size, as Mem-α's table sets them),
then for each report against the one before it (``B - A``, ``C - B``) the change in accuracy, fact
recall, tool success, memory size and mean reward, paired per instance with its 95 % Student t
interval (:mod:`memalpha.train.instance_scores`): for all instances, per source and, where
questions name a category (LoCoMo), per category. ``--out`` writes the same as JSON
(docs/quickstart.md, *Comparing two runs*).

It refuses, in one line and before printing anything, reports that are not comparable
(:mod:`memalpha.commands.report_checks`): other instances, chunks or questions, other scoring
settings, or a report marked invalid. Reports whose reward settings differ are compared without
``mean_reward``; reports written before the settings were recorded are compared on their
instances and questions alone, with a note saying so.
"""

from __future__ import annotations

import argparse
import string
import sys
from pathlib import Path
from typing import Any, NoReturn

from memalpha.agent.baselines import BASELINE_KIND_KEY, BASELINE_TOP_K_KEY, memory_label
from memalpha.commands.report_checks import (
    ReportError,
    instance_difference,
    read_report,
    report_file,
    settings_difference,
)
from memalpha.train.instance_scores import COMPARED_METRICS, change_rows
from memalpha.train.validation_report import format_columns, write_json_atomically

PROG = "memalpha compare"
POOLED = ("instances", "questions", "accuracy", "memory_tokens", "fact_recall", "tool_success", "compression",
          "mean_reward")
"""A report's own figures, from its summary (pooled over all its questions, calls and rollouts),
accuracy and memory size side by side as in Mem-α's table."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors in one line."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: error: {message} (all options: {PROG} --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="B - A of validation reports of the same held-out set: accuracy, fact recall, tool "
        "success, memory size and mean reward, per source and question category, each paired per "
        "instance with its 95 %% t interval.",
    )
    parser.add_argument(
        "reports", nargs="+", type=Path, metavar="REPORT",
        help="a validation report (validation.json, validation_step<N>.json) or a run folder holding one; "
        "two or more, each compared with the one before",
    )
    parser.add_argument(
        "--labels", help="comma-separated names of the reports in the tables (default A, B, C, ...)"
    )
    parser.add_argument("--out", type=Path, help="also write the tables as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run ``memalpha compare`` with ``argv`` (the arguments after ``compare``); exits with status 2
    and one line when the reports cannot be compared."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        labels = report_labels(args.labels, len(args.reports))
        result = compare([report_file(p) for p in args.reports], labels)
    except ReportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(format_result(result))
    if args.out is not None:
        write_json_atomically(args.out, result)
        print(f"\n(written to {args.out})")


def report_labels(given: str | None, count: int) -> list[str]:
    """The reports' names: ``--labels`` split at commas, or A, B, C, ..."""
    if count < 2:
        raise ReportError(f"needs two reports or more, got {count}")
    if given is None:
        if count > len(string.ascii_uppercase):
            raise ReportError(f"name {count} reports with --labels")
        return list(string.ascii_uppercase[:count])
    labels = [label.strip() for label in given.split(",")]
    if len(labels) != count or not all(labels) or len(set(labels)) != count:
        raise ReportError(f"--labels needs {count} different non-empty names, got {given!r}")
    return labels


def compare(paths: list[Path], labels: list[str]) -> dict[str, Any]:
    """``{reports, changes, notes}``: each report's pooled figures, each report's change from the
    one before (:func:`memalpha.train.instance_scores.change_rows`), and what was not checked or
    left out. ReportError when two of them cannot be compared."""
    reports = [read_report(path) for path in paths]
    for path, report in zip(paths, reports):
        if report["summary"].get("invalid"):
            raise ReportError(f"{path}: marked invalid, not a score: {report['summary']['invalid']}")
    notes = [
        f"{label} ({path}) records no scoring settings (written before reports held them): "
        "only its instances and questions are checked"
        for label, path, report in zip(labels, paths, reports)
        if "settings" not in report["summary"]
    ]
    changes = []
    for after in range(1, len(reports)):
        pair = (reports[after - 1], reports[after])
        left_out = left_out_metrics(pair, (str(paths[after - 1]), str(paths[after])), notes)
        changes.append({
            "before": labels[after - 1],
            "after": labels[after],
            "rows": change_rows(pair[0]["records"], pair[1]["records"], left_out),
        })
    memories = [report_memory(report) for report in reports]
    for after in range(1, len(reports)):
        if "agent" not in memories[after - 1:after + 1] or memories[after - 1] == memories[after]:
            continue
        baseline = memories[after - 1] if memories[after] == "agent" else memories[after]
        notes.append(
            f"{labels[after]} - {labels[after - 1]}: {baseline} learns nothing, makes no tool call and "
            "earns no reward, so tool_success and mean_reward are not compared"
        )
    return {
        "reports": [
            {"label": label, "path": str(path), "memory": memory,
             **{k: report["summary"]["overall"].get(k) for k in POOLED}}
            for label, path, report, memory in zip(labels, paths, reports, memories)
        ],
        "changes": changes,
        "notes": notes,
    }


def report_memory(report: dict[str, Any]) -> str:
    """What wrote the report's memories: ``agent``, or the baseline its settings record
    (:func:`memalpha.agent.baselines.memory_label`)."""
    memory = (report["summary"].get("settings") or {}).get("memory") or {}
    return memory_label(memory.get(BASELINE_KIND_KEY), memory.get(BASELINE_TOP_K_KEY))


def left_out_metrics(pair: tuple[dict, dict], names: tuple[str, str], notes: list[str]) -> tuple[str, ...]:
    """The metrics of :data:`~memalpha.train.instance_scores.COMPARED_METRICS` the two reports
    cannot be compared on (``mean_reward`` under other reward settings, said in ``notes``);
    ReportError when they cannot be compared at all (other instances, other scoring settings)."""
    refusal = f"{names[0]} and {names[1]} are not comparable"
    difference = instance_difference((pair[0]["records"], pair[1]["records"]), names)
    settings = [report["summary"].get("settings") for report in pair]
    if all(isinstance(s, dict) for s in settings):
        scoring = settings_difference((settings[0].get("scoring", {}), settings[1].get("scoring", {})))
        if scoring is not None:
            raise ReportError(
                f"{refusal}: scored with other settings: {scoring} (validate both with the same)"
            )
        if difference is not None:
            raise ReportError(f"{refusal}: {difference}")
        reward = settings_difference((settings[0].get("reward", {}), settings[1].get("reward", {})))
        if reward is not None:
            notes.append(f"mean_reward of {names[1]} - {names[0]} left out: other reward settings ({reward})")
            return ("mean_reward",)
    elif difference is not None:
        raise ReportError(f"{refusal}: {difference}")
    return ()


def _change(change: dict[str, Any] | None, digits: int) -> str:
    """``+0.031 [-0.12, +0.18]`` (bounds one digit shorter); ``+0.500 (1 instance)``; ``-`` without one."""
    if change is None:
        return "-"
    mean = f"{change['mean']:+.{digits}f}"
    if change["half_width"] is None:
        return f"{mean} (1 instance)"
    bounds = max(digits - 1, 1)
    return f"{mean} [{change['low']:+.{bounds}f}, {change['high']:+.{bounds}f}]"


DIGITS = {"memory_tokens": 1}
"""Decimals of a metric in the tables (3 otherwise)."""


def format_result(result: dict[str, Any]) -> str:
    """The tables :func:`compare` returns, as text: the reports, then each change."""
    reports = [("report", "memory", *POOLED)]
    for report in result["reports"]:
        figures = (_figure(report[k], k) for k in POOLED)
        reports.append((report["label"], report.get("memory", "agent"), *figures))
    width = max(len(r["label"]) for r in result["reports"])
    lines = [f"{r['label'].ljust(width)}  {r['path']}" for r in result["reports"]]
    lines += ["", format_columns(reports)]
    for change in result["changes"]:
        cells = [("source", "instances", *COMPARED_METRICS)]
        for row in change["rows"]:
            name = row["source"] if row["category"] is None else f"  {row['source']} / {row['category']}"
            cells.append((name, str(row["instances"]),
                          *(_change(row[m], DIGITS.get(m, 3)) for m in COMPARED_METRICS)))
        lines += [
            "",
            f"{change['after']} - {change['before']}: mean change per instance [95 % t interval]",
            format_columns(cells),
        ]
    lines += ["", "An interval that holds 0 does not tell the two reports apart on these instances."]
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _figure(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key in ("instances", "questions"):
        return str(value)
    return f"{value:.{DIGITS.get(key, 3)}f}"
