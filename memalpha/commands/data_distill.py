"""``memalpha data distill``: demonstrations from a stronger agent's recorded trajectories.

    memalpha data distill --config FIT.yaml --out F.jsonl --records runs/.../validation.json
                          [--instances FILE] [--min-accuracy A]
    memalpha data distill --config FIT.yaml --out F.jsonl --official-responses responses.jsonl
                          --instances instances.jsonl

docs/cold_start.md, *Demonstrations from recorded trajectories*, describes the two recorded layouts
(a memalpha validation report, whose memory ``seed`` gives the recorded memory ids; the official
Mem-α-4B responses, one ``✿FUNCTION✿`` chunk turn per line) and which instances are used. Prompts
are rebuilt under the config's rollout settings (:func:`memalpha.agent.trajectory_replay.replay_trajectory`).
Bad input exits with status 2 and one line naming the file, the record and the field.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memalpha.agent.trajectory_replay import DistillStats, RecordedTurn, replay_trajectory
from memalpha.commands.data_demos import config_instances, demonstrations_parser
from memalpha.data.demo_files import Demonstration, save_demonstrations
from memalpha.data.loaders import load_instances
from memalpha.data.schema import DataValidationError
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.seeding import stable_seed
from memalpha.train.settings_loader import load_config


def _field(record: dict[str, Any], name: str, kind: type | tuple[type, ...], file: str, index: int) -> Any:
    value = record.get(name)
    if not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataValidationError(
            file, f"must be {expected}, got {type(value).__name__}", index=index, field=name
        )
    return value


def memalpha_trajectories(
    path: Path, min_accuracy: float
) -> Iterator[tuple[str, int, list[RecordedTurn], dict]]:
    """``(instance_id, memory_seed, turns, metadata)`` of every rollout in a validation report
    whose accuracy reaches ``min_accuracy``."""
    file = str(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataValidationError(file, f"not a readable validation report: {exc}") from exc
    records = report.get("records") if isinstance(report, dict) else None
    if not isinstance(records, list):
        raise DataValidationError(file, "not a validation report: no 'records' list", field="records")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataValidationError(file, "a record must be an object", index=index)
        instance_id = _field(record, "instance_id", str, file, index)
        memory = _field(record, "memory", dict, file, index)
        seed = memory.get("seed")
        if not isinstance(seed, int):
            raise DataValidationError(
                file, "must hold the memory's integer 'seed'", index=index, field="memory.seed"
            )
        questions = _field(record, "questions", list, file, index)
        scores = [q.get("score", 0.0) for q in questions if isinstance(q, dict)]
        accuracy = sum(scores) / len(scores) if scores else 0.0
        if accuracy < min_accuracy:
            continue
        turns = []
        for position, turn in enumerate(_field(record, "turns", list, file, index)):
            if (
                not isinstance(turn, dict)
                or not isinstance(turn.get("response"), str)
                or not isinstance(turn.get("chunk_index"), int)
            ):
                raise DataValidationError(
                    file,
                    "a turn needs an integer 'chunk_index' and a 'response' string",
                    index=index,
                    field=f"turns[{position}]",
                )
            turns.append(
                RecordedTurn(turn["chunk_index"], turn["response"], bool(turn.get("truncated", False)))
            )
        meta = {"teacher_accuracy": accuracy, "rollout_index": record.get("rollout_index", 0)}
        yield instance_id, seed, turns, meta


def official_trajectories(path: Path) -> Iterator[tuple[str, int, list[RecordedTurn], dict]]:
    """``(instance_id, memory_seed, turns, metadata)`` per instance of an official responses file
    (its memory ids are not recorded, so the replay memory is seeded from the instance id)."""
    file = str(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataValidationError(file, f"not a readable JSONL file: {exc}") from exc
    by_instance: dict[str, list[RecordedTurn]] = {}
    for index, line in enumerate(line for line in lines if line.strip()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataValidationError(file, f"not valid JSON: {exc.msg}", index=index) from exc
        if not isinstance(record, dict):
            raise DataValidationError(file, "a record must be an object", index=index)
        instance_id = _field(record, "instance_id", str, file, index)
        chunk = _field(record, "chunk_idx", int, file, index)
        response = _field(record, "response_qwen", str, file, index)
        by_instance.setdefault(instance_id, []).append(RecordedTurn(chunk, response))
    if not by_instance:
        raise DataValidationError(file, "holds no recorded turns")
    for instance_id, turns in by_instance.items():
        yield (
            instance_id,
            stable_seed(0, "official", instance_id),
            sorted(turns, key=lambda t: t.chunk_index),
            {},
        )


def run(args: argparse.Namespace) -> tuple[int, DistillStats]:
    config = load_config(args.config)  # the profile first, as every command
    settings, data = config.agent(), config.section("data")
    rollout = settings.rollout
    if args.records is not None:
        trajectories, source, source_format = (
            memalpha_trajectories(args.records, args.min_accuracy),
            "teacher",
            None,
        )
    else:
        if args.instances is None:
            raise ValueError(
                "--official-responses needs --instances (the instances the responses were recorded on)"
            )
        trajectories, source, source_format = (
            official_trajectories(args.official_responses),
            "official",
            "qwen",
        )
    if args.instances is not None:
        instances, _ = load_instances(args.instances)
    else:
        instances = config_instances(settings.model, data, rollout)
    by_id = {instance.instance_id: instance for instance in instances}
    tokenizer = load_tokenizer(settings.model)
    demos: list[Demonstration] = []
    stats = DistillStats()
    for instance_id, seed, turns, meta in trajectories:
        instance = by_id.get(instance_id)
        if instance is None:
            where = args.instances or f"{args.config}'s validation set"
            raise ValueError(
                f"instance {instance_id!r} of the recorded trajectories is not in {where}; pass --instances"
            )
        got, _, turn_stats = replay_trajectory(
            instance,
            turns,
            tokenizer,
            rollout,
            memory_seed=seed,
            source=source,
            source_format=source_format,
            metadata=meta,
        )
        demos.extend(got)
        stats.add(turn_stats)
    if not demos:
        raise ValueError(f"no demonstration: {stats.describe()}")
    count = save_demonstrations(args.out, demos)
    print(f"wrote {count} demonstrations to {args.out}: {stats.describe()}")
    return count, stats


def main(argv: list[str] | None = None) -> None:
    parser = demonstrations_parser(
        "memalpha data distill",
        "Write demonstrations (JSONL) from recorded trajectories, prompts rebuilt for a training config.",
    )
    recorded = parser.add_mutually_exclusive_group(required=True)
    recorded.add_argument("--records", type=Path, help="a memalpha validation report (validation*.json)")
    recorded.add_argument(
        "--official-responses", type=Path, help="official Mem-α responses.jsonl (one chunk turn per line)"
    )
    parser.add_argument(
        "--instances", type=Path, default=None, help="the instances the trajectories were recorded on"
    )
    parser.add_argument(
        "--min-accuracy",
        type=float,
        default=0.0,
        help="keep rollouts whose accuracy reaches this (--records)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not 0.0 <= args.min_accuracy <= 1.0:
            raise ValueError(f"--min-accuracy must be in [0, 1], got {args.min_accuracy}")
        run(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"memalpha data distill: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
