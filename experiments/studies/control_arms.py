"""Learning against a control: does GRPO beat more SFT, and a GRPO run that never updates?

Run:  make control-arms           (from a fresh clone)
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/control_arms.py
          [--config configs/tiny_cpu.yaml] [--sft-config configs/sft_tiny_cpu.yaml]
          [--demos 24] [--sft-steps 16] [--steps 8] [--val 48] [--questions 4] [--seeds 0,1,2]
          [--run-dir runs/control_arms] [--out experiments/results/control_arms.json] [--reuse]

Every stage is the user's command line (``memalpha data demos``, ``sft``, ``fit``, ``validate``)
on configs derived from ``--config`` and ``--sft-config``, written next to the run:

1. one *format-saturated* SFT start shared by every arm: oracle demonstrations of ``--demos``
   training instances, then ``--sft-steps`` SFT steps (16, as ``make demo``: tool success about
   1, so r2 has no headroom left); ``memalpha validate`` of it is the arm ``start``;
2. per seed, three arms from that adapter:
   ``grpo``: ``memalpha fit`` for ``--steps`` GRPO steps;
   ``grpo_lr0``: the same run at learning rate ``--lr0`` (1e-30; ``OptimizerSettings`` refuses 0
   as a mistake, and 1e-30 moves no fp32 weight of this size: the largest change of the exported
   adapter against the start is recorded as ``no_update_max_abs_change``): it samples, scores and
   steps like ``grpo`` but learns nothing; validation is greedy, so with unchanged weights its
   scores must equal ``start``'s exactly: ``grpo_lr0 - start`` checks the pipeline (export,
   reload, validation), and ``grpo - grpo_lr0`` is what the updates alone did;
   ``sft_continued``: ``memalpha sft`` continued from the adapter for the same training time as
   that seed's ``grpo`` run: Lightning's ``trainer.max_time`` set to the ``grpo`` run's summed
   TensorBoard ``step_s`` (rollouts and updates, not model loading or validation), so both arms
   are timed on the machine as it is while they run. (A step count from the start's SFT step
   time failed: the start ran beside other jobs at ~72 s a step, 10x its idle time, and the
   first seed-0 arm got 5 steps, 53 s against GRPO's 380 s.) The summed ``step_s`` of every arm
   is recorded as ``train_s``, its steps as ``steps``;
3. every arm's exported adapter validated by ``memalpha validate`` on the same ``--val`` held-out
   synthetic instances with ``--questions`` questions each (greedy, one rollout).

``--steps 8`` fits the whole run (start, 3 seeds x 3 arms, 10 validations) in about 100 minutes
on the 2 shared cores it was sized on: a GRPO step took 40 s there, an SFT step 7.6 s, a
validation of 48 instances x 4 questions 305 s (load average 1.5-3). Under ``nice -n 19`` beside
other jobs at nice 0 it gets far less: one SFT step took 140 s at load 6.

The report (``python -m memalpha_lab.control_arms_report``, which rebuilds it from the committed files):
paired per instance, ``grpo - sft_continued``, ``grpo - grpo_lr0`` and each arm ``- start`` on
accuracy, fact recall and mean reward (plus tool success and memory tokens), with 95 % intervals
*over seeds* (each seed's paired mean change, a t interval over seeds and a two-level bootstrap),
*pooled* (each instance averaged over the seeds first, then a paired t over instances) and *per
seed*. Outputs: the summary ``experiments/results/control_arms.json`` (settings,
timings, intervals, the per-step training scalars r1-r4, reward, tool success, fact recall of
every GRPO run), the per-instance scores of every validation in
``experiments/results/control_arms/instance_scores.json``, and the plot ``control_arms.png``
beside the summary; both JSON files are rewritten after every stage, so a run stopped early
still reports what it finished. ``--reuse`` keeps every stage whose output exists and resumes an
interrupted ``fit`` or continued ``sft`` from its ``last.ckpt``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab.arm_runs import Experiment
from memalpha_lab.control_arms_report import print_report
from memalpha_lab.study_runner import (
    add_recipe_arguments,
    add_run_arguments,
    check_positive,
    clear_run_dir,
    parse_seeds,
)

GRPO_ARMS = ("grpo", "grpo_lr0")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_recipe_arguments(
        parser,
        sft_steps=16,
        sft_help="SFT steps of the shared start (make demo: 16)",
        steps=8,
        steps_help="GRPO steps of each GRPO arm",
    )
    parser.add_argument("--val", type=int, default=48, help="held-out synthetic validation instances")
    parser.add_argument(
        "--questions", type=int, default=4, help="questions per training and validation instance"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (the SFT start is shared)")
    parser.add_argument(
        "--lr0", type=float, default=1e-30, help="learning rate of the no-update arm grpo_lr0"
    )
    add_run_arguments(parser, "control_arms", "control_arms")
    args = parser.parse_args(argv)
    check_positive(parser, args, ("demos", "sft_steps", "steps", "val", "questions"))
    if not 0.0 < args.lr0 < 1e-20:
        parser.error(f"--lr0 must be in (0, 1e-20) so that no weight moves, got {args.lr0}")
    args.seed_list = parse_seeds(parser, args.seeds)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    clear_run_dir(run_dir, args.reuse)
    experiment = Experiment(args)
    print(f"control arms in {run_dir}", flush=True)
    experiment.start()
    for seed in args.seed_list:
        for arm in GRPO_ARMS:
            experiment.grpo_arm(seed, arm)
        experiment.sft_arm(seed)
    result = experiment.write()
    print_report(result["arm_means"], result["comparisons"])
    for name, run in result["runs"].items():
        print(
            f"  {name}: {run['steps']} steps, {run['train_s']:.0f} s of training"
            + (
                f", max |weight change| {run['no_update_max_abs_change']:.1e}"
                if "no_update_max_abs_change" in run
                else ""
            )
        )
    print(f"\n(written to {args.out}, {args.out.with_suffix('.png')}; {result['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
