"""specstate.Llama: llama-cpp-python's calls on real models, results checked with the openai package's own types."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion as OpenAICompletion
from openai.types import CompletionChoice as OpenAICompletionChoice
from openai.types.chat import ChatCompletion as OpenAIChatCompletion
from openai.types.chat import ChatCompletionChunk as OpenAIChatCompletionChunk

from specstate import Generator, Llama, LlamaGrammar, Model
from specstate.llama import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    UnsupportedParameterError,
    call_settings,
    read_chat,
)
from specstate_testkit import models
from test_chat import TINY_TEMPLATE

N_CTX = 256
PROMPT = "Once upon a time"
#: A template that reads each message's ``name``, which specstate cannot pass to it.
NAMED_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message.name }}: {{ message['content'] }}\n{% endfor %}"
)


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama model with TINY_TEMPLATE in its metadata."""
    return models.build_llama(tmp_path_factory.mktemp("llama_api") / "templated.gguf", chat_template=TINY_TEMPLATE)


def tiny_llama(path: Path, **settings: Any) -> Llama:
    """A Llama over the tiny model: small context, one thread, a fixed seed."""
    return Llama(str(path), n_ctx=N_CTX, n_batch=64, n_threads=1, seed=7, **settings)


@pytest.fixture
def llm(tiny_chat: Path) -> Llama:
    return tiny_llama(tiny_chat)


def completion_chunks_valid(chunks: list[CompletionChunk]) -> str:
    """Check every chunk against openai's ``Completion``; return their text.

    The SDK's ``CompletionChoice`` requires a ``finish_reason``, which the API
    (and llama-cpp-python) leave null until the last chunk: the others are
    checked with it filled in, after checking it is null.
    """
    for chunk in chunks[:-1]:
        assert chunk["choices"][0]["finish_reason"] is None
        choice = {**chunk["choices"][0], "finish_reason": "length"}
        OpenAICompletion.model_validate({**chunk, "choices": [choice]})
    OpenAICompletion.model_validate(chunks[-1])
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    return "".join(chunk["choices"][0]["text"] for chunk in chunks)


def chat_chunks_valid(chunks: Iterator[ChatCompletionChunk]) -> tuple[str, str | None]:
    """Check every chunk against openai's ``ChatCompletionChunk``; return the content and the finish reason."""
    listed = list(chunks)
    for chunk in listed:
        OpenAIChatCompletionChunk.model_validate(chunk)
    assert listed[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert listed[-1]["choices"][0]["delta"] == {}
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in listed[:-1])
    assert len({chunk["id"] for chunk in listed}) == 1
    content = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in listed[1:-1])
    return content, listed[-1]["choices"][0]["finish_reason"]


def text_of(completion: Completion) -> str:
    """The completion's text, after checking the whole result against openai's type."""
    parsed = OpenAICompletion.model_validate(completion)
    assert parsed.usage is not None
    assert parsed.usage.total_tokens == parsed.usage.prompt_tokens + parsed.usage.completion_tokens
    return completion["choices"][0]["text"]


def content_of(reply: ChatCompletion) -> str:
    """The reply's content, after checking the whole result against openai's type."""
    parsed = OpenAIChatCompletion.model_validate(reply)
    assert parsed.choices[0].message.role == "assistant"
    content = reply["choices"][0]["message"]["content"]
    assert content is not None  # a reply without tools always has text
    return content


# --- completions ---------------------------------------------------------------------------------


def test_a_completion_has_openais_shape_and_counts_its_tokens(llm: Llama) -> None:
    result = llm(PROMPT, max_tokens=8, temperature=0.0)
    text_of(result)
    assert result["object"] == "text_completion" and result["id"].startswith("cmpl-")
    assert result["model"] == llm.model_path
    OpenAICompletionChoice.model_validate(result["choices"][0])
    assert result["choices"][0]["finish_reason"] == "length"
    prompt_tokens = llm.model.tokenize(PROMPT, parse_special=True)
    assert result["usage"] == {
        "prompt_tokens": len(prompt_tokens),
        "completion_tokens": 8,
        "total_tokens": len(prompt_tokens) + 8,
    }
    assert llm.create_completion(PROMPT, max_tokens=8, temperature=0.0, model="tiny")["model"] == "tiny"


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_greedy_completions_equal_the_generators_tokens(tiny_chat: Path, mode: str) -> None:
    llm = tiny_llama(tiny_chat, mode=mode)
    result = llm.create_completion(PROMPT, max_tokens=30, temperature=0)
    generator = Generator(Model(tiny_chat), n_ctx=N_CTX, n_batch=64, n_threads=1)
    expected = generator.generate(PROMPT, max_tokens=30)
    assert text_of(result) == expected
    assert result["usage"]["completion_tokens"] == len(generator.tokens) == 30
    assert llm.detokenize(generator.tokens) == expected.encode()
    prompt_ids = generator.prompt_tokens
    assert text_of(llm(prompt_ids, max_tokens=30, temperature=0)) == expected
    chunks = list(llm(prompt_ids, max_tokens=30, temperature=0, stream=True))  # one chunk per token here
    pieces = [llm.detokenize([token]).decode() for token in generator.tokens]
    assert [chunk["choices"][0]["text"] for chunk in chunks[:-1]] == pieces


