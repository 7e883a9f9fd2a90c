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
# `make test` installs each of these extras alone in a fresh venv ($(EXTRAS_VENV)-EXTRA:
# the wheel and what the extra brings, no test tools) and runs its first documented
# example there (tests/smoke_extras.py), so that a module an extra needs and does not
# install fails; then all but redis together in $(EXTRAS_VENV), with [otel].
EXTRAS_ALONE := redis http mcp cli a2a
EXTRAS_TOGETHER := http,mcp,cli,otel
EXAMPLE := examples/weather-agent/agent.json
# The extension `make dev` builds (and so `make bench` and `make run` use):
# `version`, for the venv's CPython only, or `abi3`, the stable-ABI build that
# `make wheel` ships. The version-specific build reads lists, tuples and
# reference counts inline: about 1.5x faster on push_many/pop_many, a few
# percent elsewhere (benches/README.md, "The stable ABI's price").
ABI ?= version
# (The comma by name: a bare one would split $(if ...)'s arguments.)
COMMA := ,
ABI_FLAGS := $(if $(filter abi3,$(ABI)),--features python$(COMMA)abi3,)
SDIST_VENV := .venv-sdist
# The docs site, strictly: a broken link, a page left out or a reference that
# does not resolve fails. (The variable silences Material's notice about MkDocs 2.)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
# maturin finds zig as `python3 -m ziglang`: the venv's python, which has ziglang.
MATURIN_ZIG := env PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/maturin
LINUX_TARGETS := x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-unknown-linux-musl aarch64-unknown-linux-musl
# The Debian arm64 root of `make test-cross` (kept between runs) and its wheel.
CROSS := .cross

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS): requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The frameworks the agent turn is timed against (benches/test_bench_peers.py):
# `make bench` only, so that `make test`'s set-up does not carry them.
PEERS := $(VENV)/.peers-stamp
$(PEERS): benches/requirements-peers.txt $(DEPS)
	$(PY) -m pip install --quiet -r benches/requirements-peers.txt
	touch $@

.PHONY: setup
setup: $(DEPS) ## Create the virtual environment with the test and benchmark tools

.PHONY: dev
dev: $(DEPS) ## Build the extension in release mode into .venv, or VENV=path (editable Python sources)
	@mkdir -p target
	@# The other ABI's build would shadow or be shadowed by this one.
	rm -f python/openstarry/_core.*so
	@# maturin develop installs into $$VIRTUAL_ENV (else a .venv here): named, so that
	@# VENV=/another/venv gets it whichever venv, if any, the shell has activated.
	$(LOCK) env VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet $(ABI_FLAGS)

.PHONY: wheel
wheel: $(DEPS) ## Build the abi3 wheel (CPython >= 3.10) for this machine into dist/: manylinux2014 (glibc 2.17), linked by zig
	@mkdir -p target
	rm -rf dist
	$(LOCK) $(MATURIN_ZIG) build --release --zig --compatibility manylinux2014 --features python,abi3 --out dist --quiet

