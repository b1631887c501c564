"""``specstate serve`` under hostile and careless requests: each way a request could stall or kill a
slot, or get around a limit, answered by an OpenAI-shaped 2xx/4xx in bounded time, the server serving on."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specstate import Model
from specstate._text import StopScanner
from specstate.llama import CHAT_TEMPERATURE, TOP_K, Llama
from specstate.serve.cache import ConversationCache, conversation_key
from specstate.serve.request import RequestError, RequestLimits, read_request
from test_server import BACKENDS, KEY, MODEL, Live, config, tiny_chat

__all__ = ["tiny_chat"]  # the module fixture, shared with test_server

HELLO = [{"role": "user", "content": "Hi"}]
#: Ten alternatives per level over six levels: 10**6 parse stacks if nothing bounds them.
EXPLODING_GRAMMAR = (
    "root ::= l1\n"
    + "".join(
        f"l{level} ::= " + " | ".join(f'l{level + 1} "{digit}"' for digit in range(10)) + "\n" for level in range(1, 6)
    )
    + "l6 ::= "
    + " | ".join(f'"{digit}"' for digit in range(10))
    + "\n"
)


@pytest.fixture(scope="module", params=list(BACKENDS))
def live(request: pytest.FixtureRequest, tiny_chat: Path) -> Iterator[Live]:
    server = Live(config(tiny_chat, slots=1, limits=RequestLimits(max_tokens=8), ray_workers=BACKENDS[request.param]))
    yield server
    server.stop()


def post_json(live: Live, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    status, answer, _ = live.post(path, body)
    return status, answer


def chat(live: Live, **body: Any) -> tuple[int, dict[str, Any]]:
    return post_json(live, "/v1/chat/completions", json.dumps({"messages": HELLO, **body}).encode())


def still_serves(live: Live) -> None:
    status, answer = chat(live, max_tokens=2, temperature=0)
    assert status == 200 and answer["choices"][0]["message"]["content"] is not None, answer
    health = json.loads(live.get("/health")[1])
    assert health["status"] == "ok" and health["slots_serving"] == health["slots"], health


def refused(status: int, answer: dict[str, Any], param: str | None) -> None:
    assert status == 400, answer
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["param"] == param, answer


# 1. a bad `messages` value, and any exception in a slot


@pytest.mark.parametrize(
    "messages",
    [None, [{"role": "user", "content": [{"type": "text", "text": 5}]}], "hi", [5], [{"role": 1, "content": "x"}]],
)
def test_a_bad_messages_value_is_a_400_and_the_slot_serves_on(live: Live, messages: object) -> None:
    status, answer, _ = live.post("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    refused(status, answer, "messages")
    still_serves(live)


def test_any_exception_in_a_slot_is_that_requests_500_and_the_slot_serves_on(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*looked_up: object) -> None:
        raise RuntimeError("the cache broke")

    monkeypatch.setattr(live.state.cache, "longest", broken)
    status, answer = chat(live, max_tokens=2)
    assert (
        status == 500 and answer["error"]["type"] == "server_error" and "the cache broke" in answer["error"]["message"]
    )
    monkeypatch.undo()
    still_serves(live)


# 2. a grammar whose parse stacks explode


def test_an_exploding_grammar_is_refused_quickly_and_the_slot_serves_on(live: Live) -> None:
    start = time.monotonic()
    status, answer = chat(live, grammar=EXPLODING_GRAMMAR, max_tokens=2)
    assert status == 400 and "stack" in answer["error"]["message"], answer
    assert time.monotonic() - start < 30  # not hours
    still_serves(live)


# 4. stop strings: bounded in the server, linear in the API


def test_stop_strings_are_bounded(live: Live) -> None:
    refused(*chat(live, stop="x" * 500_000), "stop")
    refused(*chat(live, stop=["a"] * 17), "stop")
    still_serves(live)


def test_a_long_stop_string_costs_linear_time() -> None:
    """500,000 characters that the text keeps almost matching: matched in linear time, not quadratic."""
    stop = "a" * 500_000 + "b"
    pieces = (piece for piece in ["a" * 1000] * 200 + ["c"])
    scanner = StopScanner(pieces, [stop])
    start = time.monotonic()
    assert "".join(scanner) == "a" * 200_000 + "c" and not scanner.stopped
    assert time.monotonic() - start < 10


# 5. many messages: bounded before any hashing


def test_a_flood_of_messages_is_refused_before_any_hashing(live: Live) -> None:
    messages = [{"role": "assistant", "content": ""}] * 30_000
    start = time.monotonic()
    body = json.dumps({"messages": messages}, separators=(",", ":")).encode()  # under the body limit
    status, answer, _ = live.post("/v1/chat/completions", body)
    refused(status, answer, "messages")
    assert time.monotonic() - start < 10


def test_the_conversation_cache_looks_up_every_prefix_in_one_pass() -> None:
    pairs = [("user" if i % 2 else "assistant", "x" * 100) for i in range(1024)]
    cache = ConversationCache(1 << 20)
    cache.put(pairs[:501], b"checkpoint")  # it ends with a reply
    start = time.monotonic()
    assert cache.longest(pairs) == (501, b"checkpoint")
    assert time.monotonic() - start < 2
    assert conversation_key(pairs[:500]) != conversation_key(pairs[:502])


# 6. max_tokens 0 or less: the server's limit, not the whole context


@pytest.mark.parametrize("tokens", [0, -1])
def test_max_tokens_zero_or_negative_means_the_servers_limit(live: Live, tokens: int) -> None:
    status, answer = chat(live, max_tokens=tokens, temperature=0, stop=[])
    assert status == 200 and answer["usage"]["completion_tokens"] <= 8, answer


@pytest.mark.parametrize("tokens", [1.5, "10", 10**30, True])
def test_max_tokens_must_be_an_integer_within_the_limit(live: Live, tokens: object) -> None:
    refused(*chat(live, max_tokens=tokens), "max_tokens")


# 7. a client that leaves a non-streamed request stops it


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_client_that_leaves_a_whole_answer_stops_its_generation(tiny_chat: Path, backend: str) -> None:
    server = Live(config(tiny_chat, slots=1, n_ctx=4096, ray_workers=BACKENDS[backend]))

    def running() -> int:
        return server.state.gauges()[1]

    try:
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        deadline = time.monotonic() + 30
        while not running():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sock.close()
        # Counted by the slot that stopped it (on the Ray backend, a worker's: its next report brings the count).
        while running() or "specstate_cancelled_requests_total 1" not in server.get("/metrics")[1]:
            assert time.monotonic() < deadline, "the abandoned generation kept its slot"
            time.sleep(0.05)
        answer = server.client().completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=0)
        assert answer.choices[0].text is not None and answer.usage is not None
    finally:
        server.stop()


# 8. logit_bias over HTTP: JSON's keys are strings


def test_logit_bias_with_string_keys_works_over_http(live: Live, tiny_chat: Path) -> None:
    status, plain = chat(live, max_tokens=1, temperature=0)
    assert status == 200
    first = Model(tiny_chat).tokenize(plain["choices"][0]["message"]["content"], add_special=False)[0]
    status, biased = chat(live, max_tokens=1, temperature=0, logit_bias={str(first): -100})
    assert status == 200 and biased["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
    refused(*chat(live, logit_bias={"abc": 1}), "logit_bias")
    refused(*chat(live, logit_bias={str(i): 1 for i in range(1025)}), "logit_bias")


# 9. a restart with another chat template


def test_a_restart_with_another_template_decodes_the_conversation_anew(tiny_chat: Path, tmp_path: Path) -> None:
    cached = config(tiny_chat, cache_dir=str(tmp_path / "cache"))
    first_server = Live(cached)
    try:
        body = json.dumps({"messages": HELLO, "max_tokens": 8}).encode()
        status, first = post_json(first_server, "/v1/chat/completions", body)
    finally:
        first_server.stop()
    assert status == 200
    reply = first["choices"][0]["message"]["content"]
    messages = [*HELLO, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    second_server = Live(config(tiny_chat, cache_dir=str(tmp_path / "cache"), chat_template="chatml"))
    try:
        body = json.dumps({"messages": messages, "max_tokens": 4}).encode()
        status, second, _ = second_server.post("/v1/chat/completions", body)
        assert status == 200, second
        assert "specstate_conversations_restored_total" not in second_server.get("/metrics")[1]
    finally:
        second_server.stop()


# 10. deeply nested JSON


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"messages": ' + b"[" * 65 + b"]" * 65 + b"}"])
def test_deeply_nested_json_is_a_400(live: Live, body: bytes) -> None:
    status, answer = post_json(live, "/v1/chat/completions", body)
    assert status == 400 and "nested" in answer["error"]["message"], answer


# 11. /metrics behind the API key


def test_metrics_need_the_api_key_unless_made_public(live: Live, tiny_chat: Path) -> None:
    def metrics(port: int) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/metrics")
        return connection.getresponse().status

    assert metrics(live.port) == 401 and live.get("/metrics")[0] == 200
    public = Live(config(tiny_chat, metrics_public=True))
    try:
        assert metrics(public.port) == 200
    finally:
        public.stop()


# 12. what else lies in the cache directory


def test_links_and_fifos_in_the_cache_directory_are_passed_over(tiny_chat: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    (directory / f"{'a' * 64}.ckpt").symlink_to(tmp_path / "nowhere")
    os.mkfifo(directory / f"{'b' * 64}.ckpt")
    assert ConversationCache(1 << 20, str(directory)).get("b" * 64) is None
    server = Live(config(tiny_chat, cache_dir=str(directory)))
    try:
        status, _, _ = server.post("/v1/chat/completions", json.dumps({"messages": HELLO, "max_tokens": 2}).encode())
        assert status == 200
    finally:
        server.stop()


# Both backends read a request the same way


def test_one_reading_of_a_request_for_both_backends() -> None:
    request = read_request("chat", {"messages": HELLO}, RequestLimits(), model_name=MODEL, template_source="")
    settings = request.call.sampling.settings()  # what a Ray worker generates with
    assert settings["temperature"] == pytest.approx(CHAT_TEMPERATURE) and settings["top_k"] == TOP_K
    assert request.max_tokens == RequestLimits().max_tokens and request.call.model == MODEL
    stopped = read_request(
        "chat", {"messages": HELLO, "stop": "x"}, RequestLimits(), model_name=MODEL, template_source=""
    )
    assert stopped.call.stops == ["x"] and stopped.pairs == (("user", "Hi"),)
    with pytest.raises(RequestError) as refusal:
        read_request(
            "completion", {"prompt": "x", "max_tokens": 2.5}, RequestLimits(), model_name=MODEL, template_source=""
        )
    assert refusal.value.param == "max_tokens"


def test_the_llama_api_refuses_a_checkpoint_of_another_template(tiny_chat: Path) -> None:
    llama = Llama(tiny_chat, n_ctx=512, n_threads=1)
    llama.create_chat_completion(HELLO, max_tokens=2, temperature=0)
    assert llama.chat_generator is not None
    checkpoint = llama.chat_generator.checkpoint()
    other = Llama(tiny_chat, n_ctx=512, n_threads=1, chat_format="chatml")
    with pytest.raises(ValueError, match="another chat template"):
        other.restore_chat(checkpoint)
    assert other.chat_generator is None


# Hostile but well-formed bodies, at random


def _json_values() -> st.SearchStrategy[object]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=40),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )


FIELDS = [
    "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "stop", "seed",
    "grammar", "response_format", "logprobs", "top_logprobs", "echo", "stream", "n", "user", "priority",
    "stream_options", "model", "tools", "tool_choice", "suffix", "mirostat_mode", "tfs_z",
]  # fmt: skip


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    endpoint = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    body: dict[str, object] = {"messages": HELLO} if "chat" in endpoint else {"prompt": "Hi"}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        body[name] = draw(_json_values())
    return endpoint, body


def post(live: Live, path: str, body: bytes) -> tuple[int, str, bytes]:
    """Status, content type and body of a POST (a stream read to its end)."""
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    connection.request("POST", path, body=body, headers={"Authorization": f"Bearer {KEY}"})
    response = connection.getresponse()
    return response.status, response.getheader("content-type", ""), response.read()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(hostile_bodies())
def test_hostile_bodies_get_openai_answers_in_bounded_time(live: Live, case: tuple[str, dict[str, object]]) -> None:
    endpoint, body = case
    start = time.monotonic()
    status, kind, data = post(live, endpoint, json.dumps(body).encode())
    assert time.monotonic() - start < 30
    assert 200 <= status < 300 or 400 <= status < 500, (status, data)
    if kind.startswith("text/event-stream"):
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and all("choices" in json.loads(e) for e in events[:-1]), data
        return
    answer = json.loads(data)
    if status < 300:
        assert "choices" in answer and "usage" in answer, answer
    else:
        assert set(answer["error"]) == {"message", "type", "param", "code"}, answer


def test_after_hostile_bodies_the_server_serves_a_normal_chat(live: Live) -> None:
    still_serves(live)


def test_the_limits_table_of_the_server_page_is_request_limits() -> None:
    """docs/server.md lists every limit with its option and default: the ones RequestLimits has."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    table = dict(re.findall(r"^\| [^|]+ \| `--([a-z-]+)` \| ([\d,]+) \|$", page, re.MULTILINE))
    defaults = {limit.name.replace("_", "-"): limit.default for limit in fields(RequestLimits)}
    queues = ("queue", "embedding-queue")  # ServerConfig's, not a request's
    assert {option: int(value.replace(",", "")) for option, value in table.items() if option not in queues} == defaults


