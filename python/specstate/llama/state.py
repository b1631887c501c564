"""llama-cpp-python's state and cache API over specstate's checkpoints: :class:`LlamaState`
(``Llama.save_state``/``load_state``), :class:`LlamaRAMCache` and :class:`LlamaDiskCache` (``Llama.set_cache``).

A state is a generation's checkpoint (its contexts' sequence states, tokens, sampling and RNG, speculative
state, conversation) and the tokens it holds, so it restores exactly, in any process: what a restored
generation goes on to generate is token for token what the uninterrupted one would have. A cache keeps the
states of finished calls by their tokens, bounded in bytes (the least recently used dropped first), and gives
a later call the longest cached state its prompt extends.

A cache entry is used only when its checkpoint is whole, holds exactly the tokens it is kept under (read from
the checkpoint itself when a :class:`~specstate.Llama` restores it) and restores on the model and settings
of the call; any other entry is a miss, dropped with a ``RuntimeWarning`` that says why, never an error for
the call and never another generation continued. A dropped entry of another model, version or configuration
(a :class:`LlamaDiskCache` directory may be shared) is only forgotten; a damaged one is deleted too.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from specstate import _files
from specstate._native import inspect_checkpoint
from specstate.errors import (
    CheckpointError,
    ConfigMismatchError,
    GenerationError,
    ModelMismatchError,
    SpeculativeStateError,
    UnsupportedVersionError,
)

__all__ = ["BaseLlamaCache", "LlamaCache", "LlamaDiskCache", "LlamaRAMCache", "LlamaState"]

#: llama-cpp-python's default cache capacity (2 GiB).
DEFAULT_CAPACITY_BYTES = 2 << 30
#: The name of a :class:`LlamaDiskCache` entry, the key being 64 hex digits: the files of its directory it
#: counts, reads and deletes (any other file there is not the cache's).
ENTRY_NAME = "specstate-llama-cache-{key}.ckpt"
_ENTRY = re.compile(re.escape(ENTRY_NAME).replace(re.escape("{key}"), "([0-9a-f]{64})"))
#: What a restore of an entry made for another model, specstate version or configuration raises: the entry is
#: forgotten by this cache, and its file kept for whoever it is for.
_FOREIGN = (ModelMismatchError, ConfigMismatchError, UnsupportedVersionError)
#: What restoring an entry that cannot be used raises (a damaged checkpoint, or one the call's settings refuse).
_UNUSABLE = (ValueError, SpeculativeStateError, GenerationError)

_T = TypeVar("_T")


@dataclass(frozen=True)
class LlamaState:
    """What :meth:`Llama.save_state` returns and :meth:`Llama.load_state` takes: picklable, with
    llama-cpp-python's ``LlamaState`` fields where they mean something here (``input_ids``, ``n_tokens``,
    ``llama_state``, ``llama_state_size``, ``seed``). ``llama_state`` is a specstate checkpoint: smaller than
    llama-cpp-python's (no logits), and it carries the speculative and sampler state too."""

    #: The tokens the state holds: the prompt (or conversation) and what was generated.
    input_ids: tuple[int, ...]
    #: The generation's checkpoint.
    llama_state: bytes
    #: The seed the generation was started with (None: a greedy generation).
    seed: int | None = None
    #: Whether it is a chat's (restored as the conversation the next chat call continues).
    chat: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def llama_state_size(self) -> int:
        return len(self.llama_state)


