# CMake toolchain file of the zig builds (`make wheel`: maturin --zig). maturin passes its zig wrappers to the build
# in CC_<target>, CXX_<target>, AR_<target> and RANLIB_<target>; left alone, cargo-zigbuild would hand CMake a
# toolchain file of its own (CMAKE_TOOLCHAIN_FILE_<target>, which the `cmake` crate prefers), and the
# CMAKE_TOOLCHAIN_FILE that .cargo/config.toml sets for every build would be skipped. This file sets the zig tools
# and then reads that one. TARGET is the Rust target of the build script running CMake.
string(REPLACE "-" "_" _specstate_target "$ENV{TARGET}")
set(CMAKE_C_COMPILER "$ENV{CC_${_specstate_target}}")
set(CMAKE_CXX_COMPILER "$ENV{CXX_${_specstate_target}}")
set(CMAKE_AR "$ENV{AR_${_specstate_target}}")
set(CMAKE_RANLIB "$ENV{RANLIB_${_specstate_target}}")
# `make wheel-cuda`: nvcc compiles ggml-cuda's host code with zig's c++ too, against the same glibc headers, and
# the toolkit's crt/math_functions.h is told that they declare C23's math functions (see the Makefile's CUDA
# toolkit recipe). Nothing here matters to a build without CUDA.
set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
set(CMAKE_CUDA_FLAGS_INIT "-Xcompiler=-DSPECSTATE_ZIG_GLIBC_HEADERS")
# zig's linker writes no dependency files.
set(CMAKE_C_LINKER_DEPFILE_SUPPORTED FALSE)
set(CMAKE_CXX_LINKER_DEPFILE_SUPPORTED FALSE)
if(DEFINED ENV{CMAKE_TOOLCHAIN_FILE})
    include("$ENV{CMAKE_TOOLCHAIN_FILE}")
endif()
