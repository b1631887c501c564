"""``POST /v1/embeddings``: OpenAI's embeddings endpoint over :class:`specstate.embeddings.Embedder`.

Embeddings run on workers of their own (``--embedding-workers``, each with an embedder made at its first
request: its context is only paid for when used) from a bounded queue of their own (``--embedding-queue``, 429
beyond), apart from the chat slots and from the threads that read requests; over the server's model and
context length, with ``--embedding-pooling`` (default: the model's own, or ``mean`` for a
generative model, which records none: OpenAI's reply has one vector per input). A request is read as the
completions are: every field checked and bounded before anything is decoded (``input`` a string or a list of
at most ``MAX_EMBEDDING_INPUTS`` strings, each at most the context), the model named only by its name.
``encoding_format`` ``float`` gives lists of numbers, ``base64`` the little-endian float32 bytes in base64, as
OpenAI's client asks for by default. Vectors are normalized (unit L2 norm), as OpenAI's are.
"""

from __future__ import annotations

import base64
import collections
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specstate._native import Model
from specstate.embeddings import (
    EMBEDDING_POOLINGS,
    MAX_EMBEDDING_INPUTS,
    Embedder,
    EmbeddingValue,
    Pooling,
    embedding_response,
)
from specstate.serve.jobs import Metrics
from specstate.serve.request import RequestError

__all__ = ["EmbeddingJob", "Embeddings", "read_embedding_request"]

#: What an embeddings request may hold besides ``input``.
_FIELDS = {"input", "model", "encoding_format", "dimensions", "user"}


def read_embedding_request(body: dict[str, Any], model_name: str) -> tuple[list[str], bool]:
    """The texts of an embeddings request and whether the reply is base64, every field checked."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise RequestError(400, f"{unknown[0]!r} is not a parameter of /v1/embeddings", param=unknown[0])
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestError(404, f"the model {model!r} does not exist; this server has {model_name!r}", param="model")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise RequestError(400, "input must be a string or a non-empty list of strings", param="input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise RequestError(400, f"input may hold at most {MAX_EMBEDDING_INPUTS} texts, not {len(texts)}", param="input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestError(400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
    if body.get("dimensions") is not None:
        raise RequestError(400, "dimensions is not supported: the vectors have the model's width", param="dimensions")
    return texts, encoding == "base64"


#: Texts embedded between two looks at whether the request's client is still there.
TEXTS_PER_STEP = 16


@dataclass
class EmbeddingJob:
    """One checked embeddings request on its way through the embedding workers."""

    texts: list[str]
    base64_floats: bool
    #: Called from a worker with the reply, or with a :class:`RequestError`.
    deliver: Callable[[object], None]
    #: Set when the client leaves: a waiting job is dropped, a running one stops at its next step.
    cancelled: threading.Event = field(default_factory=threading.Event)


class Embeddings:
    """The server's embeddings: their own bounded queue and worker threads, apart from the chat slots and from
    the threads that read requests, so that neither waits behind the other. Each worker has an embedder of its
    own (a context over the server's model, made at its first request); ``capacity`` requests may wait, one
    more is refused with 429; a request whose client left is dropped when its turn comes, or stops within
    :data:`TEXTS_PER_STEP` texts when it is running."""

    def __init__(
        self,
        pooling: str | None,
        n_ctx: int,
        n_threads: int,
        *,
        workers: int = 1,
        capacity: int = 16,
        metrics: Metrics | None = None,
    ) -> None:
        if pooling is not None and pooling not in EMBEDDING_POOLINGS:
            raise ValueError(f"the embedding pooling must be one of {', '.join(EMBEDDING_POOLINGS)}, not {pooling!r}")
        self.pooling: Pooling | None = pooling
        self.n_ctx, self.n_threads, self.workers, self.capacity = n_ctx, n_threads, workers, capacity
        self.metrics = metrics or Metrics()
        self._jobs: collections.deque[EmbeddingJob] = collections.deque()
        self._ready = threading.Condition()
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self.closed = False

    def submit(self, model: Model, model_name: str, job: EmbeddingJob) -> None:
        """Queue ``job`` (:class:`RequestError` 429 when the queue is full); the workers start at the first."""
        with self._ready:
            if self.closed:
                raise RequestError(503, "the server is stopping", "server_error")
            idle = self._idle + self.workers - len(self._threads)  # a worker not started yet is idle too
            if len(self._jobs) >= self.capacity + idle:
                raise RequestError(429, "the server is busy: the embeddings queue is full", "rate_limit")
            self._jobs.append(job)
            self._ready.notify()
            while len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work, args=(model, model_name), daemon=True, name="specstate-embeddings"
                )
                self._threads.append(thread)
                thread.start()

    def depth(self) -> int:
        """Requests waiting."""
        with self._ready:
            return len(self._jobs)

    def busy(self) -> int:
        """Workers running a request (or starting)."""
        with self._ready:
            return len(self._threads) - self._idle

    def close(self) -> None:
        """Stop the workers once their current request is done (waiting ones are dropped)."""
        with self._ready:
            self.closed = True
            self._jobs.clear()
            self._ready.notify_all()

    def _take(self) -> EmbeddingJob | None:
        with self._ready:
            self._idle += 1
            while not self._jobs and not self.closed:
                self._ready.wait()
            self._idle -= 1
            return None if self.closed else self._jobs.popleft()

    def _work(self, model: Model, model_name: str) -> None:
        """A worker: its embedder, and the queue's requests one at a time; it never dies on a request."""
        embedder: Embedder | None = None
        while (job := self._take()) is not None:
            if job.cancelled.is_set():
                self.metrics.add("cancelled_requests")
                continue
            reply: object
            try:
                embedder = embedder or self._embedder(model)
                reply = self._answer(embedder, job, model_name)
            except RequestError as error:
                reply = error
            except Exception as error:  # the model failed: the client hears it, the worker goes on
                reply = RequestError.unforeseen(error)
            if reply is None:
                self.metrics.add("cancelled_requests")
            else:
                job.deliver(reply)

    def _embedder(self, model: Model) -> Embedder:
        embedder = Embedder(model, n_ctx=self.n_ctx, pooling=self.pooling, n_threads=self.n_threads)
        if embedder.pooling == "none":  # a generative model: one vector per text, as OpenAI's reply has
            embedder = Embedder(model, n_ctx=self.n_ctx, pooling="mean", n_threads=self.n_threads)
        return embedder

    def _answer(self, embedder: Embedder, job: EmbeddingJob, model_name: str) -> dict[str, Any] | None:
        """The reply to a checked request, :data:`TEXTS_PER_STEP` texts at a time (each text is decoded on its
        own: the vectors do not depend on the steps); None once its client has left."""
        vectors: list[EmbeddingValue] = []
        tokens = 0
        for start in range(0, len(job.texts), TEXTS_PER_STEP):
            if job.cancelled.is_set():
                return None
            try:
                step, count = embedder.embed(
                    job.texts[start : start + TEXTS_PER_STEP], normalize=True, return_count=True
                )
            except (TypeError, ValueError) as error:
                raise RequestError(400, str(error), param="input") from None
            vectors += step
            tokens += count
        reply: dict[str, Any] = dict(embedding_response(vectors, model=model_name, prompt_tokens=tokens))
        if job.base64_floats:
            for entry in reply["data"]:
                vector = entry["embedding"]
                entry["embedding"] = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return reply
