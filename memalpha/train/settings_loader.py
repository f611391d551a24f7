"""One way from a config file to settings: its YAML, its ``profile:`` and the caller's overrides.

:func:`load_config` is that way. It reads the file once: a file that is not valid YAML is one line
naming its line and column. Then it lays the chosen profile's values (:mod:`memalpha.train.profiles`)
under the file's own, and the caller's overrides (option keys, as typed on the command line:
``model.rollout.max_new_tokens``) over both. ``memalpha fit|validate|predict`` parse with Lightning's
CLI, which reads the same profile through :func:`profile_named` and checks the files through
:func:`check_config_files`. ``memalpha data demos|distill|answers``, the Python API
(:class:`~memalpha.inference.memory_agent.MemoryAgent`) and the benchmarks read a config through
:func:`load_config`.

The settings an agent runs with (:class:`AgentSettings`: the base model and the ``model.*`` groups
``lm``, ``lora``, ``rollout``, ``reader`` and ``reward``) hold the rules that span groups in their
``__post_init__``, so every path that builds an agent stops on the same bad pair in one line, before any
model loads. :class:`TrainingSettings` adds the rules that need the update settings or the adapter a
run starts from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.grpo.settings import UpdateSettings
from memalpha.lm.core.adapters import check_adapter_base
from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.reader.settings import ReaderSettings
from memalpha.train.profiles import PROFILES

GROUPS: dict[str, type] = {
    "lm": LMSettings, "lora": LoraSettings, "rollout": RolloutSettings, "reader": ReaderSettings,
    "reward": RewardSettings,
}  # fmt: skip
"""The ``model.*`` settings groups an agent uses (the others only train)."""


class AgentLoadError(ValueError):
    """The config, adapter folder or checkpoint cannot give an agent; one line naming it."""


# ------------------------------------------------------------------ the file
def read_config_file(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; :class:`AgentLoadError` in one line naming the file (and the line
    and column of a YAML error) when it cannot be read or is not a mapping."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentLoadError(f"config: {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise AgentLoadError(f"config: {path}{yaml_error_place(error)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AgentLoadError(f"config: {path}: expected a YAML mapping, got {type(data).__name__}")
    return data


def yaml_error_place(error: yaml.YAMLError) -> str:
    """``, line 3, column 5: not valid YAML: ...`` for a YAML error."""
    mark = getattr(error, "problem_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def config_paths(args: Iterable[str]) -> list[str]:
    """The files named by ``--config F``, ``--config=F`` or ``-c F`` in ``args``, in order."""
    args = list(args)
    paths = []
    for index, arg in enumerate(args):
        if arg in ("--config", "-c") and index + 1 < len(args):
            paths.append(args[index + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def check_config_files(args: Iterable[str]) -> None:
    """``ValueError`` naming the file, line and column of the first config file in ``args`` that is not
    valid YAML (jsonargparse's own message names only ``"<unicode string>"``). A missing or unreadable
    file is left to the CLI, which reports it itself."""
    for path in config_paths(args):
        if Path(path).expanduser().is_file():
            try:
                yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
            except yaml.YAMLError as error:
                raise ValueError(f"{path}{yaml_error_place(error)}") from None


def profile_named(args: Iterable[str], default: str | None = "memalpha") -> str | None:
    """The profile ``args`` choose: the last ``--profile`` flag or top-level ``profile:`` key of a
    ``--config`` file, in the order given (``default`` when none does). An unreadable config file is
    left to the CLI, which reports it itself."""
    args = list(args)
    chosen = default
    for index, arg in enumerate(args):
        following = args[index + 1] if index + 1 < len(args) else None
        if arg == "--profile" and following is not None:
            chosen = following
        elif arg.startswith("--profile="):
            chosen = arg.split("=", 1)[1]
        elif (arg in ("--config", "-c") and following is not None) or arg.startswith("--config="):
            try:
                config = read_config_file(following if arg in ("--config", "-c") else arg.split("=", 1)[1])
            except AgentLoadError:
                continue
            if "profile" in config:
                chosen = str(config["profile"])
    if chosen is not None and chosen not in PROFILES:
        raise ValueError(f"profile must be one of {list(PROFILES)}, got {chosen!r}")
    return chosen


@dataclass(frozen=True)
class LoadedConfig:
    """A config file read with its profile and overrides: ``sections`` holds its top-level keys
    (``model``, ``data``, ``trainer``, ...) as nested dicts."""

    path: Path | None
    profile: str
    sections: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        """The ``name`` section (``model``, ``data``); empty when absent, one line when not a mapping."""
        value = self.sections.get(name) or {}
        if not isinstance(value, dict):
            raise AgentLoadError(f"config: {self.path}: '{name}' must be a mapping")
        return value

    def agent_layer(self) -> dict[str, Any]:
        """The agent's settings in the ``model`` section (``model.model`` and :data:`GROUPS`), as a
        layer for :func:`agent_settings`."""
        return {k: v for k, v in self.section("model").items() if k == "model" or k in GROUPS}

    def agent(self, *over: Mapping[str, Any], fallback_model: str | None = None) -> AgentSettings:
        """The typed agent settings of this config, with ``over`` layered on top."""
        return agent_settings(self.agent_layer(), *over, fallback_model=fallback_model)


def load_config(
    path: str | Path | None, overrides: Mapping[str, Any] | None = None, *, profile: str | None = None
) -> LoadedConfig:
    """The config at ``path`` (None: no file), its profile (``profile``, else its ``profile:`` key, else
    ``memalpha``) under it and ``overrides`` (option keys as on the command line,
    ``{"model.rollout.max_new_tokens": 384}``) over it. One line (:class:`AgentLoadError`) for a file that
    cannot be read, an unknown profile or an override that is not an option key."""
    data = read_config_file(path) if path is not None else {}
    name = profile or str(data.get("profile", "memalpha"))
    where = f"config: {path}: " if path is not None else ""
    if name not in PROFILES:
        raise AgentLoadError(f"{where}profile must be one of {list(PROFILES)}, got {name!r}")
    sections: dict[str, Any] = {}
    for key, value in PROFILES[name].items():
        merge(sections, nested(key.split("."), value))
    merge(sections, {k: v for k, v in data.items() if k != "profile"})
    for key, value in (overrides or {}).items():
        if not key or key.startswith((".", "-")) or "." not in key:
            raise AgentLoadError(f"override {key!r}: name an option key such as model.rollout.max_new_tokens")
        merge(sections, nested(key.split("."), value))
    return LoadedConfig(None if path is None else Path(path), name, sections)


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


# ------------------------------------------------------------------ the settings
@dataclass
class AgentSettings:
    """Everything an agent runs with but the weights: the base model and the typed settings groups.

    The rules between groups are checked here, before any weight loads (one ``ValueError`` line each):
    an answer agent (``reader.adapter_path``) trained on the base ``model``; the ``engine`` reader only
    with the ``vllm`` rollout backend; the ``llm`` content judge only with a reader that is a model;
    ``rollout.trains: answer`` only with the local reader and no second answer adapter.
    """

    model: str
    lm: LMSettings = field(default_factory=LMSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    reward: RewardSettings = field(default_factory=RewardSettings)

    def __post_init__(self) -> None:
        reader, rollout = self.reader, self.rollout
        if reader.adapter_path is not None:
            check_adapter_base(reader.adapter_path, self.model, "reader.adapter_path")
        if reader.kind == "engine" and rollout.backend != "vllm":
            raise ValueError(
                "reader.kind: engine answers from the vLLM server of a run whose rollout.backend is vllm: "
                "set rollout.backend: vllm, or use reader.kind: openai"
            )
        if reader.kind == "extractive" and self.reward.content_judge == "llm":
            raise ValueError(
                "reward.content_judge: llm asks the reader, and reader.kind: extractive has no model "
                "to judge with: use content_judge: rule or a language-model reader"
            )
        if rollout.trains == "answer":
            if reader.kind != "local":
                raise ValueError(
                    f"rollout.trains: answer trains the answer agent on the local reader's prompts; "
                    f"reader.kind is {reader.kind}"
                )
            if reader.adapter_path is not None:
                raise ValueError(
                    "rollout.trains: answer trains the policy as the answer agent: start it with "
                    "model.adapter_path, not reader.adapter_path"
                )


@dataclass
class TrainingSettings:
    """An agent's settings with what a run adds: the adapter it starts from and its update settings.

    Checked here: a baseline (``rollout.baseline.kind``) loads no adapter, and an answer agent's GRPO
    (one turn per answer) pays with ``update.credit: broadcast``.
    """

    agent: AgentSettings
    adapter_path: str | None = None
    update: UpdateSettings = field(default_factory=UpdateSettings)

    def __post_init__(self) -> None:
        baseline = self.agent.rollout.baseline.kind
        if baseline is not None and self.adapter_path:
            raise ValueError(
                f"rollout.baseline.kind {baseline} learns nothing and loads no adapter: leave model."
                f"adapter_path out (it names {self.adapter_path})"
            )
        if self.agent.rollout.trains == "answer" and self.update.credit != "broadcast":
            raise ValueError(
                f"rollout.trains: answer: an answer is one turn, so update.credit must be broadcast, "
                f"not {self.update.credit}"
            )


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
    try:
        return AgentSettings(model=model, **groups)
    except ValueError as exc:
        raise AgentLoadError(str(exc)) from None
