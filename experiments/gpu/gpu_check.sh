#!/usr/bin/env bash
# The GPU measurements of docs/real_model.md in one prepared run (issue 38, item 4), sized for a lent
# GPU machine whose minutes are few: one call of at most 600 s, on a bare machine, under 8 minutes with
# the packed environment's install and the packing of the results, so that a failed start still leaves
# room to rerun inside 15 device-minutes. Every stage has its own time limit, writes its JSON as it
# goes, and a stage that fails or times out does not stop the next one.
#
#   here, once per commit:  make test                 (converts the embedded model: its tokenizer is packed)
#                           bash experiments/gpu/gpu_pack.sh   (writes .device/, ~36 MB, and stamps the commit)
#   on the GPU machine:     carry .device;  command: bash experiments/gpu/gpu_check.sh
#
# Before any stage: one line saying whether torch's CUDA matches a library of the packed bitsandbytes
# (a mismatch stops here: every 4-bit stage would fail), then the tree check: the run refuses a tree
# with uncommitted changes (one line) unless started with --allow-dirty, which every result records.
#
# Stages, the most decision-relevant first (default: fit decode nf4_gradients; GPU_CHECK_STAGES picks):
#   fit            `memalpha fit --config configs/qlora_4090.yaml` for 2 steps, reader included, on a
#                  random-weight Qwen3-4B, one ~6k-token prompt per turn (experiments/gpu/gpu_fit_check.py):
#                  each step's phases with their seconds and peaks, written after every step    item 3
#   decode         the cuda-graph sampler at 8 rows after 6,144-token prompts, 2,048 new tokens, and its
#                  fraction of the bytes-read limit: $DECODE_CMD (experiments/bench/bench_graph_decode.py)  issue 37
#   nf4_gradients  QLoRA gradients on the GPU before/after sampling and against the dequantised weights
#                  (tests/test_nf4_gradients.py on cuda)
#   scale          (only when named) one GRPO step at the config's full sizes without the reader
#                  (experiments/bench/bench_scale.py); the fit covers what it showed, at the config's sizes
#   decode_hf      (only when named) transformers' generate with its static cache and torch.compile, the
#                  reference loop and cuda-graph at 8 rows after 1,024-token prompts         issue 37 item 4
#   decode_compiled (only when named) the cuda-graph step compiled by inductor before each capture, 8 rows
#                  after 6,144-token prompts, 512 new tokens (3 widths, each compiled)   issue 37 item 2, 57 item 1
#   decode_hf_6144 (only when named) cuda-graph against transformers' static cache + torch.compile at the
#                  recipe's shape, 8 rows after 6,144-token prompts, 256 new tokens, 3 repeats each
#                                                                                          issue 57 item 2
#   real_step      (only when named; alone in a call) one step of the config at its own row count: 4
#                  instances x 8 rollouts (32 rows in calls of generation_batch_size 4) reading one chunk
#                  of 2,048 tokens, reader and update included (gpu_fit_check.py). A real step reads
#                  ~10 such chunks, ~4 minutes of sampling each by the last lease's figures, so one chunk
#                  is what fits a call; its phases give the per-chunk cost to scale     issue 57 item 3
#
# Issue 57's run (docs/real_model.md, "Issue 57's run"), one lease each, in this order (both do not fit one
# lease of 15 device-minutes): GPU_CHECK_STAGES="decode_compiled decode_hf_6144", then
# GPU_CHECK_STAGES=real_step.
#
#   bash experiments/gpu/gpu_check.sh [--allow-dirty] [--dry-run] [--print-budget] [--tiny]
#     --dry-run       every check and stage's bookkeeping, each stage's command printed, not run
#     --print-budget  the stages' limits and the fixed costs as TSV, and the total against BUDGET_S
#     --tiny          a rehearsal on any machine: the fit stage in its CPU form (gpu_fit_check.py --tiny)
#
# Results go to experiments/results/gpu/ (GPU_CHECK_RESULTS). Where $OUT is set (the device tool's folder
# that comes back, at most 8 files), every stage's end also packs that folder into $OUT/gpu_results.tgz,
# so a call killed at its limit still returns the stages that finished.
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository root: .device/, .venv and every stage's path are relative to it

