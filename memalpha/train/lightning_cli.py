"""MemAlphaCLI: Lightning's CLI over GRPOModule and RolloutDataModule, with memalpha's defaults.

``memalpha fit|validate`` land here (:func:`run_lightning_cli`). Besides Lightning's own
behaviour the CLI links ``model.model`` to ``data.tokenizer_name`` (the DataModule chunks long
contexts with the policy's tokenizer), writes checkpoints atomically, saves ``last.ckpt`` on
``SIGTERM``, names the file, line and column of a config file that is not valid YAML, and reads a
``--ckpt_path``'s saved settings under the ones the user names (``MemAlphaCLI._parse_ckpt_path``).

Bad input, and memalpha's own errors while the run goes on (:func:`run_errors`), end the process
with one line naming the option as a user types it, and no traceback (docs/troubleshooting.md
lists each case); with ``MEMALPHA_DEBUG=1`` in the environment they are raised with their traceback.

The training progress bar is :class:`~memalpha.train.progress_bar.StepProgressBar` unless the
config names a progress bar of its own or ``trainer.enable_progress_bar`` is false.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from jsonargparse import Namespace
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.train.known_warnings import silence_known_warnings
from memalpha.train.profiles import PROFILES, ProfileName
from memalpha.train.settings_loader import check_config_files, profile_named

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
    from memalpha.lm.sampling.vllm_server import VllmServerError
    from memalpha.reader.openai_compat import ReaderRequestRefused
    from memalpha.train.checkpoint_io import CheckpointWriteError
    from memalpha.train.engine_sync import SamplerDriftError, StaleSamplesError
    from memalpha.train.step_faults import ReaderFailureError, StepOutOfMemory

    return (
        DataValidationError, CheckpointWriteError, NonFiniteTrainingError, RolloutError, StaleSamplesError,
        SamplerDriftError, ReaderFailureError, StepOutOfMemory, ReaderRequestRefused, VllmServerError,
    )


def _as_list(value: Any) -> list[Any]:
    """A trainer option that takes one object or a list of them (``plugins``, ``callbacks``), as a list."""
    return list(value) if isinstance(value, (list, tuple)) else ([value] if value else [])


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

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands but ``test``: memalpha scores held-out data with ``validate``
        (``memalpha test`` says so in one line, :data:`memalpha.cli.REPLACED`)."""
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name != "test"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", OneLineErrorParser)
        super().__init__(*args, **kwargs)

    def setup_parser(self, *args: Any, **kwargs: Any) -> None:
        super().setup_parser(*args, **kwargs)
        predict = self._subcommand_parsers.get("predict")
        if predict is not None:  # predict's records go to data.predict.output, never into a list in memory
            predict.set_defaults({"return_predictions": False})

    def parse_arguments(self, parser, args) -> None:
        self._given_args = args
        self._profile_given = False
        if args is None or isinstance(args, list):
            given = list(sys.argv[1:] if args is None else args)
            try:
                check_config_files(given)
            except ValueError as exc:
                command = "sft" if isinstance(self, SFTCLI) else (given[0] if given else "")
                raise SystemExit(f"memalpha {command}: error: {exc}") from None
            if self.takes_profile:
                self._apply_profile(given)
        super().parse_arguments(parser, args)
        self._check_ckpt_path()  # before the checkpoint's settings are read (_parse_ckpt_path)
        self._check_baseline()

    def _parse_ckpt_path(self) -> None:
        """The checkpoint's saved ``model.*`` settings under the config files and the command line.

        Lightning's own version parses the saved settings over the whole config, so a setting the
        user names (``--model.reader.kind extractive``) would silently run as the checkpoint had it.
        Here they become the subcommand's defaults and the arguments are parsed again: a setting the
        config files, the command line or an explicitly chosen profile names wins, every other one
        is the checkpoint's. A setting that decides what the checkpoint's weights are
        (:data:`CHECKPOINT_DECIDES`) cannot be changed: naming another value stops the run here,
        before any model loads, with one line naming the option and both values.
        """
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not path or not Path(path).is_file():  # Lightning's names (last, best, ...): its own business
            return
        import torch

        checkpoint = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        saved = checkpoint.get("hyper_parameters") or {}
        saved.pop("_instantiator", None)
        if not saved:
            return
        parser = self._subcommand_parsers[subcommand]
        try:
            values = checkpoint_settings(saved, parser.get_defaults(), "model", str(path))
        except ValueError as exc:
            if debugging():
                raise
            raise SystemExit(f"{self._prog()}: error: {exc}") from None
        if self._profile_given:  # the profile named wins over the checkpoint, as over the defaults
            values = {k: v for k, v in values.items() if not any(k in keys for keys in PROFILES.values())}
        parser.set_defaults(values)
        args = self._given_args
        parse = self.parser.parse_object if isinstance(args, (dict, Namespace)) else self.parser.parse_args
        self.config = parse(args)
        for key in CHECKPOINT_DECIDES + (CHECKPOINT_DECIDES_FIT if subcommand == "fit" else ()):
            named = self.config[subcommand].get(key)
            if key in values and named != values[key]:
                raise SystemExit(
                    f"{self._prog()}: error: {key}: the checkpoint {path} was trained with {values[key]!r} "
                    f"but the config or command line names {named!r}; a checkpoint runs as it was trained: "
                    f"leave {key} out or set it to {values[key]!r}"
                )

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
        # the module's checked rollout settings size the chunks of data.load.chunk_tokens: null
        if isinstance(getattr(self.model, "rollout_settings", None), RolloutSettings):
            self.datamodule.rollout = self.model.rollout_settings

    def instantiate_trainer(self, **kwargs: Any):
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        from memalpha.train.checkpoint_io import AtomicCheckpointIO
        from memalpha.train.progress_bar import StepProgressBar
        from memalpha.train.sigterm import CheckpointOnSigterm

        trainer = self._get(self.config_init, "trainer")
        plugins = _as_list(trainer.get("plugins"))
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        kwargs["plugins"] = plugins
        trainer["plugins"] = None
        configured = _as_list(trainer.get("callbacks"))
        # StepProgressBar, unless the config brings a progress bar or turns it off
        bar = trainer.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in configured
        )
        kwargs["callbacks"] = [*configured, CheckpointOnSigterm(), *([StepProgressBar()] if bar else [])]
        try:
            return super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as exc:
            if debugging():
                raise
            raise SystemExit(f"{self._prog()}: error: trainer: {exc}") from None

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
            name = profile_named(args, default=None)
        except ValueError as exc:
            raise SystemExit(f"memalpha {args[0] if args else ''}: error: {exc}") from None
        self._profile_given = name is not None
        name = name or "memalpha"
        for subparser in self._subcommand_parsers.values():
            subparser.set_defaults({"profile": name, **PROFILES[name]})

    def _check_baseline(self) -> None:
        """A baseline (``model.rollout.baseline.kind``, :mod:`memalpha.agent.baselines`) learns nothing
        and loads no adapter: ``fit`` with one, or one with ``--ckpt_path``, stops here in one line."""
        subcommand = self.config.get("subcommand")
        kind = self.config[subcommand].get("model.rollout.baseline.kind") if subcommand else None
        if kind is None:
            return
        if subcommand == "fit":
            raise SystemExit(
                f"{self._prog()}: error: model.rollout.baseline.kind {kind} learns "
                "nothing, so there is nothing to fit: score it with memalpha validate, or leave it out"
            )
        if self.config[subcommand].get("ckpt_path"):
            raise SystemExit(
                f"{self._prog()}: error: model.rollout.baseline.kind {kind} loads no adapter: leave "
                "--ckpt_path out"
            )

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


