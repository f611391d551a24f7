"""Generate ``docs/configuration.md`` from the CLI itself, so the reference cannot drift.

The page has two parts:

* one table per configurable class (:class:`~memalpha.train.module.GRPOModule`, each of its
  settings groups, and :class:`~memalpha.train.datamodule.RolloutDataModule`): every argument
  with its type, its default and the help text from the class docstring's ``Args:`` section;
* the complete resolved configuration of ``configs/tiny_cpu.yaml`` as printed by
  ``memalpha fit --config configs/tiny_cpu.yaml --print_config`` (Lightning's trainer
  section included).

Run ``python -m memalpha_lab.config_reference`` to rewrite the page, or with ``--check`` to exit
with status 1 when the page on disk differs from what would be generated.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIG = Path("configs/tiny_cpu.yaml")
OUTPUT = Path("docs/configuration.md")
COMMAND = "python -m memalpha_lab.config_reference"
_ARG_LINE = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:\s?(.*)$")


def docstring_args(obj: Any) -> dict[str, str]:
    """The ``Args:`` section of ``obj``'s docstring as ``{name: help}`` (continuation lines joined).

    An entry starts with ``name: text`` at the section's indentation; deeper-indented lines
    continue it. The section ends at the first non-blank line indented no deeper than
    ``Args:`` itself.
    """
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return {}
    header_indent = len(lines[start]) - len(lines[start].lstrip())
    result: dict[str, str] = {}
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= header_indent:
            break
        match = _ARG_LINE.match(line)
        if match and (entry_indent is None or indent == entry_indent):
            entry_indent = indent
            current = match.group(2)
            result[current] = match.group(3).strip()
        elif current is not None:
            result[current] = f"{result[current]} {line.strip()}".strip()
    return result


def _type_name(annotation: Any) -> str:
    """A short, readable spelling of a type annotation (``int | None``, ``'a' | 'b'``)."""
    if annotation is inspect.Parameter.empty:
        return ""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, str):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default_text(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "required"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"see `{type(value).__name__}`"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    """Table-safe markdown: reST-style double backticks become single ones, pipes are escaped."""
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


def argument_rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """``(option, type, default, help)`` for every ``__init__`` argument of ``cls``.

    Raises ValueError when an argument has no entry in the docstring's ``Args:`` section,
    so an undocumented knob fails the docs test instead of showing up blank.
    """
    helps = docstring_args(cls)
    hints = (
        typing.get_type_hints(cls.__init__)
        if not dataclasses.is_dataclass(cls)
        else typing.get_type_hints(cls)
    )
    factories = {
        f.name: f.default_factory
        for f in (dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ())
        if f.default_factory is not dataclasses.MISSING
    }
    rows = []
    for name, param in inspect.signature(cls).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in helps:
            raise ValueError(
                f"{cls.__module__}.{cls.__qualname__}: argument {name!r} is missing from the Args: docstring"
            )
        annotation = hints.get(name, param.annotation)
        default = factories[name]() if name in factories else param.default
        rows.append((f"`{prefix}{name}`", _cell(_type_name(annotation)), _cell(_default_text(default)),
                     _cell(helps[name])))
    return rows


def _table(rows: Sequence[tuple[str, str, str, str]]) -> list[str]:
    out = ["| option | type | default | meaning |", "|---|---|---|---|"]
    out.extend(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    return out


def _settings_table(kind: type, prefix: str) -> list[str]:
    """The table of settings group ``kind`` at option ``prefix``, then one per group nested in it
    (a field whose default is itself a settings dataclass, e.g. ``model.rollout.vllm``)."""
    lines = [f"### `{prefix}` (`{kind.__name__}`)", "", *_table(argument_rows(kind, f"{prefix}.")), ""]
    for field in dataclasses.fields(kind):
        if field.default_factory is not dataclasses.MISSING:
            nested = field.default_factory()
            if dataclasses.is_dataclass(nested):
                lines += _settings_table(type(nested), f"{prefix}.{field.name}")
    return lines


def _group_tables(cls: type, section: str = "model") -> list[str]:
    """One table per settings group (a dataclass default) of ``cls.__init__``, in signature order,
    each at ``section.<argument>``."""
    lines: list[str] = []
    for name, param in inspect.signature(cls).parameters.items():
        group = param.default
        if dataclasses.is_dataclass(group) and not isinstance(group, type):
            lines += _settings_table(type(group), f"{section}.{name}")
    return lines


def print_config(config: Path = CONFIG) -> str:
    """The output of ``memalpha fit --config CONFIG --print_config``, run in this process.

    ``config`` is resolved against the repository root, so the working directory does not matter.
    """
    from memalpha.train.lightning_cli import run_lightning_cli

    path = config if config.is_absolute() else REPO_ROOT / config
    if not path.is_file():
        raise FileNotFoundError(f"{path}: config to print not found (run from a memalpha source checkout)")
    buffer = io.StringIO()
    saved_argv = sys.argv
    # LightningCLI warns when argv and args both hold options
    sys.argv = [saved_argv[0] if saved_argv else "memalpha"]
    with contextlib.redirect_stdout(buffer):
        try:
            run_lightning_cli(["fit", "--config", str(path), "--print_config"])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise RuntimeError(
                    f"--print_config exited with status {exc.code}: {buffer.getvalue()}"
                ) from exc
        else:
            raise RuntimeError("memalpha fit --print_config returned without exiting; nothing was printed")
        finally:
            sys.argv = saved_argv
    return buffer.getvalue()


def render_reference(config_text: str | None = None) -> str:
    """The complete markdown of ``docs/configuration.md``."""
    from memalpha.train.datamodule import RolloutDataModule
    from memalpha.train.demo_datamodule import DemoDataModule
    from memalpha.train.module import GRPOModule
    from memalpha.train.sft_module import SFTModule

    config_text = print_config() if config_text is None else config_text
    lines = [
        "# Configuration reference",
        "",
        f"<!-- generated by `{COMMAND}` from the CLI and the classes' docstrings; do not edit by hand -->",
        f"*This page is generated by `{COMMAND}`; `tests/test_docs.py` fails when it is out of date.*",
        "",
        (
            "Every option can be set in a YAML config (`--config file.yaml`) or on the command line "
            "with its dotted name, e.g. `--model.rollout.group_size 4` or `--data.instances_per_step 1`. "
            "Later arguments override earlier ones. `memalpha fit --config FILE --print_config` prints the "
            "fully resolved config of any run; the run itself saves it next to its logs as `config.yaml`."
        ),
        "",
        (
            "The **default** column is the class default. The shipped configs "
            "([tiny_cpu](../configs/tiny_cpu.yaml), [qlora_4090](../configs/qlora_4090.yaml), "
            "[memalpha_official](../configs/memalpha_official.yaml)) override many of them."
        ),
        "",
        "## `model`: the policy and the GRPO update (`GRPOModule`)",
        "",
        *_table(argument_rows(GRPOModule, "model.")),
        "",
        *_group_tables(GRPOModule),
        "## `data`: instances and the rollout stream (`RolloutDataModule`)",
        "",
        *_table(argument_rows(RolloutDataModule, "data.")),
        "",
        *_group_tables(RolloutDataModule, "data"),
        "## `memalpha sft`: the cold start on demonstrations (`SFTModule`, `DemoDataModule`)",
        "",
        (
            "`memalpha sft --config configs/sft_tiny_cpu.yaml` takes the same `trainer` section and these "
            "`model` and `data` options ([cold_start.md](cold_start.md))."
        ),
        "",
        *_table(argument_rows(SFTModule, "model.")),
        "",
        *_table(argument_rows(DemoDataModule, "data.")),
        "",
        *_group_tables(DemoDataModule, "data"),
        "## `trainer`, `seed_everything`, `ckpt_path`",
        "",
        (
            "The `trainer` section is Lightning's own `Trainer` (devices, strategy, precision, max_steps, "
            "val_check_interval, logger, callbacks, ...); see the Lightning Trainer documentation for its "
            "arguments. memalpha drives its own optimisation (Lightning's manual optimisation), so leave "
            "`trainer.accumulate_grad_batches` at 1 and `trainer.gradient_clip_val` unset (Lightning refuses "
            "them in that mode): use `model.update.num_mini_batches`, `model.update.micro_batch_size` and "
            "`model.optimizer.grad_clip` instead. "
            "`trainer.max_steps` counts optimiser steps. `ckpt_path` resumes a run from a checkpoint file, "
            "e.g. `runs/tiny_cpu/checkpoints/last.ckpt`."
        ),
        "",
        "## `profile`",
        "",
        (
            "`profile: official` (or `--profile official`) sets the options of the Mem-alpha paper's code as "
            "defaults, before the config files and flags, which still override them; `memalpha` (the "
            "default) sets none. [official_compatibility.md](official_compatibility.md) "
            "lists what each profile sets."
        ),
        "",
        f"## Everything, resolved: `memalpha fit --config {CONFIG.as_posix()} --print_config`",
        "",
        "```yaml",
        config_text.rstrip("\n"),
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=f"Write {OUTPUT} from the CLI's --print_config and the classes' docstrings."
    )
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 if {OUTPUT} is not current; write nothing"
    )
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / OUTPUT, help=f"page to write (default {OUTPUT})"
    )
    args = parser.parse_args(argv)
    text = render_reference()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != text:
            state = "missing" if current is None else "out of date"
            print(f"{args.output} is {state}; regenerate it with `{COMMAND}`", file=sys.stderr)
            return 1
        print(f"{args.output} is current")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
