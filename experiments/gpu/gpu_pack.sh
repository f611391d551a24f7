#!/usr/bin/env bash
# Pack what a bare GPU machine lacks into .device/ at the project root (about 36 MB), so that one
# run there can carry it: carry .device, and start the command with `source .device/env.sh;`
# (experiments/gpu/gpu_check.sh does). docs/real_model.md says when this is needed. It also stamps the
# commit (.device/tree.json): the GPU run refuses a copy whose files differ from it.
#
# The GPU image already has torch (CUDA build), lightning, tensorboard, accelerate, safetensors,
# tokenizers, huggingface_hub, numpy, pyarrow, pytest. It lacks bitsandbytes, jsonargparse (and its
# signatures extras), bm25s, rank-bm25, json-repair and gguf, and its transformers/peft are older than our pins.
# bitsandbytes' wheel is 43 MB because it ships a library per CUDA version; only the CUDA 13 ones
# are kept (the image's torch is a cu130 build), which brings it to ~4 MB.
# The embedded model (98 MB GGUF) does not fit in a carry; a tokenizer folder is packed instead
# (experiments/bench/bench_scale.py --tokenizer .device/tok), and random-weight models are built there.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/whl .device/site .device/tok
pin() { grep -i "^$1==" constraints.txt | head -n 1 | cut -d' ' -f1; }
py=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python  # it has memalpha_lab (make install)
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .device/dl \
  "$(pin bitsandbytes)" "$(pin jsonargparse)" "$(pin docstring_parser)" "$(pin typeshed_client)" \
  "$(pin bm25s)" "$(pin rank-bm25)" "$(pin json-repair)" "$(pin gguf)" "$(pin peft)" "$(pin transformers)"
mv .device/dl/transformers-*.whl .device/whl/   # installed there from the wheel (59 MB unpacked)
$py -m pip install -q --no-deps --no-compile --target .device/site .device/dl/*.whl
rm -rf .device/dl .device/site/bin
find .device/site/bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*cuda13*' ! -name '*_cpu.so' -delete
tok=$(ls -d "${MEMALPHA_CACHE:-$HOME/.cache/memalpha}"/models/*/ 2>/dev/null | head -n 1 || true)
if [ -n "$tok" ]; then cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json .device/tok/; cp "$tok"/chat_template.jinja .device/tok/ 2>/dev/null || true
else echo "no converted embedded model under the memalpha cache: run make demo or make test once first" >&2; fi
cat > .device/env.sh <<'ENV'
# On the GPU machine: source .device/env.sh (from the project root)
_d=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/devsite "$_d"/whl/*.whl >/dev/null 2>&1
_root=$(cd "$_d/.." && pwd)
export PYTHONPATH=$_d/site:/tmp/devsite:$_root:$_root/experiments/lab  # memalpha, and memalpha_lab from experiments/lab/
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
ENV
# the commit this pack is for: the GPU run checks its copy's files against it (.git may not travel);
# after a new commit, `.venv/bin/python -m memalpha_lab.tree_state stamp` alone refreshes it
$py -m memalpha_lab.tree_state stamp --out .device/tree.json
du -sh .device
