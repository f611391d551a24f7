"""What a trained agent is made of, read from an adapter folder or a checkpoint and a config.

An adapter folder (what ``memalpha fit`` and ``memalpha sft`` export, or any PEFT LoRA folder)
holds the weights and the tokenizer but not how the agent was run; a Lightning checkpoint
(``last.ckpt`` of ``memalpha fit`` or ``sft``) holds the adapter's weights and the run's
settings. The settings an agent needs (the ``model.*`` groups ``lm``, ``lora``, ``rollout``,
``reader`` and ``reward``, and ``model.model``) come, later ones winning key by key, from the
defaults, the checkpoint, the ``model:`` section of a config file (the ``--config`` of
``memalpha fit``; its ``profile:`` applied first, as the CLI does) and the caller's overrides.
Every check here runs before any weight loads and fails with one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.lm.core.adapters import check_adapter_folder
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.reader.settings import ReaderSettings
from memalpha.train.checkpoint_io import MODULE_KEY
from memalpha.train.profiles import PROFILES

GROUPS: dict[str, type] = {
    "lm": LMSettings, "lora": LoraSettings, "rollout": RolloutSettings, "reader": ReaderSettings,
    "reward": RewardSettings,
}  # fmt: skip
"""The ``model.*`` settings groups an agent uses (the others only train)."""
TRAINED_BY = ("GRPOModule", "SFTModule")


class AgentLoadError(ValueError):
    """The adapter folder, checkpoint or config cannot give an agent; one line naming it."""


@dataclass
class AgentSettings:
    """Everything but the weights: the base model and the typed settings groups."""

    model: str
    lm: LMSettings
    lora: LoraSettings
    rollout: RolloutSettings
    reader: ReaderSettings
    reward: RewardSettings


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


def config_settings(config: str | Path) -> dict[str, Any]:
    """The agent's settings in a config file's ``model:`` section, over its ``profile:``'s."""
    path = Path(config).expanduser()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise AgentLoadError(f"config: {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise AgentLoadError(f"config: {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model", {}), dict):
        raise AgentLoadError(f"config: {path}: expected a mapping with a 'model:' section")
    profile = data.get("profile", "memalpha")
    if profile not in PROFILES:
        raise AgentLoadError(f"config: {path}: profile must be one of {list(PROFILES)}, got {profile!r}")
    settings: dict[str, Any] = {}
    for key, value in PROFILES[profile].items():
        parts = key.split(".")
        if parts[0] == "model" and parts[1] in GROUPS:
            merge(settings, nested(parts[1:], value))
    return merge(settings, {k: v for k, v in data.get("model", {}).items() if k == "model" or k in GROUPS})


def nested(keys: list[str], value: Any) -> dict[str, Any]:
    """``{keys[0]: {keys[1]: ... value}}``."""
    for key in reversed(keys):
        value = {key: value}
    return value


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``base`` key by key, nested mappings merged too; returns ``base``."""
    for key, value in update.items():
        value = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


def agent_settings(*layers: Mapping[str, Any], fallback_model: str | None = None) -> AgentSettings:
    """The typed settings of ``layers`` merged in order (later wins); a bad value is one line
    naming the key (``rollout.group_size must be >= 1``, ``rollout: unknown setting 'grup_size'``)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merge(merged, layer)
    groups = {}
    for name, kind in GROUPS.items():
        values = merged.get(name, {})
        known = [f.name for f in fields(kind)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise AgentLoadError(f"{name}: unknown setting {unknown[0]!r} (its settings: {', '.join(known)})")
        try:
            groups[name] = kind(**values)
        except (TypeError, ValueError) as exc:
            raise AgentLoadError(str(exc)) from None
    model = merged.get("model") or fallback_model or EMBEDDED_MODEL_NAME
    return AgentSettings(model=model, **groups)