.PHONY: wheels
wheels: $(DEPS) ## Build and check every Linux wheel (manylinux2014, musllinux_1_2; x86_64, aarch64) and the sdist into dist/
	rustup target add $(LINUX_TARGETS)
	@mkdir -p target
	rm -rf dist
	for target in $(LINUX_TARGETS); do \
	  case $$target in *-gnu) tag=manylinux2014;; *-musl) tag=musllinux_1_2;; esac; \
	  $(LOCK) $(MATURIN_ZIG) build --release --zig --target $$target --compatibility $$tag --features python,abi3 --out dist --quiet || exit 1; \
	done
	$(PY) tests/check_wheel.py dist/*.whl
	@# The sdist is made from the tracked files (with their uncommitted changes), never from stray ones.
	rm -rf target/sdist-tree && mkdir -p target/sdist-tree
	rev=$$(git stash create) && git archive --format=tar "$${rev:-HEAD}" | tar -x -C target/sdist-tree
	cd target/sdist-tree && $(abspath $(VENV))/bin/maturin sdist --out $(CURDIR)/dist
	rm -rf $(SDIST_VENV)
	$(PYTHON) -m venv $(SDIST_VENV)
	$(LOCK) $(SDIST_VENV)/bin/python -m pip install --quiet --no-deps dist/openstarry-*.tar.gz
	$(SDIST_VENV)/bin/python tests/smoke_wheel.py
	@ls -l dist

.PHONY: test-cross
test-cross: $(DEPS) ## Build the manylinux2014 aarch64 wheel and run its smoke test and the example agent in a Debian arm64 root under qemu
	rustup target add aarch64-unknown-linux-gnu
	@mkdir -p target
	rm -rf $(CROSS)/dist
	$(LOCK) $(MATURIN_ZIG) build --release --zig --target aarch64-unknown-linux-gnu --compatibility manylinux2014 --features python,abi3 --out $(CROSS)/dist --quiet
	$(PY) tests/check_wheel.py $(CROSS)/dist/*.whl
	CROSS=$(CROSS) PY=$(PY) tests/cross_arm64.sh $(CROSS)/dist/openstarry-*.whl $(EXAMPLE)

.PHONY: wheel-version
wheel-version: $(DEPS) ## Build version-specific wheels for every CPython >= 3.10 found, into dist/version-specific/ (pip prefers them to the abi3 wheel)
	@mkdir -p target
	rm -rf dist/version-specific
	@pys=""; for v in 10 11 12 13 14; do \
	  py=$$(ls -d $$HOME/.pyenv/versions/3.$$v.*/bin/python3 2>/dev/null | tail -n 1); \
	  [ -n "$$py" ] || py=$$(command -v python3.$$v); \
	  [ -n "$$py" ] && $$py -c pass 2>/dev/null && pys="$$pys -i $$py"; \
	done; [ -n "$$pys" ] || { echo "no CPython >= 3.10 found"; exit 1; }; \
	echo "maturin build --release --zig --compatibility manylinux2014$$pys"; \
	$(LOCK) $(MATURIN_ZIG) build --release --zig --compatibility manylinux2014 $$pys --out dist/version-specific --quiet

.PHONY: run
run: dev ## Set up, then run the example weather agent through the spec 000 section 5 sequence
	$(PY) -m openstarry.cli run $(EXAMPLE) --input "Query weather in Taipei"

.PHONY: docs
docs: dev ## Build the docs site into site/ (open site/index.html), strictly; its references are generated from the code
	$(MKDOCS)

.PHONY: demo
demo: dev ## Run the Rust ingestion demo on the shipped NDJSON sample
	$(PY) -m openstarry.cli demo examples/events.ndjson

.PHONY: browser
browser: ## Install Debian's chromium and chromium-driver when missing (the console's browser test drives them)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  echo "chromium and chromedriver: found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else \
	  echo "The console's browser test needs chromium and chromedriver: as root, 'apt-get install chromium chromium-driver' (Debian), or put both on PATH. Without them that test is skipped."; \
	fi

.PHONY: console
console: dev ## Serve the example agent and its console on http://127.0.0.1:8000/ (Ctrl-C stops it)
	@echo "openstarry console: http://127.0.0.1:8000/"
	@(sleep 2; command -v xdg-open >/dev/null && xdg-open http://127.0.0.1:8000/ >/dev/null 2>&1 || true) &
	$(PY) -m openstarry.cli serve $(EXAMPLE) --port 8000

# The Redis bus's tests start their own redis-server: Debian's package, installed when missing.
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else echo "make: the Redis bus tests need redis-server: install it (Debian: apt-get install redis-server)" >&2; exit 1; fi; }

