"""Conversations that come back: checkpoints of finished chat turns, by the conversation they hold."""

from __future__ import annotations

import contextlib
import hashlib
import json
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from specstate import _files

Pairs = Sequence[tuple[str, str]]


def conversation_keys(messages: Pairs) -> Iterator[tuple[int, str]]:
    """``(n, key)`` for each prefix of ``messages`` (its first ``n``), in one pass over their text: the cache key
    of a conversation is the SHA-256 of its messages' roles and texts, one JSON line each."""
    digest = hashlib.sha256()
    for n, (role, text) in enumerate(messages, 1):
        digest.update(json.dumps([role, text], ensure_ascii=False).encode() + b"\n")
        yield n, digest.copy().hexdigest()


def conversation_key(messages: Pairs) -> str:
    """The cache key of a whole conversation (see :func:`conversation_keys`)."""
    keys = [key for _, key in conversation_keys(messages)]
    return keys[-1] if keys else hashlib.sha256().hexdigest()


class ConversationCache:
    """Checkpoints of finished chat turns, by the conversation they hold (its messages, the reply included).

    In memory up to ``memory_bytes``, the least recently used moved to ``directory`` when there is one (up to
    ``directory_bytes``, the least recently used file removed), else dropped. A directory's files are found
    again by a restarted server: ``<key>.ckpt``, written atomically, read back only as checkpoints (anything
    else there, a link or a FIFO named so included, is passed over)."""

    def __init__(self, memory_bytes: int, directory: str | None = None, directory_bytes: int = 0) -> None:
        self.memory_bytes, self.directory_bytes = memory_bytes, directory_bytes
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._files: OrderedDict[str, int] = OrderedDict()  # key -> size, least recently used first
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            for key, size in _checkpoint_files(self.directory):
                self._files[key] = size

    def put(self, messages: Pairs, checkpoint: bytes) -> None:
        key = conversation_key(messages)
        with self._lock:
            self._memory[key] = checkpoint
            self._memory.move_to_end(key)
            while sum(len(data) for data in self._memory.values()) > self.memory_bytes and self._memory:
                old, data = self._memory.popitem(last=False)
                self._spill(old, data)

    def get(self, key: str) -> bytes | None:
        """The checkpoint cached under ``key`` (None if none, or if its file is gone or damaged)."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
            if key not in self._files or self.directory is None:
                return None
            self._files.move_to_end(key)
            path = self.directory / f"{key}.ckpt"
        try:
            return _files.read_checkpoint(path)
        except Exception:  # removed or damaged behind the server's back: as if never cached
            return None

    def longest(self, messages: Pairs) -> tuple[int, bytes] | None:
        """The longest cached conversation that ``messages`` extend (it ends with a reply): its length and bytes."""
        ends = [(n, key) for n, key in conversation_keys(messages[:-1]) if messages[n - 1][0] == "assistant"]
        for n, key in reversed(ends):
            if (data := self.get(key)) is not None:
                return n, data
        return None

    def _spill(self, key: str, data: bytes) -> None:
        if self.directory is None or len(data) > self.directory_bytes:
            return
        _files.replace_atomically(self.directory / f"{key}.ckpt", data, 0o600)
        self._files[key] = len(data)
        self._files.move_to_end(key)
        while sum(self._files.values()) > self.directory_bytes:
            old, _ = self._files.popitem(last=False)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / f"{old}.ckpt").unlink()

    def flush(self) -> None:
        """Move every checkpoint held in memory to the directory (at shutdown, so a restart finds them)."""
        with self._lock:
            while self._memory:
                key, data = self._memory.popitem(last=False)
                self._spill(key, data)


def _checkpoint_files(directory: Path) -> list[tuple[str, int]]:
    """``(key, size)`` of the regular files ``<key>.ckpt`` in ``directory``, oldest first (links, FIFOs, devices
    and files that vanish while being looked at are passed over)."""
    found = []
    for path in directory.glob("*.ckpt"):
        try:
            status = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode) and len(path.stem) == 64:
            found.append((status.st_mtime, path.stem, status.st_size))
    return [(key, size) for _, key, size in sorted(found)]