RESULTS=${GPU_CHECK_RESULTS:-experiments/results/gpu}
# The decoding measurement that decides issue 37: the cuda-graph sampler (length-bucketed attention)
# at the recipe's shape, 8 rows after 6,144-token prompts, 2,048 new tokens, bf16 layout, with its
# bytes-read-limit fraction. decode_hf (only when named) puts transformers' static cache + compile
# and the reference loop (memalpha_lab.growing_cache) beside it at 8 rows after 1,024-token prompts.
DECODE_CMD=${GPU_CHECK_DECODE_CMD:-"experiments/bench/bench_graph_decode.py --device cuda --nf4 --rows 8 \
  --upcast-unquantised off --prompt-tokens 6144 --max-new-tokens 2048 --paths graph --check-steps 4 \
  --out $RESULTS/bench_graph_decode_8x6144.json"}
DECODE_COMPILED_CMD="experiments/bench/bench_graph_decode.py --device cuda --nf4 --rows 8 --upcast-unquantised off \
  --prompt-tokens 6144 --max-new-tokens 512 --paths graph --compile-step inductor --check-steps 0 \
  --out $RESULTS/bench_graph_decode_8x6144_compiled.json"
DECODE_HF_6144_CMD="experiments/bench/bench_graph_decode.py --device cuda --nf4 --rows 8 --upcast-unquantised off \
  --prompt-tokens 6144 --max-new-tokens 256 --paths graph,hf-static --repeats 3 \
  --check-steps 0 --out $RESULTS/bench_graph_decode_8x6144_vs_hf.json"
DECODE_HF_CMD="experiments/bench/bench_graph_decode.py --device cuda --nf4 --rows 8 --upcast-unquantised off \
  --prompt-tokens 1024 --max-new-tokens 256 --loop-max-new-tokens 32 --paths loop,graph,hf-static \
  --check-steps 0 --out $RESULTS/bench_graph_decode_8x1024.json"

DEFAULT_STAGES="fit decode nf4_gradients"
declare -A LIMIT=([fit]=270 [decode]=90 [nf4_gradients]=45 [scale]=150 [decode_hf]=150 [decode_compiled]=180
  [decode_hf_6144]=210 [real_step]=420)  # seconds, each stage's own
START_S=45   # installing .device's wheels, the CUDA line and the tree check, before the first stage
PACK_S=5     # packing the results into $OUT after each stage
BUDGET_S=480 # 8 minutes: the whole run, well under one 600-second call
# GPU_CHECK_LIMITS="fit=300 decode=1" overrides limits (a slower card; tests/test_gpu_check.py)
for pair in ${GPU_CHECK_LIMITS:-}; do LIMIT[${pair%%=*}]=${pair#*=}; done

ALLOW_DIRTY="" DRY_RUN="" PRINT_BUDGET="" TINY=""
for arg in "$@"; do
  case $arg in
    --allow-dirty) ALLOW_DIRTY=--allow-dirty ;;
    --dry-run) DRY_RUN=1 ;;
    --print-budget) PRINT_BUDGET=1 ;;
    --tiny) TINY=--tiny ;;
    *) echo "unknown argument $arg (choose from: --allow-dirty --dry-run --print-budget --tiny)"; exit 2 ;;
  esac
done
STAGES=${GPU_CHECK_STAGES:-$DEFAULT_STAGES}

if [ -n "$PRINT_BUDGET" ]; then  # what tests/test_gpu_check.py sums
  total=$START_S
  printf 'start\t%s\n' "$START_S"
  for stage in $STAGES; do
    printf '%s\t%s\n' "$stage" "${LIMIT[$stage]:?unknown stage $stage}"; printf 'pack\t%s\n' "$PACK_S"
    total=$((total + LIMIT[$stage] + PACK_S))
  done
  printf 'total\t%s\nbudget\t%s\n' "$total" "$BUDGET_S"
  exit 0
fi

