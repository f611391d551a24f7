#!/usr/bin/env bash
# The GPU measurements of docs/real_model.md in one prepared run (issue 29, items 1-4), for a lent
# GPU machine whose minutes are few: each stage has its own time limit, writes its JSON as soon as
# it ends, and a stage that fails or times out does not stop the next one.
#
#   on this machine, once:  make test            (converts the embedded model: its tokenizer is packed)
#                           bash experiments/gpu_pack.sh      (writes .device/, ~36 MB)
#   on the GPU machine:     carry .device;  command: bash experiments/gpu_check.sh
#
# Stages, in the order they run (about 8 minutes in all on an H200, under 10 when each fits its limit):
#   1. sampler_bf16   new tokens/s of 8 rows of Qwen3-4B NF4 + LoRA r32 after 1,024-token prompts in the
#                     config's bf16 layout, memalpha's growing-cache loop against cuda-graph (after a
#                     teacher-forced comparison of their logits), and a profile of 8 eager steps
#                     (experiments/bench_graph_decode.py)                                item 2
#   2. scale          one GRPO step at configs/qlora_4090.yaml's sizes (8 x 6144 prompt tokens,
#                     2048 response tokens, micro-batches of 2 x 8192) under a 24 GiB cap, every phase
#                     timed, peak reserved and driver-side memory (experiments/bench_scale.py)  items 1, 3
#   3. fit            `memalpha fit --config configs/qlora_4090.yaml` for 2 steps on a random-weight
#                     Qwen3-4B folder, one ~4.4k-token chunk per instance (random weights never end a
#                     turn early, so every turn decodes the full 2048 tokens; a step took 110 s on an
#                     H200) (experiments/gpu_fit_check.py)                               item 3
#   4. nf4_gradients  QLoRA gradients on the GPU before/after sampling and against the dequantised
#                     weights (tests/test_nf4_gradients.py on cuda)                      item 4
#   Also, named in GPU_CHECK_STAGES: sampler (the same as 1 with the default float32 residual
#   stream) and sampler32 (32 rows, cuda-graph only).
#
# Results go to experiments/results/gpu/. Where $OUT is set (the device tool's folder that comes back,
# at most 8 files), every stage's end also packs that folder into $OUT/gpu_results.tgz, so a call
# killed at its limit still returns the stages that finished.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -f .device/env.sh ]; then source .device/env.sh; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
RESULTS=experiments/results/gpu
mkdir -p "$RESULTS"
TOKENIZER=${MEMALPHA_TOKENIZER:-$( [ -d .device/tok ] && echo .device/tok || echo smollm2-135m-instruct )}
STAGES=${GPU_CHECK_STAGES:-sampler_bf16 scale fit nf4_gradients}
declare -A LIMIT=([sampler_bf16]=70 [scale]=150 [fit]=300 [nf4_gradients]=50 [sampler]=90 [sampler32]=45)

run_stage() {  # name, command...: its own limit, its log beside its JSON, its exit status in the summary
  local name=$1; shift
  local start=$SECONDS
  echo "== $name (limit ${LIMIT[$name]} s): $*"
  timeout --kill-after=10 "${LIMIT[$name]}" "$@" > "$RESULTS/$name.log" 2>&1
  local status=$?
  tail -n 25 "$RESULTS/$name.log"
  printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" >> "$RESULTS/stages.tsv"
  echo "== $name: exit $status after $((SECONDS - start)) s"
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu_results.tgz" -C "$RESULTS" .; fi
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
printf 'stage\texit\tseconds\n' > "$RESULTS/stages.tsv"
for stage in $STAGES; do
  case $stage in
    nf4_gradients) run_stage nf4_gradients env MEMALPHA_TEST_DEVICE=cuda MEMALPHA_TEST_TOKENIZER="$TOKENIZER" \
                     "$PY" -m pytest -q -p no:cacheprovider tests/test_nf4_gradients.py \
                     --junitxml="$RESULTS/nf4_gradients.xml" ;;
    sampler) run_stage sampler "$PY" experiments/bench_graph_decode.py --device cuda --nf4 --rows 8 \
               --out "$RESULTS/bench_graph_decode.json" ;;
    sampler_bf16) run_stage sampler_bf16 "$PY" experiments/bench_graph_decode.py --device cuda --nf4 --rows 8 \
                    --upcast-unquantised off --loop-max-new-tokens 32 --check-steps 4 --profile-steps 8 \
                    --out "$RESULTS/bench_graph_decode_bf16.json" ;;
    sampler32) run_stage sampler32 "$PY" experiments/bench_graph_decode.py --device cuda --nf4 --rows 32 \
                 --paths graph --check-steps 0 --out "$RESULTS/bench_graph_decode_32.json" ;;
    scale) run_stage scale "$PY" experiments/bench_scale.py --device cuda --tokenizer "$TOKENIZER" \
             --out "$RESULTS/bench_scale.json" ;;
    fit) run_stage fit "$PY" experiments/gpu_fit_check.py --tokenizer "$TOKENIZER" --chunks 1 \
           --out "$RESULTS/gpu_fit_check.json" ;;
    *) echo "unknown stage $stage (choose from: sampler_bf16 scale fit nf4_gradients sampler sampler32)"; exit 2 ;;
  esac
done
cat "$RESULTS/stages.tsv"
