"""MemAlphaCLI: Lightning's CLI over GRPOModule and RolloutDataModule, with memalpha's defaults.

``memalpha fit|validate`` land here (:func:`run_lightning_cli`). Besides Lightning's own
behaviour the CLI links ``model.model`` to ``data.tokenizer_name`` (the DataModule chunks long
contexts with the policy's tokenizer), writes checkpoints atomically, saves ``last.ckpt`` on
``SIGTERM``, and refuses the flat ``model.*`` keys of memalpha 0.1 and the prefixed keys that
became nested groups (``model.reader.openai_*``, the reader's retrieval keys, ``data.synthetic_*``,
the data files' reading keys) with a message that names the key that replaced each.

Bad input ends the process with one line naming the option, the value and what is allowed, and
no traceback (docs/troubleshooting.md lists each case): a parse error, a setting out of range
(raised by the settings groups and modules while they are built, before any model loads), a
``--ckpt_path`` that is not a checkpoint of this command, a damaged data file, a checkpoint that
cannot be written and a run stopped by non-finite steps. memalpha's own errors raised while the
run goes on (:func:`run_errors`: an instance over the prompt budget, a stale vLLM sample, ...)
end it the same way, their setting names written as the options a user types. With
``MEMALPHA_DEBUG=1`` in the environment each of these errors is raised with its traceback instead.

The training progress bar is :class:`~memalpha.train.progress_bar.StepProgressBar` unless the
config names a progress bar of its own or ``trainer.enable_progress_bar`` is false.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from memalpha.train.known_warnings import silence_known_warnings
from memalpha.train.profiles import PROFILES, ProfileName, profile_named

_MOVED = {
    "lm": ("load_precision:precision", "compute_dtype", "gradient_checkpointing", "share_prefix"),
    "reader": (
        "reader_max_new_tokens:max_new_tokens", "reader_temperature:temperature",
        "reader_top_k_entries:retrieval.top_k_entries", "reader_prompt_tokens:retrieval.prompt_tokens",
        "reader_batch_size:batch_size", "openai_base_url:openai.base_url", "openai_model:openai.model",
        "openai_api_key_env:openai.api_key_env", "openai_max_concurrency:openai.max_concurrency",
        "openai_timeout_s:openai.timeout_s", "openai_max_retries:openai.max_retries",
    ),
    "reward": ("beta", "gamma", "content_judge", "metric_overrides"),
    "update": (
        "advantage_scale", "clip_low", "clip_high", "kl_coef", "loss_agg", "ppo_epochs", "num_mini_batches",
        "micro_batch_size",
    ),
    "optimizer": ("learning_rate", "weight_decay", "warmup_ratio", "grad_clip"),
}
RENAMED_MODEL_KEYS: dict[str, str] = {
    old: f"{group}.{new or old}"
    for group, entries in _MOVED.items()
    for old, _, new in (entry.partition(":") for entry in entries)
}
"""Flat ``model.*`` keys of memalpha 0.1 and the grouped key that replaced each."""
FORMER_CHOICES = {"reader": "reader.kind", "optimizer": "optimizer.name"}
"""Groups whose name was a plain choice in memalpha 0.1 (``model.reader: local``)."""
_NESTED = {
    "model.reader": {
        **{
            f"openai_{key}": f"openai.{key}"
            for key in ("base_url", "model", "api_key_env", "max_concurrency", "timeout_s", "max_retries")
        },
        **{
            key: f"retrieval.{key}"
            for key in (
                "top_k_entries",
                "prompt_tokens",
                "bm25",
                "k_reduction",
                "system_prompt_limit",
                "bm25_query",
            )
        },
    },
    "data": {
        **{
            f"synthetic_{key}": f"synthetic.{key}"
            for key in (
                "train",
                "val",
                "chunks",
                "facts_per_chunk",
                "distractors_per_chunk",
                "questions",
                "chunk_words",
                "families",
            )
        },
        **{
            key: f"load.{key}"
            for key in ("layout", "chunk_tokens", "wrap", "skip_bad", "train_limit", "val_limit")
        },
    },
}
RENAMED_GROUP_KEYS: dict[str, str] = {
    **{
        f"{section}.{old}": f"{section}.{new}"
        for section, moved in _NESTED.items() for old, new in moved.items()
    },
    # one setting says how tokens are sampled (memalpha/lm/sampling/backend.py)
    **dict.fromkeys(
        ("model.rollout.engine", "model.lm.sampling_backend", "model.lm.fold_adapters_for_sampling"),
        "model.rollout.backend",
    ),
}
"""Keys inside a section that moved into a nested group (``model.reader.openai_base_url``,
``model.reader.bm25``, ``data.synthetic_train``, ``data.layout``) or folded into another
(``model.rollout.engine``, ``model.lm.sampling_backend``, ``model.lm.fold_adapters_for_sampling``)
and the key that replaced each (``model.reader.openai.base_url``, ``model.reader.retrieval.bm25``,
``data.synthetic.train``, ``data.load.layout``, ``model.rollout.backend``)."""


RENAMED_HINTS = {
    "model.rollout.engine": "hf: auto or a named in-process loop; vllm: vllm",
    "model.lm.fold_adapters_for_sampling": "false: growing-cache or hf-generate, which sample unfolded",
}
"""How an old value reads in the key that replaced it, where that is not the same value."""


def renamed_key_message(key: str, value: Any, where: str) -> str | None:
    """The error for an old flat ``model`` key (None when ``key`` is current)."""
    if key in RENAMED_MODEL_KEYS:
        return f"{where}: model.{key} is now model.{RENAMED_MODEL_KEYS[key]}"
    if key in FORMER_CHOICES and isinstance(value, str):
        return f"{where}: model.{key} is a settings group now; write model.{FORMER_CHOICES[key]}: {value}"
    return None


def renamed_option_message(option: str, value: Any, where: str) -> str | None:
    """The error for an old option given by its full dotted name (``model.kl_coef``,
    ``model.reader.bm25``, ``data.synthetic_train``); None when ``option`` is current."""
    if option in RENAMED_GROUP_KEYS:
        hint = f" ({RENAMED_HINTS[option]})" if option in RENAMED_HINTS else ""
        return f"{where}: {option} is now {RENAMED_GROUP_KEYS[option]}{hint}"
    section, _, key = option.partition(".")
    if section == "model" and key and "." not in key:
        return renamed_key_message(key, value, where)
    return None


def _options(mapping: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    """Every ``(dotted option, value)`` of a config mapping, nested mappings included."""
    found = []
    for key, value in mapping.items():
        option = f"{prefix}.{key}"
        found.append((option, value))
        if isinstance(value, dict):
            found.extend(_options(value, option))
    return found


def _config_files(args: list[str]) -> list[str]:
    files = []
    for index, arg in enumerate(args):
        if arg == "--config" and index + 1 < len(args):
            files.append(args[index + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def read_config_files(args: list[str]) -> list[tuple[str, Any]]:
    """Each config file named in ``args`` (``--config F``, ``--config=F``) with its parsed YAML, read
    once; raise ``ValueError`` naming the file, line and column of the first one that is not valid
    YAML (jsonargparse's own message names only ``"<unicode string>"``). A missing or unreadable
    file is left out: the CLI itself reports it."""
    import yaml

    configs = []
    for path in _config_files(args):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError:
            continue
        try:
            configs.append((path, yaml.safe_load(text)))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            context = getattr(error, "context", None)
            raise ValueError(
                f"{path}{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")
            ) from None
    return configs


def check_renamed_keys(
    args: list[str],
    groups: tuple[str, ...] = ("model", "data"),
    configs: list[tuple[str, Any]] | None = None,
) -> None:
    """Exit with one line per old key (:data:`RENAMED_MODEL_KEYS`, :data:`RENAMED_GROUP_KEYS`) of
    ``groups`` found in ``args`` or the config files they name (``configs``, as
    :func:`read_config_files` returns them: read here when not given)."""
    problems = []
    for path, config in read_config_files(args) if configs is None else configs:
        sections = (
            [config] + [config.get(sub) for sub in ("fit", "validate")] if isinstance(config, dict) else []
        )
        for section in sections:
            for name in groups:
                group = section.get(name) if isinstance(section, dict) else None
                if isinstance(group, dict):
                    problems.extend(renamed_option_message(o, v, path) for o, v in _options(group, name))
    for index, arg in enumerate(args):
        if arg.startswith(tuple(f"--{name}." for name in groups)):
            option, eq, value = arg[2:].partition("=")
            value = value if eq else (args[index + 1] if index + 1 < len(args) else None)
            problems.append(renamed_option_message(option, value, "command line"))
    problems = [p for p in problems if p]
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems) + " (see docs/configuration.md)")


DEBUG_ENV = "MEMALPHA_DEBUG"
"""Set (to anything but ``""`` or ``0``) to get the traceback behind a one-line error."""


def debugging() -> bool:
    """Whether :data:`DEBUG_ENV` asks for tracebacks instead of one-line errors."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_errors() -> tuple[type[BaseException], ...]:
    """memalpha's errors that mean "this input or setting cannot work", raised before or during a
    run: each ends the process with its one-line message (:func:`run_cli`,
    :meth:`MemAlphaCLI._run_subcommand`)."""
    from memalpha.agent.rollout import RolloutError
    from memalpha.data.schema import DataValidationError
    from memalpha.grpo.update import NonFiniteTrainingError
    from memalpha.reader.openai_compat import ReaderRequestRefused
    from memalpha.train.checkpoint_io import CheckpointWriteError
    from memalpha.train.engine_sync import SamplerDriftError, StaleSamplesError
    from memalpha.train.step_faults import ReaderFailureError, StepOutOfMemory

    return (
        DataValidationError, CheckpointWriteError, NonFiniteTrainingError, RolloutError, StaleSamplesError,
        SamplerDriftError, ReaderFailureError, StepOutOfMemory, ReaderRequestRefused,
    )


class OneLineErrorParser(LightningArgumentParser):
    """Lightning's argument parser, reporting a bad option in one line instead of the whole usage."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {' '.join(message.split())} (all options: {prog} --help)\n")
        raise SystemExit(2)


class MemAlphaCLI(LightningCLI):
    """LightningCLI with memalpha's defaults.

    Configs are saved next to the logs (overwriting), and checkpoints are written
    atomically unless the user configured their own checkpoint IO plugin.
    """

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.model", "data.tokenizer_name")
        if self.takes_profile:
            parser.add_argument(
                "--profile", type=ProfileName, default="memalpha",
                help="Settings preset applied before the config files and flags, which still override it: "
                "memalpha (the documented defaults) or official (the Mem-alpha paper's code; "
                "docs/official_compatibility.md).",
            )

    takes_profile = True
    """Offer ``--profile`` (:mod:`memalpha.train.profiles`); its keys are :class:`GRPOModule`'s."""

    renamed_key_sections: tuple[str, ...] = ("model", "data")
    """Where to refuse memalpha 0.1's flat ``model.*`` keys of :class:`GRPOModule` and the prefixed
    keys that became nested groups (see :data:`RENAMED_MODEL_KEYS`, :data:`RENAMED_GROUP_KEYS`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", OneLineErrorParser)
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        if args is None or isinstance(args, list):
            given = list(sys.argv[1:] if args is None else args)
            try:
                configs = read_config_files(given)
            except ValueError as exc:
                command = "sft" if isinstance(self, SFTCLI) else (given[0] if given else "")
                raise SystemExit(f"memalpha {command}: error: {exc}") from None
            if self.renamed_key_sections:
                check_renamed_keys(given, self.renamed_key_sections, configs)
            if self.takes_profile:
                self._apply_profile(given)
        super().parse_arguments(parser, args)
        self._check_ckpt_path()  # before Lightning reads the checkpoint's hyperparameters

    def instantiate_classes(self) -> None:
        """Build the module and DataModule; a setting out of range exits with one line naming it.

        Every settings group checks its values in ``__post_init__`` and the modules check theirs
        in ``__init__``, all before any model loads, so a ``ValueError`` or ``TypeError`` here is
        a bad config value, not a crash to debug.
        """
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as exc:
            if debugging():
                raise
            keys = list(self.config[self.subcommand].keys()) if self.subcommand else list(self.config.keys())
            raise SystemExit(f"{self._prog()}: error: {qualify_option(str(exc), keys)}") from None

    def instantiate_trainer(self, **kwargs: Any):
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        from memalpha.train.checkpoint_io import AtomicCheckpointIO
        from memalpha.train.sigterm import CheckpointOnSigterm

        key = "plugins"
        plugins = self.config_init[self.subcommand]["trainer"].get(key) if self.subcommand else None
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else ([plugins] if plugins else [])
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        kwargs[key] = plugins
        if self.subcommand:
            self.config_init[self.subcommand]["trainer"][key] = None
        configured = (
            self.config_init[self.subcommand]["trainer"].get("callbacks") if self.subcommand else None
        )
        configured = (
            list(configured)
            if isinstance(configured, (list, tuple))
            else ([configured] if configured else [])
        )
        kwargs["callbacks"] = [*configured, CheckpointOnSigterm(), *self._default_progress_bar(configured)]
        try:
            return super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as exc:
            if debugging():
                raise
            raise SystemExit(f"{self._prog()}: error: trainer: {exc}") from None

    def _default_progress_bar(self, configured: list[Any]) -> list[ProgressBar]:
        """:class:`StepProgressBar`, unless the config brings a progress bar or turns it off."""
        from memalpha.train.progress_bar import StepProgressBar

        enabled = (
            self.config_init[self.subcommand]["trainer"].get("enable_progress_bar")
            if self.subcommand
            else None
        )
        if enabled is False or any(isinstance(c, ProgressBar) for c in configured):
            return []
        return [StepProgressBar()]

    def _run_subcommand(self, subcommand: str) -> None:
        """Run ``fit``/``validate``; one of :func:`run_errors` ends the process with one line, its
        setting names qualified (``rollout.max_prompt_tokens`` becomes
        ``model.rollout.max_prompt_tokens``)."""
        try:
            super()._run_subcommand(subcommand)
        except run_errors() as exc:
            if debugging():
                raise
            keys = list(self.config[subcommand].keys())
            raise SystemExit(f"{self._prog()}: error: {qualify_options(str(exc), keys)}") from None

    def _prog(self) -> str:
        return f"memalpha {self.subcommand}"

    def _apply_profile(self, args: list[str]) -> None:
        """Make the chosen profile's values the defaults of every subcommand, so the config files
        and flags parsed next override them."""
        try:
            name = profile_named(args)
        except ValueError as exc:
            raise SystemExit(f"memalpha {args[0] if args else ''}: error: {exc}") from None
        for subparser in self._subcommand_parsers.values():
            subparser.set_defaults({"profile": name, **PROFILES[name]})

    def _check_ckpt_path(self) -> None:
        from memalpha.train.checkpoint_io import check_checkpoint

        self.subcommand = self.config.get("subcommand")
        path = self.config[self.subcommand].get("ckpt_path") if self.subcommand else None
        if path:
            try:
                check_checkpoint(str(path), self.model_class.__name__, self._prog())
            except ValueError as exc:
                if debugging():
                    raise
                raise SystemExit(f"{self._prog()}: error: {exc}") from None


def qualify_option(message: str, keys: list[str]) -> str:
    """``message`` with its leading setting name written as the full option a user types.

    Settings groups name themselves (``rollout.group_size must be >= 1``) without knowing where
    the CLI puts them; the one config key ending in that name gives the option
    (``model.rollout.group_size``). Messages that start otherwise come back unchanged.
    """
    name, sep, rest = message.partition(" ")
    bare = name.rstrip(":")
    matches = [key for key in keys if key == bare or key.endswith("." + bare)]
    if len(matches) != 1:
        return message
    return matches[0] + name[len(bare):] + sep + rest


_SETTING = re.compile(r"(?<![\w./-])([a-z_]+(?:\.[a-z_]+)+)(?![\w/-])")


def qualify_options(message: str, keys: list[str]) -> str:
    """``message`` with every setting name in it (``rollout.max_prompt_tokens``) written as the one
    config key ending in that name (``model.rollout.max_prompt_tokens``); other words stay as they are."""

    def full(match: re.Match) -> str:
        name = match.group(1)
        hits = [key for key in keys if key == name or key.endswith("." + name)]
        return hits[0] if len(hits) == 1 else name

    return _SETTING.sub(full, message)


def run_cli(prog: str, cli_class: type[MemAlphaCLI], *args: Any, **kwargs: Any) -> MemAlphaCLI:
    """Run ``cli_class(*args, **kwargs)``; one of :func:`run_errors` (bad data, an unwritable checkpoint,
    a run stopped by non-finite steps, ...) raised outside the subcommand's run ends the process
    with its one-line message instead of a traceback (unless :func:`debugging`)."""
    try:
        return cli_class(*args, **kwargs)
    except run_errors() as exc:
        if debugging():
            raise
        raise SystemExit(f"{prog}: error: {exc}") from None


def run_lightning_cli(args: list[str] | None = None) -> MemAlphaCLI:
    """``memalpha fit|validate ...``: the CLI over :class:`GRPOModule` and :class:`RolloutDataModule`."""
    silence_known_warnings()
    from memalpha.train.datamodule import RolloutDataModule
    from memalpha.train.module import GRPOModule

    command = list(sys.argv[1:] if args is None else args)[:1]
    return run_cli(
        " ".join(["memalpha", *command]), MemAlphaCLI, GRPOModule, RolloutDataModule,
        save_config_kwargs={"overwrite": True}, args=args,
    )


def run_sft_cli(args: list[str] | None = None) -> MemAlphaCLI:
    """``memalpha sft ...``: Lightning's ``fit`` over :class:`SFTModule` and :class:`DemoDataModule`."""
    from memalpha.train.demo_datamodule import DemoDataModule
    from memalpha.train.sft_module import SFTModule

    silence_known_warnings()
    args = list(sys.argv[2:] if args is None else args)
    return run_cli(
        "memalpha sft",
        SFTCLI,
        SFTModule,
        DemoDataModule,
        save_config_kwargs={"overwrite": True},
        args=["fit", *args],
    )


class SFTCLI(MemAlphaCLI):
    """:class:`MemAlphaCLI` for ``memalpha sft``: SFTModule's ``model.micro_batch_size`` is its own key,
    and no profile applies (the profiles set GRPO and reader options)."""

    renamed_key_sections = ("data",)  # data.train_limit -> data.load.train_limit, as for fit
    takes_profile = False

    def _prog(self) -> str:
        return "memalpha sft"
