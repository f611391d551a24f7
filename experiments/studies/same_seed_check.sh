#!/usr/bin/env bash
# Same results before and after a change, on the same seed (issue 31's check of a restructure):
# `memalpha fit --config configs/tiny_cpu.yaml` (2 GRPO steps from ADAPTER, validating at step 2)
# and `memalpha validate` of its last checkpoint, each run at BEFORE_REV and at AFTER_REV (default
# HEAD) from a worktree of that revision, then python -m memalpha_lab.compare_runs over the two outputs.
#
#   bash experiments/studies/same_seed_check.sh BEFORE_REV ADAPTER_DIR [AFTER_REV]
#   BEFORE_FLAGS / AFTER_FLAGS: extra options for each side's fit and validate, to hold fixed what
#   changed on purpose between the two (a reward rule, say); docs/architecture.md has the flags of
#   the check against f9e8d3d.
#
# Uses this checkout's .venv (make install); about 20 minutes on 2 idle cores. Writes
# experiments/results/compare_runs_<before>.json; the runs stay under a temporary folder it names.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_REV ADAPTER_DIR [AFTER_REV]" >&2; exit 2; }
before_rev=$(git rev-parse --short "$1")
after_rev=$(git rev-parse --short "${3:-HEAD}")
adapter=$(realpath "$2")
[ -f "$adapter/adapter_config.json" ] || { echo "$2: no adapter_config.json (an exported LoRA adapter folder)" >&2; exit 2; }
work=$(mktemp -d /tmp/memalpha-same-seed-XXXXXX)
echo "runs under $work"
for side in before after; do
  rev=$([ $side = before ] && echo "$before_rev" || echo "$after_rev")
  flags=$([ $side = before ] && echo "${BEFORE_FLAGS:-}" || echo "${AFTER_FLAGS:-}")
  tree=$work/$side/tree
  git worktree add --detach -q "$tree" "$rev"
  run() {  # one memalpha command from the side's tree, its log beside its runs
    (cd "$tree" && PYTHONPATH=$tree HF_HUB_OFFLINE=1 "$root/.venv/bin/python" -m memalpha.cli "$@")
  }
  # shellcheck disable=SC2086  # the flags are words
  run fit --config configs/tiny_cpu.yaml --model.adapter_path "$adapter" $flags \
    --trainer.logger.init_args.save_dir "$work/$side/runs" \
    --trainer.callbacks.init_args.dirpath "$work/$side/checkpoints" > "$work/$side/fit.log" 2>&1
  # shellcheck disable=SC2086
  run validate --config configs/tiny_cpu.yaml --model.adapter_path "$adapter" $flags \
    --trainer.logger.init_args.save_dir "$work/$side/runs" \
    --ckpt_path "$work/$side/checkpoints/last.ckpt" > "$work/$side/validate.log" 2>&1
  git worktree remove --force "$tree"
  echo "$side ($rev): done"
done
"$root/.venv/bin/python" -m memalpha_lab.compare_runs "$work/before/runs" "$work/after/runs" --tolerance 1e-5 \
  --out "experiments/results/compare_runs_${before_rev}.json"
