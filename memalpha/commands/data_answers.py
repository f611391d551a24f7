"""``memalpha data answers``: answer demonstrations for the answer agent, from memories an agent wrote.

    memalpha data answers --config FIT.yaml --memories RECORDS [RECORDS ...] --out FILE.jsonl

``RECORDS`` are ``memalpha predict`` outputs or validation reports: memories a memory agent wrote
in its own rollouts, with each instance's questions and golds. Every question gives one
demonstration: the config's reader's answer prompt over that memory and the gold answer as short as
the source's metric wants it (:mod:`memalpha.agent.answer_demos`); ``memalpha sft`` trains the
answer agent on them (docs/answer_agent.md). The config is read as every command reads it, its
``profile:`` first (:func:`memalpha.train.settings_loader.load_config`). Bad input exits with status 2
and one line.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from memalpha.agent.answer_demos import answer_demonstrations, records_of
from memalpha.agent.rollout import make_token_counter
from memalpha.commands.data_demos import demonstrations_parser
from memalpha.data.demo_files import save_demonstrations
from memalpha.data.schema import DataValidationError
from memalpha.lm.core.embedded import load_tokenizer
from memalpha.train.settings_loader import AgentLoadError, load_config

PROG = "memalpha data answers"


def run(config: Path, memories: list[Path], out: Path) -> int:
    """Write the answer demonstrations of ``memories`` for ``config``'s reader to ``out``; their count."""
    settings = load_config(config).agent()
    if settings.reader.kind != "local":
        raise ValueError(
            f"{config}: the answer agent answers as reader.kind: local, and this config names "
            f"{settings.reader.kind}: its prompts would not be the ones the adapter is shown"
        )
    records = records_of(memories)  # every file checked before the tokenizer loads
    tokenizer = load_tokenizer(settings.model)
    rollout = settings.rollout
    prompts = replace(settings.reader, adapter_path=None)  # the prompts alone: no weights, no adapter
    reader = prompts.build(None, tokenizer, rollout.templates, backend=rollout.backend)
    demos, skipped = answer_demonstrations(
        records, reader, make_token_counter(tokenizer), metric_overrides=settings.reward.metric_overrides
    )
    if not demos:
        raise ValueError(f"no question of {', '.join(map(str, memories))} has an answer to learn")
    count = save_demonstrations(out, demos)
    left = f" ({skipped} questions judged by a rubric left out)" if skipped else ""
    print(f"wrote {count} answer demonstrations from {len(records)} records to {out}{left}")
    return count


def main(argv: list[str] | None = None) -> None:
    parser = demonstrations_parser(
        PROG, "Write answer demonstrations (JSONL) from memories a memory agent wrote, for memalpha sft."
    )
    parser.add_argument(
        "--memories", required=True, nargs="+", type=Path, metavar="RECORDS",
        help="memalpha predict outputs (JSONL) or validation reports holding each instance's memory, "
        "questions and golds",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args.config, args.memories, args.out)
    except (OSError, ValueError, AgentLoadError, DataValidationError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
