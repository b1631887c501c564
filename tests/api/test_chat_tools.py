"""Tools at the chat-template level: rendering with tools (llama.cpp's ``common_chat_templates_apply``) and its
parser, specstate's parsers of three formats, the stream reader, and grammars that make a real model's greedy
reply a call."""

from __future__ import annotations

import json
import string
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import ChatTemplateError, Generator, Model
from specstate.chat import (
    TOOL_CALL_FORMATS,
    ToolCallFormat,
    ToolCallStream,
    guess_tool_call_format,
    parse_tool_calls,
    render_tools,
    tool_call_grammar,
    tool_turn_tokens,
)
from specstate.tool_calls import MAX_JSON_DEPTH

#: A Hermes / Qwen 2.5 style template: tools in the system turn, calls in <tool_call> blocks, tool results
#: in a user turn.
HERMES_TEMPLATE = (Path(__file__).resolve().parents[2] / "examples" / "hermes_tools.jinja").read_text()

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}
FORECAST: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "The forecast for a city, for a number of days.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
TOOLS = [WEATHER, FORECAST]
HISTORY: list[Mapping[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]


# --- rendering with tools ------------------------------------------------------------------------


def test_a_template_receives_the_tools_the_calls_and_the_results(smollm2: Model) -> None:
    prompt = render_tools(smollm2, HISTORY, TOOLS, template=HERMES_TEMPLATE)
    assert prompt.format == "peg-native" and prompt.tool_call_format == "hermes"
    assert json.dumps(WEATHER["function"]["parameters"]) in prompt.text  # the tools, as the template writes them
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt.text
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n") and prompt.generation_prompt == "<|im_start|>assistant\n"
    assert "<tool_call>" in prompt.preserved_tokens
    assert smollm2.detokenize(prompt.tokens(), special=True) == prompt.text


def test_llama_cpp_builds_a_grammar_for_each_choice(smollm2: Model) -> None:
    auto = render_tools(smollm2, HISTORY, TOOLS, template=HERMES_TEMPLATE)
    assert auto.grammar_lazy and ("word", "<tool_call>\n", -1) in auto.grammar_triggers
    required = render_tools(smollm2, HISTORY, TOOLS, tool_choice="required", template=HERMES_TEMPLATE)
    assert required.grammar and not required.grammar_lazy
    named = render_tools(
        smollm2, HISTORY, TOOLS, tool_choice={"type": "function", "function": {"name": "x"}}, template=HERMES_TEMPLATE
    )
    assert named.text == required.text
    assert render_tools(smollm2, HISTORY, TOOLS, tool_choice="none", template=HERMES_TEMPLATE).grammar == ""


def test_llama_cpps_parser_reads_the_templates_calls(smollm2: Model) -> None:
    prompt = render_tools(smollm2, HISTORY, TOOLS, template=HERMES_TEMPLATE)
    reply = 'Checking.\n<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>'
    message = prompt.parse(reply)
    assert message["content"] == "Checking.\n"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_forecast"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome", "days": 3}
    assert call["id"].startswith("call_") and prompt.parse(reply)["tool_calls"][0]["id"] == call["id"]
    partial = prompt.parse(reply[: reply.index("Rome")], partial=True)
    assert partial["tool_calls"][0]["function"]["name"] == "get_forecast"
    assert prompt.parse("Just text.") == {"role": "assistant", "content": "Just text."}
    stream = prompt.stream()
    shown = "".join(stream.feed(reply[i : i + 5]) for i in range(0, len(reply), 5))
    rest, calls = stream.finish()
    assert stream.started and shown + rest == "Checking.\n" and calls == message["tool_calls"]


