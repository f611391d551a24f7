"""``memalpha data demos``: oracle demonstrations for the cold start, matching a training config.

    memalpha data demos --config configs/tiny_cpu.yaml --out runs/demos/train.jsonl [--split train]
                        [--count N] [--seed S] [--reply-share F] [--data conv-26.json]

The config's ``model.model``, ``model.rollout`` (read as every command reads it, its ``profile:``
first: :func:`memalpha.train.settings_loader.load_config`) and ``data.synthetic`` decide the
demonstrations, so their prompts are the prompts the rollout will build (docs/cold_start.md,
*Oracle demonstrations*); every chunk gives one (:func:`memalpha.agent.oracle_demos.oracle_demonstrations`).
With ``--data``, the instances are a LoCoMo file's conversations instead, cut as the config's
``data.load`` cuts them, and each chunk's notes are LoCoMo's ``observation`` facts
(:func:`memalpha.data.locomo.read_observations`).
Bad input exits with status 2 and one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from memalpha.agent.oracle_demos import DEFAULT_REPLY_SHARE, OracleError, oracle_demonstrations
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.demo_files import save_demonstrations
from memalpha.data.schema import DataValidationError, Instance
from memalpha.data.synthetic import SyntheticSettings
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.train.datamodule import RolloutDataModule
from memalpha.train.settings_loader import load_config


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    settings, data = config.agent(), config.section("data")
    rollout = settings.rollout
    seed = args.seed if args.seed is not None else int(data.get("seed", 0))
    tokenizer = load_tokenizer(settings.model)
    if args.data is not None:
        instances = observed(config_instances(settings.model, data, rollout, args.data), args.data)
        what = f"{len(instances)} conversations of {args.data}"
    else:
        try:
            synthetic = SyntheticSettings(**(data.get("synthetic") or {}))
        except ValueError as exc:
            raise ValueError(f"{args.config}: {exc}") from None
        instances = synthetic.generate(args.split, seed, count=args.count)
        what = f"{len(instances)} {args.split} instances"
    demos = oracle_demonstrations(instances, tokenizer, rollout, seed=seed, reply_share=args.reply_share)
    count = save_demonstrations(args.out, demos)
    print(f"wrote {count} demonstrations from {what} to {args.out}")
    return count


def config_instances(
    model: str, data: dict[str, Any], rollout: RolloutSettings, path: Path | None = None
) -> list[Instance]:
    """The validation set ``memalpha validate --config`` scores (or the file ``path``, read as its
    ``data.val_path``), built by its own DataModule: ``model``'s tokenizer cuts the chunks as
    ``data.load`` says, to fit ``rollout``'s prompt budget when it names no size."""
    named = {"val_path": str(path)} if path is not None else {}
    module = RolloutDataModule(**{**data, "tokenizer_name": model, **named})
    module.rollout = rollout
    module.setup("validate")
    return module.val_instances


def observed(instances: list[Instance], path: Path) -> list[Instance]:
    """LoCoMo conversations with their ``observation`` facts as the notes of their chunks; a
    conversation without ``observation`` is refused in one line."""
    out = []
    for index, instance in enumerate(instances):
        observations = instance.metadata.get("observations")
        if observations is None:
            raise DataValidationError(
                str(path), "no observation: demonstrations are written from LoCoMo's observation facts",
                index=index, instance_id=instance.instance_id, field="observation",
            )
        out.append(dataclasses.replace(instance, metadata={**instance.metadata, "notes": observations}))
    return out


def demonstrations_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the two options every demonstration writer takes: ``--config`` and ``--out``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config", required=True, type=Path, help="the memalpha fit config the demonstrations serve"
    )
    parser.add_argument("--out", required=True, type=Path, help="JSONL file to write")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = demonstrations_parser(
        "memalpha data demos",
        "Write oracle demonstrations (JSONL) whose prompts match a training config's rollouts.",
    )
    parser.add_argument(
        "--split", default="train", choices=("train", "val", "test"), help="synthetic split (default train)"
    )
    parser.add_argument(
        "--count", type=int, default=32, help="synthetic instances (default 32); one demonstration per chunk"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the synthetic instances (default: the config's data.seed)",
    )
    parser.add_argument(
        "--reply-share",
        type=float,
        default=DEFAULT_REPLY_SHARE,
        help="longest reply, as a share of rollout.max_new_tokens, that a demonstration may take when a "
        f"shorter form exists (default {DEFAULT_REPLY_SHARE}): "
        "headroom so the imitating model is not cut at the cap",
    )
    parser.add_argument(
        "--data", type=Path, default=None,
        help="a LoCoMo file: demonstrations from its conversations' observation facts, not synthetic data",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.count < 1:
            raise ValueError(f"--count must be >= 1, got {args.count}")
        if not 0.0 < args.reply_share <= 1.0:
            raise ValueError(f"--reply-share must be in (0, 1], got {args.reply_share}")
        run(args)
    except (OSError, ValueError, TypeError, OracleError) as exc:
        print(f"memalpha data demos: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
