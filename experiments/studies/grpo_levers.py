"""What moves GRPO against the control: the control-arms GRPO run again with one setting changed.

Run:  make grpo-levers            (after make control-arms, whose start and arms it reuses)
      HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/grpo_levers.py
          [--levers extractive_reader,r1_weight_3,instances_4,extractive_instances_4,lr_1e-3]
          [--seeds 0] [--steps 8] [--val 48] [--questions 4]
          [--run-dir runs/control_arms] [--out experiments/results/grpo_levers.json] [--reuse]

``experiments/studies/control_arms.py`` found its GRPO arm no better than SFT continued for the same
time (below it on fact recall; docs/results.md, "control_arms"). With r1 from the extractive
reader and 4 instances a step GRPO beats that control on fact recall over 3 seeds
(docs/results.md, "grpo_levers"). Each *lever* here is that GRPO
arm (``fit`` from the same SFT start, same seed, same steps, validated by the same ``validate``
config on the same held-out instances) with the settings of :data:`memalpha_lab.levers.LEVERS` changed:

``extractive_reader``  r1 from ``reader.kind: extractive`` (no reader model: a question scores
                       when its gold is stored where retrieval finds it), so the reward measures
                       the memory alone, without the 135M reader's misreadings;
``r1_weight_3``        a rollout's accuracy r1 weighs 3 against the turn's tool success r2
                       (``reward.accuracy_weight``; the paper weighs them alike);
``lr_1e-3``            five times the learning rate (``tiny_cpu``: 2e-4);
``group_8``            8 rollouts per group instead of 4 (twice the samples a step; not run yet);
``instances_4``        4 training instances a step instead of 1 (four groups: four times the
                       samples, and an update that averages over instances, not one instance's);
``extractive_instances_4``  ``extractive_reader`` and ``instances_4`` together;
``steps_24``           three times the steps (not run yet).

Validation always uses the run's own reader (the local 135M model), so accuracy stays comparable
with the control arms; ``answer_stored`` (the share of questions whose gold is written in the final
memory) and fact recall say what the memory holds whatever the reader makes of it, and
``reader_given_stored`` (the reader's accuracy on the questions whose answer is stored) how much of
that the reader turns into accuracy. The report pairs each lever with the seed's ``grpo``,
``sft_continued`` and the ``start`` per instance (95 % intervals, ``control_arms_report``'s
functions: over seeds where a lever ran two or more, and pooled over them, as the control arms do), and
carries the per-step training scalars r1-r4. It covers every lever run validated in the run folder, this
invocation's and earlier ones' (``--levers extractive_reader --seeds 1,2`` adds two seeds to a
seed-0 report); a seed's references enter once ``control_arms.py`` has validated them. Outputs: the summary
``experiments/results/grpo_levers.json`` and the per-instance scores of every validation it used in
``experiments/results/grpo_levers/instance_scores.json`` (rewritten after every lever);
``python -m memalpha_lab.grpo_levers_report --check`` rebuilds the intervals from them.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab.arm_configs import tag, validate_config
from memalpha_lab.arm_runs import arm_compute, step_seconds, train_run, validate
from memalpha_lab.common import REPO_ROOT, command_line, machine_info, write_json
from memalpha_lab.compute import measured
from memalpha_lab.control_arms_report import INTERVALS, START, TRAIN_TAGS
from memalpha_lab.grpo_levers_report import LEVER_METRICS, REFERENCES, lever_comparisons, print_levers
from memalpha_lab.levers import LEVERS, lever_config, lever_runs
from memalpha_lab.recipe_configs import load_yaml, write_yaml
from memalpha_lab.run_state import exported
from memalpha_lab.study_runner import add_run_arguments, check_positive, parse_seeds
from memalpha_lab.tb_scalars import event_scalars


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny_cpu.yaml")
    parser.add_argument(
        "--levers",
        default="extractive_reader,r1_weight_3,instances_4,extractive_instances_4,lr_1e-3",
        help=f"comma-separated, from {', '.join(LEVERS)}",
    )
    parser.add_argument(
        "--seeds", default="0", help="comma-separated control-arms seeds whose grpo run is changed"
    )
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps (the control arms' --steps)")
    parser.add_argument("--val", type=int, default=48, help="held-out instances (the control arms' --val)")
    parser.add_argument("--questions", type=int, default=4, help="questions per instance (the control arms')")
    add_run_arguments(parser, "control_arms", "grpo_levers", "keep the levers whose validation exists")
    args = parser.parse_args(argv)
    args.lever_list = [name for name in args.levers.split(",") if name]
    unknown = [name for name in args.lever_list if name not in LEVERS]
    if unknown or not args.lever_list:
        parser.error(f"--levers must name some of {', '.join(LEVERS)}, got {args.levers!r}")
    check_positive(parser, args, ("steps", "val", "questions"))
    args.seed_list = parse_seeds(parser, args.seeds)
    args.lr0 = None  # arm_fit_config reads it only for the arm grpo_lr0
    return args


def report(
    args: argparse.Namespace, run_dir: Path, val_yaml: Path, machine: dict[str, Any], started: float
) -> dict[str, Any]:
    """Both JSON files from every lever run validated in ``run_dir`` (this invocation's and earlier
    ones'), each with its seed's control-arms references where those are validated."""
    adapter = run_dir / "sft" / "adapter"
    scores: dict[str, Any] = {START: validate(run_dir, val_yaml, adapter, START, True), "seeds": {}}
    runs: dict[str, Any] = {}
    train: dict[str, Any] = {}
    for seed, lever in lever_runs(run_dir):
        arms = scores["seeds"].setdefault(str(seed), {})
        for arm in REFERENCES:
            name = tag(seed, arm)
            if arm not in arms and (run_dir / "validate" / name / "validation.json").is_file():
                arms[arm] = validate(run_dir, val_yaml, adapter, name, True)
                runs[name] = {
                    "train_s": sum(step_seconds(run_dir / "arms" / name)),
                    "compute": arm_compute(run_dir, name, "sft" if arm == "sft_continued" else "fit"),
                }
        name = tag(seed, f"lever_{lever}")
        folder = run_dir / "arms" / name
        arms[f"lever_{lever}"] = validate(run_dir, val_yaml, folder / "adapter", name, True)
        train[name] = {
            t: {str(k): v for k, v in s.items()} for t, s in event_scalars(folder, TRAIN_TAGS).items()
        }
        taken = step_seconds(folder)
        runs[name] = {"train_s": sum(taken), "steps": len(taken), "settings": LEVERS[lever],
                      "compute": arm_compute(run_dir, name, "fit")}
    scores_path = args.out.parent / args.out.stem / "instance_scores.json"
    write_json({"benchmark": "grpo_levers", **scores}, scores_path, machine=machine)
    result = {
        "benchmark": "grpo_levers",
        "command": command_line(),
        "settings": {
            "config": str(args.config),
            "steps": args.steps,
            "val_instances": args.val,
            "questions": args.questions,
            "levers": LEVERS,
            "runs": [list(r) for r in lever_runs(run_dir)],
            "intervals": INTERVALS,
        },
        "instance_scores": str(
            scores_path.relative_to(REPO_ROOT) if scores_path.is_relative_to(REPO_ROOT) else scores_path
        ),
        "runs": runs,
        "comparisons": lever_comparisons(scores, LEVER_METRICS),
        "train": train,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_json(result, args.out, machine=machine)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    if not exported(run_dir / "sft" / "adapter"):
        raise SystemExit(
            f"grpo_levers: no SFT start at {run_dir / 'sft' / 'adapter'}: "
            "run experiments/studies/control_arms.py first"
        )
    base = load_yaml(args.config)
    val_yaml = write_yaml(validate_config(base, run_dir, args), run_dir / "validate.yaml")
    machine, started = machine_info(), time.perf_counter()
    print(f"GRPO levers in {run_dir}", flush=True)
    for lever in args.lever_list:
        for seed in args.seed_list:
            name = tag(seed, f"lever_{lever}")
            config = lever_config(base, run_dir, args, lever, seed)
            path = write_yaml(config, run_dir / f"{name}.yaml")
            folder = run_dir / "arms" / name
            if not (args.reuse and exported(folder / "adapter")):
                with measured(run_dir, f"fit_{name}"):
                    train_run(path, config, run_dir / "logs" / f"fit_{name}.log", "fit")
            validate(run_dir, val_yaml, folder / "adapter", name, args.reuse)
            # after every run: a stopped one keeps the rest
            result = report(args, run_dir, val_yaml, machine, started)
    print_levers(result["comparisons"])
    print(f"\n(written to {args.out}; {result['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