def test_a_stop_string_ends_the_text_before_it(llm: Llama) -> None:
    full = text_of(llm(PROMPT, max_tokens=30, temperature=0))
    stop = full[10:13]
    result = llm(PROMPT, max_tokens=30, temperature=0, stop=["never there", stop])
    assert text_of(result) == full[: full.index(stop)]
    assert result["choices"][0]["finish_reason"] == "stop"
    chunks = list(llm(PROMPT, max_tokens=30, temperature=0, stop=stop, stream=True))
    assert completion_chunks_valid(chunks) == full[: full.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_completion_is_the_same_text(llm: Llama) -> None:
    whole = text_of(llm(PROMPT, max_tokens=12, temperature=0))
    chunks = list(llm.create_completion(PROMPT, max_tokens=12, temperature=0, stream=True))
    assert completion_chunks_valid(chunks) == whole
    assert len(chunks) > 2 and chunks[-1]["choices"][0] == {
        "text": "",
        "index": 0,
        "logprobs": None,
        "finish_reason": "length",
    }
    echoed = list(llm(PROMPT, max_tokens=12, temperature=0, stream=True, echo=True))
    assert completion_chunks_valid(echoed) == PROMPT + whole
    assert text_of(llm(PROMPT, max_tokens=12, temperature=0, echo=True)) == PROMPT + whole


def test_no_max_tokens_runs_until_the_context_is_full(tiny_chat: Path) -> None:
    llm = Llama(str(tiny_chat), n_ctx=64, n_batch=64, n_threads=1)
    length = Generator(llm.model, n_ctx=64, n_batch=64).context_length  # llama.cpp may round n_ctx up
    for max_tokens in (None, 0, -1):
        result = llm(PROMPT, max_tokens=max_tokens, temperature=0)
        assert result["choices"][0]["finish_reason"] == "length"
        assert result["usage"]["total_tokens"] == length


def test_sampling_is_seeded(llm: Llama) -> None:
    first = text_of(llm(PROMPT, max_tokens=20, temperature=1.0, top_k=0, top_p=1.0))
    assert text_of(llm(PROMPT, max_tokens=20, temperature=1.0, top_k=0, top_p=1.0)) == first  # the constructor's seed
    other = [text_of(llm(PROMPT, max_tokens=20, temperature=1.0, top_k=0, top_p=1.0, seed=s)) for s in (1, 2, 1)]
    assert other[0] == other[2] and len({*other, first}) > 1


# --- chat ----------------------------------------------------------------------------------------


def test_a_chat_completion_has_openais_shape(llm: Llama) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    reply = llm.create_chat_completion(messages, max_tokens=10, temperature=0)
    content = content_of(reply)
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["choices"][0]["finish_reason"] == "length"
    generator = llm.chat_generator
    assert generator is not None and generator.messages[-1]["content"] == content
    assert reply["usage"]["prompt_tokens"] == len(generator.prompt_tokens)
    assert reply["usage"]["completion_tokens"] == len(generator.tokens) == 10
    streamed = tiny_llama(Path(llm.model_path)).create_chat_completion(
        messages, max_tokens=10, temperature=0, stream=True
    )
    assert chat_chunks_valid(streamed) == (content, "length")


def test_a_resent_history_decodes_only_the_new_message(llm: Llama) -> None:
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Tell me a story."}]
    first = llm.create_chat_completion(messages, max_tokens=6, temperature=0)
    generator = llm.chat_generator
    assert generator is not None
    held = generator._native.history
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    second, finish = chat_chunks_valid(llm.create_chat_completion(messages, max_tokens=6, temperature=0, stream=True))
    assert llm.chat_generator is generator and finish == "length"
    assert [m["role"] for m in generator.messages] == ["user", "assistant", "user", "assistant"]
    assert generator.messages[:3] == messages and generator.messages[3]["content"] == second
    assert generator._native.history[: len(held)] == held  # the first turn was kept, not decoded again
    messages += [{"role": "assistant", "content": second}, {"role": "user", "content": "And then?"}]
    llm.create_chat_completion(messages, max_tokens=6, temperature=0, seed=99)  # greedy: the seed changes nothing
    assert llm.chat_generator is generator and len(generator.messages) == 6


def test_a_full_context_ends_the_reply_and_then_refuses_the_next_turn(tiny_chat: Path) -> None:
    llm = Llama(str(tiny_chat), n_ctx=64, n_batch=64, n_threads=1)
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Hi"}]
    reply = llm.create_chat_completion(messages, temperature=0)  # max_tokens None: until the context is full
    generator = llm.chat_generator
    assert generator is not None and reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["total_tokens"] == generator.context_length
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "More."}]
    with pytest.raises(ValueError, match="no room"):
        llm.create_chat_completion(messages, temperature=0)
    assert llm.chat_generator is None  # a failed turn leaves no conversation to continue


