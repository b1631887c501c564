"""A chat template comes from a model file, and a model file is hostile input: rendering it is bounded in steps,
text and time (llama.cpp's Jinja engine, patch 0010), runs without holding the GIL, and a template past a bound is
a clear error when it is loaded: by :func:`specstate.chat.chat_template`, :class:`specstate.Llama` and
``specstate serve`` (which names the file and does not start)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specstate import Llama, Model
from specstate.chat import chat_template
from specstate.errors import ChatTemplateError
from specstate.serve.app import Server
from specstate.serve.config import ServerConfig
from specstate_testkit import models

BOUND = "exceeds a rendering bound"
#: Nested loops over huge ranges: unbounded, setup never ends.
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}"
#: A quarter of a million small steps: more time than a render may take.
SLOW = "{% for i in range(500) %}{% for j in range(500) %}{% endfor %}{% endfor %}"
#: Each asks for a huge amount of memory in one expression, or by doubling a string.
HOSTILE = {
    "range": "{{ range(1000000000000) | length }}",
    "repetition": "{{ 'x' * 1000000000000 }}",
    "large repetition": "{{ ('x' * 1000000) * 300 }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    "{{ ns.s }}",
    "indent": "{{ 'a\\nb' | indent(1000000000000) }}",
    "loops": LOOPS,
}
#: Time enough for a template stopped by its time bound, on a loaded machine.
STOPPED_WITHIN_SECONDS = 30


@pytest.fixture(scope="module")
def template_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("templates")
    sources = {**HOSTILE, "slow": SLOW}
    return {
        name: models.build_llama(folder / f"{index}.gguf", chat_template=source)
        for index, (name, source) in enumerate(sources.items())
    }


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_template_past_a_bound_is_a_clear_error_at_load(name: str, template_models: dict[str, Path]) -> None:
    model = Model(str(template_models[name]))
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=BOUND):
        chat_template(model)
    assert time.monotonic() - started < STOPPED_WITHIN_SECONDS


def test_other_threads_run_while_a_template_renders(template_models: dict[str, Path]) -> None:
    model = Model(str(template_models["slow"]))
    ticks, done = [0], threading.Event()

    def count() -> None:
        while not done.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        with pytest.raises(ChatTemplateError, match="ms"):
            chat_template(model)
    finally:
        done.set()
        counter.join()
    assert ticks[0] > 100_000, "the counting thread stood still: the render held the GIL"


def test_a_llama_chat_with_such_a_template_fails_in_bounded_time(template_models: dict[str, Path]) -> None:
    llama = Llama(str(template_models["loops"]), n_ctx=256, n_threads=1)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=BOUND):
        llama.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2)
    assert time.monotonic() - started < STOPPED_WITHIN_SECONDS


def test_the_server_does_not_start_on_such_a_template_and_names_the_file(template_models: dict[str, Path]) -> None:
    path = template_models["loops"]
    server = Server(ServerConfig(model_path=str(path), n_ctx=256, n_threads=1, slots=1))
    try:
        with pytest.raises(ChatTemplateError, match=BOUND) as refused:
            server.start()
    finally:
        server.stop()
    assert str(path) in str(refused.value) and "--template" in str(refused.value)


def test_specstate_serve_exits_naming_the_file(template_models: dict[str, Path]) -> None:
    path = template_models["range"]
    command = [sys.executable, "-m", "specstate", "serve", "--model", str(path), "--port", "0", "--threads", "1"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0
    assert str(path) in finished.stderr and BOUND in finished.stderr


def test_a_template_with_another_template_given_in_its_place_serves(template_models: dict[str, Path]) -> None:
    llama = Llama(str(template_models["loops"]), n_ctx=256, n_threads=1, chat_format="chatml")
    reply = llama.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply["choices"][0]["message"]["role"] == "assistant"
