"""Embeddings of texts, as llama-cpp-python's ``Llama.embed`` and ``Llama.create_embedding`` give them.

:class:`Embedder` runs a llama.cpp embedding context over a :class:`~specstate.Model`
(``specstate._native.Embedder``): each text is tokenized as llama-cpp-python tokenizes it (special tokens
added, as ``Llama.tokenize`` does by default, none parsed from the text), decoded alone from an empty memory,
and pooled by llama.cpp:

- ``pooling=None`` (the default) takes the model's own pooling (``<arch>.pooling_type`` in its GGUF
  metadata), as llama-cpp-python does; a generative model records none, so it gets ``"none"``: one vector
  per token. ``"mean"``, ``"cls"`` (the first token's vector) and ``"last"`` give one vector per text.
- ``normalize=True`` divides each vector by its L2 norm (a zero vector stays as it is), as llama-cpp-python's
  ``normalize_embedding``; like llama-cpp-python 0.3's ``embed`` and ``create_embedding``, the default is
  ``False``.
- ``truncate=True`` (the default) keeps the first ``n_ctx`` tokens of a longer text; with ``False`` such a
  text is refused with ``ValueError("Requested tokens (N) exceed context window of n_ctx (input i)")``.
  llama-cpp-python truncates to its ``n_batch``; here one batch is the whole context.
- ``return_count=True`` also returns the tokens embedded (after truncation), which
  :meth:`Embedder.create_embedding` reports as ``usage``.

Every text of a call is tokenized and checked before any is decoded, so a refused call (an empty text, one
too long, more than ``max_inputs`` texts) computes nothing. The same text gives the same bits, alone or among
others. :func:`embedding_response` builds OpenAI's ``/v1/embeddings`` reply from vectors already computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypedDict, Union, cast, overload

from specstate import _native
from specstate._native import Model

__all__ = [
    "EMBEDDING_POOLINGS",
    "MAX_EMBEDDING_INPUTS",
    "CreateEmbeddingResponse",
    "Embedder",
    "Embedding",
    "EmbeddingUsage",
    "EmbeddingValue",
    "Pooling",
    "embedding_response",
    "normalize",
]

#: A pooling llama.cpp applies to a text's token vectors.
Pooling = Literal["none", "mean", "cls", "last"]
#: The poolings, in llama.cpp's order (written once, in Rust).
EMBEDDING_POOLINGS: tuple[Pooling, ...] = _native.EMBEDDING_POOLINGS
#: The most texts one call embeds (OpenAI's bound per request; written once, in Rust).
MAX_EMBEDDING_INPUTS: int = _native.MAX_EMBEDDING_INPUTS
#: One text's embedding: a vector, or with pooling ``"none"`` one vector per token.
EmbeddingValue = Union[list[float], list[list[float]]]


class Embedding(TypedDict):
    """One entry of :class:`CreateEmbeddingResponse`'s ``data`` (llama-cpp-python's and OpenAI's shape)."""

    object: Literal["embedding"]
    embedding: EmbeddingValue
    index: int


