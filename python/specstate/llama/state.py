"""llama-cpp-python's state and cache API over specstate's checkpoints: :class:`LlamaState`
(``Llama.save_state``/``load_state``), :class:`LlamaRAMCache` and :class:`LlamaDiskCache` (``Llama.set_cache``).

A state is a generation's checkpoint (its contexts' sequence states, tokens, sampling and RNG, speculative
state, conversation) and the tokens it holds, so it restores exactly, in any process: what a restored
generation goes on to generate is token for token what the uninterrupted one would have. A cache keeps the
states of finished calls by their tokens, bounded in bytes (the least recently used dropped first), and gives
a later call the longest cached state its prompt extends.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specstate import _files

__all__ = ["BaseLlamaCache", "LlamaCache", "LlamaDiskCache", "LlamaRAMCache", "LlamaState"]

#: llama-cpp-python's default cache capacity (2 GiB).
DEFAULT_CAPACITY_BYTES = 2 << 30


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
        """The state holding the longest prefix of ``tokens`` (shorter than them), or None."""
        keys = _prefix_keys(tokens[:-1]) if tokens else []
        for n in range(len(keys), 0, -1):
            with self._lock:
                if keys[n - 1] not in self._sizes:
                    continue
                self._sizes.move_to_end(keys[n - 1])
            state = self._get(keys[n - 1], tuple(tokens[:n]))
            if state is not None:
                return state
        return None

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
        raise NotImplementedError

    def _put(self, key: str, state: LlamaState) -> None:
        raise NotImplementedError

    def _drop(self, key: str) -> None:
        raise NotImplementedError


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
    """States kept as checkpoint files in ``cache_dir`` (``<key>.ckpt``, written atomically, read back only as
    checkpoints, never unpickled), found again by a later process; anything else there (a link, a FIFO) is
    passed over."""

    def __init__(
        self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache", capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    ) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.cache_dir.glob("*.ckpt"):
            try:
                status = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(status.st_mode):
                found.append((status.st_mtime, path.stem, status.st_size))
        for _, key, size in sorted(found):
            self._sizes[key] = size

    def _get(self, key: str, tokens: tuple[int, ...]) -> LlamaState | None:
        try:
            return LlamaState(tokens, _files.read_checkpoint(self.cache_dir / f"{key}.ckpt"))
        except Exception:  # removed or damaged behind the cache's back: as if never cached
            return None

    def _put(self, key: str, state: LlamaState) -> None:
        _files.replace_atomically(self.cache_dir / f"{key}.ckpt", state.llama_state, 0o600)

    def _drop(self, key: str) -> None:
        (self.cache_dir / f"{key}.ckpt").unlink(missing_ok=True)


#: llama-cpp-python's name for the memory cache.
LlamaCache = LlamaRAMCache
