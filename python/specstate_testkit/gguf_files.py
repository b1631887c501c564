"""Writing GGUF files for the tests: whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf

__all__ = ["gguf_writer"]


@contextmanager
def gguf_writer(path: Path, arch: str, **options: Any) -> Iterator[gguf.GGUFWriter]:
    """A ``gguf.GGUFWriter`` (``options`` passed on) whose file replaces ``path`` once the block is done.

    The block adds metadata and tensors; then header, metadata and tensors are
    written to a temporary file in ``path``'s folder (created if missing),
    which gets mode ``0o644`` and is renamed over ``path``, so ``path`` is never
    seen half-written. If the block or the writing fails, the temporary file
    is removed and ``path`` left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, arch, **options)
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
