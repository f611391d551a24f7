"""The ``memalpha`` command.

``memalpha fit|validate`` are Lightning's own subcommands through ``MemAlphaCLI`` (a
``LightningCLI`` over :class:`~memalpha.module.GRPOModule` and
:class:`~memalpha.data.datamodule.RolloutDataModule`); ``memalpha data ...`` holds
the dataset tools (synth, inspect, convert).
"""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO


class MemAlphaCLI(LightningCLI):
    """LightningCLI with memalpha's defaults.

    Configs are saved next to the logs (overwriting), and checkpoints are written
    atomically unless the user configured their own checkpoint IO plugin.
    """

    def instantiate_trainer(self, **kwargs: Any):
        from memalpha.checkpoint_io import AtomicCheckpointIO

        key = "plugins"
        plugins = self.config_init[self.subcommand]["trainer"].get(key) if self.subcommand else None
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else ([plugins] if plugins else [])
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        kwargs[key] = plugins
        if self.subcommand:
            self.config_init[self.subcommand]["trainer"][key] = None
        return super().instantiate_trainer(**kwargs)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "data":
        from memalpha.data.cli import main as data_main

        data_main(args[1:])
        return
    from memalpha.data.datamodule import RolloutDataModule
    from memalpha.module import GRPOModule

    MemAlphaCLI(
        GRPOModule,
        RolloutDataModule,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )


if __name__ == "__main__":
    main()
