"""Embeddings (specstate.embeddings over _native.Embedder) on SmolLM2 and the tiny llama model: exact and
independent of what else a call embeds, llama-cpp-python's normalisation, truncation and counts, per-token
vectors for pooling none, refusals that change nothing, and similarities that make sense."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import cast

import pytest

from specstate import CreateEmbeddingResponse, Embedder, Model, _native
from specstate.embeddings import (
    EMBEDDING_POOLINGS,
    MAX_EMBEDDING_INPUTS,
    EmbeddingValue,
    embedding_response,
    normalize,
)

CAT = "The cat sat on the mat."
TEXTS = [CAT, "Quarterly revenue rose five percent in fiscal 2023.", "A kitten was sitting on the rug."]
#: Longer than the small contexts below, in tokens, on both models.
LONG = " ".join(f"word{index}" for index in range(80))


def vector(value: EmbeddingValue) -> list[float]:
    """A pooled embedding, checked to be one."""
    assert all(isinstance(x, float) for x in value)
    return cast("list[float]", value)


def rows(value: EmbeddingValue) -> list[list[float]]:
    """A per-token embedding, checked to be one."""
    assert all(isinstance(row, list) for row in value)
    return cast("list[list[float]]", value)


def norm(vector: Sequence[float]) -> float:
    return math.sqrt(math.fsum(value * value for value in vector))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


@pytest.fixture(scope="module")
def mean(smollm2: Model) -> Embedder:
    return Embedder(smollm2, n_ctx=64, pooling="mean", n_threads=2)


@pytest.fixture(scope="module")
def per_token(smollm2: Model) -> Embedder:
    return Embedder(smollm2, n_ctx=64, n_threads=2)


@pytest.fixture(scope="module")
def tiny(llama_model: Model) -> Embedder:
    return Embedder(llama_model, n_ctx=64, n_threads=2)


# --- exactness ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mean", "per_token", "tiny"])
def test_the_same_input_gives_the_same_bits_alone_or_among_others(name: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(name)
    alone = [embedder.embed(text) for text in TEXTS]
    assert [embedder.embed(text) for text in TEXTS] == alone
    assert embedder.embed(TEXTS) == alone
    # Order and neighbours change nothing: each input is decoded alone, from an empty memory.
    assert embedder.embed([TEXTS[2], LONG, TEXTS[0], TEXTS[2]]) == [alone[2], embedder.embed(LONG), alone[0], alone[2]]


def test_a_new_embedder_gives_the_same_bits(smollm2: Model, mean: Embedder) -> None:
    again = Embedder(smollm2, n_ctx=64, pooling="mean", n_threads=2)
    assert again.embed(TEXTS) == mean.embed(TEXTS)


def test_calls_from_other_threads_run_one_at_a_time_and_agree(mean: Embedder) -> None:
    expected = mean.embed(TEXTS)
    results: list[object] = []

    def run() -> None:
        results.append(mean.embed(TEXTS))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 3


# --- poolings -------------------------------------------------------------------------------------------


def test_pooling_none_gives_a_vector_per_token_and_the_poolings_read_them(smollm2: Model, per_token: Embedder) -> None:
    assert per_token.pooling == "none"  # a generative model records no pooling: llama.cpp's default
    tokens = smollm2.tokenize(CAT)
    rows = per_token.embed(CAT)
    assert len(rows) == len(tokens)
    assert all(isinstance(row, list) and len(row) == per_token.n_embd == smollm2.n_embd for row in rows)
    pooled = {
        pooling: Embedder(smollm2, n_ctx=64, pooling=pooling, n_threads=2).embed(CAT)
        for pooling in ("mean", "cls", "last")
    }
    columns = list(zip(*rows))
    assert pooled["mean"] == pytest.approx([math.fsum(column) / len(rows) for column in columns], abs=1e-4)
    assert pooled["cls"] == pytest.approx(rows[0], abs=1e-5)
    assert pooled["last"] == pytest.approx(rows[-1], abs=1e-5)


def test_the_tiny_model_embeds_with_every_pooling(llama_model: Model, tiny: Embedder) -> None:
    assert tiny.pooling == "none"
    rows = tiny.embed("abc")
    assert len(rows) == len(llama_model.tokenize("abc"))
    for pooling in EMBEDDING_POOLINGS:
        embedder = Embedder(llama_model, n_ctx=64, pooling=pooling, n_threads=2)
        assert embedder.pooling == pooling
        vector = embedder.embed("abc")
        assert vector == embedder.embed("abc")
        if pooling != "none":
            assert len(vector) == llama_model.n_embd
            assert all(isinstance(value, float) and math.isfinite(value) for value in vector)


def test_n_ctx_zero_is_the_trained_length_and_the_default_is_llama_cpp_pythons(llama_model: Model) -> None:
    assert Embedder(llama_model, n_ctx=0, n_threads=1).n_ctx == llama_model.n_ctx_train
    assert Embedder(llama_model, n_threads=1).n_ctx == _native.EMBEDDING_N_CTX == 512
    signature = _native.Embedder.__text_signature__ or ""
    assert f"n_ctx={_native.EMBEDDING_N_CTX}," in signature


# --- llama-cpp-python's semantics -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mean", "per_token"])
def test_normalize_divides_each_vector_by_its_l2_norm(name: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(name)
    raw = embedder.embed(CAT)
    unit = embedder.embed(CAT, normalize=True)
    vectors, raw_vectors = ([vector(unit)], [vector(raw)]) if name == "mean" else (rows(unit), rows(raw))
    for unit_vector, raw_vector in zip(vectors, raw_vectors):
        assert norm(unit_vector) == pytest.approx(1.0, abs=1e-12)
        assert unit_vector == normalize(raw_vector)
    assert norm(raw_vectors[0]) != pytest.approx(1.0)  # llama-cpp-python 0.3 does not normalize by default


def test_normalize_leaves_a_zero_vector_as_it_is() -> None:
    assert normalize([0.0, 0.0]) == [0.0, 0.0]
    assert normalize([3.0, 4.0]) == [0.6, 0.8]


def test_a_text_longer_than_the_context_is_truncated_and_counted(smollm2: Model, mean: Embedder) -> None:
    tokens = smollm2.tokenize(LONG)
    assert len(tokens) > mean.n_ctx
    vector, count = mean.embed(LONG, return_count=True)
    assert count == mean.n_ctx
    assert vector == mean.native.embed(tokens[: mean.n_ctx])
    both, total = mean.embed([CAT, LONG], return_count=True)
    assert both == [mean.embed(CAT), vector]
    assert total == len(smollm2.tokenize(CAT)) + mean.n_ctx


def test_create_embedding_has_openais_shape(smollm2: Model, mean: Embedder) -> None:
    reply = mean.create_embedding(TEXTS[:2], model="smol")
    assert reply["object"] == "list" and reply["model"] == "smol"
    assert [entry["index"] for entry in reply["data"]] == [0, 1]
    assert [entry["object"] for entry in reply["data"]] == ["embedding", "embedding"]
    assert [entry["embedding"] for entry in reply["data"]] == mean.embed(TEXTS[:2])
    tokens = sum(len(smollm2.tokenize(text)) for text in TEXTS[:2])
    assert reply["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    single = mean.create_embedding(CAT)
    assert single["model"] == str(smollm2.path) and len(single["data"]) == 1
    assert single["data"][0]["embedding"] == mean.embed(CAT)
    unit = mean.create_embedding(CAT, normalize=True)["data"][0]["embedding"]
    assert unit == mean.embed(CAT, normalize=True)
    openai_types = pytest.importorskip("openai.types")
    parsed = openai_types.CreateEmbeddingResponse.model_validate(reply)
    assert parsed.data[1].embedding == reply["data"][1]["embedding"]


def test_embedding_response_builds_the_reply_from_vectors() -> None:
    reply: CreateEmbeddingResponse = embedding_response([[1.0], [[2.0], [3.0]]], model="m", prompt_tokens=3)
    assert reply == {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": [1.0], "index": 0},
            {"object": "embedding", "embedding": [[2.0], [3.0]], "index": 1},
        ],
        "model": "m",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    with pytest.raises(ValueError, match="prompt_tokens"):
        embedding_response([], model="m", prompt_tokens=-1)


def test_a_text_is_closer_to_itself_repeated_than_to_an_unrelated_one(mean: Embedder) -> None:
    cat, revenue, kitten = (vector(value) for value in mean.embed(TEXTS))
    repeated = vector(mean.embed(f"{CAT} {CAT}"))
    assert cosine(cat, cat) == pytest.approx(1.0)
    assert cosine(cat, repeated) > cosine(cat, kitten) > cosine(cat, revenue)


# --- refusals -------------------------------------------------------------------------------------------


def refusals(smollm2: Model, embedder: Embedder) -> list[tuple[Callable[[], object], type[Exception], str]]:
    return [
        (lambda: embedder.embed(LONG, truncate=False), ValueError, r"exceed context window of 64 \(input 0\)"),
        (lambda: embedder.embed([CAT, LONG], truncate=False), ValueError, r"Requested tokens \(\d+\) .* \(input 1\)"),
        (lambda: embedder.embed(""), ValueError, "input 0 is empty"),
        (lambda: embedder.embed([CAT, ""]), ValueError, "input 1 is empty"),
        (lambda: embedder.embed([]), ValueError, "at least one text"),
        (lambda: embedder.embed([CAT, 3]), TypeError, "input 1 must be a string"),  # type: ignore[list-item]
        (lambda: embedder.embed(b"bytes"), TypeError, "not bytes"),  # type: ignore[call-overload]
        (lambda: Embedder(smollm2, max_inputs=2).embed(TEXTS), ValueError, "3 inputs exceed the 2"),
        (lambda: embedder.native.embed([]), ValueError, "input 0 is empty"),
        (lambda: embedder.native.embed([smollm2.n_vocab]), ValueError, "outside the vocabulary"),
        (lambda: embedder.native.embed(list(range(65))), ValueError, r"Requested tokens \(65\) exceed context"),
        (lambda: embedder.native.embed("abc"), TypeError, "not str"),  # type: ignore[arg-type]
        (lambda: embedder.native.embed_batch([[1]] * (MAX_EMBEDDING_INPUTS + 1)), ValueError, "2049 inputs"),
        (lambda: embedder.native.embed_batch([[1], []]), ValueError, "input 1 is empty"),
    ]


def test_refused_calls_compute_nothing_and_change_nothing(smollm2: Model, mean: Embedder) -> None:
    before = mean.embed(CAT)
    for call, error, message in refusals(smollm2, mean):
        with pytest.raises(error, match=message):
            call()
        assert mean.embed(CAT) == before


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"pooling": "rank"}, ValueError, 'pooling must be None .* not "rank"'),
        ({"pooling": "MEAN"}, ValueError, 'not "MEAN"'),
        ({"n_ctx": 1}, ValueError, "n_ctx must be"),
        ({"n_ctx": 10**6}, ValueError, "trained context length 8192"),
        ({"n_ctx": -1}, ValueError, "n_ctx must be between 0 and"),
        ({"n_threads": -1}, ValueError, "n_threads must be between 0"),
        ({"max_inputs": 0}, ValueError, "max_inputs must be between 1 and 2048"),
        ({"max_inputs": MAX_EMBEDDING_INPUTS + 1}, ValueError, "max_inputs must be between 1 and 2048"),
        ({"max_inputs": True}, TypeError, "max_inputs must be an integer"),
    ],
)
def test_bad_settings_are_refused(smollm2: Model, arguments: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Embedder(smollm2, **arguments)  # type: ignore[arg-type]
