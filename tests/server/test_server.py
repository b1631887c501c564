"""``specstate serve``: the real ``openai`` client against a live server on loopback, over the tiny model."""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from openai.types.chat import ChatCompletionMessageParam

from specstate import Generator, Llama, Model
from specstate.serve import RequestLimits, ServerConfig, build_app
from specstate.serve.cache import DEFAULT_TENANT
from specstate.serve.jobs import Job
from specstate.serve.ray import _Running
from specstate.serve.request import read_request
from specstate_testkit import models
from test_chat import TINY_TEMPLATE

KEY = "test-key"
MODEL = "tiny.gguf"
N_CTX = 512


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_llama(tmp_path_factory.mktemp("server") / "tiny.gguf", chat_template=TINY_TEMPLATE)


def shared_ray() -> None:
    """Join one local Ray instance for every Ray-backed server of the test run, started on first use and stopped
    when the tests end: each server's driver then joins it (as it joins a cluster's), rather than starting and
    stopping an instance of its own, seconds each. (``test_server_backends.py`` keeps that
    path tested.)"""
    import ray

    from specstate.cluster.pool import _quiet_raylet

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        _quiet_raylet(True)
        atexit.register(ray.shutdown)


class Live:
    """A server running in a thread of this process, on a free loopback port."""

    def __init__(self, config: ServerConfig, join_shared_ray: bool = True) -> None:
        if config.ray_workers and not config.ray_address and join_shared_ray:
            shared_ray()
        self.app, self.state = build_app(config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=60)

    def get(self, path: str) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("GET", path, headers={"Authorization": f"Bearer {KEY}"})
        response = connection.getresponse()
        return response.status, response.read().decode()

    def post(self, path: str, body: bytes, key: str = KEY) -> tuple[int, dict[str, object], dict[str, str]]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), dict(response.getheaders())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def config(path: Path, **changes: object) -> ServerConfig:
    base = ServerConfig(model_path=str(path), mode="ngram", n_ctx=N_CTX, n_threads=1, slots=1, api_key=KEY)
    return replace(base, **changes)  # type: ignore[arg-type]


#: The backends a test of what a request means runs against: the slot threads, and two Ray workers.
BACKENDS = {"slots": 0, "ray": 2}


@pytest.fixture(scope="module", params=list(BACKENDS))
def live(request: pytest.FixtureRequest, tiny_chat: Path) -> Iterator[Live]:
    """A server of two slots, on each backend (one server each for the module)."""
    server = Live(config(tiny_chat, slots=2, ray_workers=BACKENDS[request.param]))
    yield server
    server.stop()


def plain_reply(path: Path, messages: list[ChatCompletionMessageParam], max_tokens: int) -> str:
    """The same greedy reply from a Generator in this process (mode none)."""
    generator = Generator(Model(path), n_ctx=N_CTX, n_threads=1)
    return generator.chat(
        [{"role": m["role"], "content": str(m.get("content"))} for m in messages], max_tokens=max_tokens
    )


def test_chat_completions_streamed_and_not_equal_plain_greedy(live: Live, tiny_chat: Path) -> None:
    client = live.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].finish_reason in ("stop", "length")
    text = whole.choices[0].message.content
    assert text == plain_reply(tiny_chat, messages, 24)  # speculation (ngram) changes nothing
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    assert "specstate_generated_tokens_total" in live.get("/metrics")[1]
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_follow_up_turn_continues_the_held_conversation(live: Live, tiny_chat: Path) -> None:
    client = live.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
    messages += [{"role": "user", "content": "Go on."}]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert second.choices[0].message.content
    driver = live.state.driver
    if driver is None:
        held = [slot.llama.chat_generator for slot in live.state.slots if slot.llama is not None]
        assert any(g is not None and len(g.messages) == 4 for g in held)  # continued, not re-sent twice
    else:  # the follow-up went to the worker holding the conversation, which continued it there
        pairs = [(m["role"], str(m["content"])) for m in messages]
        pairs.append(("assistant", second.choices[0].message.content))
        holders = {driver.holder_of(pairs[:n], DEFAULT_TENANT) for n in (2, 4)}
        assert len(holders) == 1 and None not in holders


