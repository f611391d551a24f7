"""Rebuild every interval of the control-arms experiment from its committed files alone.

Run:  .venv/bin/python -m memalpha_lab.control_arms_report
          [--scores experiments/results/control_arms/instance_scores.json]
          [--summary experiments/results/control_arms.json] [--check] [--update] [--plot PATH]

``experiments/studies/control_arms.py`` writes the per-instance scores of every validation
(``instance_scores.json``: ``{"start": {source: {instance: {metric: value}}}, "seeds": {seed:
{arm: ...}}}``) and a summary JSON holding the intervals, the settings and the per-step training
scalars. This script recomputes the intervals from the scores file with the same functions the
experiment uses and prints them; ``--check`` also compares them with the summary's and exits 1
on a difference; ``--update`` rewrites the summary's intervals from the scores file (and nothing
else of it); ``--plot`` redraws the figure from both files. When the summary is there, the report
also prints each run's compute as the summary records it.

The intervals, all 95 % and all paired per held-out instance (an instance's questions read one
memory, so the instance is the unit):

* **seed level** (the headline, ``seed_level``; :func:`memalpha_lab.seed_intervals.seed_level_change`):
  each seed's paired mean change ``A - B`` over its instances, then ``t``, the Student t
  interval over those per-seed means (``seeds - 1`` degrees of freedom), and ``bootstrap``, a
  two-level percentile bootstrap (seeds with replacement, then instances within each drawn seed).
  A training run is one draw of a random process, so this is the interval about a new run of the
  recipe; with 3 seeds the t interval has 2 degrees of freedom and is wide, and the bootstrap
  cannot reach beyond the seeds seen (it is the narrower one, not the better one). Absent
  (``None``) below 2 seeds.
* **pooled** (instance level): each instance's score is first averaged over the seeds that hold
  both arms, then the paired differences ``A - B`` over the instances are one t interval
  (``n - 1`` degrees of freedom). The seed-to-seed variation of a training run enters only
  through these averages, so this interval is about these instances under these runs, not
  about a new seed.
* **per seed**: the same paired interval for each seed on its own.

The arm ``start`` (the shared SFT adapter) is one validation used by every seed. ``fact_recall``
pairs only the instances that know their facts (all synthetic ones do), ``reader_given_stored``
(the reader's accuracy on the questions whose gold the memory holds, beside ``answer_stored``,
the share of such questions: :func:`memalpha_lab.instance_scores.study_instance_values`) only the
instances where both arms stored at least one answer.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memalpha.intervals import mean_interval, paired_interval
from memalpha.train.instance_scores import InstanceScores
from memalpha_lab.common import RESULTS_DIR, command_line, print_table, write_text_atomically
from memalpha_lab.seed_intervals import seed_level_change

ARMS = ("grpo", "grpo_lr0", "sft_continued")
START = "start"
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("grpo", "sft_continued"),
    ("grpo", "grpo_lr0"),
    ("grpo", START),
    ("grpo_lr0", START),
    ("sft_continued", START),
)
METRICS = (
    "accuracy",
    "fact_recall",
    "mean_reward",
    "tool_success",
    "memory_tokens",
    "answer_stored",
    "reader_given_stored",
)
HEADLINE = ("accuracy", "fact_recall", "mean_reward")
TRAIN_TAGS = (
    "train/reward",
    "rewards/r1_accuracy",
    "rewards/r2_tool",
    "rewards/r3_compression",
    "rewards/r4_content",
    "train/tool_success",
    "train/fact_recall",
    "memory/tokens",
    "train/reward_std",
    "train/frac_reward_zero_std",
    "train/grad_norm",
    "train/kl",
    "step_s",
)
INTERVALS = (
    "95 %, paired per instance; seed_level = per-seed mean changes, Student t over seeds (seeds - 1 df)"
    " and a two-level bootstrap (seeds, then instances); pooled = Student t over instances, each"
    " averaged over seeds first"
)
"""The summaries' ``settings.intervals``: what their comparisons hold."""
SCORES_PATH = RESULTS_DIR / "control_arms" / "instance_scores.json"
SUMMARY_PATH = RESULTS_DIR / "control_arms.json"

Flat = dict[str, dict[str, float]]
"""``{"source/instance": {metric: value}}``."""


def flatten(scores: InstanceScores) -> Flat:
    """One key per instance, ``source/instance``."""
    return {
        f"{source}/{instance}": dict(values)
        for source, inst in scores.items()
        for instance, values in inst.items()
    }


