# Two commands do everything on a fresh clone: `make reports` and `make test`.
# Both create the virtual environment on first use (and again when pyproject.toml changes).

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LESSONS := $(sort $(wildcard lessons/*.ipynb))
CELL_TIMEOUT := 900

# Notebook kernels and tools come from the venv; hashing is fixed so lessons repeat exactly.
export PATH := $(abspath $(BIN)):$(PATH)
export JUPYTER_PREFER_ENV_PATH := 1
export PYTHONHASHSEED := 0
# One intra-op thread for lessons and tests (see conftest.py for why); benchmarks may override.
export OMP_NUM_THREADS ?= 1
# Bytecode is written on first import: with none, each of the hundreds of Python processes a
# test run starts (servers, kernels, workers) would compile torch's modules again, 2 s each.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: reports test lab lint format model bench peers cuda-check wheels-for-device browser

# torch goes first and pinned: a bare torch pulled in by a dependency is a multi-GB CUDA build.
# --no-compile: pip would byte-compile every module of every package (a minute on 2 cores);
# Python compiles only what is imported, once, when it may write bytecode (below).
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --no-compile torch==2.13.0
	$(BIN)/pip install --no-compile -e '.[dev]'
	touch $@

# Execute every lesson in place, in name order, writing figures/ and reports/; then
# strip run-to-run noise from the notebooks so the committed diff is only what changed.
reports: $(STAMP)
	@for notebook in $(LESSONS); do \
		echo "executing $$notebook"; \
		env -u LLMENGINE_ARTIFACTS $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
			--ExecutePreprocessor.kernel_name=python3 \
			--ExecutePreprocessor.timeout=$(CELL_TIMEOUT) "$$notebook" || exit 1; \
	done
	$(BIN)/python scripts/normalize_notebooks.py $(LESSONS)

# Lint, unit tests (two workers, each test file whole in one, so module fixtures load once),
# then every lesson executed into a temporary folder and its tables compared with the
# committed reports/ (no file in the repository changes).
test: lint $(STAMP) browser
	$(BIN)/pytest -n 2 --dist loadfile tests
	$(BIN)/python scripts/check_lessons.py --timeout $(CELL_TIMEOUT)

# Headless Chromium for the dashboard's browser test: the distribution's package, installed
# with apt-get only when missing (Playwright, from the dev extras, drives it; it never
# downloads a browser of its own). Where it cannot be installed the test is skipped, saying why.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
		>/dev/null 2>&1 || echo "chromium could not be installed: the browser test will be skipped"

# Read and run the lessons one cell at a time, without executing them all first. Jupyter
# refuses to start as root (a container, a CI machine) unless told it may; LAB_OPTIONS passes
# more options through (the test starts it with a port, a token and no browser).
LAB_AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_AS_ROOT) $(LAB_OPTIONS) lessons/

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

model: $(STAMP)
	$(BIN)/python scripts/train_embedded_model.py

# Benchmarks measured by hand, not by CI: they write wall-clock tables to reports/wallclock/.
# torch picks its own thread count here (each script takes --threads to pin it).
bench: $(STAMP)
	env -u OMP_NUM_THREADS $(BIN)/python scripts/bench_decode_step.py
	env -u OMP_NUM_THREADS $(BIN)/python scripts/bench_throughput.py
	env -u OMP_NUM_THREADS $(BIN)/python scripts/bench_kernels.py
	$(BIN)/python scripts/bench_tensor_parallel.py
	$(BIN)/python scripts/bench_speculative.py
	$(BIN)/python scripts/bench_host_time.py
	$(BIN)/python scripts/bench_host_split.py
	env -u OMP_NUM_THREADS $(BIN)/python scripts/bench_http_bound.py
	$(BIN)/python scripts/bench_engine_events.py
	$(BIN)/python scripts/dashboard_screenshot.py

# llama.cpp and vLLM against llmengine on the same weights and threads (2 unless PEERS_ARGS
# says --threads N); builds and downloads into .cache/peers/ on first use (see README).
peers: $(STAMP)
	env -u OMP_NUM_THREADS $(BIN)/python scripts/peers.py $(PEERS_ARGS)

# The checks only a GPU can run (CI has none): CUDA parity and engine tests, then the CUDA
# throughput benchmark; writes reports/wallclock/cuda-parity.md and cuda-throughput.md, within
# 10 minutes on an H200 (scripts/check_cuda.sh budgets each part). Where $(CUDA_PYTHON)'s
# torch sees a GPU (the GPU machine's image: a CUDA torch, no venv, no network) it runs the
# checks itself, the server's packages coming from the wheels of `wheels-for-device` in
# .whl/; elsewhere the venv's python does (and is told there is no GPU).
# CUDA_CHECK_ARGS go to bench_cuda.py.
CUDA_PYTHON ?= python3
cuda-check:
	@if $(CUDA_PYTHON) -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; \
	then PYTHON=$(CUDA_PYTHON) scripts/check_cuda.sh $(CUDA_CHECK_ARGS); \
	else $(MAKE) $(STAMP) && PYTHON=$(BIN)/python scripts/check_cuda.sh $(CUDA_CHECK_ARGS); fi

# The wheels the GPU machine's image lacks, at the venv's versions, into .whl/ (git-ignored),
# for a device run to carry (README, "On a GPU").
wheels-for-device: $(STAMP)
	scripts/device_wheels.sh $(BIN)/python
