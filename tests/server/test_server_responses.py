"""OpenAI's Responses API (``/v1/responses``), driven by OpenAI's own client: each response is the chat path's
answer to the same conversation; a stored response is continued by ``previous_response_id``, after a restart too,
with the reply the whole conversation sent again gets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import openai
import pytest

from test_server import BACKENDS, Live, config
from test_server_hostile import HERMES, counter

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 16}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    return tmp_path_factory.mktemp(f"responses-{backend}")


@pytest.fixture(scope="module")
def live(smollm2_file: Path, cache_dir: Path, backend: str) -> Iterator[Live]:
    shape = {"mode": "ngram", "n_threads": 2, "n_ctx": 2048, "chat_template": HERMES, "cache_dir": str(cache_dir)}
    server = Live(config(smollm2_file, ray_workers=BACKENDS[backend], **shape))
    yield server
    server.stop()


def openai_client(live: Live, key: str = "test-key") -> Any:
    """OpenAI's client (untyped here: the requests below pass plain dictionaries)."""
    return live.client(key)


def chat_text(live: Live, messages: list[dict[str, Any]], max_tokens: int = 16) -> str:
    """The chat path's reply to the same conversation (temperature 0)."""
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens}
    status, answer, _ = live.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 200, answer
    return str(cast(Any, answer)["choices"][0]["message"]["content"])


def test_a_response_is_the_chat_answer_to_the_same_conversation(live: Live) -> None:
    made = openai_client(live).responses.create(input="Name three colours.", instructions="Be brief.", **GREEDY)
    asked = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]
    assert made.object == "response" and made.status in ("completed", "incomplete")
    assert made.output_text == chat_text(live, asked)
    assert made.usage is not None and made.usage.output_tokens > 0


def test_a_stream_sends_the_responses_events_in_order_and_its_text_is_the_whole_reply(live: Live) -> None:
    api = openai_client(live)
    whole = api.responses.create(input="Name three colours.", **GREEDY)
    kinds, deltas, final = [], [], None
    for event in api.responses.create(input="Name three colours.", stream=True, **GREEDY):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert "".join(deltas) == whole.output_text and final is not None and final.output_text == whole.output_text


def test_function_calls_and_their_outputs_round_trip(live: Live) -> None:
    api = openai_client(live)
    asked = "What is the weather in Paris?"
    called = api.responses.create(
        input=asked, tools=[WEATHER], tool_choice="required", **{**GREEDY, "max_output_tokens": 60}
    )
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    turn: list[Any] = [
        {"role": "user", "content": asked},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C."},
    ]
    answered = api.responses.create(input=turn, tools=[WEATHER], **GREEDY)
    assert answered.status in ("completed", "incomplete")


def test_a_json_schema_text_format_gives_json_of_the_schema(live: Live) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}}
    made = openai_client(live).responses.create(
        input="Name a colour.", text=text, **{**GREEDY, "max_output_tokens": 40}
    )
    assert set(json.loads(made.output_text)) == {"colour"}


def test_a_follow_up_continues_its_stored_response_as_the_whole_conversation_would(live: Live) -> None:
    api = openai_client(live)
    first = api.responses.create(input="Name three colours.", **GREEDY)
    follow = api.responses.create(previous_response_id=first.id, input="Two more.", **GREEDY)
    whole: list[Any] = [
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Two more."},
    ]
    again = api.responses.create(input=whole, store=False, **GREEDY)
    assert follow.output_text == again.output_text
    assert api.responses.retrieve(first.id).output_text == first.output_text
    api.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="no stored response"):
        api.responses.create(previous_response_id=first.id, input="Again.", **GREEDY)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(again.id)  # store=False: not kept


def test_a_stored_response_is_continued_after_a_restart(live: Live, smollm2_file: Path, cache_dir: Path) -> None:
    first = openai_client(live).responses.create(input="Name a fruit.", **GREEDY)
    follow = openai_client(live).responses.create(previous_response_id=first.id, input="Another.", **GREEDY)
    live.state.cache.flush()  # what a server that stops writes to its cache directory
    restarted = Live(replace(live.state.config))
    try:
        again = openai_client(restarted).responses.create(previous_response_id=first.id, input="Another.", **GREEDY)
        assert again.output_text == follow.output_text
        assert counter(restarted, "conversations_restored") == 1  # only the new input was decoded
        assert openai_client(restarted).responses.retrieve(first.id).output_text == first.output_text
    finally:
        restarted.stop()


def test_another_keys_stored_responses_are_not_found(smollm2_file: Path, tmp_path: Path) -> None:
    """The server keeps the stored responses, whichever backend decodes them."""
    keys = tmp_path / "keys"
    keys.write_text("key-a\nkey-b\n")
    server = Live(config(smollm2_file, mode="none", n_threads=2, n_ctx=1024, api_key=None, api_key_file=str(keys)))
    try:
        made = openai_client(server, "key-a").responses.create(input="Hi.", **{**GREEDY, "max_output_tokens": 2})
        with pytest.raises(openai.NotFoundError):
            openai_client(server, "key-b").responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError):
            openai_client(server, "key-b").responses.create(previous_response_id=made.id, input="Hi.", **GREEDY)
    finally:
        server.stop()


def test_errors_name_the_field(live: Live) -> None:
    status, answer, _ = live.post(
        "/v1/responses", json.dumps({"input": [{"type": "input_image"}], "model": MODEL}).encode()
    )
    assert status == 400 and cast(Any, answer)["error"]["param"] == "input"
    status, answer, _ = live.post(
        "/v1/responses", json.dumps({"input": "x", "tools": [{"type": "web_search"}]}).encode()
    )
    assert status == 400 and cast(Any, answer)["error"]["param"] == "tools"
