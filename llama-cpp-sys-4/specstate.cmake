# specstate's own changes to llama.cpp, applied to the copy of llama.cpp that the pinned llama-cpp-sys-4 crate
# builds (no third-party source is kept in this repository).
#
# How it gets in: the sys crate configures llama.cpp with the `cmake` crate, which passes the CMAKE_TOOLCHAIN_FILE
# of the environment to CMake; .cargo/config.toml sets it to this file (cmake/cuda.cmake includes it for the CUDA
# build), so `make`, `cargo build`, `maturin build` and `pip install .` all read it. CMake reads a toolchain file
# at the start of every configure, before any source is compiled: this one applies patches/*.patch (in name
# order) to the source tree being configured. LLAMA_SPECSTATE_PATCHES in .cargo/config.toml is the SHA-256 of
# the patches (tests/project/test_build.py keeps it so): the sys crate reruns its build when a LLAMA_* variable changes.
#
# Idempotent: the files a patch touches are kept as they came (*.specstate-orig) before the first patch, and a
# stamp records the patch set applied; another patch set restores the originals and applies the new set.

set(_specstate_src "${CMAKE_SOURCE_DIR}")
if(NOT EXISTS "${_specstate_src}/ggml/src/ggml-cpu/ggml-cpu.c")
    return() # a try_compile project, or not llama.cpp
endif()

file(GLOB _specstate_patches "${CMAKE_CURRENT_LIST_DIR}/patches/*.patch")
list(SORT _specstate_patches)
set(_specstate_digest "")
foreach(_patch IN LISTS _specstate_patches)
    file(SHA256 "${_patch}" _sum)
    string(APPEND _specstate_digest "${_sum}")
endforeach()
string(SHA256 _specstate_digest "${_specstate_digest}")

set(_specstate_stamp "${_specstate_src}/.specstate-patches")
set(_specstate_applied "")
if(EXISTS "${_specstate_stamp}")
    file(READ "${_specstate_stamp}" _specstate_applied)
endif()
if(_specstate_applied STREQUAL _specstate_digest)
    return()
endif()

# Back to the source as it came, then every patch.
file(GLOB_RECURSE _specstate_origs "${_specstate_src}/*.specstate-orig")
foreach(_orig IN LISTS _specstate_origs)
    string(REGEX REPLACE "\\.specstate-orig$" "" _file "${_orig}")
    file(COPY_FILE "${_orig}" "${_file}")
endforeach()
foreach(_patch IN LISTS _specstate_patches)
    file(STRINGS "${_patch}" _targets REGEX "^\\+\\+\\+ b/")
    foreach(_target IN LISTS _targets)
        string(REGEX REPLACE "^\\+\\+\\+ b/([^\t]*).*$" "\\1" _target "${_target}")
        if(EXISTS "${_specstate_src}/${_target}" AND NOT EXISTS "${_specstate_src}/${_target}.specstate-orig")
            file(COPY_FILE "${_specstate_src}/${_target}" "${_specstate_src}/${_target}.specstate-orig")
        endif()
    endforeach()
    execute_process(
        COMMAND patch -p1 -N -s -i "${_patch}"
        WORKING_DIRECTORY "${_specstate_src}"
        RESULT_VARIABLE _result
        OUTPUT_VARIABLE _output
        ERROR_VARIABLE _output)
    if(NOT _result EQUAL 0)
        message(FATAL_ERROR "specstate: ${_patch} does not apply to ${_specstate_src}:\n${_output}")
    endif()
    message(STATUS "specstate: applied ${_patch}")
endforeach()
file(WRITE "${_specstate_stamp}" "${_specstate_digest}")
