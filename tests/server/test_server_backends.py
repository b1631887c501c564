"""The Ray backend is the slot backend scaled out: one OpenAI client script, run against ``specstate serve`` and
against ``specstate serve --ray-workers 2``, passes on both and gets the same replies at temperature 0: chats whole
and streamed (with the usage), stop strings, log-probabilities, ``echo``, several prompts, a JSON schema, tools with
``tool_choice: "required"``, a follow-up turn, and both agent APIs (Anthropic's Messages, OpenAI's Responses).
Without a Ray instance to join, a server's driver starts one of its own and stops it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openai.types.chat import ChatCompletionMessageParam

from test_server import Live, config, tiny_chat
from test_server_hostile import HERMES

__all__ = ["tiny_chat"]  # the module fixture, shared with test_server

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
COLOURS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colours."}]


def chats(server: Live) -> list[Any]:
    """What the chat completions of the script answer (ids and times left out)."""
    client: Any = server.client()  # untyped: the requests below pass plain dictionaries
    whole = client.chat.completions.create(messages=COLOURS, max_tokens=16, **GREEDY)
    text = whole.choices[0].message.content or ""
    chunks = list(
        client.chat.completions.create(
            messages=COLOURS, max_tokens=16, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    stopped = client.chat.completions.create(messages=COLOURS, max_tokens=16, stop=[","], **GREEDY).choices[0]
    assert stopped.finish_reason == "stop" and "," not in (stopped.message.content or "")
    scored = client.chat.completions.create(messages=COLOURS, max_tokens=6, logprobs=True, top_logprobs=2, **GREEDY)
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    follow: list[ChatCompletionMessageParam] = [*COLOURS, {"role": "assistant", "content": text}]
    follow.append({"role": "user", "content": "And one more?"})
    again = client.chat.completions.create(messages=follow, max_tokens=8, **GREEDY).choices[0].message.content
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    shaped = client.chat.completions.create(
        messages=COLOURS,
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        **GREEDY,
    )
    content = shaped.choices[0].message.content or ""
    assert content.startswith("{")
    return [text, whole.usage, stopped.message.content, logprobs.model_dump(), again, content]


def tools(server: Live) -> list[Any]:
    """A chat whose tools must be called (``tool_choice: "required"``), whole and streamed."""
    client: Any = server.client()  # untyped: the requests below pass plain dictionaries
    asked: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]
    options: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 48, **GREEDY}
    whole = client.chat.completions.create(messages=asked, **options)
    calls = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
    chunks = list(client.chat.completions.create(messages=asked, stream=True, **options))
    streamed = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    return [(c.function.name, c.function.arguments) for c in calls] + [
        (c.function.name, c.function.arguments) for c in streamed if c.function
    ]


def completions(server: Live) -> list[Any]:
    """Completions: the prompt echoed with its log-probabilities, and several prompts, whole and streamed."""
    client: Any = server.client()  # untyped: the requests below pass plain dictionaries
    echoed = client.completions.create(prompt="Once upon a time", max_tokens=6, echo=True, logprobs=2, **GREEDY)
    prompts = ["Once upon a time", "The sea"]
    several = client.completions.create(prompt=prompts, max_tokens=6, **GREEDY)
    streamed = list(client.completions.create(prompt=prompts, max_tokens=6, stream=True, **GREEDY))
    texts = ["".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in (0, 1)]
    assert texts == [choice.text for choice in several.choices] and len({c.id for c in streamed}) == 1
    return [echoed.choices[0].model_dump(), [c.model_dump() for c in several.choices], several.usage]


def agents(server: Live) -> list[Any]:
    """Both agent APIs, whole and streamed."""
    message = {"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hi."}]}
    status, said, _ = server.post("/v1/messages", json.dumps(message).encode())
    assert status == 200, said
    asked = {"model": MODEL, "input": "Name three colours.", "temperature": 0, "max_output_tokens": 8, "store": False}
    status, made, _ = server.post("/v1/responses", json.dumps(asked).encode())
    assert status == 200, made
    streamed = server.client().responses.create(stream=True, **asked)  # type: ignore[call-overload]
    deltas = "".join(event.delta for event in streamed if event.type == "response.output_text.delta")
    text = made["output"][0]["content"][0]["text"]  # type: ignore[index]
    assert deltas == text
    return [said["content"], said["stop_reason"], text]


def test_an_openai_client_script_gets_the_same_replies_from_both_backends(smollm2_file: Path) -> None:
    answers = []
    for workers in (0, 2):
        server = Live(
            config(smollm2_file, mode="ngram", n_threads=1, n_ctx=1024, chat_template=HERMES, ray_workers=workers)
        )
        try:
            answers.append([chats(server), tools(server), completions(server), agents(server)])
        finally:
            server.stop()
    for part in range(4):
        assert answers[0][part] == answers[1][part], part


def test_a_driver_starts_and_stops_its_own_ray(tiny_chat: Path) -> None:
    """With no Ray instance to join, the server's driver starts a local one, and stops it when the server stops."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    server = Live(config(tiny_chat, ray_workers=1), join_shared_ray=False)
    try:
        assert ray.is_initialized()
        answer = server.client().completions.create(model="tiny.gguf", prompt="Hi", max_tokens=2, temperature=0)
        assert answer.usage is not None and answer.usage.completion_tokens == 2
    finally:
        server.stop()
    assert not ray.is_initialized()