CHECKPOINT_DECIDES = ("model.model", "model.adapter_path", "model.lora.r", "model.lora.alpha",
                      "model.lora.target_modules")
"""Saved settings a ``--ckpt_path`` run keeps: the base model, the adapter the run started from and
the LoRA shape and scale its weights were trained with (another value would load the weights into
another model, or run them at another scale)."""
CHECKPOINT_DECIDES_FIT = ("model.optimizer.name",)
"""Saved settings a resumed ``fit`` also keeps: the optimiser whose state the checkpoint holds."""


def checkpoint_settings(saved: dict[str, Any], defaults: Namespace, prefix: str, path: str) -> dict[str, Any]:
    """The checkpoint's ``saved`` hyper-parameters as option keys below ``prefix``
    (``{"model.lora.r": 8, ...}``), nested groups followed down to the parser's options in
    ``defaults``; raises ``ValueError`` naming a saved setting this memalpha has no option for."""
    values: dict[str, Any] = {}
    for name, value in saved.items():
        key = f"{prefix}.{name}"
        if key not in defaults:
            raise ValueError(f"ckpt_path: {path} holds the setting {key}, which this memalpha does not have")
        if isinstance(value, dict) and isinstance(defaults.get(key), Namespace):
            values.update(checkpoint_settings(value, defaults, key, path))
        else:
            values[key] = value
    return values


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

    takes_profile = False

    def setup_parser(self, *args: Any, **kwargs: Any) -> None:
        super().setup_parser(*args, **kwargs)
        self._subcommand_parsers["fit"].prog = "memalpha sft"  # its errors name the command typed

    def _prog(self) -> str:
        return "memalpha sft"
