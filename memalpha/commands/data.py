"""``memalpha data``: make, look at and convert instance files, and write demonstrations.

    memalpha data synth --out DIR --num-train N --num-val M --seed S
    memalpha data inspect PATH [--tokenizer NAME|none]
    memalpha data convert IN OUT [--layout L] [--tokenizer NAME] [--chunk-tokens N] [--wrap STYLE]
                                 [--processing official [--keyword-golds FILE]]

docs/data.md, *memalpha data*, describes each (``--processing official``:
:mod:`memalpha.data.official_processing`). Bad input exits with status 2 and a message naming file,
record and field.

``demos``, ``distill`` and ``answers`` (:mod:`memalpha.commands.data_demos`,
:mod:`memalpha.commands.data_distill`, :mod:`memalpha.commands.data_answers`) have their own parsers;
:func:`main` hands them their arguments, importing them (and Lightning) only then.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memalpha.data.chunking import DEFAULT_CHUNK_TOKENS, count_tokens
from memalpha.data.loaders import (
    LAYOUTS,
    is_saved_dataset,
    list_data_files,
    load_instances,
    save_jsonl,
)
from memalpha.data.official_processing import (
    KEYWORD_OPTION,
    PROCESSINGS,
    load_keyword_golds,
    process_official,
)
from memalpha.data.schema import DataValidationError, Instance
from memalpha.data.synthetic import DEFAULT_FAMILIES, EVIDENCE_PLACEMENTS, FAMILIES, generate_synthetic
from memalpha.data.wrapping import WRAP_STYLES

DEFAULT_TOKENIZER = "smollm2-135m-instruct"


def main(argv: list[str] | None = None) -> None:
    """Run ``memalpha data`` with ``argv`` (the arguments after ``data``). Exits with status 2 on bad
    input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demos"]:
        from memalpha.commands.data_demos import main as demos_main

        demos_main(argv[1:])
        return
    if argv[:1] == ["answers"]:
        from memalpha.commands.data_answers import main as answers_main

        answers_main(argv[1:])
        return
    if argv[:1] == ["distill"]:
        from memalpha.commands.data_distill import main as distill_main

        distill_main(argv[1:])
        return
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (DataValidationError, ValueError, TypeError) as exc:
        print(f"memalpha data {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memalpha data",
        description="Make, inspect and convert instance files.",
        epilog=(
            "memalpha data demos --config FIT.yaml --out FILE.jsonl writes oracle demonstrations for "
            "memalpha sft; memalpha data distill --config FIT.yaml --out FILE.jsonl --records REPORT.json "
            "writes them from recorded trajectories; memalpha data answers --config FIT.yaml "
            "--out FILE.jsonl --memories RECORDS writes answer demonstrations for the answer agent."
        ),
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{synth,inspect,convert,demos,distill,answers}"
    )

    synth = sub.add_parser("synth", help="write synthetic train/validation JSONL (deterministic from --seed)")
    synth.add_argument("--out", required=True, type=Path, help="folder for train.jsonl and validation.jsonl")
    synth.add_argument("--num-train", type=int, default=64, help="training instances (default 64)")
    synth.add_argument("--num-val", type=int, default=16, help="validation instances (default 16)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--num-chunks", type=int, default=4, help="chunks per instance (default 4)")
    synth.add_argument("--facts-per-chunk", type=int, default=3)
    synth.add_argument("--distractors-per-chunk", type=int, default=1)
    synth.add_argument("--questions-per-instance", type=int, default=4)
    synth.add_argument(
        "--chunk-words", type=int, default=120, help="approximate words per chunk (default 120)"
    )
    synth.add_argument(
        "--families",
        default=",".join(DEFAULT_FAMILIES),
        help=f"comma-separated families of {','.join(FAMILIES)} (default {','.join(DEFAULT_FAMILIES)})",
    )
    synth.add_argument(
        "--evidence", choices=EVIDENCE_PLACEMENTS, default="random",
        help="where the questions' evidence sits: random chunks, or spread evenly over the input "
        "(default random)",
    )
    synth.set_defaults(run=_run_synth)

    inspect = sub.add_parser("inspect", help="print per-source statistics of a data source")
    inspect.add_argument("path", help="file, folder or hub dataset name")
    _add_load_options(inspect)
    inspect.set_defaults(run=_run_inspect)

    convert = sub.add_parser("convert", help="write memalpha JSONL from any supported layout")
    convert.add_argument("input", help="file, folder or hub dataset name")
    convert.add_argument("output", type=Path, help="JSONL file to write")
    _add_load_options(convert)
    convert.add_argument(
        "--processing",
        choices=PROCESSINGS,
        default="none",
        help="official: raw MemoryAgentBench as the Mem-alpha evaluation set (drop its left-out sources, "
        "sentence chunks, Sentence/Label rewrite of icl_*, dated wrappers; docs/data.md)",
    )
    convert.add_argument(
        KEYWORD_OPTION,
        type=Path,
        default=None,
        metavar="FILE",
        help="with --processing official: JSON/JSONL mapping instance id or source to the keyword golds "
        "of the long-range summary question (needed for infbench_sum*)",
    )
    convert.set_defaults(run=_run_convert)
    return parser


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layout", choices=LAYOUTS, default="auto")
    parser.add_argument("--split", default=None, help="split of a folder, saved DatasetDict or hub dataset")
    parser.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help=f"tokenizer (model name or path) for token counts and chunking (default {DEFAULT_TOKENIZER}; "
        "'none' counts white-space words)",
    )
    parser.add_argument(
        "--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, help="chunk size for long contexts"
    )
    parser.add_argument(
        "--wrap", choices=WRAP_STYLES, default=None, help="wrap chunks as dated dialogue/reading"
    )
    parser.add_argument("--skip-bad", action="store_true", help="skip (and report) bad records")
    parser.add_argument("--limit", type=int, default=None, help="read only the first N records")


