"""Learning curve: does GRPO raise held-out reward beyond a partial SFT start, and by how much?

Run:  make learning-curve         (from a fresh clone)
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/learning_curve.py
          [--config configs/tiny_cpu.yaml] [--sft-config configs/sft_tiny_cpu.yaml]
          [--demos 24] [--sft-steps 6] [--steps 20] [--every 5] [--val 32] [--seeds 0]
          [--learning-rate LR] [--questions Q] [--run-dir runs/learning_curve] [--out PATH] [--reuse]

Every stage is the user's command line (``memalpha data demos``, ``memalpha sft``,
``memalpha validate``, ``memalpha fit``) on configs derived from ``--config`` and
``--sft-config`` and written next to the run (``<run-dir>/fit_seed<S>.yaml``, ``sft.yaml``):

1. oracle demonstrations of ``--demos`` training instances;
2. a deliberately *partial* cold start: ``--sft-steps`` SFT steps (the demo takes 16), so the
   policy writes some valid calls (GRPO needs reward spread) and has room to improve;
3. ``memalpha validate`` of that adapter on ``--val`` held-out synthetic instances (step 0);
4. per seed, ``memalpha fit`` from the adapter for ``--steps`` GRPO steps, validating the same
   instances every ``--every`` steps (greedy, one rollout each).

Every validation report holds every question and turn, so each point of the curve is a mean
over instances with a 95 % t interval (``experiments/lab/memalpha_lab/stats.py``), per data source and over
all; the step-``N`` minus step-0 difference is paired over the same instances. The training
scalars (reward, its spread, gradient norm, KL) come from TensorBoard. Output: a table, the
JSON ``experiments/results/learning_curve.json`` and the plot ``learning_curve.png`` beside
it (``docs/results.md`` shows it). ``--reuse`` keeps stages whose outputs exist (a crashed run
continues where it stopped).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab.cli_runs import memalpha_stage
from memalpha_lab.common import REPO_ROOT, command_line, load_records, machine_info, print_table, write_json
from memalpha_lab.instance_scores import study_instance_values
from memalpha_lab.recipe_configs import fit_config, load_yaml, sft_config, write_yaml
from memalpha_lab.stats import METRICS, paired_difference, summarise_with_ci
from memalpha_lab.study_runner import (
    add_recipe_arguments,
    add_run_arguments,
    check_positive,
    clear_run_dir,
    parse_seeds,
)
from memalpha_lab.tb_scalars import event_scalars

TRAIN_SCALARS = (
    "train/reward",
    "train/reward_std",
    "train/frac_reward_zero_std",
    "train/grad_norm",
    "train/kl",
    "train/tool_success",
)


def report_step(path: Path) -> int:
    match = re.fullmatch(r"validation_step(\d+)", path.stem)
    return int(match.group(1)) if match else 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ("mean_reward", "accuracy", "tool_success", "memory_tokens")
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 3.6))
    for seed_run in result["seeds"]:
        points = seed_run["curve"]
        steps = [p["step"] for p in points]
        sources = list(points[0]["metrics"])
        for ax, metric in zip(axes, panels):
            for source in sources:
                means = [p["metrics"][source][metric]["mean"] for p in points]
                half = [p["metrics"][source][metric]["half_width"] for p in points]
                style = (
                    {"linewidth": 2.2, "color": "black"}
                    if source == "all"
                    else {"linewidth": 1, "alpha": 0.8}
                )
                ax.errorbar(steps, means, yerr=half, capsize=3, marker="o", markersize=3,
                            label=f"{source} (seed {seed_run['seed']})", **style)
            ax.set_title(f"held-out {metric}")
            ax.set_xlabel("GRPO step")
        train = seed_run["train"]
        if "train/reward" in train:
            xs = sorted(train["train/reward"])
            axes[-1].plot([x + 1 for x in xs], [train["train/reward"][x] for x in xs], marker=".",
                          label=f"train/reward (seed {seed_run['seed']})")
        if "train/grad_norm" in train:
            xs = sorted(train["train/grad_norm"])
            axes[-1].plot([x + 1 for x in xs], [train["train/grad_norm"][x] for x in xs], linestyle="--",
                          label=f"train/grad_norm (seed {seed_run['seed']})")
    axes[-1].set_title("training rounds")
    axes[-1].set_xlabel("GRPO step")
    axes[0].legend(fontsize=6)
    axes[-1].legend(fontsize=6)
    fig.suptitle(
        "GRPO from a partial SFT start (means over held-out instances, 95 % t intervals)", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_recipe_arguments(parser, sft_steps=6, sft_help="SFT steps of the partial cold start", steps=20,
                         steps_help="GRPO steps per seed")
    parser.add_argument("--every", type=int, default=5, help="GRPO steps between validations")
    parser.add_argument("--val", type=int, default=32, help="held-out synthetic validation instances")
    parser.add_argument("--seeds", default="0", help="comma-separated GRPO seeds (the SFT start is shared)")
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="override model.optimizer.learning_rate"
    )
    parser.add_argument(
        "--questions",
        type=int,
        default=None,
        help="override data.synthetic.questions (questions per training and validation instance)",
    )
    add_run_arguments(parser, "learning_curve", "learning_curve")
    args = parser.parse_args(argv)
    check_positive(parser, args, ("demos", "sft_steps", "steps", "every", "val"))
    if args.questions is not None and args.questions < 1:
        parser.error(f"--questions must be >= 1, got {args.questions}")
    if args.steps % args.every:
        parser.error(f"--steps ({args.steps}) must be a multiple of --every ({args.every})")
    seeds = parse_seeds(parser, args.seeds)
    machine = machine_info()
    started = time.perf_counter()
    run_dir = args.run_dir.resolve()
    clear_run_dir(run_dir, args.reuse)
    base_fit = load_yaml(args.config)
    base_sft = load_yaml(args.sft_config)
    fit_yamls = {seed: write_yaml(fit_config(base_fit, run_dir, args, seed), run_dir / f"fit_seed{seed}.yaml")
                 for seed in seeds}
    fit_yaml = fit_yamls[seeds[0]]  # demonstrations and the start validation do not depend on the seed
    sft_yaml = write_yaml(sft_config(base_sft, run_dir, args.sft_steps), run_dir / "sft.yaml")
    adapter = run_dir / "sft" / "adapter"
    logs = run_dir / "logs"

    print(f"learning curve in {run_dir}", flush=True)
    demos = run_dir / "demos"
    if not (args.reuse and (demos / "val.jsonl").exists()):
        memalpha_stage("data", "demos", "--config", str(fit_yaml), "--out", str(demos / "train.jsonl"),
                       "--count", str(args.demos), log=logs / "demos_train.log")
        memalpha_stage("data", "demos", "--config", str(fit_yaml), "--out", str(demos / "val.jsonl"),
                       "--split", "test", "--count", "2", log=logs / "demos_val.log")
    if not (args.reuse and (adapter / "adapter_config.json").exists()):
        memalpha_stage("sft", "--config", str(sft_yaml), log=logs / "sft.log")
    start_report = run_dir / "curve" / "start" / "validation.json"
    if not (args.reuse and start_report.exists()):
        memalpha_stage("validate", "--config", str(fit_yaml), "--model.adapter_path", str(adapter),
                       "--trainer.logger.init_args.version", "start", log=logs / "validate_start.log")
    start_values = study_instance_values(load_records(start_report))

    seed_runs = []
    for seed in seeds:
        version = f"seed{seed}"
        folder = run_dir / "curve" / version
        final = folder / f"validation_step{args.steps}.json"
        if not (args.reuse and final.exists()):
            memalpha_stage("fit", "--config", str(fit_yamls[seed]), "--model.adapter_path", str(adapter),
                           log=logs / f"fit_{version}.log")
        reports = [start_report] + sorted(folder.glob("validation_step*.json"), key=report_step)
        curve = []
        for report in reports:
            values = study_instance_values(load_records(report))
            curve.append(
                {
                    "step": report_step(report),
                    "report": str(
                        report.relative_to(REPO_ROOT) if report.is_relative_to(REPO_ROOT) else report
                    ),
                    "metrics": summarise_with_ci(values),
                }
            )
        final_values = study_instance_values(load_records(reports[-1]))
        seed_runs.append(
            {
                "seed": seed,
                "curve": curve,
                "change_last_minus_start": {
                    m: paired_difference(start_values, final_values, m) for m in METRICS
                },
                "train": {
                    tag: {int(k): v for k, v in series.items()}
                    for tag, series in event_scalars(folder, TRAIN_SCALARS).items()
                },
            }
        )

    result = {
        "benchmark": "learning_curve",
        "command": command_line(),
        "settings": {
            "config": str(args.config), "sft_config": str(args.sft_config), "demos": args.demos,
            "sft_steps": args.sft_steps, "steps": args.steps, "every": args.every, "val_instances": args.val,
            "seeds": seeds, "learning_rate": args.learning_rate, "questions": args.questions,
        },
        "seeds": seed_runs,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    out = write_json(result, args.out, machine=machine)
    png = args.out.with_suffix(".png")
    plot(result, png)

    for seed_run in seed_runs:
        print(f"\nseed {seed_run['seed']}: held-out means over instances, ± 95 % t interval")
        rows = []
        for point in seed_run["curve"]:
            for source, metrics in point["metrics"].items():
                rows.append([point["step"], source] + [
                    f"{metrics[m]['mean']:.3f} ± {metrics[m]['half_width']:.3f}" for m in METRICS
                ])
        print_table(["step", "source", *METRICS], rows)
        change = seed_run["change_last_minus_start"]
        print(f"last - start (paired over {change['mean_reward']['n']} instances): " + ", ".join(
            f"{m} {change[m]['mean']:+.3f} ± {change[m]['half_width']:.3f}" for m in METRICS))
        train = seed_run["train"]
        if train:
            steps = sorted(next(iter(train.values())))
            print_table(
                ["step", *[t.split("/")[1] for t in TRAIN_SCALARS if t in train]],
                [[s, *[train[t].get(s) for t in TRAIN_SCALARS if t in train]] for s in steps],
                floats=3,
            )
    print(f"\n(written to {out} and {png}; {result['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
