"""``POST /v1/embeddings``: OpenAI's embeddings endpoint over :class:`specstate.embeddings.Embedder`.

One embedder per server, made at the first request (its context is only paid for when used), over the
server's model and context length, with ``--embedding-pooling`` (default: the model's own, or ``mean`` for a
generative model, which records none: OpenAI's reply has one vector per input). A request is read as the
completions are: every field checked and bounded before anything is decoded (``input`` a string or a list of
at most ``MAX_EMBEDDING_INPUTS`` strings, each at most the context), the model named only by its name.
``encoding_format`` ``float`` gives lists of numbers, ``base64`` the little-endian float32 bytes in base64, as
OpenAI's client asks for by default. Vectors are normalized (unit L2 norm), as OpenAI's are.
"""

from __future__ import annotations

import base64
import struct
import threading
from typing import Any

from specstate._native import Model
from specstate.embeddings import EMBEDDING_POOLINGS, MAX_EMBEDDING_INPUTS, Embedder, Pooling
from specstate.serve.request import RequestError

__all__ = ["Embeddings", "read_embedding_request"]

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


class Embeddings:
    """The server's embedder, made when first asked for."""

    def __init__(self, pooling: str | None, n_ctx: int, n_threads: int) -> None:
        if pooling is not None and pooling not in EMBEDDING_POOLINGS:
            raise ValueError(f"the embedding pooling must be one of {', '.join(EMBEDDING_POOLINGS)}, not {pooling!r}")
        self.pooling: Pooling | None = pooling
        self.n_ctx, self.n_threads = n_ctx, n_threads
        self._embedder: Embedder | None = None
        self._lock = threading.Lock()

    def _of(self, model: Model) -> Embedder:
        with self._lock:
            if self._embedder is None:
                embedder = Embedder(model, n_ctx=self.n_ctx, pooling=self.pooling, n_threads=self.n_threads)
                if embedder.pooling == "none":  # a generative model: one vector per text, as OpenAI's reply has
                    embedder = Embedder(model, n_ctx=self.n_ctx, pooling="mean", n_threads=self.n_threads)
                self._embedder = embedder
            return self._embedder

    def answer(self, model: Model, texts: list[str], base64_floats: bool, model_name: str) -> dict[str, Any]:
        """The reply to a checked request (runs the model: call it off the event loop)."""
        embedder = self._of(model)
        try:
            reply: dict[str, Any] = dict(embedder.create_embedding(texts, model=model_name, normalize=True))
        except (TypeError, ValueError) as error:
            raise RequestError(400, str(error), param="input") from None
        if base64_floats:
            for entry in reply["data"]:
                vector = entry["embedding"]
                entry["embedding"] = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return reply
