"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands through ``MemAlphaCLI`` (a
``LightningCLI`` over :class:`~memalpha.module.GRPOModule` and
:class:`~memalpha.data.datamodule.RolloutDataModule`); ``memalpha data ...`` holds
the dataset tools (synth, inspect, convert) and starts without importing Lightning.
"""

from __future__ import annotations

import sys


def run(argv: list[str] | None = None):
    """Run the command and return the ``MemAlphaCLI`` (``None`` for ``memalpha data``); for Python callers."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "data":
        from memalpha.data.cli import main as data_main

        data_main(args[1:])
        return None
    from memalpha.data.datamodule import RolloutDataModule
    from memalpha.lightning_cli import MemAlphaCLI
    from memalpha.module import GRPOModule

    return MemAlphaCLI(
        GRPOModule,
        RolloutDataModule,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: returns nothing, so the process exits 0 on success."""
    run(argv)


if __name__ == "__main__":
    main()