# 13. a client that leaves stops its generation within a round, whatever the stream holds back

HERMES = (Path(__file__).resolve().parents[2] / "examples" / "hermes_tools.jinja").read_text()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
#: A tool whose arguments hold at least 10,000 characters: a call longer than any max_tokens below.
LONG_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "parameters": {
            "type": "object",
            "properties": {"pages": {"type": "array", "items": {"type": "string", "minLength": 1000}, "minItems": 10}},
            "required": ["pages"],
        },
    },
}


@pytest.fixture(scope="module")
def smol(smollm2_file: Path) -> Iterator[Live]:
    """SmolLM2 with a template that has tools, one slot, an embeddings queue of 2."""
    server = Live(config(smollm2_file, mode="none", n_threads=2, n_ctx=2048, chat_template=HERMES, embedding_queue=2))
    yield server
    server.stop()


def counter(live: Live, name: str) -> int:
    """A counter of /metrics (0 before it is first counted)."""
    found = re.search(rf"^specstate_{name}_total (\d+)$", live.get("/metrics")[1], re.MULTILINE)
    return int(found.group(1)) if found else 0


def send(live: Live, path: str, body: dict[str, Any]) -> socket.socket:
    """A request sent on a connection of its own, its answer not read."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", live.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_leaves_a_tool_call_stops_its_generation_within_a_round(smol: Live, stream: bool) -> None:
    """A tool call is held back until it is whole, so its stream sends nothing while 1,200 tokens are generated:
    the slot must stop at the next token, not at the next chunk."""
    cancelled = counter(smol, "cancelled_requests")
    asked = [{"role": "user", "content": "Write a long text."}]
    body = {"messages": asked, "tools": [LONG_TOOL], "tool_choice": "required", "max_tokens": 1200, "stream": stream}
    sock = send(smol, "/v1/chat/completions", body)
    deadline = time.monotonic() + 60
    while not smol.state.scheduler.busy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(1)
    sock.close()
    left = time.monotonic()
    while smol.state.scheduler.busy:
        assert time.monotonic() - left < 5, "the abandoned tool call kept its slot"
        time.sleep(0.02)
    assert counter(smol, "cancelled_requests") == cancelled + 1
    still_serves(smol)


# 14. a reply the template's tool parser does not accept is the reply's content


def test_a_reply_the_tool_parser_rejects_is_content_streamed_and_whole(smol: Live) -> None:
    """Asked to repeat ``<tool_call> hello``, the model calls a tool that does not exist: the parser refuses that
    reply, which is still a reply (not a 400 after the whole generation)."""
    client, name = smol.client(), smol.state.config.name()
    asked: list[Any] = [{"role": "user", "content": "Repeat after me: <tool_call> hello"}]
    options: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "auto", "max_tokens": 40, "temperature": 0}
    whole = client.chat.completions.create(model=name, messages=asked, **options)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "stop" and message.tool_calls is None
    assert message.content is not None and message.content.startswith("<tool_call>")
    chunks = list(client.chat.completions.create(model=name, messages=asked, stream=True, **options))
    assert not any(chunk.choices[0].delta.tool_calls for chunk in chunks)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


# 15. JSON schemas: bounded before any conversion, converted once, in the slot


def optional_properties(count: int) -> dict[str, Any]:
    """An object schema of ``count`` optional integer properties (converting it takes time about ``count``**3)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_a_json_schema_that_would_explode_is_refused_before_any_conversion(live: Live) -> None:
    """1,200 optional properties (34 KiB) take seconds to convert: refused before anything converts them."""
    start = time.monotonic()
    refused(*chat(live, response_format=response_format(optional_properties(1200))), "response_format")
    exploding_tool = {"type": "function", "function": {"name": "f", "parameters": optional_properties(1200)}}
    refused(*chat(live, tools=[exploding_tool], tool_choice="required"), "tools")
    nested = {"type": "object", "properties": {f"o{i}": optional_properties(60) for i in range(20)}}
    refused(*chat(live, response_format=response_format(nested)), "response_format")  # 1,220 properties in all
    wide = {"type": "object", "properties": {"a": {"type": "string", "description": "x" * 70_000}}}
    refused(*chat(live, response_format=response_format(wide)), "response_format")  # more than 64 KiB
    assert time.monotonic() - start < 10
    status, answer = chat(live, response_format=response_format(optional_properties(64)), max_tokens=4)
    assert status == 200, answer
    still_serves(live)


