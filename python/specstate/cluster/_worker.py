"""The Ray actor that runs generations on its loaded models, and the driver's way of calling it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NoReturn

import ray
from ray.exceptions import RayTaskError

from specstate import BatchEngine, Generator, Model, default_threads, model_fingerprint
from specstate.batch_engine import BATCHED_MODES


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
    """The Ray actor: loaded models and the generations running on them. Generations in ``none`` and ``ngram`` mode on
    an attention-only target share one :class:`~specstate.BatchEngine` per target model and context length (``batch``
    sequences each, 0: none): a call for one generation's tokens steps every generation of the engine, and each keeps up
    to the tokens last asked of it decoded ahead, so the next generation's call mostly finds its tokens ready. Each
    generation's tokens are those it gives alone; the rest (other modes, a full engine) run one generator each."""

    def __init__(self, models: Mapping[str, str], n_threads: int, sharing: int = 1, batch: int = 4) -> None:
        """``n_threads`` 0: the default thread count of one of ``sharing`` workers on this node."""
        self.models = {name: Model(path) for name, path in models.items()}
        self.n_threads = n_threads or default_threads(sharing)
        self.batch = batch
        self.generators: dict[str, Generator] = {}
        self.engines: dict[tuple[str, int], BatchEngine] = {}
        self.sequences: dict[str, tuple[BatchEngine, int, Model]] = {}
        self.steps = self.rounds = 0

    def describe(self) -> dict[str, Any]:
        """The worker's process, thread count, model fingerprints (SHA-256 by name), and its batched engines'
        steps and the rounds they ran (rounds per step: generations decoded together)."""
        fingerprints = {name: model_fingerprint(model)[0] for name, model in self.models.items()}
        batched = {"steps": self.steps, "rounds": self.rounds}
        return {"pid": os.getpid(), "n_threads": self.n_threads, "models": fingerprints, "batched": batched}

    def ping(self) -> None:
        """Nothing: a call that completes only while the worker's process lives."""

    def _draft(self, draft: str | None) -> Model | None:
        return None if draft is None else self.models[draft]

    def _engine(self, generator: Generator, target: str) -> BatchEngine | None:
        """The batched engine a generation joins, or None if it runs alone."""
        model = self.models[target]
        if not self.batch or generator.mode not in BATCHED_MODES or model.is_recurrent or model.is_hybrid:
            return None
        key = (target, generator.context_length)
        if key not in self.engines:
            self.engines[key] = BatchEngine(
                model, n_seq=self.batch, n_ctx=generator.context_length, n_threads=self.n_threads
            )
        engine = self.engines[key]
        return engine if len(engine) < engine.n_seq else None

    def _place(self, gid: str, generator: Generator, target: str, prompt: list[int] | None) -> None:
        """Hold the generation: a sequence of a batched engine, or the generator itself; decode its prompt if given."""
        engine = self._engine(generator, target)
        if engine is None:
            if prompt is not None:
                generator._native.prefill(prompt)
            self.generators[gid] = generator
            return
        seq = engine.join(generator)
        self.sequences[gid] = (engine, seq, self.models[target])
        if prompt is not None:
            engine.prefill(seq, prompt)

    def start(
        self, gid: str, prompt: str | list[int], settings: dict[str, Any], target: str, draft: str | None
    ) -> None:
        """Begin a generation: decode its prompt."""
        model = self.models[target]
        generator = Generator(model, draft_model=self._draft(draft), n_threads=self.n_threads, **settings)
        tokens = model.tokenize(prompt, add_special=True, parse_special=True) if isinstance(prompt, str) else prompt
        self._place(gid, generator, target, list(tokens))

    def restore(self, gid: str, checkpoint: bytes, target: str, draft: str | None, grammar_drafts: bool) -> int:
        """Continue a generation from its checkpoint (``grammar_drafts``: its runtime option, which checkpoints do
        not carry); returns the tokens it had handed out."""
        generator = Generator.restore(
            checkpoint,
            self.models[target],
            draft_model=self._draft(draft),
            n_threads=self.n_threads,
            grammar_drafts=grammar_drafts,
        )
        self._place(gid, generator, target, None)
        return generator._native.delivered

    def advance(self, gid: str, n: int) -> tuple[list[int], list[bytes], bool]:
        """Up to ``n`` more tokens, their bytes, and whether the generation is over."""
        if gid in self.sequences:
            return self._advance_batched(gid, n)
        native = self.generators[gid]._native
        tokens = native.take(n)
        pieces = [native.target.token_to_piece(token) for token in tokens]
        over = not tokens or (native.finished and native.undelivered == 0)
        return tokens, pieces, over

    def _advance_batched(self, gid: str, n: int) -> tuple[list[int], list[bytes], bool]:
        """Up to ``n`` more tokens of a batched generation: the engine steps (every generation of it that holds
        fewer tokens ahead than last asked of it runs a round) until this one has them or is over."""
        engine, seq, model = self.sequences[gid]
        engine.set_lead(seq, n)
        tokens = engine.take(seq, n)
        while len(tokens) < n and not engine.done(seq):
            report = engine.step()
            self.steps, self.rounds = self.steps + 1, self.rounds + report.sequences
            tokens += engine.take(seq, n - len(tokens))
        pieces = [model.token_to_piece(token) for token in tokens]
        return tokens, pieces, not tokens or engine.done(seq)

    def checkpoint(self, gid: str) -> bytes:
        if gid in self.sequences:
            engine, seq, _ = self.sequences[gid]
            return engine.snapshot(seq).checkpoint()
        return self.generators[gid].checkpoint()

    def release(self, gid: str) -> None:
        self.generators.pop(gid, None)
        if gid in self.sequences:
            engine, seq, _ = self.sequences.pop(gid)
            engine.remove(seq)

    def checkpoint_and_release(self, gid: str) -> bytes:
        data = self.checkpoint(gid)
        self.release(gid)
        return data
