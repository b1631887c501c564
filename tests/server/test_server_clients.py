"""What OpenAI clients send and expect of ``specstate serve`` (issue 35): the model by name, usage in a stream,
string logit_bias keys, and OpenAI error bodies for paths and methods the server does not have."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from specstate.serve import RequestLimits
from test_server import KEY, MODEL, Live, config, tiny_chat

__all__ = ["tiny_chat"]  # the module fixture, shared with test_server


@pytest.fixture(scope="module")
def live(tiny_chat: Path) -> Iterator[Live]:
    server = Live(config(tiny_chat, slots=1, limits=RequestLimits(max_tokens=8)))
    yield server
    server.stop()


def test_the_model_is_retrieved_by_name_and_results_name_it_never_by_path(live: Live) -> None:
    client = live.client()
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply.model == MODEL and "/" not in reply.model


@pytest.mark.parametrize("chat", [True, False])
def test_a_stream_ends_with_its_usage_when_asked(live: Live, chat: bool) -> None:
    client = live.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    chunks: list[Any]
    if chat:
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, max_tokens=4
        )
        chunks, whole = list(stream), client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    else:
        stream_ = client.completions.create(
            model=MODEL, prompt="Hi", stream=True, stream_options={"include_usage": True}, max_tokens=4, temperature=0
        )
        chunks = list(stream_)
        whole = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)  # type: ignore[assignment]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and whole.usage is not None
    assert all(c.usage is None for c in chunks[:-1]) and last.usage.prompt_tokens == whole.usage.prompt_tokens


def test_unknown_paths_and_methods_get_openai_error_bodies(live: Live) -> None:
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405)):
        connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
        connection.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        response = connection.getresponse()
        body = json.loads(response.read())
        assert response.status == status and set(body["error"]) == {"message", "type", "param", "code"}


def test_embeddings_through_the_openai_client(live: Live) -> None:
    client = live.client()
    reply = client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])  # base64, as the client asks
    vectors = [entry.embedding for entry in reply.data]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    assert abs(sum(x * x for x in vectors[0]) - 1.0) < 1e-4  # normalized, as OpenAI's are
    floats = client.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)
    assert reply.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=[])