def test_a_schema_is_not_converted_where_requests_are_read() -> None:
    """The slot that runs the request converts it, once: a request's reader only bounds it."""
    asked = {"messages": HELLO, "response_format": response_format(optional_properties(3))}
    request = read_request("chat", asked, RequestLimits(), model_name=MODEL, template_source="")
    assert request.call.schema is not None and request.call.sampling.grammar is None
    assert json.loads(request.call.schema) == asked["response_format"]["json_schema"]["schema"]  # type: ignore[index]
    grammar = request.call.converted().sampling.grammar
    assert grammar is not None and "root ::=" in grammar


# 16. embeddings: a queue and workers of their own, bounded, cancelled with their clients


def test_embeddings_have_a_bounded_queue_of_their_own_and_clients_that_leave_cancel_theirs(smol: Live) -> None:
    """Embeddings wait in their own queue (429 beyond it) for their own workers: a chat is read and answered
    beside them, and a client that leaves drops its queued request or stops its running one."""
    texts = [f"a short sentence number {i} about the weather and the sea" for i in range(256)]
    cancelled = counter(smol, "cancelled_requests")
    embeddings = smol.state.embeddings
    first = send(smol, "/v1/embeddings", {"input": texts})
    deadline = time.monotonic() + 60
    while not (embeddings.busy() and embeddings.depth() == 0):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    waiting = [send(smol, "/v1/embeddings", {"input": texts}) for _ in range(2)]  # the queue holds 2
    while embeddings.depth() < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    status, answer, headers = smol.post("/v1/embeddings", json.dumps({"input": texts}).encode())
    assert status == 429 and headers.get("retry-after") == "1", answer
    start = time.monotonic()
    still_serves(smol)
    assert time.monotonic() - start < 5  # never behind the embeddings
    for sock in [first, *waiting]:
        sock.close()
    while embeddings.busy() or embeddings.depth():
        assert time.monotonic() < deadline, "the abandoned embeddings ran on"
        time.sleep(0.02)
    assert counter(smol, "cancelled_requests") == cancelled + 3  # two dropped from the queue, one stopped
    vector = smol.client().embeddings.create(model=smol.state.config.name(), input="hello", encoding_format="float")
    assert len(vector.data[0].embedding) > 0


# 17. OpenAI's ranges and roles over HTTP (the Python API keeps llama-cpp-python's)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", 5),
        ("temperature", -0.5),
        ("top_p", 1.5),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.5),
        ("top_logprobs", 21),
        ("logit_bias", {"1": 101}),
    ],
)
def test_openai_ranges_hold_over_http(live: Live, name: str, value: object) -> None:
    extra = {"logprobs": True} if name == "top_logprobs" else {}
    refused(*chat(live, **{name: value}, **extra), name)


def test_openai_roles_and_completion_ranges_hold_over_http_and_the_python_api_keeps_its_own(
    live: Live, tiny_chat: Path
) -> None:
    status, answer, _ = live.post(
        "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "Hi"}]}).encode()
    )
    refused(status, answer, "messages")
    status, answer, _ = live.post("/v1/completions", json.dumps({"prompt": "Hi", "logprobs": 6}).encode())
    refused(status, answer, "logprobs")
    llama = Llama(tiny_chat, n_ctx=512, n_threads=1)
    assert llama.create_chat_completion(HELLO, max_tokens=2, temperature=5, seed=1)["choices"][0]["message"]
    still_serves(live)
