# mlrelease — one-command set-up, run and test on one machine (the embedded default).
# `make run` and `make test` install everything they need on first use and are fast afterwards.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON_VERSION ?= 3.11
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# The Triton toolchain (CPU tritonserver + perf_analyzer) lives apart: it needs numpy < 2 and tritonclient 2.5x.
TRITON_VENV := $(CURDIR)/.venv-triton
export MLRELEASE_REPO := $(CURDIR)
export MLRELEASE_HOME ?= $(CURDIR)/.mlrelease
export AIRFLOW_HOME := $(MLRELEASE_HOME)/airflow
export AIRFLOW_CONFIG := $(CURDIR)/airflow.cfg
# The model a process releases when the specs folder declares several (models/<name>/release.yaml).
export MLRELEASE_MODEL ?= parcel_eta
# The machine's python3, resolved before the venv goes first on PATH (a uv venv has no pip): it bootstraps uv.
SYSTEM_PYTHON := $(shell command -v python3)
export PATH := $(VENV)/bin:$(PATH)
# Build caches shared by every checkout of this user (the mypy cache, the uv bootstrap), beside uv's own.
USER_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mlrelease
# mypy's incremental cache lives with the user's other build caches (like uv's), not in the checkout: a clean clone
# re-checks only what changed (~3 s) instead of everything (~45 s). mypy validates each entry by its source's hash.
export MYPY_CACHE_DIR ?= $(USER_CACHE)/mypy
# Python writes the bytecode of what it imports, once, into the venv (even where the caller's environment turns that
# off): compiling only what is used is cheaper than compiling all 1.9 GB of the venv up front (~25 s).
export PYTHONDONTWRITEBYTECODE :=
# uv builds the venvs: the one on PATH, else a pinned private copy installed once with pip into the user's cache.
# `--target` rather than a system-wide or --user install: Debian's Python refuses those (PEP 668, externally managed).
UV_VERSION := 0.13.9
UV_TOOL := $(USER_CACHE)/uv-$(UV_VERSION)
UV := $(or $(shell command -v uv 2>/dev/null),$(UV_TOOL)/bin/uv)

# The demo run: the nightly run whose data interval ends at $(DATE) 02:00 UTC (override: make run DATE=…).
DATE ?= 2026-11-29
RUN_END := $(DATE)T02:00:00+00:00
# A fresh machine has no champion yet: the night before runs first and its model becomes champion.
PREV_END := $(shell date -u -d "$(DATE) -1 days" +%F)T02:00:00+00:00
# The demo gateway and the traffic that flows through it while the candidate is rolled out.
GATEWAY_PORT ?= 8080
# Gateway worker processes (uvicorn replaces a killed one; the other keeps answering meanwhile).
GATEWAY_WORKERS ?= 2
TRAFFIC_RATE ?= 200
HISTORY_DAYS ?= 9
# Orders per day. The demo traffic replays the last 5 h of orders (older ones are past the package features'
# freshness budget): 6,000 a day gives the long tail ~170 distinct orders there, enough for its guardrails.
ROWS_PER_DAY ?= 6000
# Corrupt the run's window to watch the data gate stop the release: make run INJECT=negative_values (any class of
# `mlrelease data generate --inject`: nulls, drift, schema, stale, duplicates, late_events, empty_partition, stuck_column,
# republished, orphans, naive_timestamps, units, negative_values, republished_new_ids, appended_twice,
# packages_after_orders, feed_outage)
INJECT ?=
# The declared models (models/<name>/release.yaml) that `make run` releases, one after the other: make run MODELS=late_delivery
MODELS ?= parcel_eta late_delivery
# Derive a bad candidate tonight to watch a gate stop it, for every model of MODELS:
# make run MODELS=late_delivery CANDIDATE_FAULT=slow (errors|low_confidence_long_tail|overconfident|shifted_high_value|batch_cost)
CANDIDATE_FAULT ?=

.PHONY: help setup system-run system-test run test test-fast lint bench render-pods clean

help:
	@echo "make run    - set up if needed, then run each model's nightly release DAG end-to-end (embedded default; MODELS=...)"
	@echo "make test   - set up if needed, then run the whole test suite (unit, integration, e2e)"
	@echo "make lint   - ruff and mypy"
	@echo "make bench  - benchmarks with comparison tables"
	@echo "make render-pods OUT=DIR - every step's Kubernetes pod manifest, rendered by the DAG's operator and validated"

