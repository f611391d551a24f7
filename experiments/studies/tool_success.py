"""Why GRPO lowers tool success: the demo's GRPO from its cold start, with one setting changed per arm.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/tool_success.py
          [--arms default,no_r1,lr_2e-5,seq_mean,kl_start] [--seeds 0,1,2] [--steps 4] [--val 48]
          [--run-dir runs/tool_success] [--out experiments/results/tool_success.json] [--reuse]

Every GRPO arm so far lowered held-out tool success (r2), a term of its own reward (issue 73, item
0; docs/results.md, "tool_success"). Each arm here is ``configs/tiny_cpu.yaml``'s GRPO from the same
cold start (``make demo``'s: oracle demonstrations, ``configs/sft_tiny_cpu.yaml``), ``--steps``
steps on ``--seeds``, with the settings of :data:`ARMS` changed, validated on the same ``--val``
new held-out instances (written once, data seed :data:`HELD_OUT_SEED`) with the config's reader.
Per arm it reports, per seed and over seeds (95 % t interval), the paired per-instance change
against the start in tool success, accuracy, fact recall and memory size, and from the training
batches, step by step, every reward term and the share of the advantages each carries
(``advantage/share_r*``, :func:`memalpha.grpo.advantages.advantage_shares`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha.data.loaders import save_jsonl
from memalpha.data.synthetic import SyntheticSettings
from memalpha.intervals import mean_interval
from memalpha.train.instance_scores import instance_values
from memalpha_lab.cli_runs import cold_start, memalpha
from memalpha_lab.common import REPO_ROOT, command_line, machine_info, write_json
from memalpha_lab.recipe_configs import load_yaml, write_yaml
from memalpha_lab.run_state import exported
from memalpha_lab.study_runner import add_run_arguments, check_positive, parse_seeds
from memalpha_lab.tb_scalars import event_scalars

ARMS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_r1": {"model.reward.accuracy_weight": 0.0},
    "lr_2e-5": {"model.optimizer.learning_rate": 2.0e-5},
    "seq_mean": {"model.update.loss_agg": "seq-mean-token-mean"},
    "kl_start": {"model.update.kl_coef": 0.1, "model.update.kl_reference": "start"},
    # added after the five planned arms ran (their held-out failures were all calls cut at the cap):
    # a follow-up, outside the plan's verdict
    "cap_160": {"model.rollout.max_new_tokens": 160, "model.rollout.stated_limit_share": 0.7},
}
"""Each arm's settings on top of ``configs/tiny_cpu.yaml`` (dotted keys): ``default`` is the demo's
GRPO; ``no_r1`` drops the reader's accuracy from the reward (r2, r3, r4 remain); ``lr_2e-5`` takes a
tenth of the step; ``seq_mean`` weighs every turn alike instead of every token; ``kl_start`` holds
the policy to its start (the SFT adapter) with a KL weight 100 times the config's; ``cap_160`` (a
follow-up, added after the others ran) lets a reply run to 160 tokens while the prompt still states the
112 the start was trained with (``stated_limit_share`` 0.7: ``int(160 * 0.7)``)."""
HELD_OUT_SEED = 7301
"""The data seed of the held-out instances, on which no setting was chosen."""
METRICS = ("tool_success", "accuracy", "fact_recall", "memory_tokens")
TRAIN_TAGS = (
    "train/reward", "train/tool_success", "train/truncated_ratio", "train/response_length",
    "rewards/r1_accuracy", "rewards/r2_tool", "rewards/r3_compression", "rewards/r4_content",
    "advantage/share_r1", "advantage/share_r2", "advantage/share_r3", "advantage/share_r4",
    "train/frac_reward_zero_std", "train/kl",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny_cpu.yaml")
    parser.add_argument("--sft-config", type=Path, default=REPO_ROOT / "configs" / "sft_tiny_cpu.yaml")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of every arm")
    parser.add_argument("--val", type=int, default=48, help="held-out instances")
    add_run_arguments(parser, "tool_success", "tool_success", "keep the runs already validated")
    parser.add_argument("--cap", type=int, help="validate with replies of up to CAP tokens, the prompt "
                        "stating the config's cap (a follow-up: were the failed calls only cut?)")
    args = parser.parse_args(argv)
    args.arm_list = [a for a in args.arms.split(",") if a]
    if not args.arm_list or any(a not in ARMS for a in args.arm_list):
        parser.error(f"--arms must name some of {', '.join(ARMS)}, got {args.arms!r}")
    args.seed_list = parse_seeds(parser, args.seeds)
    check_positive(parser, args, ("steps", "val"))
    return args


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def held_out(args: argparse.Namespace, run_dir: Path) -> Path:
    """The held-out instances, shaped as the config's synthetic data, written once."""
    path = run_dir / "held_out.jsonl"
    if not path.is_file():
        settings = SyntheticSettings(**load_yaml(args.config)["data"]["synthetic"])
        save_jsonl(settings.generate("validation", HELD_OUT_SEED, args.val), path)
    return path


