"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands (``MemAlphaCLI``, a
``LightningCLI``); ``memalpha data ...`` holds the dataset tools.
"""

from __future__ import annotations

import sys

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI


class MemAlphaCLI(LightningCLI):
    """LightningCLI with memalpha's defaults: configs are saved next to the logs, overwriting."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "data":
        from memalpha.data.cli import main as data_main

        data_main(args[1:])
        return
    MemAlphaCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )


if __name__ == "__main__":
    main()