$(VENV)/.installed: pyproject.toml requirements.lock src/mlrelease_typeguard_cache/__init__.py | $(UV)
	$(UV) venv -q --allow-existing --python $(PYTHON_VERSION) $(VENV)
	$(UV) pip sync -q --python $(PY) requirements.lock
	$(UV) pip install -q --python $(PY) --no-deps -e .
	@# Feast's typeguard instrumentation, compiled once and reused by every process (~8 s of CPU per Feast import)
	$(PY) -m mlrelease_typeguard_cache > /dev/null
	@touch $@

$(UV_TOOL)/bin/uv:
	$(SYSTEM_PYTHON) -m pip install -q --disable-pip-version-check --target $(UV_TOOL) uv==$(UV_VERSION)

$(TRITON_VENV)/.installed: requirements-triton.lock | $(UV)
	$(UV) venv -q --allow-existing --python $(PYTHON_VERSION) $(TRITON_VENV)
	$(UV) pip sync -q --python $(TRITON_VENV)/bin/python requirements-triton.lock
	@touch $@

# Test-only schema validators from the npm registry (Gateway API objects, generated from the upstream CRDs).
NODE_TOOLS := $(CURDIR)/tests/tools/node_modules/.installed
$(NODE_TOOLS): tests/tools/package.json tests/tools/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "the tests need Node.js and npm: apt-get install nodejs npm"; exit 1; }
	npm ci --silent --no-audit --no-fund --prefix tests/tools
	@touch $@

$(AIRFLOW_HOME)/airflow.db: $(VENV)/.installed
	@mkdir -p $(AIRFLOW_HOME)
	airflow db migrate > $(AIRFLOW_HOME)/db-migrate.log 2>&1 || { tail -20 $(AIRFLOW_HOME)/db-migrate.log; exit 1; }

# System packages first, before any other work: installed as root, otherwise one command to run is printed.
system-run:
	@SYSTEM_PYTHON=$(SYSTEM_PYTHON) scripts/system_packages.sh run

system-test:
	@SYSTEM_PYTHON=$(SYSTEM_PYTHON) scripts/system_packages.sh test

setup: system-run $(VENV)/.installed $(TRITON_VENV)/.installed $(AIRFLOW_HOME)/airflow.db

run: setup
	@echo "==> synthetic parcel data, $(HISTORY_DAYS) days of history up to $(DATE)"
	@mlrelease data generate --start $$(date -u -d "$(DATE) -$(HISTORY_DAYS) days" +%F) --end $(DATE) \
		--rows-per-day $(ROWS_PER_DAY) > /dev/null
	@echo "==> local Triton server (CPU, explicit model control)"
	@mlrelease triton up | grep -E '"(status|url)"'
	@MODELS="$(MODELS)" RUN_END=$(RUN_END) PREV_END=$(PREV_END) GATEWAY_PORT=$(GATEWAY_PORT) GATEWAY_WORKERS=$(GATEWAY_WORKERS) TRAFFIC_RATE=$(TRAFFIC_RATE) \
		INJECT=$(INJECT) CANDIDATE_FAULT=$(CANDIDATE_FAULT) INJECT_START=$$(date -u -d "$(DATE) -1 days" +%F) DATE=$(DATE) ROWS_PER_DAY=$(ROWS_PER_DAY) \
		scripts/release_demo.sh

# Test files run on parallel worker processes (pytest-xdist): a file stays on one worker (its module-scoped servers
# are built once), the longest files start first (tests/conftest.py), and a worker takes the next file when free.
TEST_WORKERS ?= 2
# The 25 slowest tests are listed at the end: where the suite's time goes (its target is 15 minutes here).
test: system-test setup $(NODE_TOOLS) lint
	pytest tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The pure unit tier (no servers), on the same workers as `make test`.
test-fast: system-test setup $(NODE_TOOLS)
	pytest tests/unit -n $(TEST_WORKERS)

lint: setup
	ruff check src plugins dags tests bench feature_repo
	mypy

bench: setup
	python bench/bench_materialize.py
	python bench/bench_validate_data.py
	python bench/bench_data_engines.py
	python bench/bench_dag_parse.py
	python bench/bench_serving.py
	python bench/bench_gateway.py
	python bench/bench_feature_read.py
	python bench/bench_rollout.py
	python bench/bench_verdict_sim.py --rollouts 20 --scenario aa

# Rendered through the Airflow operators, so it runs from plugins/ (on the path as Airflow puts its plugins folder).
OUT ?= build/pods
render-pods: $(VENV)/.installed
	PYTHONPATH=$(CURDIR)/plugins python -m mlrelease_airflow.render_pods --out $(OUT)

clean:
	rm -rf $(MLRELEASE_HOME)
