"""The command line of ``experiments/bench/bench_vs_trl.py``: its options (the timing mode's, the
parity mode's of :mod:`.vs_trl_parity`, ``--exact``'s of :mod:`.trl_exact`), where each mode
writes its report by default, and the :class:`~.vs_trl_job.BenchSettings` the options give.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from dataclasses import fields

from memalpha_lab import parity as _parity
from memalpha_lab.common import RESULTS_DIR
from memalpha_lab.vs_trl_job import JOBS, BenchSettings

DEFAULT_OUT = RESULTS_DIR / "bench_vs_trl.json"
PARITY_OUT = RESULTS_DIR / "bench_vs_trl_parity.json"
PARITY_RUNS_DIR = RESULTS_DIR / "parity"
EXACT_OUT = RESULTS_DIR / "bench_vs_trl_exact.json"


def parse_args(argv: Sequence[str] | None = None, description: str = "") -> argparse.Namespace:
    """The script's options (``description`` heads its ``--help``)."""
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default=defaults.model, help="embedded model name or local HF folder")
    parser.add_argument("--prompts-per-step", type=int, default=defaults.prompts_per_step)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimiser steps per run")
    parser.add_argument("--micro-batch-size", type=int, default=defaults.micro_batch_size,
                        help="sequences per forward/backward; must divide prompts-per-step * group-size")
    parser.add_argument("--num-prompts", type=int, default=defaults.num_prompts,
                        help="prompt pool size (0: prompts-per-step * steps)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef)
    parser.add_argument("--lora-r", type=int, default=defaults.lora_r)
    parser.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha)
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="the seed (timing); with --parity run i of every arm uses seed + i")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="torch threads per run (0: default)")
    parser.add_argument("--job", choices=JOBS, default=defaults.job,
                        help="validity: tool-call validity; memory: validity plus the chunk's facts stored")
    parser.add_argument("--adapter-path", default=defaults.adapter_path,
                        help="start both sides from this PEFT adapter (a memalpha sft export)")
    parser.add_argument("--parity", action="store_true",
                        help="the learning-parity check (memalpha_lab/parity.py): --repeats fresh runs of "
                             "each of --arms, one JSON each in --runs-dir, the report in "
                             f"{PARITY_OUT.name} unless --out")
    parser.add_argument("--exact", action="store_true",
                        help="no training: memalpha's and TRL's log-probs, loss and LoRA gradient on one "
                             "identical batch (experiments/lab/memalpha_lab/trl_exact.py), the report in "
                             f"{EXACT_OUT.name} unless --out")
    parser.add_argument("--arms", default=",".join(_parity.ARMS),
                        help=f"with --parity: comma-separated subset of {','.join(_parity.ARMS)}")
    parser.add_argument("--margin", type=float, default=_parity.DEFAULT_MARGIN,
                        help="with --parity: the equivalence margin on the mean reward (0-2 scale)")
    parser.add_argument("--window", type=int, default=_parity.DEFAULT_WINDOW,
                        help="with --parity: the last steps whose mean reward is each run's result")
    parser.add_argument("--runs-dir", default=str(PARITY_RUNS_DIR),
                        help="with --parity: one JSON per finished run; finished runs are not run again")
    parser.add_argument("--summary-only", action="store_true",
                        help="with --parity: run nothing, rebuild the report from --runs-dir")
    parser.add_argument("--settings-digest", default=None,
                        help="with --summary-only: the runs' settings digest (their file names' last part), "
                             "for a checkout without the adapter folder they started from")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each side, alternating "
                             "(with --parity: fresh runs of each arm, seed + i)")
    parser.add_argument("--sides", default="memalpha,trl", help="comma-separated subset of memalpha,trl")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--out", default=None, help=f"JSON report path (default {DEFAULT_OUT.name})")
    # one run of an arm in this process (the driver starts the script again with these)
    parser.add_argument("--child", choices=_parity.ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    names = {f.name for f in fields(BenchSettings)}
    settings = BenchSettings(**{name: getattr(args, name) for name in names})
    # a summary of stored runs named by their digest needs no adapter folder
    settings.validate(check_adapter=not (args.summary_only and args.settings_digest))
    return settings


def names(text: str, known: Sequence[str], flag: str) -> list[str]:
    """The comma-separated names of ``text``, each one of ``known`` (else exit naming ``flag``)."""
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown or not chosen:
        raise SystemExit(f"{flag} must name some of {tuple(known)}, got {text!r}")
    return chosen


def require_trl() -> None:
    """Exit with the install line when TRL (the ``bench`` extra) is missing."""
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(
            "TRL is not installed: pip install -e '.[bench]' -c constraints.txt (or leave trl out)"
        )
