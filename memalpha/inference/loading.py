"""Where a trained agent's weights and saved settings come from: an adapter folder or a checkpoint.

An adapter folder (what ``memalpha fit`` and ``memalpha sft`` export, or any PEFT LoRA folder)
holds the weights and the tokenizer but not how the agent was run; a Lightning checkpoint
(``last.ckpt`` of ``memalpha fit`` or ``sft``) holds the adapter's weights and the run's
settings. :class:`~memalpha.inference.memory_agent.MemoryAgent` lays those settings under a config file's and
the caller's (:mod:`memalpha.train.settings_loader`). Every check here runs before any weight loads
and fails with one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memalpha.lm.core.adapters import check_adapter_folder
from memalpha.train.checkpoint_io import MODULE_KEY
from memalpha.train.settings_loader import GROUPS, AgentLoadError

TRAINED_BY = ("GRPOModule", "SFTModule")


@dataclass
class AgentSource:
    """Where the weights come from: a PEFT folder, or a checkpoint's adapter tensors (``state``)."""

    adapter_path: Path | None
    state: dict[str, Any] | None
    settings: dict[str, Any]
    base_model: str | None = None


def read_source(source: str | Path) -> AgentSource:
    """The adapter folder or checkpoint at ``source``, checked (no weights loaded yet)."""
    path = Path(source).expanduser()
    if not path.exists():
        raise AgentLoadError(f"{source}: no such adapter folder or checkpoint file")
    if path.is_dir():
        try:
            folder = check_adapter_folder(path, "adapter")
        except ValueError as exc:
            raise AgentLoadError(str(exc)) from None
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        return AgentSource(folder, None, {}, config.get("base_model_name_or_path"))
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a file that is not a
        # checkpoint; only this load runs here, and it stops with the one line below
        raise AgentLoadError(
            f"checkpoint: {path} is not a readable checkpoint ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    module = checkpoint.get(MODULE_KEY) if isinstance(checkpoint, dict) else None
    if module not in TRAINED_BY:
        raise AgentLoadError(f"checkpoint: {path} is not one of memalpha fit or sft (no {MODULE_KEY!r})")
    prefix = "policy."
    state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    if not state:
        raise AgentLoadError(f"checkpoint: {path} holds no adapter weights")
    hparams = checkpoint.get("hyper_parameters") or {}
    settings = {k: v for k, v in hparams.items() if k == "model" or k in GROUPS}
    return AgentSource(None, state, settings)