def _run_synth(args: argparse.Namespace) -> None:
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    knobs = {
        "seed": args.seed,
        "num_chunks": args.num_chunks,
        "facts_per_chunk": args.facts_per_chunk,
        "distractors_per_chunk": args.distractors_per_chunk,
        "questions_per_instance": args.questions_per_instance,
        "chunk_words": args.chunk_words,
        "families": families,
        "evidence": args.evidence,
    }
    for split, count in (("train", args.num_train), ("validation", args.num_val)):
        instances = generate_synthetic(count, split=split, **knobs)
        target = args.out / f"{split}.jsonl"
        save_jsonl(instances, target)
        print(f"wrote {len(instances)} {split} instances to {target}")


def _tokenizer_from(name: str) -> Any:
    if name.lower() == "none":
        return None
    from memalpha.lm.core.embedded import load_tokenizer

    return load_tokenizer(name)


def _load(args: argparse.Namespace, source: str, tokenizer: Any) -> tuple[list[Instance], Any]:
    return load_instances(
        source,
        layout=args.layout,
        tokenizer=tokenizer,
        chunk_tokens=args.chunk_tokens,
        wrap=args.wrap,
        skip_bad=args.skip_bad,
        split=args.split,
        limit=args.limit,
    )


def _run_inspect(args: argparse.Namespace) -> None:
    tokenizer = _tokenizer_from(args.tokenizer)
    path = Path(args.path)
    sources: list[str] = [args.path]
    if path.is_dir() and args.split is None and not is_saved_dataset(path):
        files = list_data_files(path)
        if len(files) > 1:
            sources = [str(f) for f in files]
    for number, source in enumerate(sources):
        if number:
            print()
        instances, report = _load(args, source, tokenizer)
        token_note = args.tokenizer if tokenizer is not None else "white-space words"
        print(f"{report.source}: {report.loaded} instances (layout {report.layout}; tokens: {token_note})")
        if report.num_skipped:
            print(f"skipped {report.num_skipped} bad records:")
            for _, reason in report.skipped:
                print(f"  {reason}")
        print(format_stats(instance_stats(instances, tokenizer)))


