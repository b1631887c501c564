"""What OpenAI clients send and expect of ``specstate serve``: the model by name, usage in a stream,
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
from test_server import BACKENDS, KEY, MODEL, Live, config, tiny_chat

__all__ = ["tiny_chat"]  # the module fixture, shared with test_server


@pytest.fixture(scope="module", params=list(BACKENDS))
def live(request: pytest.FixtureRequest, tiny_chat: Path) -> Iterator[Live]:
    server = Live(config(tiny_chat, slots=1, limits=RequestLimits(max_tokens=8), ray_workers=BACKENDS[request.param]))
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


def test_tool_calls_through_the_openai_client_streamed_and_whole(smollm2_file: Path) -> None:
    """(On the Ray backend: ``test_server_backends.py``.)"""
    hermes = (Path(__file__).resolve().parents[2] / "examples" / "hermes_tools.jinja").read_text()
    server = Live(config(smollm2_file, mode="none", n_threads=2, chat_template=hermes))
    try:
        client = server.client()
        weather = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
        asked: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
        options: dict[str, Any] = {"tools": [weather], "tool_choice": "required", "max_tokens": 48, "temperature": 0}
        name = smollm2_file.name
        whole = client.chat.completions.create(model=name, messages=asked, **options)
        calls = whole.choices[0].message.tool_calls
        assert whole.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments)["city"] == "Paris"
        chunks = list(client.chat.completions.create(model=name, messages=asked, stream=True, **options))
        streamed = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
        assert [(c.function.name, c.function.arguments) for c in streamed if c.function] == [
            (calls[0].function.name, calls[0].function.arguments)
        ]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    finally:
        server.stop()