class BaseLlamaCache:
    """States by the tokens they hold, at most ``capacity_bytes`` of checkpoints (least recently used dropped)."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be a non-negative int, not {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # key -> checkpoint bytes, least recently used first

    @property
    def cache_size(self) -> int:
        """Bytes of the checkpoints held."""
        with self._lock:
            return sum(self._sizes.values())

    def longest(self, tokens: Sequence[int]) -> LlamaState | None:
        """The state holding the longest prefix of ``tokens`` (shorter than them) whose checkpoint is whole and
        holds as many tokens, or None."""
        return next((state for _, state in self._entries(tokens)), None)

    def restore_longest(
        self, tokens: Sequence[int], restore: Callable[[LlamaState], tuple[Sequence[int], _T]]
    ) -> tuple[LlamaState, _T] | None:
        """The longest entry :meth:`longest` would give that also restores right: ``restore(state)`` restores
        it and returns the tokens the restored checkpoint holds and what the caller makes of it. An entry whose
        restore raises, or whose checkpoint holds other tokens than those it is kept under, is dropped (see the
        module's docstring) and the next shorter one tried. Returns the state and ``restore``'s value, or None."""
        for key, state in self._entries(tokens):
            try:
                held, value = restore(state)
                if tuple(held) != state.input_ids:
                    raise _WrongEntryError("its checkpoint holds other tokens than those it is kept under")
            except _UNUSABLE as error:
                self._discard(key, error)
                continue
            return state, value
        return None

    def _entries(self, tokens: Sequence[int]) -> Iterator[tuple[str, LlamaState]]:
        """``(key, state)`` of the entries kept under prefixes of ``tokens`` (shorter than them), longest first,
        each a whole checkpoint of that prefix's length, said to hold that prefix (any other is dropped)."""
        keys = _prefix_keys(tokens[:-1]) if tokens else []
        for n in range(len(keys), 0, -1):
            key = keys[n - 1]
            with self._lock:
                if key not in self._sizes:
                    continue
                self._sizes.move_to_end(key)
            try:
                state = self._get(key, tuple(tokens[:n]))
                if state is not None:
                    _check_whole(state, tuple(tokens[:n]))
            except (OSError, CheckpointError) as error:
                self._discard(key, error)
                continue
            if state is None:  # removed behind the cache's back: as if never cached
                self._discard(key, None)
                continue
            yield key, state

    def _discard(self, key: str, error: Exception | None) -> None:
        """Drop entry ``key``, with a warning that gives ``error`` (none for None). What stores it is removed
        when the error says it is damaged or holds other tokens; an entry that could not be read, or that is
        another model's, version's or configuration's, is only forgotten."""
        with self._lock:
            self._sizes.pop(key, None)
        if error is not None:
            warnings.warn(f"a {type(self).__name__} entry is not used: {error}", RuntimeWarning, stacklevel=2)
        if isinstance(error, CheckpointError) and not isinstance(error, _FOREIGN):
            self._drop(key)
        else:
            self._forget(key)

    def __getitem__(self, tokens: Sequence[int]) -> LlamaState:
        found = self.longest([*tokens, -1])  # a state holding all of ``tokens`` counts too
        if found is None:
            raise KeyError("no cached state holds a prefix of these tokens")
        return found

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return self.longest([*tokens, -1]) is not None

    def __setitem__(self, tokens: Sequence[int], state: LlamaState) -> None:
        if state.llama_state_size > self.capacity_bytes:
            return
        key = _key(tokens)
        with self._lock:
            self._put(key, state)
            self._sizes[key] = state.llama_state_size
            self._sizes.move_to_end(key)
            while sum(self._sizes.values()) > self.capacity_bytes:
                old, _ = self._sizes.popitem(last=False)
                self._drop(old)

    def _get(self, key: str, tokens: tuple[int, ...]) -> LlamaState | None:
        """Entry ``key`` (of ``tokens``, as its key says), or None if it is gone."""
        raise NotImplementedError

    def _put(self, key: str, state: LlamaState) -> None:
        raise NotImplementedError

    def _drop(self, key: str) -> None:
        """Remove what stores entry ``key``."""
        raise NotImplementedError

    def _forget(self, key: str) -> None:
        """Let go of entry ``key`` without removing what others may use (in memory: the same as :meth:`_drop`)."""
        self._drop(key)


class _WrongEntryError(CheckpointError):
    """A cache entry that does not hold the tokens it is kept under."""


def _check_whole(state: LlamaState, tokens: tuple[int, ...]) -> None:
    """Raise a :class:`~specstate.CheckpointError` unless ``state`` says it holds ``tokens`` and its checkpoint
    is whole and holds as many."""
    if state.input_ids != tokens:
        raise _WrongEntryError("it says it holds other tokens than those it is kept under")
    held = inspect_checkpoint(state.llama_state)["n_tokens"]
    if held != len(tokens):
        raise _WrongEntryError(f"its checkpoint holds {held} tokens, not the {len(tokens)} it is kept under")


def _prefix_keys(tokens: Sequence[int]) -> list[str]:
    """The key of every prefix of ``tokens`` (``keys[n - 1]``: of the first n), in one pass."""
    digest, keys = hashlib.sha256(), []
    for token in tokens:
        digest.update(int(token).to_bytes(8, "little", signed=True))
        keys.append(digest.copy().hexdigest())
    return keys


def _key(tokens: Sequence[int]) -> str:
    return _prefix_keys(tokens)[-1] if tokens else hashlib.sha256().hexdigest()


class LlamaRAMCache(BaseLlamaCache):
    """States kept in memory."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        super().__init__(capacity_bytes)
        self._states: dict[str, LlamaState] = {}

    def _get(self, key: str, tokens: tuple[int, ...]) -> LlamaState | None:
        return self._states.get(key)

    def _put(self, key: str, state: LlamaState) -> None:
        self._states[key] = state

    def _drop(self, key: str) -> None:
        self._states.pop(key, None)


class LlamaDiskCache(BaseLlamaCache):
    """States kept as checkpoint files in ``cache_dir`` (named as :data:`ENTRY_NAME` says, written atomically,
    read back only as checkpoints, never unpickled), found again by a later process. The cache owns only the
    files named so: any other file there is never counted, read or deleted, and an entry that is a link, a FIFO
    or anything but a regular file is passed over."""

    def __init__(
        self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache", capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    ) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.cache_dir.iterdir():
            entry = _ENTRY.fullmatch(path.name)
            if entry is None:
                continue
            try:
                status = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(status.st_mode):
                found.append((status.st_mtime, entry.group(1), status.st_size))
        for _, key, size in sorted(found):
            self._sizes[key] = size

    def _path(self, key: str) -> Path:
        return self.cache_dir / ENTRY_NAME.format(key=key)

    def _get(self, key: str, tokens: tuple[int, ...]) -> LlamaState | None:
        try:
            return LlamaState(tokens, _files.read_checkpoint(self._path(key)))
        except FileNotFoundError:
            return None

    def _put(self, key: str, state: LlamaState) -> None:
        _files.replace_atomically(self._path(key), state.llama_state, 0o600)

    def _drop(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _forget(self, key: str) -> None:
        pass


#: llama-cpp-python's name for the memory cache.
LlamaCache = LlamaRAMCache