def test_a_restarted_server_continues_a_conversation_from_its_cache_directory(tiny_chat: Path, tmp_path: Path) -> None:
    cached = config(tiny_chat, cache_dir=str(tmp_path / "cache"))
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]
    first_server = Live(cached)
    try:
        first = first_server.client().chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0
        )
    finally:
        first_server.stop()
    assert len(list((tmp_path / "cache").glob("*.ckpt"))) == 1  # flushed to the directory at shutdown
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
    messages += [{"role": "user", "content": "Go on."}]
    second_server = Live(cached)
    try:
        second = second_server.client().chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0
        )
        assert "specstate_conversations_restored_total 1" in second_server.get("/metrics")[1]
    finally:
        second_server.stop()
    generator = Generator(Model(tiny_chat), mode="ngram", n_ctx=N_CTX, n_threads=1)  # the same turns in one process
    assert generator.chat("Tell me a story.", max_tokens=12) == first.choices[0].message.content
    assert generator.chat("Go on.", max_tokens=12) == second.choices[0].message.content
    assert second.usage is not None and second.usage.prompt_tokens == len(generator.prompt_tokens)


def test_completions_and_models(live: Live) -> None:
    client = live.client()
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text
    streamed = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == completion.choices[0].text
    assert [m.id for m in client.models.list()] == [MODEL]
    status, health = live.get("/health")
    assert status == 200 and json.loads(health)["status"] == "ok"
    status, metrics = live.get("/metrics")
    assert status == 200 and 'specstate_requests_total{endpoint="completions",status="200"}' in metrics


def test_completions_echo_the_prompt_with_its_log_probabilities(live: Live, tiny_chat: Path) -> None:
    asked: dict[str, Any] = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 2}
    served = live.client().completions.create(model=MODEL, echo=True, **asked).model_dump()["choices"][0]
    here = Llama(str(tiny_chat), n_ctx=N_CTX, n_threads=1)
    assert served["logprobs"] == here.create_completion(echo=True, **asked)["choices"][0]["logprobs"]
    assert served["logprobs"]["token_logprobs"][0] is None and served["text"].startswith(asked["prompt"])
    plain = live.client().completions.create(model=MODEL, **asked).choices[0].logprobs
    assert plain is not None and plain.text_offset and plain.text_offset[0] == len(asked["prompt"])


def test_log_probabilities_and_json_output_through_the_server(live: Live) -> None:
    client = live.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert "".join(entry.token for entry in logprobs.content) == reply.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 for entry in logprobs.content)
    schema: dict[str, object] = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    shaped = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    content = shaped.choices[0].message.content or ""
    assert content.startswith("{") and '"a"' in content


def test_errors_are_openai_shaped(live: Live) -> None:
    client = live.client()
    with pytest.raises(openai.AuthenticationError):
        live.client("wrong").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], top_p=3.0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=10**9)
    for body in (b"{not json", b"[1, 2]", json.dumps({"prompt": "x", "max_tokens": 2, "bogus": 1}).encode()):
        status, error, _ = live.post("/v1/completions", body)
        assert status == 400 and {"message", "type"} <= set(error["error"])  # type: ignore[call-overload]
    status, error, _ = live.post("/v1/completions", b"x" * (2 << 20))
    assert status == 413


def test_a_full_queue_answers_429_and_a_client_that_leaves_stops_its_generation(tiny_chat: Path) -> None:
    server = Live(config(tiny_chat, slots=1, queue=0, n_ctx=4096))
    try:
        long = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(long)}\r\n\r\n"
        )
        sock.sendall(request.encode() + long)
        received = b""
        while b"data: " not in received:  # streaming: the only slot is busy
            part = sock.recv(65536)
            assert part, received
            received += part
        status, error, headers = server.post("/v1/completions", json.dumps({"prompt": "x"}).encode())
        assert status == 429 and headers.get("retry-after") == "1" and "busy" in str(error)
        sock.close()  # the client leaves: its generation stops, the slot frees
        deadline = time.monotonic() + 60
        while server.state.scheduler.busy:
            assert time.monotonic() < deadline, "the abandoned generation kept its slot"
            time.sleep(0.05)
        assert "specstate_cancelled_requests_total 1" in server.get("/metrics")[1]
        reply = server.client().completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=0)
        assert reply.choices[0].text is not None
    finally:
        server.stop()