def arm_scores(scores: Mapping[str, Any], seed: str, arm: str) -> Flat | None:
    """The flat per-instance scores of ``arm`` under ``seed`` (``start`` is shared), None if not run yet."""
    if arm == START:
        return flatten(scores[START]) if scores.get(START) else None
    found = scores.get("seeds", {}).get(seed, {}).get(arm)
    return flatten(found) if found else None


def seed_average(runs: Sequence[Flat], metric: str) -> dict[str, float]:
    """Per instance, the mean of ``metric`` over ``runs``; only instances every run scores on it."""
    keys = set.intersection(*({k for k, v in run.items() if metric in v} for run in runs)) if runs else set()
    return {k: sum(run[k][metric] for run in runs) / len(runs) for k in sorted(keys)}


def paired(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float] | None:
    """``{mean, half_width, low, high, n}`` of ``a - b`` over the instances both hold; None below 2."""
    shared = sorted(a.keys() & b.keys())
    if len(shared) < 2:
        return None
    return paired_interval([a[k] for k in shared], [b[k] for k in shared])


def seeds_with(scores: Mapping[str, Any], arms: Sequence[str]) -> list[str]:
    """The seeds (as their JSON keys, in numeric order) whose runs of every arm in ``arms`` exist."""
    seeds = sorted(scores.get("seeds", {}), key=int)
    return [s for s in seeds if all(arm_scores(scores, s, arm) is not None for arm in arms)]


def seed_level(differences: Mapping[str, Sequence[float]]) -> dict[str, Any] | None:
    """``{"seeds", "t", "bootstrap"}`` over the seeds in ``differences`` (``{seed: [a - b, ...]}``,
    :func:`memalpha_lab.seed_intervals.seed_level_change` with its default resamples and random seed);
    None below 2 seeds."""
    if len(differences) < 2:
        return None
    level = seed_level_change(differences)
    return {"seeds": [int(s) for s in differences], "t": level["t"], "bootstrap": level["bootstrap"]}


def compare(scores: Mapping[str, Any], a: str, b: str, metric: str) -> dict[str, Any]:
    """``a - b`` on ``metric``: ``{"seed_level": seed_level(...) or None, "pooled": interval or None,
    "seeds": [...], "per_seed": {seed: interval}}``. The seed level is over the seeds whose own
    paired interval exists (2 paired instances or more)."""
    seeds = seeds_with(scores, (a, b))
    per_seed, differences = {}, {}
    for seed in seeds:
        after = seed_average([arm_scores(scores, seed, a)], metric)
        before = seed_average([arm_scores(scores, seed, b)], metric)
        per_seed[seed] = paired(after, before)
        if per_seed[seed] is not None:
            differences[seed] = [after[k] - before[k] for k in sorted(after.keys() & before.keys())]
    pooled = None
    if seeds:
        pooled = paired(seed_average([arm_scores(scores, s, a) for s in seeds], metric),
                        seed_average([arm_scores(scores, s, b) for s in seeds], metric))
    return {"seed_level": seed_level(differences), "pooled": pooled, "seeds": [int(s) for s in seeds],
            "per_seed": per_seed}


def comparisons(scores: Mapping[str, Any], metrics: Sequence[str] = METRICS) -> dict[str, dict[str, Any]]:
    """Every comparison of :data:`COMPARISONS` on every metric: ``{"A - B": {metric: compare(...)}}``."""
    return {f"{a} - {b}": {m: compare(scores, a, b, m) for m in metrics} for a, b in COMPARISONS}


def arm_means(
    scores: Mapping[str, Any], metrics: Sequence[str] = METRICS, arms: Sequence[str] = ARMS
) -> dict[str, dict[str, Any]]:
    """Per arm (the start and ``arms``) and metric, the mean over instances of the seed-averaged scores
    with its 95 % interval."""
    out: dict[str, dict[str, Any]] = {}
    for arm in (START, *arms):
        seeds = ["0"] if arm == START else seeds_with(scores, (arm,))
        runs = [arm_scores(scores, s, arm) for s in seeds]
        runs = [r for r in runs if r is not None]
        if not runs:
            continue
        out[arm] = {"seeds": [] if arm == START else [int(s) for s in seeds]}
        for metric in metrics:
            values = list(seed_average(runs, metric).values())
            out[arm][metric] = mean_interval(values) if values else None
    return out


def format_interval(interval: Mapping[str, float] | None) -> str:
    if interval is None:
        return "-"
    return f"{interval['mean']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}]"


def seed_level_part(comparison: Mapping[str, Any], part: str) -> Mapping[str, float] | None:
    """The ``part`` (``"t"`` or ``"bootstrap"``) interval of a comparison's seed level, None if it
    has none."""
    level = comparison.get("seed_level")
    return None if level is None else level[part]