def test_another_history_or_sampling_starts_a_new_generation(llm: Llama) -> None:
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Tell me a story."}]
    first = llm.create_chat_completion(messages, max_tokens=6, temperature=0)
    generator = llm.chat_generator
    changed = [{"role": "user", "content": "Tell me a joke."}, first["choices"][0]["message"]]
    llm.create_chat_completion([*changed, {"role": "user", "content": "Go on."}], max_tokens=6, temperature=0)
    assert llm.chat_generator is not generator
    assert llm.chat_generator is not None and len(llm.chat_generator.messages) == 4
    generator = llm.chat_generator
    history = [*generator.messages, {"role": "user", "content": "More."}]
    llm.create_chat_completion(history, max_tokens=6, temperature=0.5)
    assert llm.chat_generator is not generator and len(llm.chat_generator.messages) == 6


def test_a_chat_stop_string_cuts_the_reply(llm: Llama) -> None:
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Hi"}]
    full = content_of(llm.create_chat_completion(messages, max_tokens=20, temperature=0))
    stop = full[8:11]
    cut = tiny_llama(Path(llm.model_path)).create_chat_completion(messages, max_tokens=20, temperature=0, stop=stop)
    assert content_of(cut) == full[: full.index(stop)] and cut["choices"][0]["finish_reason"] == "stop"
    streamed = llm.create_chat_completion(messages, max_tokens=20, temperature=0, stop=[stop], stream=True)
    assert chat_chunks_valid(streamed) == (full[: full.index(stop)], "stop")
    generator = llm.chat_generator
    messages += [cut["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    llm.create_chat_completion(messages, max_tokens=4, temperature=0)
    assert llm.chat_generator is not generator  # the generator recorded the text after the stop: a new generation


def test_content_parts_and_names(tiny_chat: Path) -> None:
    plain = [{"role": "user", "content": "Hello\nthere"}]
    parts = [
        {
            "role": "user",
            "name": "ann",
            "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}],
        }
    ]
    expected = content_of(tiny_llama(tiny_chat).create_chat_completion(plain, max_tokens=8, temperature=0))
    assert content_of(tiny_llama(tiny_chat).create_chat_completion(parts, max_tokens=8, temperature=0)) == expected
    image = {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
    with pytest.raises(ValueError, match="image_url"):
        tiny_llama(tiny_chat).create_chat_completion([{"role": "user", "content": [image]}])
    with pytest.raises(ValueError, match="'audio' is not supported"):
        tiny_llama(tiny_chat).create_chat_completion([{"role": "user", "content": "x", "audio": {}}])
    named = tiny_llama(tiny_chat, chat_template=NAMED_TEMPLATE)
    with pytest.raises(ValueError, match="'name' is not supported"):
        named.create_chat_completion(parts, max_tokens=2)


BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"temperature": -1.0}, ValueError),
    ({"temperature": float("nan")}, ValueError),
    ({"temperature": True}, TypeError),
    ({"top_p": 0.0}, ValueError),
    ({"top_p": 1.5}, ValueError),
    ({"top_k": 1.5}, TypeError),
    ({"top_k": True}, TypeError),
    ({"seed": "1"}, TypeError),
    ({"seed": 2**64}, ValueError),
    ({"max_tokens": True}, TypeError),
    ({"max_tokens": 2.0}, TypeError),
    ({"stop": [1]}, TypeError),
    ({"stream": 1}, TypeError),
    ({"model": 3}, TypeError),
    ({"n_ctx": 3}, TypeError),
    ({"min_p": 2.0}, ValueError),
    ({"min_p": True}, TypeError),
    ({"repeat_penalty": 0.0}, ValueError),
    ({"logit_bias": {10**9: 1.0}}, ValueError),
    ({"logit_bias": [1]}, TypeError),
    ({"tfs_z": 0.5}, UnsupportedParameterError),
    ({"grammar": "root ::= foo"}, ValueError),
    ({"grammar": 3}, TypeError),
]


