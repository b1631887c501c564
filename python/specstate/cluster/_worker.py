"""The Ray actor that runs generations on its loaded models, and the driver's way of calling it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NoReturn

import ray
from ray.exceptions import RayTaskError

from specstate import Generator, Model, default_threads, model_fingerprint


def raise_cause(error: RayTaskError) -> NoReturn:
    """Raise what a worker's code raised, as itself: Ray wraps it in a RayTaskError whose text is the
    worker's whole traceback."""
    raise error.cause from None


def get(reference: Any) -> Any:
    """``ray.get``, with an error raised by the worker's code given as itself."""
    try:
        return ray.get(reference)
    except RayTaskError as error:
        raise_cause(error)


class Worker:
    """The Ray actor: loaded models and the generations running on them."""

    def __init__(self, models: Mapping[str, str], n_threads: int, sharing: int = 1) -> None:
        """``n_threads`` 0: the default thread count of one of ``sharing`` workers on this node."""
        self.models = {name: Model(path) for name, path in models.items()}
        self.n_threads = n_threads or default_threads(sharing)
        self.generators: dict[str, Generator] = {}

    def describe(self) -> dict[str, Any]:
        """The worker's process, thread count and model fingerprints (SHA-256 by name)."""
        fingerprints = {name: model_fingerprint(model)[0] for name, model in self.models.items()}
        return {"pid": os.getpid(), "n_threads": self.n_threads, "models": fingerprints}

    def ping(self) -> None:
        """Nothing: a call that completes only while the worker's process lives."""

    def _draft(self, draft: str | None) -> Model | None:
        return None if draft is None else self.models[draft]

    def start(
        self, gid: str, prompt: str | list[int], settings: dict[str, Any], target: str, draft: str | None
    ) -> None:
        """Begin a generation: decode its prompt."""
        model = self.models[target]
        generator = Generator(model, draft_model=self._draft(draft), n_threads=self.n_threads, **settings)
        tokens = model.tokenize(prompt, add_special=True, parse_special=True) if isinstance(prompt, str) else prompt
        generator._native.prefill(tokens)
        self.generators[gid] = generator

    def restore(self, gid: str, checkpoint: bytes, target: str, draft: str | None) -> int:
        """Continue a generation from its checkpoint; returns the tokens it had handed out."""
        generator = Generator.restore(
            checkpoint, self.models[target], draft_model=self._draft(draft), n_threads=self.n_threads
        )
        self.generators[gid] = generator
        return generator._native.delivered

    def advance(self, gid: str, n: int) -> tuple[list[int], list[bytes], bool]:
        """Up to ``n`` more tokens, their bytes, and whether the generation is over."""
        native = self.generators[gid]._native
        tokens = native.take(n)
        pieces = [native.target.token_to_piece(token) for token in tokens]
        over = not tokens or (native.finished and native.undelivered == 0)
        return tokens, pieces, over

    def checkpoint(self, gid: str) -> bytes:
        return self.generators[gid].checkpoint()

    def release(self, gid: str) -> None:
        self.generators.pop(gid, None)

    def checkpoint_and_release(self, gid: str) -> bytes:
        data = self.generators[gid].checkpoint()
        del self.generators[gid]
        return data