def comparison_rows(name: str, by_metric: Mapping[str, Any], metrics: Sequence[str]) -> list[list[Any]]:
    """Table rows of one comparison: the seed level first (t, then bootstrap), then the pooled
    instance-level interval, then each seed's own."""
    first = by_metric[metrics[0]]
    n_seeds = len(first["seed_level"]["seeds"]) if first.get("seed_level") else 0
    rows = []
    if n_seeds:
        rows.append(
            [
                name,
                "seeds, t",
                n_seeds,
                *[format_interval(seed_level_part(by_metric[m], "t")) for m in metrics],
            ]
        )
        rows.append(["", "seeds, bootstrap", n_seeds,
                     *[format_interval(seed_level_part(by_metric[m], "bootstrap")) for m in metrics]])
    rows.append(
        [
            name if not n_seeds else "",
            "instances, pooled",
            first["pooled"]["n"] if first["pooled"] else 0,
            *[format_interval(by_metric[m]["pooled"]) for m in metrics],
        ]
    )
    return rows


def print_report(means: Mapping[str, Any], compared: Mapping[str, Any]) -> None:
    """The arm means, then the seed-level, pooled and per-seed paired differences of the headline metrics."""
    print("\nheld-out means over instances (each averaged over seeds), 95 % t interval")
    rows = [
        [
            arm,
            ",".join(map(str, v["seeds"])) or "-",
            *[
                ("-" if v.get(m) is None else f"{v[m]['mean']:.3f} ± {v[m]['half_width']:.3f}")
                for m in METRICS
            ],
        ]
        for arm, v in means.items()
    ]
    print_table(["arm", "seeds", *METRICS], rows)
    print(
        "\npaired differences, mean [95 % interval]: over seeds first (t with seeds - 1 df; "
        "two-level bootstrap), then over instances (pooled = each instance averaged over seeds "
        "first), then each seed alone"
    )
    rows = []
    for name, by_metric in compared.items():
        first = by_metric[HEADLINE[0]]
        rows += comparison_rows(name, by_metric, HEADLINE)
        for seed in first["per_seed"]:
            interval = first["per_seed"][seed]
            rows.append(["", f"seed {seed}", interval["n"] if interval else 0,
                         *[format_interval(by_metric[m]["per_seed"][seed]) for m in HEADLINE]])
    print_table(["comparison", "over", "n", *HEADLINE], rows)


COMPUTE_FIELDS = {"train_s": "wall s", "steps": "optimiser steps"}
"""What a summary's ``runs`` record of each run's compute, and its column header."""
RECORDED_COMPUTE = {"cpu_s": "CPU s", "rollouts": "rollouts sampled", "tokens_sampled": "tokens sampled",
                    "reader_calls": "reader calls"}
"""The training compute a run's ``compute.train`` records (issue 39 item 2; :mod:`_compute`), and its
column header; runs from before that record show it as not recorded, never estimated."""


def run_compute(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"run", "seed", "arm", <COMPUTE_FIELDS present>, <RECORDED_COMPUTE present>}]`` from a
    summary's ``runs`` (``{"seed<N>_<arm>": {"train_s": ..., "steps": ..., "compute": {"train": ...}}}``),
    in the summary's order; a value the run did not record (absent or None) is left out."""
    out = []
    for name, record in runs.items():
        seed, _, arm = name.partition("_")
        entry: dict[str, Any] = {"run": name, "seed": int(seed.removeprefix("seed")), "arm": arm}
        entry.update({key: record[key] for key in COMPUTE_FIELDS if record.get(key) is not None})
        train = (record.get("compute") or {}).get("train") or {}
        entry.update({key: train[key] for key in RECORDED_COMPUTE if train.get(key) is not None})
        out.append(entry)
    return out


def print_compute(runs: Mapping[str, Mapping[str, Any]]) -> None:
    """Each run's compute as the summary records it; ``-`` or ``not recorded`` where it does not."""
    print("\ncompute of each run, as the summary records it (wall s: the sum of its logged step times,"
          " training only; CPU s: its training subprocess)")
    rows = [[e["arm"], e["seed"], *[("-" if key not in e else f"{e[key]:.0f}") for key in COMPUTE_FIELDS],
             *[("not recorded" if key not in e else f"{e[key]:.0f}") for key in RECORDED_COMPUTE]]
            for e in run_compute(runs)]
    print_table(["arm", "seed", *COMPUTE_FIELDS.values(), *RECORDED_COMPUTE.values()], rows)