@pytest.mark.parametrize(("arguments", "error"), BAD_ARGUMENTS)
def test_bad_arguments_change_nothing(llm: Llama, arguments: dict[str, Any], error: type[Exception]) -> None:
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Hi"}]
    first = llm.create_chat_completion(messages, max_tokens=4, temperature=0)
    generator = llm.chat_generator
    assert generator is not None
    before = generator.checkpoint()
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    with pytest.raises(error):
        llm.create_chat_completion(messages, **{"max_tokens": 4, **arguments})
    with pytest.raises(error):
        llm.create_completion(PROMPT, **{"max_tokens": 4, **arguments})
    assert llm.chat_generator is generator and generator.checkpoint() == before
    for bad in ([], "Hi", [{"role": "user"}], [{"role": 1, "content": "x"}], [{"role": "user", "content": [3]}]):
        with pytest.raises((TypeError, ValueError)):
            llm.create_chat_completion(bad)  # type: ignore[arg-type]
    assert llm.chat_generator is generator and generator.checkpoint() == before


UNSUPPORTED: list[tuple[str, object, object]] = [
    ("tfs_z", 0.5, 1.0),
    ("mirostat_mode", 2, 0),
]


@pytest.mark.parametrize(("name", "value", "neutral"), UNSUPPORTED)
def test_unsupported_parameters_only_at_neutral_values(llm: Llama, name: str, value: object, neutral: object) -> None:
    for call in (
        lambda **kw: llm(PROMPT, **kw),
        lambda **kw: llm.create_chat_completion([{"role": "user", "content": "x"}], **kw),
    ):
        with pytest.raises(UnsupportedParameterError, match=f"^{name}=") as raised:
            call(max_tokens=2, **{name: value})
        assert isinstance(raised.value, NotImplementedError)
        assert call(max_tokens=2, **{name: neutral})["choices"][0]["finish_reason"] == "length"
    with pytest.raises(UnsupportedParameterError, match="mirostat_mode"):
        llm(PROMPT, mirostat_mode=False)  # a bool does not stand for 0


