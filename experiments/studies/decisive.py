"""The pre-registered decisive experiment (issue 39, item 3): does GRPO beat SFT continued for the same time?

Run:  HF_HUB_OFFLINE=1 .venv/bin/python experiments/studies/decisive.py --reuse
          [--seeds 0,1,2,3,4] [--recipe extractive_instances_4] [--steps 8] [--val 96] [--questions 4]
          [--val-data-seed 3900] [--train-data-seed-base 3910] [--plan-commit HASH]
          [--run-dir runs/decisive] [--out experiments/results/decisive.json]
      .venv/bin/python experiments/studies/decisive.py --check
          (python -m memalpha_lab.decisive_report --check)

The plan, its thresholds and its commit are in docs/results.md ("Pre-registered: ..."). Every stage is
the user's command line, through the control arms' :class:`memalpha_lab.arm_runs.Experiment`
(:class:`memalpha_lab.decisive_study.Decisive`):

* **C, the start**: oracle demonstrations of ``--demos`` training instances (synthetic data seed
  ``--demos-data-seed``, 0: the control arms' demonstrations) and ``--sft-steps`` SFT steps, the
  control arms' recipe; validated once (greedy, so deterministic);
* per seed ``s``, **A** (arm ``grpo``): ``memalpha fit`` from the start for ``--steps`` steps with the
  settings of lever ``--recipe`` (``memalpha_lab.levers.LEVERS``), ``seed_everything = model.seed = s``
  and its own GRPO stream, synthetic data seed ``--train-data-seed-base + s``
  (:func:`memalpha_lab.decisive_plan.recipe_config`);
* per seed, **B** (arm ``sft_continued``): ``memalpha sft`` continued from the start on the same
  demonstrations for A's CPU seconds (the amendment in docs/results.md: the budget is the CPU seconds
  the compute ledger recorded for that seed's ``memalpha fit`` of A, enforced by
  :class:`memalpha_lab.cpu_budget.CpuBudget` in B's own process,
  :func:`memalpha_lab.arm_configs.cpu_matched_sft_config`). A's ledger must hold every attempt of its
  fit: a fit whose earlier attempt was killed with the experiment (``compute/fit_<run>.running`` left)
  stops the study with one line, and A is rerun from scratch; so does a B whose own earlier attempt was
  killed (``compute/sft_<run>.running`` left: a resumed B would not count that attempt's last seconds);
* every adapter validated by ``memalpha validate`` on ``--val`` held-out instances x ``--questions``
  questions of the validation split at synthetic data seed ``--val-data-seed`` (3900: no earlier study
  validated on it; they all used 0), scored by the local 135M reader.

Outputs: the per-instance scores ``<out stem>/instance_scores.json`` (each instance also holding
``memory_share``, its final memory tokens over its input tokens, the guard's metric) and the summary
``--out`` (settings, the decision, comparisons, arm means, each run's compute: wall and CPU seconds,
optimiser steps, rollouts, tokens sampled, reader calls), both rebuilt after every stage from what the
run folder holds, so two processes over different seeds of one folder (``--seeds 0,1,2`` and
``--seeds 3,4``) write the same files; the shared start is built under a file lock by the first.
``--reuse`` keeps every stage whose output exists and resumes an interrupted fit or SFT from its
``last.ckpt``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memalpha_lab.decisive_report import main as report
from memalpha_lab.decisive_study import Decisive, decisive_stages, parse_args, run_study


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n", 1)[0])
    return run_study(args, "decisive", Decisive, decisive_stages, report)


if __name__ == "__main__":
    raise SystemExit(main())