def plot(means: Mapping[str, Any], compared: Mapping[str, Any], train: Mapping[str, Any], path: Path) -> None:
    """Arm means, the paired differences against GRPO, and the per-step training reward parts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(HEADLINE) + 2, figsize=(4.0 * (len(HEADLINE) + 2), 3.8))
    arms = list(means)
    for ax, metric in zip(axes, HEADLINE):
        values = [means[a].get(metric) for a in arms]
        xs = [i for i, v in enumerate(values) if v is not None]
        ax.errorbar(xs, [values[i]["mean"] for i in xs], yerr=[values[i]["half_width"] for i in xs],
                    fmt="o", capsize=4, color="black")
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set_title(f"held-out {metric}")
    ax = axes[len(HEADLINE)]
    names = [n for n in compared if not n.endswith(f"- {START}")]
    for offset, metric in enumerate(HEADLINE):
        for i, name in enumerate(names):
            x = i + 0.24 * (offset - 1)
            over_seeds = seed_level_part(compared[name][metric], "t")
            if over_seeds is not None:
                ax.errorbar(x - 0.05, over_seeds["mean"], yerr=over_seeds["half_width"], fmt="s", capsize=3,
                            color=f"C{offset}", label=f"{metric}, over seeds" if i == 0 else None)
            interval = compared[name][metric]["pooled"]
            if interval is not None:
                ax.errorbar(
                    x + 0.05,
                    interval["mean"],
                    yerr=interval["half_width"],
                    fmt="o",
                    mfc="white",
                    capsize=3,
                    color=f"C{offset}",
                    label=f"{metric}, over instances" if i == 0 else None,
                )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=10, fontsize=8)
    ax.set_title("paired differences: t over seeds (squares), pooled instances (circles)", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes[-1]
    for run, tags in train.items():
        for tag, style in (("train/reward", "-"), ("rewards/r1_accuracy", ":")):
            series = tags.get(tag, {})
            steps = sorted(series, key=int)
            ax.plot([int(s) + 1 for s in steps], [series[s] for s in steps], style, marker=".",
                    label=f"{run} {tag.split('/')[1]}")
    ax.set_title("training rounds")
    ax.set_xlabel("GRPO step")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    fig.suptitle("GRPO against its controls from one SFT start (95 % t intervals; arm means over held-out "
                 "instances)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def same_numbers(a: Any, b: Any, tol: float = 1e-9) -> bool:
    """Two JSON-like values equal, floats to ``tol`` (the summary went through JSON)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_numbers(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_numbers(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    return a == b


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"control arms report: cannot read {path} ({exc})") from None


def report_command(script: str, argv: Sequence[str] | None) -> str:
    """The command line of a report run: :func:`_common.command_line` from a shell, else (called with
    ``argv``) the script's relative path with those arguments."""
    if argv is None:
        return command_line()
    return " ".join([".venv/bin/python", f"experiments/studies/{Path(script).name}", *argv])


def update_summary(path: Path, rebuilt: Mapping[str, Any], command: str) -> None:
    """Rewrite the summary at ``path`` with the keys of ``rebuilt`` replaced (the intervals rebuilt
    from the scores file), ``settings.intervals`` saying what they now are (:data:`INTERVALS`), and
    ``intervals_rebuilt`` naming the command; every other key, the run's other settings, timings and
    machine included, stays as the run wrote it. Written atomically."""
    summary = read_json(path)
    summary.update(rebuilt)
    if isinstance(summary.get("settings"), dict):
        summary["settings"]["intervals"] = INTERVALS
    summary["intervals_rebuilt"] = {"command": command}
    write_text_atomically(path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scores", type=Path, default=SCORES_PATH)
    parser.add_argument("--summary", type=Path, default=SUMMARY_PATH)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless the summary's intervals are rebuilt"
    )
    parser.add_argument("--update", action="store_true",
                        help="rewrite the summary's intervals from the scores file, keeping the rest of it")
    parser.add_argument("--plot", type=Path, default=None, help="redraw the figure to this PNG")
    args = parser.parse_args(argv)
    scores = read_json(args.scores)
    means, compared = arm_means(scores), comparisons(scores)
    print_report(means, compared)
    if args.update:
        update_summary(
            args.summary, {"arm_means": means, "comparisons": compared}, report_command(__file__, argv)
        )
        print(f"(intervals written to {args.summary})")
    if args.summary.exists():
        print_compute(read_json(args.summary).get("runs", {}))
    if args.check or args.plot:
        summary = read_json(args.summary)
        if args.plot:
            plot(means, compared, summary.get("train", {}), args.plot)
            print(f"(plot written to {args.plot})")
        if args.check:
            ok = same_numbers(compared, summary.get("comparisons")) and same_numbers(
                means, summary.get("arm_means")
            )
            print("rebuilt intervals " + ("match" if ok else "DIFFER from") + f" {args.summary}")
            return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
