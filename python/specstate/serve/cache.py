"""What the server keeps between requests, each thing by tenant: checkpoints of finished chat turns, by the
conversation they hold (:class:`ConversationCache`), and the lookup corpora that ``ngram`` drafts copy from
(:class:`TenantCorpora`). A request's tenant (:func:`tenant_of`) is its API key's, narrowed by its ``user`` and
``cache_salt``: no request reuses what another tenant's requests left."""

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
from specstate._native import LookupCorpus

Pairs = Sequence[tuple[str, str]]

#: The tenant of the requests of a server with at most one API key that name no ``user`` and no ``cache_salt``.
DEFAULT_TENANT = ""

#: Tenants whose lookup corpora are kept at once (each of ``LookupCorpus``'s default budget, 65,536 tokens, a few
#: MiB when full): beyond them the corpus of the tenant served least recently is dropped.
TENANT_CORPORA = 8


def tenant_of(key: str, user: str | None = None, cache_salt: str | None = None) -> str:
    """The tenant of a request: :data:`DEFAULT_TENANT` for ``key`` :data:`DEFAULT_TENANT` (no API key, or the
    server's only one) and neither ``user`` nor ``cache_salt``; else the SHA-256 of the three, so that the
    key's own text is never what is kept (``key``: an API key's :func:`key_identity`)."""
    if key == DEFAULT_TENANT and user is None and cache_salt is None:
        return DEFAULT_TENANT
    return hashlib.sha256(json.dumps([key, user, cache_salt], ensure_ascii=False).encode()).hexdigest()


def key_identity(key: str) -> str:
    """What tells an API key's requests from another key's: the SHA-256 of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def conversation_keys(messages: Pairs, tenant: str = DEFAULT_TENANT) -> Iterator[tuple[int, str]]:
    """``(n, key)`` for each prefix of ``messages`` (its first ``n``), in one pass over their text: the cache key
    of a conversation is the SHA-256 of its tenant (a JSON line of one string, none for the default tenant) and
    its messages' roles and texts, one JSON line of two strings each."""
    digest = _tenant_digest(tenant)
    for n, (role, text) in enumerate(messages, 1):
        digest.update(json.dumps([role, text], ensure_ascii=False).encode() + b"\n")
        yield n, digest.copy().hexdigest()


def conversation_key(messages: Pairs, tenant: str = DEFAULT_TENANT) -> str:
    """The cache key of a whole conversation of ``tenant`` (see :func:`conversation_keys`)."""
    keys = [key for _, key in conversation_keys(messages, tenant)]
    return keys[-1] if keys else _tenant_digest(tenant).hexdigest()


def _tenant_digest(tenant: str) -> hashlib._Hash:
    """The SHA-256 that a conversation key of ``tenant`` goes on from (its tenant's line read)."""
    digest = hashlib.sha256()
    if tenant != DEFAULT_TENANT:
        digest.update(json.dumps([tenant]).encode() + b"\n")
    return digest


class ConversationCache:
    """Checkpoints of finished chat turns, by the tenant and the conversation they hold (its messages, the reply
    included): a conversation is found only by the tenant that cached it.

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

    def put(self, messages: Pairs, checkpoint: bytes, tenant: str = DEFAULT_TENANT) -> None:
        """Keep ``checkpoint``, which holds ``messages``, for ``tenant``."""
        key = conversation_key(messages, tenant)
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

    def longest(self, messages: Pairs, tenant: str = DEFAULT_TENANT) -> tuple[int, bytes] | None:
        """The longest conversation ``tenant`` cached that ``messages`` extend (it ends with a reply): its length
        and bytes."""
        turns = conversation_keys(messages[:-1], tenant)
        ends = [(n, key) for n, key in turns if messages[n - 1][0] == "assistant"]
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


class TenantCorpora:
    """The lookup corpora of the tenants served lately, one each: a tenant's ``ngram`` drafts copy only from its
    own earlier requests. At most ``most`` corpora (each of ``LookupCorpus``'s default budget), the one of the
    tenant served least recently dropped beyond them."""

    def __init__(self, most: int = TENANT_CORPORA) -> None:
        if most < 1:
            raise ValueError(f"most must be at least 1, not {most}")
        self.most = most
        self._lock = threading.Lock()
        self._corpora: OrderedDict[str, LookupCorpus] = OrderedDict()

    def get(self, tenant: str) -> LookupCorpus:
        """``tenant``'s corpus (a new, empty one for a tenant not served lately)."""
        with self._lock:
            corpus = self._corpora.pop(tenant, None)
            self._corpora[tenant] = corpus = LookupCorpus() if corpus is None else corpus
            while len(self._corpora) > self.most:
                self._corpora.popitem(last=False)
            return corpus

    def documents(self) -> dict[str, int]:
        """The documents each tenant's corpus holds, by tenant."""
        with self._lock:
            return {tenant: corpus.n_documents for tenant, corpus in self._corpora.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._corpora)

    def __contains__(self, tenant: object) -> bool:
        with self._lock:
            return tenant in self._corpora
