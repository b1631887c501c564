# The whole workflow of specstate. `make demo` and `make test` do all setup on a
# fresh machine: system packages (scripts/system-deps.sh), a virtual
# environment with the pinned tools (requirements-dev.txt), the native build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Outside the clone, so that rebuilds of llama.cpp are incremental across clones.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/specstate-target
# The native build runs CMake, which comes from the virtual environment (PyPI).
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: all demo demo-cluster test develop system-deps test-rust test-python typecheck lint fmt wheel bench bench-speculation bench-cpu bench-chat bench-cluster \
	fuzz asan bench-lifecycle clean

all: test

demo: develop
	$(BIN)/specstate demo

# A generation moving between two Ray workers and surviving a worker kill (Ray is in requirements-dev.txt).
demo-cluster: develop
	$(BIN)/specstate demo-cluster

test: develop lint test-rust test-python typecheck

system-deps:
	@scripts/system-deps.sh

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

develop: system-deps $(VENV)/.installed
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(BIN)):$$PATH $(BIN)/maturin develop --release --quiet

# The Rust core needs no Python; its engine tests run on SmolLM2 (fetched once).
SMOLLM2 = $(shell $(BIN)/python -c "import runpy; print(runpy.run_path('python/specstate/smollm2.py')['smollm2_path']())")

test-rust: system-deps $(VENV)/.installed
	SPECSTATE_SMOLLM2="$(SMOLLM2)" cargo test --release

test-python: develop
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest

typecheck: develop
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest specstate._native

lint: system-deps $(VENV)/.installed
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features python -- -D warnings
	$(BIN)/ruff check python tests benchmarks scripts
	$(BIN)/ruff format --check python tests benchmarks scripts
	$(BIN)/python scripts/function_lengths.py

fmt:
	cargo fmt
	$(BIN)/ruff format python tests benchmarks scripts

wheel: system-deps $(VENV)/.installed
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/maturin build --release --out dist

bench: develop
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/run.py

# Speculation on three prompts in interleaved rounds: none, fixed draft lengths, the adaptive policy,
# llama-cpp-python's prompt lookup and llama.cpp's own n-gram speculation (also part of `make bench`).
bench-speculation: develop
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/speculation.py

bench-cpu: develop
	$(BIN)/python benchmarks/cpu_baseline.py

# The next turn of a 2,000-token conversation: restored from its checkpoint against re-prefilled.
bench-chat: develop
	$(BIN)/python benchmarks/chat_turn.py --threads 2 --json benchmarks/results/chat_turn.json

# Generations on Ray workers with random preemptions, migrations and kills, against uninterrupted runs.
bench-cluster: develop
	$(BIN)/python benchmarks/cluster.py --json benchmarks/results/cluster.json --chart benchmarks/results/cluster.png

fuzz: develop
	$(BIN)/python tests/checkpoint_fuzz.py --cases 100000 --smollm2-share 0.05 --json benchmarks/results/fuzz.json

# The Python suite against llama.cpp and the crate's shims built with AddressSanitizer
# (own target directory and .venv-asan; the first run compiles llama.cpp again).
asan: system-deps
	PYTHON=$(PYTHON) scripts/asan.sh

# Create and destroy 10,000 generators and contexts; resident memory must grow < 1%.
bench-lifecycle: develop
	$(BIN)/python benchmarks/lifecycle_memory.py --cycles 10000 --json benchmarks/results/lifecycle.json

clean:
	rm -rf $(VENV) .venv-asan dist .pytest_cache .mypy_cache .hypothesis