def test_the_sampler_chain_parameters_reach_the_generator(tiny_chat: Path) -> None:
    """Penalties and a logit bias apply to greedy calls as in llama.cpp: the same text as a generator given them."""
    llm = tiny_llama(tiny_chat)
    plain = Generator(Model(tiny_chat), n_ctx=N_CTX, n_batch=64, n_threads=1)
    plain.generate(PROMPT, max_tokens=12)
    banned = {plain.tokens[0]: -100.0}
    chain: dict[str, Any] = {"repeat_penalty": 1.5, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    generator = Generator(Model(tiny_chat), n_ctx=N_CTX, n_batch=64, n_threads=1, logit_bias=banned, **chain)
    expected = generator.generate(PROMPT, max_tokens=12)
    assert generator.tokens[0] != plain.tokens[0]
    result = llm(PROMPT, max_tokens=12, temperature=0, logit_bias=banned, **chain)
    assert text_of(result) == expected


def test_chat_only_and_completion_only_parameters(llm: Llama) -> None:
    messages = [{"role": "user", "content": "x"}]
    neutral = llm.create_chat_completion(messages, max_tokens=2, logprobs=False, response_format={"type": "text"})
    content_of(neutral)
    with pytest.raises(TypeError, match="response_format"):
        llm(PROMPT, response_format={"type": "json_object"})  # type: ignore[call-overload]
    with pytest.raises(UnsupportedParameterError, match="tools"):  # tools constrain the reply themselves
        tool = {"type": "function", "function": {"name": "f"}}
        llm.create_chat_completion(messages, tools=[tool], response_format={"type": "json_object"})
    with pytest.raises(TypeError, match="top_logprobs"):
        llm(PROMPT, top_logprobs=2)  # type: ignore[call-overload]
    with pytest.raises(UnsupportedParameterError, match="suffix"):
        llm(PROMPT, suffix="end")
    with pytest.raises(TypeError, match="echo"):
        llm.create_chat_completion(messages, echo=True)  # type: ignore[call-overload]


def test_n_ctx_zero_is_the_trained_length(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    assert llm.n_ctx() == N_CTX
    trained = Llama(str(tiny_chat), n_ctx=0, n_threads=1)
    assert trained.n_ctx() == trained.model.n_ctx_train > 0
    reply = trained.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=3)
    assert reply["usage"]["completion_tokens"] == 3


def test_constructor_arguments(tiny_chat: Path) -> None:
    with pytest.raises(ValueError, match="chat_format"):
        Llama(str(tiny_chat), chat_format="alpaca")  # llama-cpp-python names llama.cpp has no template for
    with pytest.raises(ValueError, match="mode"):
        Llama(str(tiny_chat), mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_policy"):
        Llama(str(tiny_chat), draft_policy="greedy")  # type: ignore[arg-type]
    wrong: list[tuple[str, Any]] = [
        *(("seed", True), ("n_ctx", "64"), ("n_threads", True), ("n_draft", 2.0), ("cost_curve", [1, 2.5]))
    ]
    for name, value in wrong:
        with pytest.raises(TypeError, match=name):
            Llama(str(tiny_chat), **{name: value})
    llm = Llama(str(tiny_chat), n_ctx=128, n_threads=1, chat_format="chatml")
    assert llm.n_ctx() == 128 and llm.detokenize(llm.tokenize(b"Hello", add_bos=False)) == b"Hello"
    reply = llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=2)
    assert "<|im_start|>" in llm.model.detokenize(llm.chat_generator.prompt_tokens, special=True)  # type: ignore[union-attr]
    llm.reset()
    assert llm.chat_generator is None and reply["choices"][0]["finish_reason"] == "length"


def test_chat_format_takes_jinja_source_as_documented_and_refuses_unknown_names_briefly(tiny_chat: Path) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    given = tiny_llama(tiny_chat, chat_format=TINY_TEMPLATE).create_chat_completion(messages, max_tokens=4, seed=1)
    own = tiny_llama(tiny_chat).create_chat_completion(messages, max_tokens=4, seed=1)  # TINY_TEMPLATE is the model's
    assert given["choices"] == own["choices"]
    hermes = (Path(__file__).resolve().parents[2] / "examples" / "hermes_tools.jinja").read_text()
    assert len(tiny_llama(tiny_chat, chat_format=hermes).create_chat_completion(messages, max_tokens=2)["choices"]) == 1
    with pytest.raises(ValueError, match="chat_format 'alpaca' is not available") as refused:
        tiny_llama(tiny_chat, chat_format="alpaca")
    assert len(str(refused.value)) < 300 and "chat_template" not in str(refused.value)


def test_tool_choice_required_without_a_known_tool_format_says_which_template_option_to_give(llm: Llama) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(UnsupportedParameterError, match=r"chat_template=.*--template") as refused:
        llm.create_chat_completion([{"role": "user", "content": "x"}], tools=[tool], tool_choice="required")
    assert "tool_choice='auto'" not in str(refused.value)


def test_an_adaptive_llama_pins_one_cost_curve_for_all_its_generations(tiny_chat: Path) -> None:
    assert tiny_llama(tiny_chat, mode="draft", draft_model_path=tiny_chat).pin_cost_curve() is None  # fixed policy
    # Prompt lookup's text does not depend on its draft lengths: each generation corrects its own estimate.
    assert tiny_llama(tiny_chat, mode="ngram", n_draft=3, draft_policy="adaptive").pin_cost_curve() is None
    llm = tiny_llama(tiny_chat, mode="draft", draft_model_path=tiny_chat, n_draft=3, draft_policy="adaptive")
    curve = llm.pin_cost_curve()
    assert curve is not None and len(curve) == 4 and all(cost > 0 for cost in curve)  # 1..n_draft + 1 rows
    assert llm.pin_cost_curve() == curve  # measured once
    greedy = text_of(llm.create_completion(PROMPT, max_tokens=12, temperature=0))
    assert llm._last is not None and llm._last.cost_curve == curve  # the generations draft from it
    assert greedy == text_of(tiny_llama(tiny_chat).create_completion(PROMPT, max_tokens=12, temperature=0))
    # Two objects pinned alike draft alike, so a sampled reply is the same from either.
    again = tiny_llama(
        tiny_chat, mode="draft", draft_model_path=tiny_chat, n_draft=3, draft_policy="adaptive", cost_curve=curve
    )
    assert again.pin_cost_curve() == curve
    sampled = [x.create_completion(PROMPT, max_tokens=12, temperature=0.9, seed=7) for x in (llm, again)]
    assert text_of(sampled[0]) == text_of(sampled[1])


# --- a real model --------------------------------------------------------------------------------


def test_smollm2_chat_in_llama_cpp_python_style(smollm2_file: Path) -> None:
    llm = Llama(str(smollm2_file), n_ctx=256, n_threads=1, seed=3)  # chat defaults: temperature 0.2, seeded
    messages: list[Mapping[str, object]] = [{"role": "system", "content": "You answer in one short sentence."}]
    replies, generators = [], []
    for question in ("What is the capital of France?", "And of Germany?"):
        messages.append({"role": "user", "content": question})
        chunks = llm.create_chat_completion(messages, max_tokens=16, stream=True, stop=["\n\n"])
        content, finish = chat_chunks_valid(chunks)
        messages.append({"role": "assistant", "content": content})
        generator = llm.chat_generator
        assert generator is not None and finish == "stop" and generator.stopped_by == "eos"
        assert generator.messages == messages
        replies.append(content)
        generators.append(generator)
    assert "Paris" in replies[0] and "Berlin" in replies[1]
    assert generators[0] is generators[1]  # the second turn decoded only the new message


def test_completion_log_probabilities(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat, mode="ngram")
    whole = llm(PROMPT, max_tokens=20, temperature=0, logprobs=3)
    OpenAICompletion.model_validate(whole)
    choice = whole["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs is not None and len(logprobs["tokens"]) == 20
    assert "".join(logprobs["tokens"]) == choice["text"]  # the tiny model's tokens are ASCII
    # Offsets count from the prompt's start, as OpenAI's and llama-cpp-python's do (the prompt not echoed).
    assert logprobs["text_offset"] == [len(PROMPT) + sum(map(len, logprobs["tokens"][:i])) for i in range(20)]
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert top is not None and top[token] == logprob and len(top) <= 4 and logprob is not None and logprob <= 0
    plain = tiny_llama(tiny_chat)(PROMPT, max_tokens=20, temperature=0, logprobs=3)
    assert plain["choices"][0]["logprobs"] == logprobs  # speculation does not change them
    chunks = list(llm(PROMPT, max_tokens=20, temperature=0, logprobs=3, stream=True))
    streamed = [c["choices"][0]["logprobs"] for c in chunks]
    assert [t for part in streamed if part for t in part["tokens"]] == logprobs["tokens"]
    assert [o for part in streamed if part for o in part["text_offset"]] == logprobs["text_offset"]
    cut = llm(PROMPT, max_tokens=20, temperature=0, logprobs=0, stop=[logprobs["tokens"][5]])
    cut_logprobs = cut["choices"][0]["logprobs"]
    assert cut_logprobs is not None and "".join(cut_logprobs["tokens"]) == text_of(cut)
    for bad in (-1, 21):
        with pytest.raises(ValueError, match="top_logprobs"):
            llm(PROMPT, max_tokens=2, logprobs=bad)


def test_echo_with_logprobs_scores_the_prompt_as_its_reply_was_scored(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    reply = llm(PROMPT, max_tokens=6, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    tokens = list(llm.save_state().input_ids)  # the prompt and that reply, as a new prompt
    assert reply is not None and tokens[0] != llm.token_bos()  # this model adds none
    echoed = llm(tokens, max_tokens=3, temperature=0, logprobs=2, echo=True)
    choice = echoed["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs is not None and choice["text"].startswith(llm.detokenize(tokens).decode())
    entries = len(tokens) + 3
    assert len(logprobs["tokens"]) == entries and "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"] == [sum(map(len, logprobs["tokens"][:i])) for i in range(entries)]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None  # OpenAI's first entry
    assert all(lp is not None and lp <= 0 for lp in logprobs["token_logprobs"][1:])
    scored = slice(len(tokens) - 6, len(tokens))  # the reply's tokens, scored as the reply scored them
    assert logprobs["token_logprobs"][scored] == reply["token_logprobs"]
    assert logprobs["top_logprobs"][scored] == reply["top_logprobs"]
    # (openai's types have no None entries, which OpenAI's API and llama-cpp-python send first: not checked here)
    chunks = list(llm(tokens, max_tokens=3, temperature=0, logprobs=2, echo=True, stream=True))
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == choice["text"]
    streamed = [c["choices"][0]["logprobs"] for c in chunks]
    assert [o for part in streamed if part for o in part["text_offset"]] == logprobs["text_offset"]
    text = llm(PROMPT, max_tokens=2, temperature=0, logprobs=0, echo=True)["choices"][0]
    assert text["logprobs"] is not None and "".join(text["logprobs"]["tokens"]) == text["text"]
    after_bos = llm([llm.token_bos(), *tokens], max_tokens=3, temperature=0, logprobs=2, echo=True)["choices"][0]
    assert after_bos["logprobs"] is not None and len(after_bos["logprobs"]["tokens"]) == entries  # BOS: no entry
    assert after_bos["logprobs"]["token_logprobs"][0] is None


def test_chat_log_probabilities(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat, mode="ngram")
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Hi"}]
    reply = llm.create_chat_completion(messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    OpenAIChatCompletion.model_validate(reply)
    logprobs = reply["choices"][0]["logprobs"]
    assert logprobs is not None and logprobs["content"] is not None and logprobs["refusal"] is None
    entries = logprobs["content"]
    assert "".join(entry["token"] for entry in entries) == content_of(reply)
    for entry in entries:
        assert len(entry["top_logprobs"]) == 2 and entry["bytes"] == list(entry["token"].encode())
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"]
    chunks = list(llm.create_chat_completion(messages, max_tokens=12, temperature=0, logprobs=True, stream=True))
    for chunk in chunks:
        OpenAIChatCompletionChunk.model_validate(chunk)
    streamed = [e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"] or []]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert all(e["top_logprobs"] == [] for e in streamed)  # top_logprobs 0
    with pytest.raises(ValueError, match="top_logprobs needs logprobs=True"):
        llm.create_chat_completion(messages, top_logprobs=2)
    without = llm.create_chat_completion(messages, max_tokens=4, logprobs=False)
    assert without["choices"][0]["logprobs"] is None


def test_a_parked_stream_keeps_reporting_log_probabilities(tiny_chat: Path) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me a long story."}]
    options: dict[str, Any] = {"max_tokens": 40, "temperature": 0.9, "seed": 3, "logprobs": True, "top_logprobs": 1}
    whole = tiny_llama(tiny_chat, mode="ngram").create_chat_completion(messages, **options)
    expected = whole["choices"][0]["logprobs"]
    llm = tiny_llama(tiny_chat, mode="ngram")
    stream = llm.create_chat_completion(messages, stream=True, **options)
    first = [next(stream) for _ in range(4)]
    parked = stream.park()
    assert parked is not None
    rest = list(tiny_llama(tiny_chat, mode="ngram").resume_chat(parked))
    entries = [
        e for c in first + rest if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"] or []
    ]
    assert expected is not None and entries == expected["content"]


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        {"type": "json_object", "schema": PERSON},
    ],
)
def test_response_format_gives_json_that_follows_the_schema(smollm2_file: Path, response_format: Any) -> None:
    llm = Llama(str(smollm2_file), n_ctx=512, n_threads=2, mode="ngram", seed=5)
    messages: list[Mapping[str, object]] = [{"role": "user", "content": "Describe a person as JSON."}]
    reply = llm.create_chat_completion(messages, response_format=response_format, max_tokens=80)
    OpenAIChatCompletion.model_validate(reply)
    person = json.loads(content_of(reply))
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    assert reply["choices"][0]["finish_reason"] == "stop"
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "Another one."}]
    chunks = llm.create_chat_completion(messages, response_format=response_format, max_tokens=80, stream=True)
    content, finish = chat_chunks_valid(chunks)
    assert finish == "stop" and set(json.loads(content)) == {"name", "age"}
    assert llm.chat_generator is not None and len(llm.chat_generator.messages) == 4  # the same conversation


def test_any_json_object_and_a_grammar_object(smollm2_file: Path, tmp_path: Path) -> None:
    llm = Llama(str(smollm2_file), n_ctx=512, n_threads=2, seed=5)
    messages = [{"role": "user", "content": "Give me a JSON object with a name and an age."}]
    reply = llm.create_chat_completion(messages, response_format={"type": "json_object"}, temperature=0, max_tokens=120)
    assert isinstance(json.loads(content_of(reply)), dict) and reply["choices"][0]["finish_reason"] == "stop"
    path = tmp_path / "yes.gbnf"
    path.write_text('root ::= "yes" | "no"\n')
    for grammar in (LlamaGrammar.from_file(path), LlamaGrammar.from_string('root ::= "yes" | "no"')):
        answer = llm("Is the sky blue? Answer:", grammar=grammar, max_tokens=8, temperature=0)
        assert text_of(answer) in ("yes", "no") and answer["choices"][0]["finish_reason"] == "stop"
    schema = LlamaGrammar.from_json_schema(json.dumps({"type": "integer"}))
    assert int(text_of(llm("The answer is", grammar=schema, max_tokens=8)))


@pytest.mark.parametrize(
    ("response_format", "error", "message"),
    [
        ({"type": "xml"}, ValueError, "response_format type"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, ValueError, "must be an object"),
        ({"type": "json_object", "schema": "{}"}, ValueError, "must be an object"),
        ("json", TypeError, "response_format must be a mapping"),
    ],
)
def test_bad_response_formats_change_nothing(llm: Llama, response_format: Any, error: type, message: str) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(error, match=message):
        llm.create_chat_completion(messages, response_format=response_format)
    with pytest.raises(ValueError, match="not both"):
        llm.create_chat_completion(messages, response_format={"type": "json_object"}, grammar='root ::= "a"')
    assert llm.chat_generator is None


@pytest.mark.parametrize("mode", ["none", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_parked_chat_stream_resumes_elsewhere_token_for_token(tiny_chat: Path, mode: str, temperature: float) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me a long story."}]
    options: dict[str, Any] = {"max_tokens": 60, "temperature": temperature, "seed": 11, "stop": ["zz~"]}
    whole = tiny_llama(tiny_chat, mode=mode).create_chat_completion(messages, **options)
    stream = tiny_llama(tiny_chat, mode=mode).create_chat_completion(messages, stream=True, **options)
    first = [next(stream) for _ in range(12)]
    parked = stream.park()
    assert parked is not None and parked.remaining > 0
    pickle.loads(pickle.dumps(parked))  # it travels between processes
    other = tiny_llama(tiny_chat, mode=mode)
    rest = list(other.resume_chat(parked))
    chunks = first + rest
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("role")) == 1
    assert {c["id"] for c in chunks} == {first[0]["id"]}  # one reply
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == content_of(whole)
    assert rest[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    held = other.chat_generator
    assert held is not None and held.messages[-1]["content"].startswith(text)


def test_the_llama_cpp_python_chat_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama_cpp_python_chat.py"
    questions = ["--ask", "What is the capital of France?", "--ask", "And of Italy?"]
    result = subprocess.run(
        [sys.executable, str(example), *questions, "--seed", "1", "--threads", "2", "--max-tokens", "48"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "> What is the capital of France?" and "Paris" in lines[1]
    assert set(json.loads(lines[-1])) == {"topic", "questions"}


def test_the_calls_run_what_their_arguments_read_into(tiny_chat: Path) -> None:
    """``create_chat_completion`` and ``create_completion`` read their arguments once (``call_settings``,
    ``read_chat``) and run ``chat_stream`` and ``completion_stream`` on what they read: a caller that has read them
    (``specstate serve``) gets the same chunks."""
    messages = [{"role": "user", "content": "Hi"}]
    options: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "stop": ["x"], "logprobs": True, "top_logprobs": 2}
    asked = tiny_llama(tiny_chat).create_chat_completion(messages, stream=True, **options)
    llama = tiny_llama(tiny_chat)
    chat = read_chat(messages, llama.template_source, tools=False)
    assert chat.pairs == (("user", "Hi"),) and not chat.tools
    typed = llama.chat_stream(chat, call_settings(options, chat=True))
    assert [c["choices"] for c in typed] == [c["choices"] for c in asked]
    prompt: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 2}
    whole = tiny_llama(tiny_chat).create_completion("Once upon", **prompt)
    streamed = tiny_llama(tiny_chat).completion_stream("Once upon", call_settings(prompt, chat=False)).whole()
    assert whole["choices"] == streamed["choices"]


def test_a_snapshot_of_a_chat_stream_goes_on_token_for_token_in_another_llama(tiny_chat: Path) -> None:
    """``ChatStream.snapshot``: the reply between two chunks, the stream going on; another ``Llama`` resumes it
    (``resume_chat``) with the chunks the stream went on with, sampled too."""
    messages = [{"role": "user", "content": "Hi"}]
    stream = tiny_llama(tiny_chat).create_chat_completion(
        messages, stream=True, max_tokens=40, temperature=0.9, seed=5, stop=["\n\n"]
    )
    head = [next(stream) for _ in range(8)]
    taken = stream.snapshot()
    assert taken is not None and head[0]["choices"][0]["delta"] == {"role": "assistant"}
    rest = list(stream)
    resumed = list(tiny_llama(tiny_chat).resume_chat(taken))
    assert [c["choices"] for c in resumed] == [c["choices"] for c in rest]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
def test_grammar_drafts_leave_a_schema_reply_as_it_is(tiny_chat: Path, temperature: float) -> None:
    """``Llama(grammar_drafts=...)``: a reply under a response format's schema is the same on and off."""
    schema = {"type": "object", "properties": {"colour": {"type": "string"}, "size": {"type": "integer"}}}
    schema["required"] = ["colour", "size"]
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}
    messages: Any = [{"role": "user", "content": "Describe a thing."}]
    replies = []
    for on in (True, False):
        llm = tiny_llama(tiny_chat, grammar_drafts=on)
        reply = llm.create_chat_completion(
            messages, max_tokens=30, temperature=temperature, seed=3, response_format=response_format
        )
        replies.append(reply["choices"][0]["message"]["content"])
    assert replies[0] == replies[1]