def instance_stats(instances: Sequence[Instance], tokenizer: Any) -> dict[str, dict[str, list[int]]]:
    """Per data source (and ``all``): chunks per instance, tokens per chunk, questions per instance."""
    stats: dict[str, dict[str, list[int]]] = defaultdict(
        lambda: {"chunks": [], "tokens": [], "questions": []}
    )
    for instance in instances:
        for key in (instance.data_source, "all"):
            stats[key]["chunks"].append(len(instance.chunks))
            stats[key]["questions"].append(len(instance.questions))
        tokens = [count_tokens(chunk, tokenizer) for chunk in instance.chunks]
        stats[instance.data_source]["tokens"].extend(tokens)
        stats["all"]["tokens"].extend(tokens)
    ordered = {key: stats[key] for key in sorted(k for k in stats if k != "all")}
    if instances:
        ordered["all"] = stats["all"]
    return ordered


def format_stats(stats: dict[str, dict[str, list[int]]]) -> str:
    """A fixed-width table: source, instances, then min / median / max of each statistic."""

    def spread(values: list[int]) -> str:
        if not values:
            return "-"
        return f"{min(values)} / {statistics.median(values):g} / {max(values)}"

    header = ("data_source", "instances", "chunks/instance", "tokens/chunk", "questions/instance")
    rows = [header, ("", "", "min / med / max", "min / med / max", "min / med / max")]
    for source, values in stats.items():
        rows.append(
            (
                source,
                str(len(values["chunks"])),
                spread(values["chunks"]),
                spread(values["tokens"]),
                spread(values["questions"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def _run_convert(args: argparse.Namespace) -> None:
    if args.processing == "official":
        _run_official_convert(args)
        return
    if args.keyword_golds is not None:
        raise ValueError(f"{KEYWORD_OPTION} only applies with --processing official")
    # the tokenizer is only loaded when a layout needs it (MemoryAgentBench chunking)
    tokenizer = None if args.tokenizer.lower() == "none" else args.tokenizer
    instances, report = _load(args, args.input, tokenizer)
    save_jsonl(instances, args.output)
    skipped = f", skipped {report.num_skipped} bad records" if report.num_skipped else ""
    print(f"wrote {len(instances)} instances ({report.layout} layout) to {args.output}{skipped}")
    for _, reason in report.skipped:
        print(f"  skipped: {reason}")


def _run_official_convert(args: argparse.Namespace) -> None:
    """``convert --processing official``: raw MemoryAgentBench in, the official evaluation processing out."""
    if args.wrap is not None:
        raise ValueError(
            "--wrap does not combine with --processing official "
            "(it wraps each source as the official set does)"
        )
    if args.layout not in ("auto", "memoryagentbench"):
        raise ValueError(
            f"--processing official reads the raw memoryagentbench layout, got --layout {args.layout}"
        )
    keyword_golds = None if args.keyword_golds is None else load_keyword_golds(args.keyword_golds)
    tokenizer = _tokenizer_from(args.tokenizer)
    if tokenizer is None:
        raise ValueError(
            "--processing official counts tokens for its chunks: give --tokenizer a model, not 'none'"
        )
    instances, report = _load(args, args.input, tokenizer)
    if report.layout != "memoryagentbench":
        raise ValueError(
            "--processing official reads the raw memoryagentbench "
            f"layout; {report.source} has the {report.layout} layout"
        )
    processed, dropped = process_official(
        instances,
        lambda text: count_tokens(text, tokenizer),
        chunk_tokens=args.chunk_tokens,
        keyword_golds=keyword_golds,
    )
    save_jsonl(processed, args.output)
    skipped = f", skipped {report.num_skipped} bad records" if report.num_skipped else ""
    print(f"wrote {len(processed)} instances (official processing) to {args.output}{skipped}")
    dropped_by_source = Counter((source, reason) for _, source, reason in dropped)
    for (source, reason), count in sorted(dropped_by_source.items()):
        print(f"  dropped {count} {source} ({reason})")
    for _, reason in report.skipped:
        print(f"  skipped: {reason}")
