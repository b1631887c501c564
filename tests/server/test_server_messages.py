"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), driven by Anthropic's own
client: each answer is the chat path's answer to the same request, said as Anthropic says it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from test_server import BACKENDS, KEY, Live, config
from test_server_hostile import HERMES

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "Name three colours."}]
#: Anthropic's client no longer sends sampling fields; the server takes them as its earlier API did.
GREEDY = {"temperature": 0}
#: The name the server gives its one model (requests name it, as on the chat path).
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module", params=list(BACKENDS))
def live(request: pytest.FixtureRequest, smollm2_file: Path) -> Iterator[Live]:
    workers = BACKENDS[request.param]
    server = Live(
        config(smollm2_file, mode="ngram", n_threads=2, n_ctx=2048, chat_template=HERMES, ray_workers=workers)
    )
    yield server
    server.stop()


def client(live: Live, key: str = KEY) -> Any:
    """Anthropic's client (untyped here: the requests below use fields its types no longer list)."""
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{live.port}", api_key=key, max_retries=0, timeout=60)


def openai_reply(live: Live, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """The chat path's answer to the same request (temperature 0)."""
    status, answer, _ = live.post(
        "/v1/chat/completions", json.dumps({"messages": messages, "temperature": 0, **options}).encode()
    )
    assert status == 200, answer
    return answer


def test_a_message_is_the_chat_answer_to_the_same_request(live: Live) -> None:
    reply = client(live).messages.create(model=MODEL, max_tokens=16, messages=ASK, extra_body=GREEDY)
    chat = openai_reply(live, ASK, max_tokens=16)
    assert reply.type == "message" and reply.role == "assistant"
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == chat["choices"][0]["message"]["content"]
    assert reply.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    assert reply.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert reply.usage.output_tokens == chat["usage"]["completion_tokens"]


def test_a_system_prompt_and_a_second_turn(live: Live) -> None:
    turns = [*ASK, {"role": "assistant", "content": "Red, green, blue."}, {"role": "user", "content": "Two more."}]
    blocks = [{"type": "text", "text": "You are terse."}]
    reply = client(live).messages.create(
        model=MODEL,
        max_tokens=12,
        system=blocks,
        messages=turns,
        extra_body=GREEDY,
    )
    chat = openai_reply(live, [{"role": "system", "content": "You are terse."}, *turns], max_tokens=12)
    assert reply.content[0].text == chat["choices"][0]["message"]["content"]


def test_a_stream_sends_anthropics_events_in_order_and_its_text_is_the_whole_reply(live: Live) -> None:
    messages = client(live).messages
    whole = messages.create(model=MODEL, max_tokens=20, messages=ASK, extra_body=GREEDY)
    with messages.stream(model=MODEL, max_tokens=20, messages=ASK, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    body = [kind for kind in kinds[1:-2] if kind != "text"]  # the client's own text events beside the deltas
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_tool_use_and_its_result_round_trip_whole_and_streamed(live: Live) -> None:
    messages = client(live).messages
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    options: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "tools": [WEATHER_TOOL], "extra_body": GREEDY}
    call = messages.create(messages=asked, tool_choice={"type": "any"}, **options)
    assert call.stop_reason == "tool_use"
    used = [block for block in call.content if block.type == "tool_use"]
    assert len(used) == 1 and used[0].name == "get_weather" and isinstance(used[0].input, dict)
    with messages.stream(messages=asked, tool_choice={"type": "any"}, **options) as stream:
        streamed = stream.get_final_message()
    assert [block.model_dump() for block in streamed.content] == [block.model_dump() for block in call.content]
    result = {"type": "tool_result", "tool_use_id": used[0].id, "content": "Sunny, 21 C."}
    turns = [*asked, {"role": "assistant", "content": call.content}, {"role": "user", "content": [result]}]
    answer = messages.create(messages=turns, **options)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_counts_the_prompt_a_message_decodes(live: Live) -> None:
    messages = client(live).messages
    counted = messages.count_tokens(model=MODEL, messages=ASK)
    reply = messages.create(model=MODEL, max_tokens=1, messages=ASK)
    assert counted.input_tokens == reply.usage.input_tokens > 0
    with_tools = messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER_TOOL])
    assert with_tools.input_tokens > counted.input_tokens


def test_errors_have_anthropics_shape(live: Live) -> None:
    status, answer, _ = live.post("/v1/messages", json.dumps({"messages": ASK}).encode())
    assert status == 400
    assert answer == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: field required"},
    }
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client(live).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        client(live).messages.create(model=MODEL, max_tokens=4, messages=ASK, extra_body={"temperature": 1.5})
    with pytest.raises(anthropic.AuthenticationError):
        client(live, key="wrong").messages.create(model=MODEL, max_tokens=4, messages=ASK)


def test_a_stop_sequence_ends_the_message_and_is_named_whole_and_streamed(live: Live) -> None:
    messages = client(live).messages
    free = messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY).content[0].text
    word = free.split()[2]
    options: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "messages": ASK, "extra_body": GREEDY}
    stopped = messages.create(stop_sequences=[word, "never appears"], **options)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == free[: free.index(word)]
    with messages.stream(stop_sequences=[word], **options) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word
