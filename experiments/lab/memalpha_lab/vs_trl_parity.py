"""``experiments/bench/bench_vs_trl.py --parity``: the runs of every arm and seed (run, or with
``--summary-only`` only read, one file each: :mod:`.parity`), and once all are on disk the
report, its tables and its plot. Each run is ``run_child(arm, settings, timeout_s)``: the script
starts itself again for one run of an arm.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from memalpha_lab import parity as _parity
from memalpha_lab.common import commit_state, print_table, write_json
from memalpha_lab.vs_trl_job import BenchSettings
from memalpha_lab.vs_trl_options import PARITY_OUT, names
from memalpha_lab.vs_trl_report import TABLE_HEADERS, ratios, summarise, table_rows

RunChild = Callable[[str, BenchSettings, float], dict[str, Any]]
"""One run of an arm at the given settings within ``timeout_s`` seconds: its steps and times."""


def parity_report(settings: BenchSettings, arms: Sequence[str], seeds: Sequence[int],
                  found: dict[tuple[int, str], dict[str, Any]], margin: float, window: int) -> dict[str, Any]:
    """The parity report over complete runs: timing per arm (step time as in the timing mode,
    step 0 dropped) with memalpha / TRL, the reward curves and the verdicts."""
    runs = {arm: [found[(seed, arm)] for seed in seeds] for arm in arms}
    summary = {arm: summarise(done) for arm, done in runs.items()}
    ratio = ratios(summary["memalpha"], summary["trl"]) if {"memalpha", "trl"} <= set(summary) else None
    return {
        "settings": asdict(settings), "arms": list(arms), "seeds": list(seeds),
        "run_ids": {arm: [run["run_id"] for run in done] for arm, done in runs.items()},
        "summary": summary, "ratio_memalpha_over_trl": ratio,
        "learning": _parity.summarise_learning(runs, margin, settings.steps, window), "runs": runs,
    }


def run(args: argparse.Namespace, settings: BenchSettings, extra: dict[str, Any],
        run_child: RunChild) -> dict[str, Any] | None:
    """Run (or, with ``--summary-only``, only read) the parity check's runs; with all of them on
    disk, print and write the report. Returns it, or None while runs are missing."""
    arms = names(args.arms, _parity.ARMS, "--arms")
    seeds = [settings.seed + i for i in range(args.repeats)]
    digest = args.settings_digest or _parity.settings_digest(asdict(settings))
    runs_dir = Path(args.runs_dir)
    todo = _parity.plan(arms, seeds)

    def log(line: str) -> None:
        print(f"[parity] {line}", file=sys.stderr, flush=True)

    def run_one(arm: str, seed: int) -> dict[str, Any]:
        seeded = replace(settings, seed=seed)
        done = run_child(arm, seeded, args.timeout)
        done.update(settings=asdict(seeded), code=commit_state())
        return done

    log(f"settings digest {digest}, runs in {runs_dir}")
    if args.summary_only:
        found = _parity.load_runs(runs_dir, todo, digest)
    else:
        found = _parity.execute(todo, runs_dir, digest, run_one, log)
    missing = [_parity.run_id(arm, seed, digest) for seed, arm in todo if (seed, arm) not in found]
    if missing:
        for (seed, arm), done in sorted(found.items()):
            mean = _parity.final_mean(done, args.window)
            log(f"finished {arm} seed {seed}: last-{args.window} mean {mean:.3f}")
        log(f"{len(missing)} of {len(todo)} runs missing, no summary: {', '.join(missing)}")
        return None
    report = parity_report(settings, arms, seeds, found, args.margin, args.window)
    report.update(extra, runs_dir=str(runs_dir), settings_digest=digest)
    print_table(TABLE_HEADERS, table_rows(report["summary"], report["ratio_memalpha_over_trl"]))
    learning = report["learning"]
    rows = [[arm, *data["final_window_per_run"], data["final_window_mean"]]
            for arm, data in learning["arms"].items()]
    print_table(["arm", *[f"seed {s}" for s in seeds], f"mean of last {args.window}"], rows, floats=3)
    print("\n".join(_parity.verdict_lines(learning)))
    out = Path(args.out) if args.out else PARITY_OUT
    path = write_json(report, out)
    title = f"{settings.job} job, {len(seeds)} seeds a side, {settings.steps} steps"
    _parity.plot(learning, title, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return report