def validate(args: argparse.Namespace, run_dir: Path, data: Path, name: str, adapter: Path) -> list[dict]:
    """``memalpha validate`` of ``adapter`` on the held-out instances; the report's records. With
    ``--cap N`` the replies may run to ``N`` tokens while the prompt states the config's cap (the
    validation is named ``<name>_capN``)."""
    config = load_yaml(args.config)["model"]["rollout"]
    extra = []
    if args.cap is not None:
        name = f"{name}_cap{args.cap}"
        share = config["max_new_tokens"] / args.cap
        extra = ["--model.rollout.max_new_tokens", str(args.cap),
                 "--model.rollout.stated_limit_share", str(share)]
    report = run_dir / "validate" / name / "validation.json"
    if not (args.reuse and report.is_file()):
        memalpha(["validate", "--config", str(args.config.resolve()), "--model.adapter_path", str(adapter),
                  "--data.val_path", str(data), "--trainer.logger.init_args.save_dir", str(run_dir),
                  "--trainer.logger.init_args.name", "validate", "--trainer.logger.init_args.version", name,
                  "--trainer.enable_progress_bar", "false", *extra],
                 run_dir / "logs" / f"validate_{name}.log", "tool_success")
    return json.loads(report.read_text(encoding="utf-8"))["records"]


def fit(args: argparse.Namespace, run_dir: Path, adapter: Path, arm: str, seed: int) -> Path:
    """The arm's GRPO from the start on ``seed``; its exported adapter."""
    name = f"{arm}_seed{seed}"
    folder = run_dir / "arms" / name
    if args.reuse and exported(folder / "adapter"):
        return folder / "adapter"
    config = load_yaml(args.config)
    config["seed_everything"] = seed
    trainer = config["trainer"]
    trainer.update(max_steps=args.steps, limit_val_batches=0, enable_checkpointing=False, callbacks=[],
                   enable_progress_bar=False)
    trainer.pop("val_check_interval", None)
    trainer["logger"]["init_args"].update(save_dir=str(run_dir), name="arms", version=name)
    for key, value in {"model.adapter_path": str(adapter), "model.seed": seed,
                       "model.export_adapter_dir": str(folder / "adapter"), **ARMS[arm]}.items():
        set_key(config, key, value)
    path = write_yaml(config, run_dir / "configs" / f"{name}.yaml")
    memalpha(["fit", "--config", str(path)], run_dir / "logs" / f"fit_{name}.log", "tool_success")
    return folder / "adapter"


def paired(records: list[dict], start: list[dict]) -> dict[str, float]:
    """The mean per-instance change of :data:`METRICS` from the start's records to ``records``."""
    after, before = instance_values(records), instance_values(start)
    out = {}
    for metric in METRICS:
        pairs = [(v[metric], before[s][i][metric]) for s, inst in after.items() for i, v in inst.items()
                 if metric in v and metric in before.get(s, {}).get(i, {})]
        out[metric] = sum(a - b for a, b in pairs) / len(pairs)
    return out


def pooled(records: list[dict]) -> dict[str, float]:
    """The mean per instance of :data:`METRICS` (the study's unit is the instance)."""
    values = [v for inst in instance_values(records).values() for v in inst.values()]
    return {m: sum(v[m] for v in values if m in v) / max(1, sum(m in v for v in values)) for m in METRICS}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    machine, started = machine_info(), time.perf_counter()
    adapter = cold_start(run_dir, args.config.resolve(), args.sft_config.resolve(), "tool_success")
    data = held_out(args, run_dir)
    start_records = validate(args, run_dir, data, "start", adapter)
    result: dict[str, Any] = {
        "benchmark": "tool_success", "command": command_line(),
        "settings": {"config": str(args.config), "steps": args.steps, "val": args.val, "cap": args.cap,
                     "held_out_seed": HELD_OUT_SEED, "seeds": args.seed_list,
                     "arms": {a: ARMS[a] for a in args.arm_list}},
        "start": pooled(start_records), "arms": {},
    }
    for arm in args.arm_list:
        runs = {}
        for seed in args.seed_list:
            trained = fit(args, run_dir, adapter, arm, seed)
            records = validate(args, run_dir, data, f"{arm}_seed{seed}", trained)
            curves = event_scalars(run_dir / "arms" / f"{arm}_seed{seed}", TRAIN_TAGS)
            runs[str(seed)] = {"held_out": pooled(records), "change": paired(records, start_records),
                               "train": {t: {str(k): v for k, v in c.items()} for t, c in curves.items()}}
        changes = {m: mean_interval([r["change"][m] for r in runs.values()]) for m in METRICS}
        result["arms"][arm] = {"seeds": runs, "change_over_seeds": changes}
        result["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(result, args.out, machine=machine)  # after every arm: a stopped study keeps the rest
        ts = changes["tool_success"]
        print(f"{arm}: tool success - start {ts['mean']:+.3f} [{ts['low']:+.3f}, {ts['high']:+.3f}]",
              flush=True)
    print(f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
