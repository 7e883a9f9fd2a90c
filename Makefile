# openstarry: `make run` and `make test` set up everything they need themselves.
.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.deps-stamp
# Serialises builds when several shells build at once.
LOCK := flock $(CURDIR)/target/.openstarry-build.lock
SMOKE_VENV := .venv-smoke
AGENT_VENV := .venv-agent
EXTRAS_VENV := .venv-extras
EXAMPLE := examples/weather-agent/agent.json

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS): requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

.PHONY: setup
setup: $(DEPS) ## Create the virtual environment with the test and benchmark tools

.PHONY: dev
dev: $(DEPS) ## Build the extension in release mode into .venv (editable Python sources)
	@mkdir -p target
	$(LOCK) $(VENV)/bin/maturin develop --release --quiet

.PHONY: wheel
wheel: $(DEPS) ## Build the abi3 wheel (CPython >= 3.10) into dist/
	@mkdir -p target
	rm -rf dist
	$(LOCK) $(VENV)/bin/maturin build --release --out dist --quiet

.PHONY: run
run: dev ## Set up, then run the example weather agent through the spec 000 section 5 sequence
	$(PY) -m openstarry.cli run $(EXAMPLE) --input "Query weather in Taipei"

.PHONY: demo
demo: dev ## Run the Rust ingestion demo on the shipped NDJSON sample
	$(PY) -m openstarry.cli demo examples/events.ndjson

# The Redis bus's tests start their own redis-server: Debian's package, installed when missing.
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else echo "make: the Redis bus tests need redis-server: install it (Debian: apt-get install redis-server)" >&2; exit 1; fi; }

.PHONY: test
test: wheel redis-server ## Set up, then run every test: cargo test, the layers contract, pytest against the wheel, smoke tests of the wheel (alone, with its dependencies, with its extras) in clean venvs
	cargo test --quiet
	PYTHONPATH=python $(VENV)/bin/lint-imports --no-cache
	$(PY) -m pip install --quiet --force-reinstall --no-deps dist/openstarry-*.whl
	$(PY) -m pytest
	rm -rf $(SMOKE_VENV)
	$(PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install --quiet --no-deps --no-index dist/openstarry-*.whl
	$(SMOKE_VENV)/bin/python tests/smoke_wheel.py
	rm -rf $(AGENT_VENV)
	$(PYTHON) -m venv $(AGENT_VENV)
	$(AGENT_VENV)/bin/python -m pip install --quiet dist/openstarry-*.whl
	set -o pipefail; $(AGENT_VENV)/bin/openstarry run $(EXAMPLE) --input "Query weather in Taipei" | tee $(AGENT_VENV)/run.txt
	grep -q "The weather in Taipei is 25°C, Sunny." $(AGENT_VENV)/run.txt
	rm -rf $(EXTRAS_VENV)
	$(PYTHON) -m venv $(EXTRAS_VENV)
	$(EXTRAS_VENV)/bin/python -m pip install --quiet "$$(ls dist/openstarry-*.whl)[http,mcp,cli]"
	$(EXTRAS_VENV)/bin/python tests/smoke_extras.py $(EXAMPLE)

.PHONY: compat
compat: wheel ## The abi3 wheel on every CPython >= 3.10 found (python3.N on PATH or under pyenv): smoke test alone, then pytest
	@found=0; for v in 10 11 12 13 14; do \
	  py=$$(ls -d $$HOME/.pyenv/versions/3.$$v.*/bin/python3 2>/dev/null | tail -n 1); \
	  [ -n "$$py" ] || py=$$(command -v python3.$$v); \
	  [ -n "$$py" ] && $$py -c pass 2>/dev/null || continue; found=1; \
	  rm -rf .venv-compat && $$py -m venv .venv-compat && \
	  .venv-compat/bin/python -m pip install --quiet --no-deps --no-index dist/openstarry-*.whl && \
	  echo "$$($$py --version):" && .venv-compat/bin/python tests/smoke_wheel.py && \
	  .venv-compat/bin/python -m pip install --quiet dist/openstarry-*.whl -r requirements-dev.txt && \
	  .venv-compat/bin/python -m pytest -q -p no:cacheprovider || exit 1; \
	done; rm -rf .venv-compat; [ $$found = 1 ] || echo "no other CPython found"

.PHONY: bench
bench: dev redis-server ## Run the benchmarks: each openstarry piece beside its pure-Python baseline, as ratios
	$(PY) -m pytest benches --benchmark-enable --benchmark-only --benchmark-group-by=group --benchmark-columns=min,median,mean,ops -q -p no:randomly
	$(PY) benches/ratios.py
	$(PY) -m openstarry.cli bench

.PHONY: lint
lint: dev ## cargo fmt --check, clippy -D warnings, ruff, mypy --strict, stubtest, the layers contract
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest openstarry._core
	PYTHONPATH=python $(VENV)/bin/lint-imports --no-cache

.PHONY: format
format: $(DEPS) ## Format the Rust and Python sources
	cargo fmt
	$(VENV)/bin/ruff format python tests benches
	$(VENV)/bin/ruff check --fix python tests benches

.PHONY: clean
clean: ## Remove build outputs and virtual environments
	rm -rf target dist $(VENV) $(SMOKE_VENV) $(AGENT_VENV) $(EXTRAS_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks

.PHONY: help
help: ## Show this help
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'
