# CMake toolchain file for `make wheel-cuda`. The pinned llama-cpp-sys-4 forwards only `LLAMA_*` options to
# llama.cpp's CMake; the `cmake` crate it uses reads CMAKE_TOOLCHAIN_FILE from the environment, so the CUDA
# settings of ggml come from here. Inputs (environment): CUDAToolkit_ROOT (a toolkit root, e.g. the
# site-packages/nvidia/cu13 of the PyPI toolkit wheels) and SPECSTATE_CUDA_ARCHITECTURES (e.g. "80-real;90-real").
# specstate's own llama.cpp patches, as in every other build (this file replaces .cargo/config.toml's
# CMAKE_TOOLCHAIN_FILE for the CUDA build).
include("${CMAKE_CURRENT_LIST_DIR}/../llama-cpp-sys-4/specstate.cmake")
set(CUDAToolkit_ROOT "$ENV{CUDAToolkit_ROOT}" CACHE PATH "CUDA toolkit root")
set(CMAKE_CUDA_COMPILER "$ENV{CUDAToolkit_ROOT}/bin/nvcc" CACHE FILEPATH "nvcc")
# ggml picks its own list (PTX and SASS for 75 to 121) unless the architectures are set before it looks.
set(CMAKE_CUDA_ARCHITECTURES "$ENV{SPECSTATE_CUDA_ARCHITECTURES}" CACHE STRING "CUDA architectures")
# No direct link to libcuda (the driver): without VMM ggml-cuda needs only the runtime, and the runtime loads the
# driver when a CUDA call is first made, so the extension imports on a machine without an NVIDIA driver.
set(GGML_CUDA_NO_VMM ON CACHE BOOL "ggml: do not try to use CUDA VMM")
# FlashAttention kernels for ggml's default K/V type pairs only (all pairs multiply the compile time).
set(GGML_CUDA_FA_ALL_QUANTS OFF CACHE BOOL "ggml: compile all quants for FlashAttention")
# One GPU per process here; NCCL is not in the toolkit wheels.
set(GGML_CUDA_NCCL OFF CACHE BOOL "ggml: use NVIDIA Collective Comm. Library")
# The extension is a shared object, and the sys crate links ggml's static archives into it: every object must be
# position-independent. The `cmake` crate adds -fPIC to the C and C++ flags only; this covers the host code nvcc
# compiles for ggml's .cu files too (-Xcompiler=-fPIC). Measured: without it the first complete build failed at the
# final link ("relocation R_X86_64_PC32 cannot be used against symbol 'stderr'; recompile with -fPIC").
set(CMAKE_POSITION_INDEPENDENT_CODE ON CACHE BOOL "position-independent code for every target")
