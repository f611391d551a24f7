"""The learning-parity check of ``bench_vs_trl.py --parity``: arms, fresh runs stored one file
each, and a verdict that can fail.

Arms: ``memalpha`` (memalpha's single-turn trainer), ``trl`` (TRL's ``GRPOTrainer``, the
reference) and ``memalpha-lr0`` (memalpha's trainer at learning rate 0: it samples, scores and
backpropagates like the others and never moves the adapter). Run ``i`` of every arm uses seed
``seed + i`` (the prompts, the sampling and the data order), so the arms see the same seeds and
every run of an arm is a fresh one; each run is its own subprocess.

Each finished run is written at once to ``<runs_dir>/<arm>_seed<S>_<hash>.json`` where the hash
covers every shared setting but the seed, and the adapter's bytes. A later invocation with the
same settings finds those files and runs only what is missing; the summary is computed once
every planned run is on disk. A run is deterministic for its seed on both sides (on the CPU, as
far as these runs go), so running a seed again adds no information: the store keeps one run per
(arm, seed) and never mixes runs of different settings.

The statistic: each run's mean reward over its last ``window`` steps; per arm other than TRL,
Welch's 95 % interval of (arm mean) - (TRL mean) over runs, and the verdict of
:func:`memalpha_lab.seed_intervals.equivalence` against ``±margin``: ``equivalent`` (the check passes)
only when the whole interval lies inside the margin. The check *discriminates* when memalpha
passes and the never-updating arm does not. With fewer than :data:`MIN_STEPS` steps or
:data:`MIN_RUNS` runs a side nothing passes: such a run is not a parity check.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memalpha_lab.common import write_text_atomically
from memalpha_lab.seed_intervals import equivalence, welch_interval

ARMS = ("memalpha", "trl", "memalpha-lr0")
REFERENCE = "trl"
CANDIDATE = "memalpha"
NO_UPDATE = "memalpha-lr0"
MIN_STEPS = 20
MIN_RUNS = 4
DEFAULT_WINDOW = 10
DEFAULT_MARGIN = 0.1


def settings_digest(settings: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the settings without ``seed`` and, when ``adapter_path`` is
    set, over the adapter folder's files (the same path may hold another adapter later)."""
    shared = {key: value for key, value in sorted(settings.items()) if key != "seed"}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True).encode())
    adapter = settings.get("adapter_path")
    if adapter:
        for path in sorted(Path(adapter).iterdir()):
            if path.is_file():
                digest.update(path.name.encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def run_id(arm: str, seed: int, digest: str) -> str:
    return f"{arm}_seed{seed}_{digest}"


def plan(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[int, str]]:
    """Every ``(seed, arm)`` to run, seed by seed, so the arms alternate and drift of the shared
    machine hits them alike."""
    return [(seed, arm) for seed in seeds for arm in arms]


def run_path(runs_dir: Path, arm: str, seed: int, digest: str) -> Path:
    return runs_dir / f"{run_id(arm, seed, digest)}.json"


def load_runs(
    runs_dir: Path, todo: Iterable[tuple[int, str]], digest: str
) -> dict[tuple[int, str], dict[str, Any]]:
    """The finished runs of ``todo`` found in ``runs_dir``."""
    found = {}
    for seed, arm in todo:
        path = run_path(runs_dir, arm, seed, digest)
        if path.is_file():
            found[(seed, arm)] = json.loads(path.read_text(encoding="utf-8"))
    return found


def save_run(runs_dir: Path, run: dict[str, Any]) -> Path:
    """Write one finished run atomically (a run killed while writing leaves no half file)."""
    return write_text_atomically(runs_dir / f"{run['run_id']}.json", json.dumps(run, indent=2) + "\n")


def execute(
    todo: Sequence[tuple[int, str]],
    runs_dir: Path,
    digest: str,
    run_one: Callable[[str, int], dict[str, Any]],
    log: Callable[[str], None] = lambda _: None,
) -> dict[tuple[int, str], dict[str, Any]]:
    """Run what ``runs_dir`` does not hold yet, saving each run as it finishes; returns them all."""
    runs = load_runs(runs_dir, todo, digest)
    missing = [item for item in todo if item not in runs]
    log(f"{len(runs)} of {len(todo)} runs on disk, {len(missing)} to run")
    for index, (seed, arm) in enumerate(missing, 1):
        log(f"run {index}/{len(missing)}: {arm} seed {seed} ...")
        run = run_one(arm, seed)
        run.update(arm=arm, seed=seed, settings_digest=digest, run_id=run_id(arm, seed, digest))
        save_run(runs_dir, run)
        runs[(seed, arm)] = run
        rewards = ", ".join(f"{step['reward']:.2f}" for step in run["steps"])
        log(f"  {arm} seed {seed}: rewards {rewards}")
    return runs


def final_mean(run: Mapping[str, Any], window: int) -> float:
    """The mean reward of the run's last ``window`` steps."""
    rewards = [step["reward"] for step in run["steps"]]
    return statistics.fmean(rewards[-window:])


def arm_curves(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Mean, min and max over runs of the reward at each step."""
    curves = [[s["reward"] for s in run["steps"]] for run in runs]
    per_step = list(zip(*curves, strict=True))
    return {
        "reward_per_step_mean": [statistics.fmean(v) for v in per_step],
        "reward_per_step_min": [min(v) for v in per_step],
        "reward_per_step_max": [max(v) for v in per_step],
    }


def verdicts(
    finals: Mapping[str, Sequence[float]], margin: float, steps: int, window: int
) -> dict[str, Any]:
    """Per arm other than TRL: Welch's 95 % interval of its final means minus TRL's and the
    equivalence verdict; ``adequate`` (enough steps and runs for a parity check), ``passes``
    (memalpha equivalent, and adequate), ``no_update_fails`` (the lr-0 arm is not equivalent)
    and ``discriminates`` (both: the same check passes memalpha and fails the arm that never
    learns; None without an lr-0 arm)."""
    problems = []
    if steps < MIN_STEPS:
        problems.append(f"{steps} steps < {MIN_STEPS}")
    if window > steps:
        problems.append(f"window {window} > {steps} steps")
    short = {arm: len(values) for arm, values in finals.items() if len(values) < MIN_RUNS}
    if short:
        problems.append(", ".join(f"{arm}: {n} runs < {MIN_RUNS}" for arm, n in short.items()))
    out: dict[str, Any] = {
        "margin": margin, "window": window, "adequate": not problems, "problems": problems, "against_trl": {},
    }
    for arm, values in finals.items():
        if arm == REFERENCE or REFERENCE not in finals:
            continue
        if len(values) < 2 or len(finals[REFERENCE]) < 2:
            continue
        interval = welch_interval(values, finals[REFERENCE])
        verdict = equivalence(interval["low"], interval["high"], margin)
        out["against_trl"][arm] = {**interval, **verdict, "passes": verdict["passes"] and not problems}
    against = out["against_trl"]
    out["passes"] = bool(against.get(CANDIDATE, {}).get("passes"))
    out["no_update_fails"] = not against[NO_UPDATE]["passes"] if NO_UPDATE in against else None
    out["discriminates"] = out["passes"] and out["no_update_fails"] if NO_UPDATE in against else None
    return out


def summarise_learning(
    runs_by_arm: Mapping[str, Sequence[Mapping[str, Any]]], margin: float, steps: int, window: int
) -> dict[str, Any]:
    """Per arm the reward curves and the final-window mean of each run; then :func:`verdicts`."""
    arms: dict[str, Any] = {}
    finals: dict[str, list[float]] = {}
    for arm, runs in runs_by_arm.items():
        finals[arm] = [final_mean(run, window) for run in runs]
        arms[arm] = {
            **arm_curves(runs),
            "seeds": [run.get("seed") for run in runs],
            "final_window_per_run": finals[arm],
            "final_window_mean": statistics.fmean(finals[arm]),
            "final_window_sd": statistics.stdev(finals[arm]) if len(finals[arm]) > 1 else 0.0,
        }
    return {"arms": arms, **verdicts(finals, margin, steps, window)}


def verdict_lines(learning: Mapping[str, Any]) -> list[str]:
    """The verdict in words, one line per arm and one for the check."""
    lines = []
    for arm, v in learning["against_trl"].items():
        lines.append(
            f"{arm} - trl over the last {learning['window']} steps: {v['difference']:+.3f}, "
            f"95 % Welch interval [{v['low']:+.3f}, {v['high']:+.3f}] (df {v['df']:.1f}) "
            f"against ±{v['margin']}: {v['verdict']}"
        )
    if not learning["adequate"]:
        lines.append(f"not a parity check: {'; '.join(learning['problems'])}")
    lines.append(f"parity: {'passes' if learning['passes'] else 'fails'}; the lr-0 arm fails: "
                 f"{learning['no_update_fails']}; the check discriminates (memalpha passes, lr-0 fails): "
                 f"{learning['discriminates']}")
    return lines


def plot(learning: Mapping[str, Any], title: str, path: Path) -> None:
    """Mean reward per step of each arm (lines: the mean over runs; bands: min to max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (arm, data), colour in zip(learning["arms"].items(), ("tab:blue", "tab:orange", "tab:grey")):
        steps = list(range(1, len(data["reward_per_step_mean"]) + 1))
        ax.plot(steps, data["reward_per_step_mean"], marker="o", markersize=3, color=colour,
                label=f"{arm} (mean of {len(data['seeds'])} runs)")
        ax.fill_between(
            steps, data["reward_per_step_min"], data["reward_per_step_max"], color=colour, alpha=0.15
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the step's samples")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    plt.close(fig)
