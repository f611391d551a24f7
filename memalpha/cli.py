"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands through
:class:`~memalpha.train.lightning_cli.MemAlphaCLI` (a ``LightningCLI`` over
:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.datamodule.RolloutDataModule`);
``memalpha sft`` is Lightning's ``fit`` over :class:`~memalpha.train.sft_module.SFTModule` and
:class:`~memalpha.train.demo_datamodule.DemoDataModule` (the cold start from demonstrations).
``memalpha data ...`` holds the dataset tools (synth, inspect, convert start without importing
Lightning; ``demos`` writes oracle demonstrations for a training config, ``distill``
demonstrations from recorded trajectories).
"""

from __future__ import annotations

import sys


def run(argv: list[str] | None = None):
    """Run the command and return the ``MemAlphaCLI`` (``None`` for ``memalpha data``); for Python callers."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["data", "demos"]:
        from memalpha.train.demos_command import main as demos_main

        demos_main(args[2:])
        return None
    if args[:2] == ["data", "distill"]:
        from memalpha.train.distill_command import main as distill_main

        distill_main(args[2:])
        return None
    if args and args[0] == "data":
        from memalpha.data.cli import main as data_main

        data_main(args[1:])
        return None
    if args and args[0] == "sft":
        from memalpha.train.lightning_cli import run_sft_cli

        return run_sft_cli(args[1:])
    from memalpha.train.lightning_cli import run_lightning_cli

    return run_lightning_cli(argv)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: returns nothing, so the process exits 0 on success."""
    run(argv)


if __name__ == "__main__":
    main()