class EmbeddingUsage(TypedDict):
    """The tokens embedded (``prompt_tokens`` and ``total_tokens`` are equal: nothing is generated)."""

    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(TypedDict):
    """``create_embedding``'s result: OpenAI's ``CreateEmbeddingResponse``."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def normalize(vector: Sequence[float]) -> list[float]:
    """``vector`` divided by its L2 norm (computed in double precision); a zero vector is returned as it is."""
    norm = math.sqrt(math.fsum(value * value for value in vector))
    if norm == 0.0:
        return list(vector)
    return [value / norm for value in vector]


def embedding_response(
    embeddings: Sequence[EmbeddingValue], *, model: str, prompt_tokens: int
) -> CreateEmbeddingResponse:
    """OpenAI's embeddings reply for ``embeddings`` (in input order) of ``prompt_tokens`` tokens from ``model``."""
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
        raise ValueError(f"prompt_tokens must be an integer >= 0, not {prompt_tokens!r}")
    data: list[Embedding] = [
        {"object": "embedding", "embedding": embedding, "index": index} for index, embedding in enumerate(embeddings)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _texts(input: str | Sequence[str], max_inputs: int) -> list[str]:
    """The texts of ``input`` (one string, or a list or tuple of them), at most ``max_inputs``, at least one."""
    if isinstance(input, str):
        return [input]
    if not isinstance(input, (list, tuple)):
        raise TypeError(f"input must be a string or a list of strings, not {type(input).__name__}")
    if not input:
        raise ValueError("input must hold at least one text")
    if len(input) > max_inputs:
        raise ValueError(f"{len(input)} inputs exceed the {max_inputs} that one call embeds")
    for index, text in enumerate(input):
        if not isinstance(text, str):
            raise TypeError(f"input {index} must be a string, not {type(text).__name__}")
    return list(input)


class Embedder:
    """Embeddings of texts over ``model``, with llama-cpp-python's ``embed`` and ``create_embedding``.

    Args:
        model: the model whose vectors are taken.
        n_ctx: the context length, the most tokens a text may have (0: the model's trained length; default
            llama-cpp-python's 512). One text is decoded in one batch of up to ``n_ctx`` rows.
        pooling: ``None`` (the model's own; ``"none"`` for a generative model), ``"none"``, ``"mean"``,
            ``"cls"`` or ``"last"``.
        n_threads: decoding threads (0: the default thread count, docs/threads.md).
        max_inputs: the most texts one call takes (at most :data:`MAX_EMBEDDING_INPUTS`).

    Raises:
        ValueError: for a pooling, length or count outside its range.

    Usable from any thread: calls run one at a time, each with the GIL released while it decodes. With pooling
    ``"none"`` llama.cpp also computes each token's logits: the context holds ``n_ctx * n_vocab`` floats.
    """

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int = _native.EMBEDDING_N_CTX,
        pooling: Pooling | None = None,
        n_threads: int = 0,
        max_inputs: int = MAX_EMBEDDING_INPUTS,
    ) -> None:
        if isinstance(max_inputs, bool) or not isinstance(max_inputs, int):
            raise TypeError(f"max_inputs must be an integer, not {type(max_inputs).__name__}")
        if not 1 <= max_inputs <= MAX_EMBEDDING_INPUTS:
            raise ValueError(f"max_inputs must be between 1 and {MAX_EMBEDDING_INPUTS}, not {max_inputs}")
        self.native = _native.Embedder(model, n_ctx=n_ctx, pooling=pooling, n_threads=n_threads)
        self.model = model
        self.max_inputs = max_inputs

    @property
    def n_ctx(self) -> int:
        """The context length: the most tokens a text may have."""
        return self.native.n_ctx

    @property
    def n_embd(self) -> int:
        """Floats in one vector."""
        return self.native.n_embd

    @property
    def pooling(self) -> Pooling:
        """The pooling in effect (the model's own when none was asked for)."""
        return self.native.pooling

    def tokenize(self, text: str) -> list[int]:
        """The tokens of ``text`` as they are embedded: special tokens added (BOS where the model adds one),
        none parsed from the text (llama-cpp-python's ``Llama.tokenize`` defaults)."""
        return self.model.tokenize(text, add_special=True, parse_special=False)

    @overload
    def embed(
        self, input: str, normalize: bool = ..., truncate: bool = ..., return_count: Literal[False] = ...
    ) -> EmbeddingValue: ...
    @overload
    def embed(
        self, input: list[str], normalize: bool = ..., truncate: bool = ..., return_count: Literal[False] = ...
    ) -> list[EmbeddingValue]: ...
    @overload
    def embed(
        self, input: str, normalize: bool = ..., truncate: bool = ..., *, return_count: Literal[True]
    ) -> tuple[EmbeddingValue, int]: ...
    @overload
    def embed(
        self, input: list[str], normalize: bool = ..., truncate: bool = ..., *, return_count: Literal[True]
    ) -> tuple[list[EmbeddingValue], int]: ...
    @overload
    def embed(
        self, input: str | list[str], normalize: bool = ..., truncate: bool = ..., return_count: bool = ...
    ) -> EmbeddingValue | list[EmbeddingValue] | tuple[EmbeddingValue | list[EmbeddingValue], int]: ...
    def embed(
        self, input: str | list[str], normalize: bool = False, truncate: bool = True, return_count: bool = False
    ) -> EmbeddingValue | list[EmbeddingValue] | tuple[EmbeddingValue | list[EmbeddingValue], int]:
        """The embedding of ``input`` (a string), or of each of its strings (a list), as llama-cpp-python's
        ``Llama.embed``: with ``return_count`` also the tokens embedded, after truncation.

        Raises:
            ValueError: for an empty list, more than ``max_inputs`` texts, a text without tokens, or (with
                ``truncate=False``) one longer than ``n_ctx`` tokens. Nothing is decoded then.
            TypeError: for an input that is not a string or a list of strings.
        """
        texts = _texts(input, self.max_inputs)
        inputs = [self.tokenize(text) for text in texts]
        if truncate:
            inputs = [tokens[: self.n_ctx] for tokens in inputs]
        embeddings = [self._normalized(embedding, normalize) for embedding in self.native.embed_batch(inputs)]
        result: EmbeddingValue | list[EmbeddingValue] = embeddings[0] if isinstance(input, str) else embeddings
        if return_count:
            return result, sum(len(tokens) for tokens in inputs)
        return result

    def _normalized(self, embedding: EmbeddingValue, wanted: bool) -> EmbeddingValue:
        """``embedding``, each of its vectors normalized if ``wanted``."""
        if not wanted:
            return embedding
        if self.pooling == "none":
            return [normalize(row) for row in cast("list[list[float]]", embedding)]
        return normalize(cast("list[float]", embedding))

    def create_embedding(
        self, input: str | list[str], model: str | None = None, *, normalize: bool = False
    ) -> CreateEmbeddingResponse:
        """OpenAI's embeddings reply for ``input`` (a string or a list of them), as llama-cpp-python's
        ``Llama.create_embedding``: one entry per text, in order, ``usage`` the tokens embedded (truncated to
        ``n_ctx``), ``model`` the name given or else the model's path. ``normalize`` is specstate's own
        (llama-cpp-python's reply is not normalized); the errors are :meth:`embed`'s.
        """
        texts = [input] if isinstance(input, str) else input
        embeddings, tokens = self.embed(texts, normalize=normalize, return_count=True)
        name = model if model is not None else str(self.model.path)
        return embedding_response(embeddings, model=name, prompt_tokens=tokens)

    def __repr__(self) -> str:
        return f"Embedder(model={str(self.model.path)!r}, n_ctx={self.n_ctx}, pooling={self.pooling!r})"