def test_the_command_line_serves_until_interrupted(tiny_chat: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "specstate", "serve", "--model", str(tiny_chat), "--port", str(port)]
    process = subprocess.Popen([*command, "--threads", "1", "--n-ctx", "256"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "specstate serve did not come up"
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=3, temperature=0).choices[0].text
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert f"http://127.0.0.1:{port}/v1" in stderr


PARKING = [(False, True), (True, True), (False, False)]
#: Tokens of the reply a higher-priority request parks: still running long after that request is served.
LONG_REPLY = 1200


@pytest.mark.parametrize(("spill", "streamed"), PARKING, ids=["in-memory", "spilled", "whole-answer"])
def test_a_higher_priority_request_parks_a_running_reply_that_then_resumes_exactly(
    tiny_chat: Path, tmp_path: Path, spill: bool, streamed: bool
) -> None:
    """The parked reply's checkpoint stays in memory, or (beyond ``parked_bytes``) goes to the spill directory;
    a whole (non-streamed) answer parks too."""
    spilling = {"parked_bytes": 0, "spill_dir": str(tmp_path / "spill")} if spill else {}
    server = Live(config(tiny_chat, slots=1, queue=4, n_ctx=4096, **spilling))
    try:
        client = server.client()
        story: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]
        chunks: list[str] = []
        whole: list[Any] = []

        def low() -> None:
            if not streamed:
                whole.append(
                    client.chat.completions.create(model=MODEL, messages=story, max_tokens=LONG_REPLY, temperature=0)
                )
                return
            stream = client.chat.completions.create(
                model=MODEL, messages=story, max_tokens=LONG_REPLY, temperature=0, stream=True
            )
            chunks.extend(c.choices[0].delta.content or "" for c in stream)

        reader = threading.Thread(target=low)
        reader.start()
        started = time.monotonic()
        while len(chunks) < 20 and not (
            not streamed and server.state.scheduler.busy and time.monotonic() > started + 0.3
        ):
            assert time.monotonic() < started + 60 and reader.is_alive(), "the low-priority reply did not start"
            time.sleep(0.01)
        urgent = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Quick!"}],
            max_tokens=8,
            temperature=0,
            extra_body={"priority": 10},
        )
        assert urgent.choices[0].message.content and reader.is_alive()  # served while the long one was parked
        reader.join(timeout=120)
        metrics = server.get("/metrics")[1]
        assert "specstate_preemptions_total 1" in metrics and "specstate_parked_bytes 0" in metrics
        assert f"specstate_spilled_checkpoints_total {int(spill)}" in metrics
    finally:
        server.stop()
    if spill:
        assert (tmp_path / "spill").is_dir() and not list((tmp_path / "spill").iterdir())  # read back, removed
    generator = Generator(Model(tiny_chat), mode="ngram", n_ctx=4096, n_threads=1)
    expected = generator.chat("Tell me a long story.", max_tokens=LONG_REPLY)
    if streamed:
        assert "".join(chunks) == expected  # no gap, no duplicate
    else:
        (answer,) = whole
        assert answer.choices[0].message.content == expected and answer.usage.completion_tokens == LONG_REPLY


