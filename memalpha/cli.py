"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands through
:class:`~memalpha.train.lightning_cli.MemAlphaCLI` (a ``LightningCLI`` over
:class:`~memalpha.train.module.GRPOModule` and :class:`~memalpha.train.datamodule.RolloutDataModule`);
``memalpha sft`` is Lightning's ``fit`` over :class:`~memalpha.train.sft_module.SFTModule` and
:class:`~memalpha.train.demo_datamodule.DemoDataModule` (the cold start from demonstrations).
``memalpha data ...`` holds the dataset tools, all in :mod:`memalpha.commands.data` (synth,
inspect, convert start without importing Lightning; ``demos`` writes oracle demonstrations for a
training config, ``distill`` demonstrations from recorded trajectories).
``make demo`` runs the cold-start recipe through :func:`run` (``lab/memalpha_lab/demo.py``).
"""

from __future__ import annotations

import sys


def run(argv: list[str] | None = None):
    """Run the command and return the ``MemAlphaCLI`` (``None`` for ``memalpha data`` and ``prompts``); for
    Python callers."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "prompts":
        from memalpha.templates.official import main as prompts_main

        prompts_main(args[1:])
        return None
    if args and args[0] == "data":
        from memalpha.commands.data import main as data_main

        data_main(args[1:])
        return None
    if args and args[0] == "sft":
        from memalpha.train.lightning_cli import run_sft_cli

        return run_sft_cli(args[1:])
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
