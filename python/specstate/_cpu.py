"""The CPU check made before the native module is loaded.

The native code is compiled for the x86-64-v3 baseline (AVX, AVX2, FMA, F16C,
BMI1, BMI2, LZCNT, MOVBE; see ``docs/cpu-baseline.md``). Loading it on a CPU
without those instructions could die with an illegal instruction before any
Python code runs, so on x86-64 Linux the flags of ``/proc/cpuinfo`` are checked
first. The native module repeats the check with CPUID when it initialises.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

__all__ = ["BASELINE", "BASELINE_FLAGS", "check_cpu", "missing_flags"]

BASELINE = "x86-64-v3"
#: ``/proc/cpuinfo`` flag names of the baseline (``abm`` is how Linux names LZCNT).
BASELINE_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")


def missing_flags(flags: Iterable[str]) -> list[str]:
    """The baseline flags absent from ``flags``, in baseline order."""
    present = set(flags)
    return [flag for flag in BASELINE_FLAGS if flag not in present]


def _cpuinfo_flags(text: str) -> set[str] | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return None


def check_cpu(cpuinfo_path: str = "/proc/cpuinfo") -> None:
    """Raise ``ImportError`` naming what is missing if this CPU is below the baseline.

    Only x86-64 Linux is checked here; elsewhere the native module's own CPUID
    check applies.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as cpuinfo:
            flags = _cpuinfo_flags(cpuinfo.read())
    except OSError:
        return
    if flags is None:
        return
    missing = missing_flags(flags)
    if missing:
        raise ImportError(
            f"specstate's native code was compiled for {BASELINE} and this CPU lacks "
            f"{', '.join(missing)}; rebuild it from source for this CPU "
            "(see docs/cpu-baseline.md)"
        )
