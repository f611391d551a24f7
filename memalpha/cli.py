"""The ``memalpha`` command.

``memalpha fit|validate|predict`` are Lightning's own subcommands through
:class:`~memalpha.train.lightning_cli.MemAlphaCLI` (a ``LightningCLI`` over
:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.datamodule.RolloutDataModule`);
``memalpha sft`` is Lightning's ``fit`` over :class:`~memalpha.train.sft_module.SFTModule` and
:class:`~memalpha.train.demo_datamodule.DemoDataModule` (the cold start from demonstrations).
``memalpha compare`` sets validation reports side by side (:mod:`memalpha.commands.compare`).
``memalpha data ...`` holds the dataset tools, all in :mod:`memalpha.commands.data` (synth,
inspect, convert start without importing Lightning; ``demos`` writes oracle demonstrations for a
training config, ``distill`` demonstrations from recorded trajectories).
``memalpha --help`` lists :data:`COMMANDS`; Lightning's ``test``, which memalpha has no use for,
stops with one line pointing at ``validate`` (:data:`REPLACED`).
``make demo`` runs the cold-start recipe as ``memalpha`` commands (the Makefile's ``demo`` target).
"""

from __future__ import annotations

import sys

COMMANDS: dict[str, str] = {
    "fit": "train the memory agent with GRPO (Lightning's fit)",
    "validate": "score a model, adapter or checkpoint on the held-out sets; writes validation.json",
    "predict": "run a trained agent over new data and write the memory it builds (Lightning's predict)",
    "sft": "cold start: supervised fine-tuning on demonstrations (Lightning's fit)",
    "compare": "B - A of validation reports of the same held-out set, with paired 95 % intervals",
    "data": "make, inspect and convert instance files; write demonstrations",
    "prompts": "import the official Mem-alpha prompt texts from a local clone",
}
"""Every ``memalpha`` command and its line in ``memalpha --help``."""

REPLACED: dict[str, str] = {
    "test": "memalpha has no test stage: score held-out sets with 'memalpha validate' (data.val_path)",
}
"""Lightning subcommands memalpha does not offer, and the line that says what to use instead."""

LIGHTNING = ("fit", "validate", "predict")
"""The commands :func:`~memalpha.train.lightning_cli.run_lightning_cli` runs."""


def help_text() -> str:
    """``memalpha --help``: the usage line and one line per command of :data:`COMMANDS`."""
    width = max(map(len, COMMANDS))
    lines = [
        "usage: memalpha COMMAND [options]",
        "",
        "Train LLM agents to build their own long-term memory with GRPO (docs/architecture.md).",
        "",
        "commands:",
        *(f"  {name.ljust(width)}  {line}" for name, line in COMMANDS.items()),
        "",
        "memalpha COMMAND --help lists a command's options.",
    ]
    return "\n".join(lines)


def run(argv: list[str] | None = None):
    """Run the command and return the ``MemAlphaCLI`` (``None`` for the commands that are not
    Lightning's: ``data``, ``prompts``, ``compare``); for Python callers."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else None
    if command in (None, "-h", "--help"):
        print(help_text(), file=sys.stdout if command else sys.stderr)
        if command is None:
            raise SystemExit(2)
        return None
    if command in REPLACED:
        raise SystemExit(f"memalpha {command}: error: {REPLACED[command]}")
    if command == "prompts":
        from memalpha.commands.prompt_files import main as prompts_main

        prompts_main(args[1:])
        return None
    if command == "data":
        from memalpha.commands.data import main as data_main

        data_main(args[1:])
        return None
    if command == "compare":
        from memalpha.commands.compare import main as compare_main

        compare_main(args[1:])
        return None
    if command == "sft":
        from memalpha.train.lightning_cli import run_sft_cli

        return run_sft_cli(args[1:])
    if command not in LIGHTNING and not command.startswith("-"):  # LightningCLI's own -c/--config come first
        raise SystemExit(f"memalpha: error: unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    from memalpha.train.lightning_cli import run_lightning_cli

    return run_lightning_cli(argv)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: returns nothing, so the process exits 0 on success. The CUDA
    allocator's setting is made here, before anything touches CUDA (memalpha/allocator.py)."""
    from memalpha.allocator import prefer_expandable_segments

    prefer_expandable_segments()
    run(argv)


if __name__ == "__main__":
    main()