def test_a_next_turn_with_tools_decodes_only_what_follows_the_reply(smollm2: Model) -> None:
    first = HISTORY[:1]
    prompt = render_tools(smollm2, first, TOOLS, template=HERMES_TEMPLATE)
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    [im_end] = smollm2.tokenize("<|im_end|>", add_special=False, parse_special=True)
    held = prompt.tokens() + smollm2.tokenize(reply, add_special=False, parse_special=False) + [im_end]
    new = [{"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}]
    tail = tool_turn_tokens(smollm2, first, im_end, new, TOOLS, template=HERMES_TEMPLATE)
    whole = render_tools(
        smollm2, [*first, {"role": "assistant", "content": reply}, *new], TOOLS, template=HERMES_TEMPLATE
    )
    assert smollm2.detokenize(held + tail, special=True) == whole.text
    assert tail[0] != im_end  # the reply's end-of-turn token is not written twice
    with pytest.raises(ValueError, match="new message"):
        tool_turn_tokens(smollm2, first, im_end, [], TOOLS, template=HERMES_TEMPLATE)


def test_tools_need_a_jinja_template(smollm2: Model) -> None:
    with pytest.raises(ChatTemplateError, match="Jinja"):
        render_tools(smollm2, HISTORY, TOOLS, template="gemma")
    with pytest.raises(ValueError, match="tool_choice"):
        render_tools(smollm2, HISTORY, TOOLS, tool_choice="always", template=HERMES_TEMPLATE)
    with pytest.raises(ChatTemplateError):
        render_tools(smollm2, [{"role": "user", "content": 3}], TOOLS, template=HERMES_TEMPLATE)


def test_the_format_is_read_from_the_templates_markers(smollm2: Model) -> None:
    assert guess_tool_call_format(HERMES_TEMPLATE) == "hermes"
    assert guess_tool_call_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert guess_tool_call_format("<|start_header_id|>{% if tools %}{% endif %}") == "llama3"
    assert smollm2.chat_template is not None and guess_tool_call_format(smollm2.chat_template) is None


# --- specstate's parsers -------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,30}", fullmatch=True)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ARGUMENTS = st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=5)
CALLS = st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=3)
CONTENT = st.text(alphabet=string.ascii_letters + string.digits + " .,!?\n", max_size=40)


def write_calls(format: ToolCallFormat, calls: list[tuple[str, dict[str, Any]]], content: str, compact: bool) -> str:
    """``calls`` written as a model writes them in ``format``, after ``content``."""
    dump = (lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)) if compact else json.dumps
    if format == "hermes":
        return content + "".join(
            f"<tool_call>\n{dump({'name': name, 'arguments': args})}\n</tool_call>\n" for name, args in calls
        )
    if format == "llama3":
        return "; ".join(dump({"name": name, "parameters": args}) for name, args in calls)
    if compact:
        return content + "".join(f"[TOOL_CALLS]{name}[ARGS]{dump(args)}" for name, args in calls)
    items = [{"name": name, "arguments": args, "id": f"id{index:07d}"} for index, (name, args) in enumerate(calls)]
    return content + "[TOOL_CALLS]" + dump(items)


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@settings(max_examples=examples(ci=500, dev=100))
@given(calls=CALLS, content=CONTENT, compact=st.booleans(), cut=st.integers(1, 7))
def test_calls_round_trip_through_each_format(
    format: ToolCallFormat, calls: list[tuple[str, dict[str, Any]]], content: str, compact: bool, cut: int
) -> None:
    text = write_calls(format, calls, content, compact)
    parsed_content, parsed = parse_tool_calls(text, format)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert all(c["type"] == "function" and c["id"] for c in parsed)
    assert len({c["id"] for c in parsed}) == len(parsed)
    assert parsed_content == ("" if format == "llama3" else content.strip())
    assert parse_tool_calls(text, format) == (parsed_content, parsed)  # the same ids every time
    stream = ToolCallStream(format)
    shown = "".join(stream.feed(text[i : i + cut]) for i in range(0, len(text), cut))
    rest, streamed = stream.finish()
    assert stream.started and shown + rest == parsed_content and streamed == parsed


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@given(content=CONTENT, cut=st.integers(1, 7))
def test_a_reply_without_calls_is_content_shown_as_it_arrives(format: ToolCallFormat, content: str, cut: int) -> None:
    assert parse_tool_calls(content, format) == (content.strip(), [])
    stream = ToolCallStream(format)
    shown = "".join(stream.feed(content[i : i + cut]) for i in range(0, len(content), cut))
    rest, calls = stream.finish()
    assert shown + rest == content.strip() and calls == [] and not stream.started
    assert shown == content.strip()  # nothing held back at the end but blanks


@pytest.mark.parametrize(
    ("format", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}'),  # never closed
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),  # arguments not an object
        ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),  # no name
        ("hermes", "<tool_call>\nnot json\n</tool_call>"),
        ("llama3", 'Call {"name": "f", "parameters": {}}'),  # text before the call
        ("llama3", '{"name": "f", "parameters": {}} and more'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}'),  # cut short
        ("mistral", "[TOOL_CALLS]f[ARGS]{"),
    ],
)
def test_a_call_that_does_not_parse_stays_content(format: ToolCallFormat, text: str) -> None:
    assert parse_tool_calls(text, format) == (text.strip(), [])


