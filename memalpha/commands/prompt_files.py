"""``memalpha prompts import PATH [--output FILE] [--qwen-agent DIR]``: a prompt-template file from a
local clone of the official Mem-alpha code (:func:`memalpha.templates.official.import_official` reads
it; docs/official_compatibility.md, difference 4)."""

from __future__ import annotations

import argparse
from pathlib import Path

from memalpha.templates.loader import dump_templates
from memalpha.templates.official import import_official

HEADER = """Prompt templates imported by `memalpha prompts import` from a local clone of the official
Mem-alpha code at {root}. Use with rollout.prompt_templates: PATH (docs/official_compatibility.md).
{tools}"""
TOOLS_OURS = (
    "The tool blocks are memalpha's (the official one comes from the Qwen-Agent package: --qwen-agent DIR)."
)
TOOLS_OFFICIAL = (
    "tool_block_qwen is the official tool block, built with the Qwen-Agent install at {qwen_agent};\n"
    "the hermes tool blocks are memalpha's."
)


def main(argv: list[str] | None = None) -> None:
    """Run ``memalpha prompts`` with ``argv`` (the arguments after ``prompts``)."""
    parser = argparse.ArgumentParser(
        prog="memalpha prompts",
        description="Prompt-template files (docs/official_compatibility.md, difference 4).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser(
        "import", help="write a template file from a local clone of the official Mem-alpha repository"
    )
    imp.add_argument(
        "path", help="folder of a clone of github.com/wangyu-ustc/Mem-alpha (nothing is downloaded)"
    )
    imp.add_argument("--output", default="official_prompts.yaml", help="file to write (default: %(default)s)")
    imp.add_argument(
        "--qwen-agent",
        metavar="DIR",
        default=None,
        help="a local Qwen-Agent install (the folder holding qwen_agent/, e.g. site-packages; the official "
        "code pins qwen-agent 0.0.29): tool_block_qwen becomes the official tool block (default: memalpha's)",
    )
    args = parser.parse_args(argv)
    try:
        texts = import_official(args.path, args.qwen_agent)
    except ValueError as exc:
        parser.exit(2, f"memalpha prompts import: error: {exc}\n")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tools = (
        TOOLS_OURS
        if args.qwen_agent is None
        else TOOLS_OFFICIAL.format(qwen_agent=Path(args.qwen_agent).resolve())
    )
    output.write_text(
        dump_templates(texts, HEADER.format(root=Path(args.path).resolve(), tools=tools)), encoding="utf-8"
    )
    print(f"wrote {output} ({len(texts)} templates); use it with --model.rollout.prompt_templates {output}")
