"""Typed shapes of values the native module returns."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["NativeInfo"]


class NativeInfo(TypedDict):
    """What :func:`specstate.native_info` returns.

    Keys: ``specstate_version``; ``llama_cpp_sys_version`` (the pinned
    ``llama-cpp-sys-4``); ``llama_cpp_build`` and ``llama_cpp_commit`` (the
    llama.cpp it vendors); ``backends`` compiled in (``cpu``, ``cuda``,
    ``metal``); ``cpu_baseline`` and the ``simd_features`` ggml's CPU kernels
    were compiled for; ``system_info``, llama.cpp's own summary.
    """

    specstate_version: str
    llama_cpp_sys_version: str
    llama_cpp_build: str
    llama_cpp_commit: str
    backends: list[str]
    cpu_baseline: str
    simd_features: list[str]
    system_info: str