.PHONY: test
test: wheel browser redis-server ## Set up, then run every test: cargo test, the layers contract, pytest against the wheel (the docs' examples included), the docs site built strictly, smoke tests of the wheel (alone, with its dependencies, with its extras) in clean venvs
	cargo test --quiet
	PYTHONPATH=python $(VENV)/bin/lint-imports --no-cache
	PYTHONPATH=python $(PY) tests/check_house.py python/openstarry
	$(PY) tests/check_wheel.py dist/openstarry-*.whl
	$(PY) -m pip install --quiet --force-reinstall --no-deps dist/openstarry-*.whl
	$(PY) -m pytest
	$(MKDOCS)
	$(PY) tests/check_site_links.py site
	rm -rf $(SMOKE_VENV)
	$(PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/python -m pip install --quiet --no-deps --no-index dist/openstarry-*.whl
	$(SMOKE_VENV)/bin/python tests/smoke_wheel.py
	rm -rf $(AGENT_VENV)
	$(PYTHON) -m venv $(AGENT_VENV)
	$(AGENT_VENV)/bin/python -m pip install --quiet dist/openstarry-*.whl
	set -o pipefail; $(AGENT_VENV)/bin/openstarry run $(EXAMPLE) --input "Query weather in Taipei" | tee $(AGENT_VENV)/run.txt
	grep -q "The weather in Taipei is 25°C, Sunny." $(AGENT_VENV)/run.txt
	@for extras in $(EXTRAS_ALONE) $(EXTRAS_TOGETHER); do \
	  case $$extras in *,*) venv=$(EXTRAS_VENV);; *) venv=$(EXTRAS_VENV)-$$extras;; esac; \
	  start=$$SECONDS; \
	  echo "openstarry[$$extras] in a fresh $$venv"; \
	  rm -rf $$venv && $(PYTHON) -m venv $$venv && \
	  $$venv/bin/python -m pip install --quiet "$$(ls dist/openstarry-*.whl)[$$extras]" || exit 1; \
	  echo "  venv and install: $$((SECONDS - start)) s"; \
	  $$venv/bin/python tests/smoke_extras.py --extra $$extras $(EXAMPLE) || exit 1; \
	done

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

.PHONY: test-faults
test-faults: dev redis-server ## The process-level fault tests (frozen past a lease, kill -9, a master killed), five runs in a row (make test runs them once)
	for i in 1 2 3 4 5; do $(PY) -m pytest tests/test_exactly_once_state.py -q -p no:randomly || exit 1; done

.PHONY: bench
bench: dev redis-server $(PEERS) ## Run the benchmarks: each openstarry piece beside its pure-Python baseline, the agent turn beside its peers, as ratios (ABI=abi3 for the stable-ABI build)
	@# The build the run loads (told from its file name), not the one asked for.
	@$(PY) -c "from openstarry.bench import describe_extension; print(describe_extension())"
	$(PY) -m pytest benches --benchmark-enable --benchmark-only --benchmark-group-by=group --benchmark-columns=min,median,mean,ops -q -p no:randomly
	$(PY) -m openstarry.cli bench
	$(PY) -m openstarry.cli bench latency --rates 1000,10000,100000 --duration 3 --against pure-python
	@# Last: fails the run when a target is missed by more than the spread benches/README.md states.
	$(PY) benches/ratios.py --strict

FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz: ## Fuzz the Rust decoders (JSON scanner, envelope, segment, DedupWindow.restore, HTTP responses, server-sent events, Chat Completions chunks), FUZZ_SECONDS each (60); needs nightly and cargo-fuzz
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
	fuzz/run.sh $(FUZZ_SECONDS)

.PHONY: lint
lint: dev ## cargo fmt --check, clippy -D warnings, ruff, mypy --strict, stubtest, the import contracts (layers, no cycles, backends), the house rules (module and class sizes), the release workflow
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features python -- -D warnings
	cargo clippy --all-targets --features python,abi3 -- -D warnings
	$(VENV)/bin/ruff check python tests benches docs/*.py
	$(VENV)/bin/ruff format --check python tests benches docs/*.py
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest openstarry._core
	PYTHONPATH=python $(VENV)/bin/lint-imports --no-cache
	PYTHONPATH=python $(PY) tests/check_house.py python/openstarry
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(PY) tests/check_workflow.py .github/workflows/release.yml

.PHONY: format
format: $(DEPS) ## Format the Rust and Python sources
	cargo fmt
	$(VENV)/bin/ruff format python tests benches docs/*.py
	$(VENV)/bin/ruff check --fix python tests benches docs/*.py

.PHONY: clean
clean: ## Remove build outputs and virtual environments
	rm -rf target dist site test-artifacts $(VENV) $(SMOKE_VENV) $(AGENT_VENV) $(EXTRAS_VENV) $(EXTRAS_ALONE:%=$(EXTRAS_VENV)-%) $(SDIST_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .benchmarks

.PHONY: help
help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'