if [ -f .device/env.sh ]; then source .device/env.sh; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
mkdir -p "$RESULTS"
TOKENIZER=${MEMALPHA_TOKENIZER:-$( [ -d .device/tok ] && echo .device/tok || echo smollm2-135m-instruct )}

"$PY" -m memalpha_lab.cuda_match 2>&1 | tee "$RESULTS/cuda_match.txt"
if [ "${PIPESTATUS[0]}" = 1 ] && [ -z "${GPU_CHECK_IGNORE_CUDA:-}" ]; then
  echo "stopping: the 4-bit stages cannot load this bitsandbytes (GPU_CHECK_IGNORE_CUDA=1 runs them)"; exit 4
fi
# the pack's stamp, not git, where .device/ came with the copy: the device tool's copy can carry a .git
# of another commit than the files (seen on 2026-11-28: HEAD of the session's start, every later commit
# "uncommitted"); the stamp hashes every tracked file against the commit the pack was made for
STAMP_ARG=$( [ -f .device/tree.json ] && echo "--stamp .device/tree.json" )
"$PY" -m memalpha_lab.tree_state check $ALLOW_DIRTY $STAMP_ARG --out "$RESULTS/tree.json" || exit 3
export MEMALPHA_TREE_STATE=$RESULTS/tree.json  # the stages record this state, checked once here

run_stage() {  # name, command...: its own limit, its log beside its JSON, its exit status in the summary
  local name=$1; shift
  local start=$SECONDS
  echo "== $name (limit ${LIMIT[$name]} s): $*"
  if [ -n "$DRY_RUN" ]; then
    echo "dry run: not started" > "$RESULTS/$name.log"
  else
    timeout --kill-after=10 "${LIMIT[$name]}" "$@" > "$RESULTS/$name.log" 2>&1
  fi
  local status=$?
  tail -n 25 "$RESULTS/$name.log"
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" "${LIMIT[$name]}" \
    >> "$RESULTS/stages.tsv"
  echo "== $name: exit $status after $((SECONDS - start)) s"
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu_results.tgz" -C "$RESULTS" .; fi
}

printf 'stage\texit\tseconds\tlimit\n' > "$RESULTS/stages.tsv"
for stage in $STAGES; do
  case $stage in
    fit) run_stage fit "$PY" experiments/gpu/gpu_fit_check.py --tokenizer "$TOKENIZER" --chunks 1 \
           --out "$RESULTS/gpu_fit_check.json" $TINY ;;
    decode) run_stage decode "$PY" $DECODE_CMD ;;
    decode_hf) run_stage decode_hf "$PY" $DECODE_HF_CMD ;;
    decode_compiled) run_stage decode_compiled "$PY" $DECODE_COMPILED_CMD ;;
    decode_hf_6144) run_stage decode_hf_6144 "$PY" $DECODE_HF_6144_CMD ;;
    real_step) run_stage real_step "$PY" experiments/gpu/gpu_fit_check.py --tokenizer "$TOKENIZER" --steps 1 \
                 --instances 4 --chunks 1 $( [ -z "$TINY" ] && echo --chunk-tokens 2048 ) \
                 --out "$RESULTS/gpu_real_step.json" $TINY ;;
    nf4_gradients) run_stage nf4_gradients env MEMALPHA_TEST_DEVICE=cuda \
                     MEMALPHA_TEST_TOKENIZER="$TOKENIZER" "$PY" -m pytest -q -p no:cacheprovider \
                     tests/test_nf4_gradients.py \
                     --junitxml="$RESULTS/nf4_gradients.xml" ;;
    scale) run_stage scale "$PY" experiments/bench/bench_scale.py --device cuda --tokenizer "$TOKENIZER" \
             --out "$RESULTS/bench_scale.json" ;;
    *) echo "unknown stage $stage (choose from: fit decode nf4_gradients scale decode_hf decode_compiled"\
            "decode_hf_6144 real_step)"; exit 2 ;;
  esac
done
cat "$RESULTS/stages.tsv"
echo "total: $SECONDS s (budget $BUDGET_S s)"
