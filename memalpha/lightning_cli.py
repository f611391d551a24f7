"""MemAlphaCLI: Lightning's CLI over GRPOModule and RolloutDataModule, with memalpha's defaults."""

from __future__ import annotations

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