def sampled_stream(client: openai.OpenAI, driver: Any, kill_at: int | None) -> str:
    """A seeded sampled chat's streamed text, its worker killed at its ``kill_at``-th chunk (None: not)."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Sing."}]
    pieces: list[str] = []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=300, temperature=1.0, seed=11, stream=True
    ):
        pieces.append(chunk.choices[0].delta.content or "")
        if len(pieces) == kill_at:
            (running,) = [index for index, worker in enumerate(driver.workers) if worker.running]
            os.kill(driver.worker_pid(running), signal.SIGKILL)
    return "".join(pieces)


def test_ray_workers_lose_nothing_when_a_worker_dies(tiny_chat: Path) -> None:
    """``--ray-workers 4``: the worker of a running stream is killed, and the stream goes on from another worker,
    its text the uninterrupted reply (a sampled one from its latest snapshot, a greedy one run again); the
    follow-up turn goes to the worker that finished the first; that one is killed too, and the next turn continues
    the conversation from its checkpoint on another worker, exactly; the same conversation from another tenant
    (another ``user``) is neither continued nor restored."""
    server = Live(config(tiny_chat, ray_workers=4, n_ctx=4096, limits=RequestLimits(max_tokens=600)))
    driver = server.state.driver
    assert driver is not None
    turns = ["Tell me a long story.", "Go on.", "And then?"]
    replies: list[str] = []
    try:
        client = server.client()
        sampled = sampled_stream(client, driver, kill_at=40)  # resumed from its latest snapshot
        assert sampled == sampled_stream(client, driver, kill_at=None)  # the reply it gets uninterrupted
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": turns[0]}]
        pieces: list[str] = []
        for chunk in client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=400, temperature=0, stream=True
        ):
            pieces.append(chunk.choices[0].delta.content or "")
            if len(pieces) == 20:
                (running,) = [index for index, worker in enumerate(driver.workers) if worker.running]
                os.kill(driver.worker_pid(running), signal.SIGKILL)
        replies.append("".join(pieces))
        killed = {running}
        for turn in turns[1:]:
            before = [(str(m["role"]), str(m["content"])) for m in messages] + [("assistant", replies[-1])]
            messages += [{"role": "assistant", "content": replies[-1]}, {"role": "user", "content": turn}]
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
            replies.append(reply.choices[0].message.content or "")
            holder = driver.holder_of([*before, ("user", turn), ("assistant", replies[-1])], DEFAULT_TENANT)
            assert holder is not None and holder not in killed
            if turn == turns[1]:  # the worker that held the conversation continued it; now it dies
                assert holder == driver.holder_of(before, DEFAULT_TENANT)
                os.kill(driver.worker_pid(holder), signal.SIGKILL)
                killed.add(holder)
                deadline = time.monotonic() + 30
                while driver.workers[holder].alive:  # the driver finds it dead at its next poll
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
        other = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0, user="u")
        assert other.choices[0].message.content is not None  # another tenant: nothing of the conversation reused
        metrics = server.get("/metrics")[1]
    finally:
        server.stop()
    assert "specstate_ray_requests_rerun_total 1" in metrics and "specstate_conversations_restored_total 1" in metrics
    assert "specstate_ray_requests_resumed_total 1" in metrics
    generator = Generator(Model(tiny_chat), mode="ngram", n_ctx=4096, n_threads=1)  # the same turns in one process
    assert replies == [generator.chat(turn, max_tokens=400 if i == 0 else 12) for i, turn in enumerate(turns)]


def test_a_rerun_sends_its_client_only_the_text_it_does_not_have() -> None:
    """A request run again after its worker died: its chunks keep the first run's labels, and its client is sent
    only the text after what it has (the role chunk once); a sampled stream without a seed is not run again."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "stream": True}
    request = read_request("chat", body, RequestLimits(), model_name=MODEL, template_source="")
    running = _Running(Job(request, lambda item: None), 0)

    def chunk(delta: dict[str, str], ident: str) -> dict[str, Any]:
        return {"id": ident, "created": 1, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}

    for delta in ({"role": "assistant"}, {"content": "Hello"}, {"content": " wor"}):
        assert running.news(chunk(delta, "first")) is not None
    assert running.reproducible()
    running.rerun()
    again = [
        running.news(chunk(d, "second"))
        for d in ({"role": "assistant"}, {"content": "Hel"}, {"content": "lo world"}, {})
    ]
    assert again[:2] == [None, None]
    assert again[2] is not None and again[2]["choices"][0]["delta"]["content"] == "ld" and again[2]["id"] == "first"
    assert again[3] is not None and again[3]["id"] == "first"
    sampled = read_request("chat", {**body, "temperature": 0.7}, RequestLimits(), model_name=MODEL, template_source="")
    running = _Running(Job(sampled, lambda item: None), 0)
    assert running.reproducible() and running.news(chunk({"content": "Hi"}, "first")) is not None
    assert not running.reproducible()


def test_completions_of_several_prompts_answer_a_choice_each_streamed_and_whole(live: Live, tiny_chat: Path) -> None:
    """OpenAI's list of prompts (LangChain's completions class always sends one): a choice per prompt, in order,
    the usage summed; a list of token-id lists too; the number is bounded."""
    client = live.client()
    prompts = ["Once upon a time", "The sea"]
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    texts = [a.choices[0].text for a in alone]
    whole = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert [(c.index, c.text) for c in whole.choices] == list(enumerate(texts))
    assert whole.usage is not None and all(a.usage is not None for a in alone)
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone if a.usage)
    assert whole.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone if a.usage)
    streamed = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, stream=True))
    assert len({chunk.id for chunk in streamed}) == 1
    assert ["".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in (0, 1)] == texts
    tokens = [Model(tiny_chat).tokenize(p, add_special=True, parse_special=True) for p in prompts]
    by_tokens = client.completions.create(model=MODEL, prompt=tokens, max_tokens=6, temperature=0)
    assert [c.text for c in by_tokens.choices] == texts
    status, error, _ = live.post("/v1/completions", json.dumps({"prompt": ["x"] * 33}).encode())
    assert status == 400 and error["error"]["param"] == "prompt"  # type: ignore[index]
    several = read_request("completion", {"prompt": prompts}, RequestLimits(), model_name=MODEL, template_source="")
    assert several.prompts == tuple(prompts)