def test_arguments_as_a_json_string_and_other_keys() -> None:
    _, [call] = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "hermes")
    assert call["function"]["arguments"] == '{"a": 1}'
    _, [call] = parse_tool_calls('<|python_tag|>{"type": "function", "name": "f", "arguments": {}}', "llama3")
    assert call["function"] == {"name": "f", "arguments": "{}"}
    _, [call] = parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {}}]', "mistral")
    assert len(call["id"]) == 9 and call["id"].isalnum()
    with pytest.raises(ValueError, match="format must be one of"):
        parse_tool_calls("", "qwen")  # type: ignore[arg-type]


def nested(depth: int) -> dict[str, Any]:
    """Arguments that nest ``depth`` levels of objects and arrays (their own object the first)."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"a": value}


def deep_call_text(format: ToolCallFormat, depth: int, as_string: bool) -> str:
    """A call of ``f`` whose arguments are :func:`nested` ``depth`` deep, as ``format`` writes it (the arguments
    as a JSON string holding them, with ``as_string``), written without recursion."""
    inner = '{"a": ' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"
    arguments = json.dumps(inner) if as_string else inner
    if format == "hermes":
        return 'Before.<tool_call>\n{"name": "f", "arguments": ' + arguments + "}\n</tool_call>"
    if format == "llama3":
        return '{"name": "f", "parameters": ' + arguments + "}"
    return 'Before.[TOOL_CALLS][{"name": "f", "arguments": ' + arguments + "}]"


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@pytest.mark.parametrize("as_string", [False, True], ids=["object", "string"])
def test_arguments_nested_past_the_bound_stay_content(format: ToolCallFormat, as_string: bool) -> None:
    deepest = MAX_JSON_DEPTH if as_string else MAX_JSON_DEPTH - 1  # an object's arguments sit inside the call's
    [call] = parse_tool_calls(deep_call_text(format, deepest, as_string), format)[1]
    assert json.loads(call["function"]["arguments"]) == nested(deepest)
    for depth in (deepest + 1, 1_000, 100_000):
        text = deep_call_text(format, depth, as_string)
        assert parse_tool_calls(text, format) == (text.strip(), [])
        stream = ToolCallStream(format)
        shown = "".join(stream.feed(text[i : i + 4096]) for i in range(0, len(text), 4096))
        rest, calls = stream.finish()
        assert shown + rest == text.strip() and calls == []


def test_a_call_read_deep_in_the_callers_stack_is_a_call_or_content_never_a_recursion_error() -> None:
    text = deep_call_text("hermes", MAX_JSON_DEPTH - 1, False)

    def read_at(frames: int) -> tuple[str, list[Any]]:
        return parse_tool_calls(text, "hermes") if frames == 0 else read_at(frames - 1)

    room = sys.getrecursionlimit() - len(traceback.extract_stack())
    content, calls = read_at(room - 20)  # 20 frames left: fewer than the decoder needs where they are shared
    assert (content, len(calls)) in ((text.strip(), 0), ("Before.", 1))


# --- grammars ------------------------------------------------------------------------------------


def test_grammar_choices_are_checked() -> None:
    with pytest.raises(ValueError, match="forces a call"):
        tool_call_grammar(TOOLS, "auto")
    with pytest.raises(ValueError, match="names no function"):
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="non-empty list"):
        tool_call_grammar([], "required")
    with pytest.raises(ValueError, match="one call per reply"):
        tool_call_grammar(TOOLS, "required", "llama3", parallel_tool_calls=True)


NAMED: dict[str, Any] = {"type": "function", "function": {"name": "get_forecast"}}


@pytest.mark.parametrize(
    ("format", "choice"),
    [("hermes", "required"), ("hermes", NAMED), ("llama3", NAMED), ("mistral", "required")],
    ids=["hermes-required", "hermes-named", "llama3-named", "mistral-required"],
)
def test_the_grammar_makes_a_greedy_reply_a_call(smollm2: Model, format: ToolCallFormat, choice: Any) -> None:
    grammar = tool_call_grammar(TOOLS, choice, format)
    generator = Generator(smollm2, mode="none", grammar=grammar)
    question = "Use a tool: what will the weather be in Paris for the next three days?"
    reply = generator.chat([{"role": "user", "content": question}], max_tokens=96)
    content, calls = parse_tool_calls(reply, format)
    assert content == "" and len(calls) == 1, reply
    name = calls[0]["function"]["name"]
    assert name in {"get_weather", "get_forecast"} if choice == "required" else name == "get_forecast"
    arguments = json.loads(calls[0]["function"]["arguments"])
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 24
    if name == "get_forecast":
        assert 1 <= arguments["days"] <= 7
