"""Tool calls in a reply's text: parsers of three formats, grammars that force a call, and a stream reader.

Formats (``format=``), each as the models that use it write a call:

- ``hermes``: Hermes 2 Pro, Qwen 2.5/3 and the many templates that copy them:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per
  call, text around the blocks is the reply's content (``"parameters"`` is
  read as ``"arguments"``; ``arguments`` may also be a JSON string).
- ``llama3``: Llama 3.1/3.2/3.3's JSON calls: the reply is
  ``{"name": ..., "parameters": {...}}`` (``"arguments"`` also read, an
  optional ``"type": "function"`` ignored, ``<|python_tag|>`` before it
  allowed), several separated by ``;``; a reply that is not only calls is
  content.
- ``mistral``: Mistral's ``[TOOL_CALLS][{"name": ..., "arguments": {...},
  "id": ...}, ...]`` (v3 to v7 templates) and the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` (Magistral, Devstral, Ministral 3); text
  before the first ``[TOOL_CALLS]`` is content.

A call's ``arguments`` is the JSON text of the arguments as the model wrote it
(checked to be a JSON object). JSON that nests arrays and objects deeper than
:data:`MAX_JSON_DEPTH` is not read: such a call does not parse, and its text
stays in the content like any other that does not. Its ``id`` is the model's own (Mistral) or one
derived from the reply's text and the call's place in it (``call_`` and 24 hex
digits; 9 letters and digits for Mistral, whose templates require that), so
the same reply always gives the same ids -- also after a checkpoint resumes it.
llama.cpp's own parser, built from a template's Jinja source, reads replies of
every format llama.cpp knows: see :func:`specstate.chat.render_tools`.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypedDict, Union

from specstate._native import json_schema_to_grammar

__all__ = [
    "MAX_JSON_DEPTH",
    "TOOL_CALL_FORMATS",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallFunction",
    "ToolCallStream",
    "guess_tool_call_format",
    "parse_tool_calls",
    "tool_call_grammar",
]

#: The tool-call formats specstate's own parsers and grammars know.
ToolCallFormat = Literal["hermes", "llama3", "mistral"]
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "llama3", "mistral")

#: OpenAI's ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or
#: ``{"type": "function", "function": {"name": ...}}``.
ToolChoice = Union[str, Mapping[str, Any]]


class ToolCallFunction(TypedDict):
    """The function a call names, and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """One tool call, in OpenAI's shape (``message.tool_calls[i]``)."""

    id: str
    type: Literal["function"]
    function: ToolCallFunction


_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_CALLS, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"
_ID_ALPHABET = string.ascii_letters + string.digits
#: The deepest nesting of arrays and objects read in a call: Python's JSON decoder recurses once per level, so a
#: deeper value is no call (its text stays in the content) rather than a ``RecursionError``.
MAX_JSON_DEPTH = 100
#: The characters that open or close a nesting level or a string, or escape within one.
_STRUCTURAL = re.compile(r'[\[\]{}"\\]')


# --- JSON reading --------------------------------------------------------------------------------


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def _shallow(text: str, at: int) -> bool:
    """Whether the JSON value starting at ``text[at]`` nests arrays and objects at most :data:`MAX_JSON_DEPTH`
    deep: one pass up to where it closes, skipping strings, without recursion."""
    depth, in_string, escaped = 0, False, -1
    for match in _STRUCTURAL.finditer(text, at):
        position, char = match.start(), match.group()
        if position == escaped:
            continue
        if in_string:
            escaped = position + 1 if char == "\\" else escaped
            in_string = char != '"'
            if not in_string and depth == 0:
                return True
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif char in "]}":
            depth -= 1
            if depth <= 0:
                return True
    return True


def _decode(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at ``text[at]`` and where it ends; None if there is none, or it nests too deep."""
    if not _shallow(text, at):
        return None
    try:
        return _DECODER.raw_decode(text, at)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: the caller's own stack was already deep
        return None


def _object_spans(text: str, at: int) -> tuple[dict[str, tuple[int, int]], int] | None:
    """The spans of the top-level values of the JSON object starting at ``text[at]``, by key, and where the object
    ends; None if no object starts there (or it nests too deep: see :func:`_decode`)."""
    if not text.startswith("{", at) or _decode(text, at) is None:
        return None
    spans: dict[str, tuple[int, int]] = {}
    at = _skip(text, at + 1)
    if text[at] == "}":
        return spans, at + 1
    while True:
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, _skip(text, at) + 1)  # past the colon
        _, end = _DECODER.raw_decode(text, at)
        spans[key] = (at, end)
        at = _skip(text, end)
        if text[at] == "}":
            return spans, at + 1
        at = _skip(text, at + 1)  # past the comma


def _arguments(text: str, span: tuple[int, int] | None) -> str | None:
    """The arguments' JSON text (an object), from a value span: an object as written, or a string holding one."""
    if span is None:
        return "{}"
    raw = text[span[0] : span[1]]
    value = json.loads(raw)  # a part of an object already read whole
    if isinstance(value, str):
        raw = value.strip()
        found = _decode(raw, 0)
        if found is None or found[1] != len(raw):
            return None
        value = found[0]
    return raw if isinstance(value, dict) else None


def _call(text: str, at: int, arguments_keys: tuple[str, ...]) -> tuple[str, str, str | None, int] | None:
    """``(name, arguments, id, end)`` of the call object at ``text[at]``, or None if there is none there."""
    found = _object_spans(text, at)
    if found is None:
        return None
    spans, end = found
    name = json.loads(text[slice(*spans["name"])]) if "name" in spans else None
    if not isinstance(name, str) or not name:
        return None
    span = next((spans[key] for key in arguments_keys if key in spans), None)
    arguments = _arguments(text, span)
    if arguments is None:
        return None
    call_id = json.loads(text[slice(*spans["id"])]) if "id" in spans else None
    return name, arguments, call_id if isinstance(call_id, str) and call_id else None, end


# --- the formats ---------------------------------------------------------------------------------


_Found = tuple[str, list[tuple[str, str, Union[str, None]]]]


def _parse_hermes(text: str) -> _Found:
    content, calls, at = [], [], 0
    while (start := text.find(_HERMES_OPEN, at)) >= 0:
        inner = _skip(text, start + len(_HERMES_OPEN))
        call = _call(text, inner, ("arguments", "parameters")) if inner < len(text) else None
        close = _skip(text, call[3]) if call else -1
        if call is None or not text.startswith(_HERMES_CLOSE, close):
            break
        content.append(text[at:start])
        calls.append(call[:3])
        at = close + len(_HERMES_CLOSE)
    content.append(text[at:])
    return "".join(content).strip(), calls


def _parse_llama3(text: str) -> _Found:
    at = _skip(text, 0)
    if text.startswith(_PYTHON_TAG, at):
        at = _skip(text, at + len(_PYTHON_TAG))
    calls = []
    while at < len(text):
        call = _call(text, at, ("parameters", "arguments"))
        if call is None:
            return text.strip(), []
        calls.append(call[:3])
        at = _skip(text, call[3])
        if at < len(text) and text[at] == ";":
            at = _skip(text, at + 1)
    return ("", calls) if calls else (text.strip(), [])


def _parse_mistral(text: str) -> _Found:
    start = text.find(_MISTRAL_CALLS)
    if start < 0:
        return text.strip(), []
    calls: list[tuple[str, str, str | None]] = []
    at = start
    while text.startswith(_MISTRAL_CALLS, at):
        at = _skip(text, at + len(_MISTRAL_CALLS))
        found = _mistral_array(text, at) if text.startswith("[", at) else _mistral_named(text, at)
        if found is None:
            return text.strip(), []
        calls.extend(found[0])
        at = _skip(text, found[1])
    if at < len(text) or not calls:
        return text.strip(), []
    return text[:start].strip(), calls


def _mistral_array(text: str, at: int) -> tuple[list[tuple[str, str, str | None]], int] | None:
    """The calls of ``[{...}, ...]`` at ``text[at]`` and where it ends."""
    calls = []
    at = _skip(text, at + 1)
    while True:
        call = _call(text, at, ("arguments", "parameters"))
        if call is None:
            return None
        calls.append(call[:3])
        at = _skip(text, call[3])
        if text.startswith("]", at):
            return calls, at + 1
        if not text.startswith(",", at):
            return None
        at = _skip(text, at + 1)


def _mistral_named(text: str, at: int) -> tuple[list[tuple[str, str, str | None]], int] | None:
    """The call of ``name[ARGS]{...}`` at ``text[at]`` and where it ends."""
    args = text.find(_MISTRAL_ARGS, at)
    name = text[at:args].strip() if args >= 0 else ""
    if not name or any(c in name for c in _WHITESPACE + "[]{}"):
        return None
    start = _skip(text, args + len(_MISTRAL_ARGS))
    found = _object_spans(text, start)
    if found is None:
        return None
    return [(name, text[start : found[1]], None)], found[1]


_PARSERS: dict[str, Callable[[str], _Found]] = {
    "hermes": _parse_hermes,
    "llama3": _parse_llama3,
    "mistral": _parse_mistral,
}


def _call_id(text: str, index: int, mistral: bool) -> str:
    digest = hashlib.sha256(f"{index}\0{text}".encode()).digest()
    if mistral:
        return "".join(_ID_ALPHABET[b % len(_ID_ALPHABET)] for b in digest[:9])
    return "call_" + digest.hex()[:24]


def _check_format(format: object) -> ToolCallFormat:
    for known in TOOL_CALL_FORMATS:
        if format == known:
            return known
    raise ValueError(f"format must be one of {', '.join(TOOL_CALL_FORMATS)}, not {format!r}")


def parse_tool_calls(text: str, format: ToolCallFormat) -> tuple[str, list[ToolCall]]:
    """The content of reply ``text`` and the tool calls in it, in ``format`` (see the module's docstring).

    The content is the text outside the calls, stripped ("" when there is none). A call that does not parse
    (cut short, not JSON, no name, arguments not an object) is left in the content, and so is every later one.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    format = _check_format(format)
    content, found = _PARSERS[format](text)
    calls: list[ToolCall] = [
        {
            "id": call_id or _call_id(text, index, format == "mistral"),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        for index, (name, arguments, call_id) in enumerate(found)
    ]
    return content, calls


def with_ids(text: str, calls: Sequence[Mapping[str, Any]], *, mistral: bool = False) -> list[ToolCall]:
    """``calls`` as parsed by llama.cpp (OpenAI-shaped, perhaps without ids) with specstate's ids where they have
    none (see the module's docstring)."""
    out: list[ToolCall] = []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        given = call.get("id")
        out.append(
            {
                "id": given if isinstance(given, str) and given else _call_id(text, index, mistral),
                "type": "function",
                "function": {"name": str(function.get("name", "")), "arguments": str(function.get("arguments", ""))},
            }
        )
    return out


def guess_tool_call_format(template_source: str) -> ToolCallFormat | None:
    """The format a chat template's Jinja source asks the model to call tools in, read from the markers it
    writes (``<tool_call>``: hermes; ``[TOOL_CALLS]``: mistral; ``<|python_tag|>`` or Llama 3's headers with
    ``tools``: llama3), or None."""
    if _HERMES_OPEN in template_source:
        return "hermes"
    if _MISTRAL_CALLS in template_source:
        return "mistral"
    if _PYTHON_TAG in template_source or ("<|start_header_id|>" in template_source and "tools" in template_source):
        return "llama3"
    return None


# --- grammars ------------------------------------------------------------------------------------


def _functions(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, parameters schema)`` of each OpenAI tool, checked."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence) or not tools:
        raise ValueError("tools must be a non-empty list of {'type': 'function', 'function': {...}}")
    functions = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(function, Mapping)
        ):
            raise ValueError(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}")
        name, parameters = function.get("name"), function.get("parameters", {"type": "object"})
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{index}]: the function's name must be a non-empty string")
        if not isinstance(parameters, Mapping):
            raise ValueError(f"tools[{index}]: the function's parameters must be a JSON Schema object")
        functions.append((name, dict(parameters)))
    return functions


def _chosen(functions: list[tuple[str, dict[str, Any]]], tool_choice: ToolChoice) -> list[tuple[str, dict[str, Any]]]:
    if tool_choice == "required":
        return functions
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        chosen = [f for f in functions if f[0] == name]
        if tool_choice.get("type", "function") == "function" and chosen:
            return chosen[:1]
        raise ValueError(f"tool_choice names no function of tools: {dict(tool_choice)!r}")
    raise ValueError(
        "a grammar forces a call: tool_choice must be 'required' or {'type': 'function', 'function': {'name': ...}}, "
        f"not {tool_choice!r}"
    )


def _call_schema(name: str, parameters: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _rule_grammar(schema: dict[str, Any], rule: str) -> str:
    """The GBNF of ``schema`` (llama.cpp's converter) with its start rule named ``rule`` instead of ``root``."""
    grammar = json_schema_to_grammar(json.dumps(schema))
    if re.search(rf"^{re.escape(rule)} ::=", grammar, re.MULTILINE):
        raise ValueError(f"the functions' schemas already use the grammar rule name {rule!r}")
    return re.sub(r"^root ::=", f"{rule} ::=", grammar, count=1, flags=re.MULTILINE)


def _gbnf(text: str) -> str:
    return json.dumps(text)


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: ToolChoice = "required",
    format: ToolCallFormat = "hermes",
    *,
    parallel_tool_calls: bool = False,
) -> str:
    """A GBNF grammar (start rule ``root``) of replies that are tool calls only, in ``format``, whose arguments
    follow the functions' ``parameters`` JSON Schemas (llama.cpp's converter, :func:`specstate.json_schema_to_grammar`):
    a reply generated under it always parses with :func:`parse_tool_calls` into calls of the chosen functions.

    ``tool_choice``: ``"required"`` (any of ``tools``) or ``{"type": "function", "function": {"name": ...}}``
    (that one). ``parallel_tool_calls``: one or more calls (``hermes`` and ``mistral``; ``llama3`` writes one).
    Raises ``ValueError`` for tools or a choice that give no grammar.
    """
    format = _check_format(format)
    chosen = _chosen(_functions(tools), tool_choice)
    if format == "llama3":
        if parallel_tool_calls:
            raise ValueError("the llama3 format has one call per reply: parallel_tool_calls must be False")
        schemas = [_call_schema(name, parameters, "parameters") for name, parameters in chosen]
        return json_schema_to_grammar(json.dumps(schemas[0] if len(schemas) == 1 else {"anyOf": schemas}))
    schemas = [_call_schema(name, parameters, "arguments") for name, parameters in chosen]
    one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if format == "mistral":
        array = {"type": "array", "items": one, "minItems": 1, **({} if parallel_tool_calls else {"maxItems": 1})}
        return f"root ::= {_gbnf(_MISTRAL_CALLS)} specstate-calls\n" + _rule_grammar(array, "specstate-calls")
    block = f"{_gbnf(_HERMES_OPEN + chr(10))} specstate-call {_gbnf(chr(10) + _HERMES_CLOSE)}"
    more = f' ("\\n" {block})*' if parallel_tool_calls else ""
    return f"root ::= {block}{more}\n" + _rule_grammar(one, "specstate-call")


# --- streams -------------------------------------------------------------------------------------


def _marker_prefix_at_end(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ToolCallStream:
    """Reads a reply as it arrives: which text is content that can be shown now, and whether a tool call has
    started (from then on the rest is held back until :meth:`finish`).

    ``format`` is one of :data:`TOOL_CALL_FORMATS`, or a callable that parses a reply's text so far
    (``partial``) into ``(content, calls)``, as :meth:`specstate.chat.ToolPrompt.parse_tool_calls` does with
    llama.cpp's parser; ``markers`` are then the texts a call opens with (a :class:`~specstate.chat.ToolPrompt`
    has them). Content is released up to its last non-blank character and never where a call's opening could
    be starting, so what :meth:`feed` returned, followed by the first item :meth:`finish` returns, is the
    content the parser gives for the whole reply.
    """

    def __init__(
        self,
        format: ToolCallFormat | Callable[[str, bool], tuple[str, list[ToolCall]]],
        *,
        markers: Sequence[str] = (),
    ) -> None:
        self._parse: Callable[[str, bool], tuple[str, list[ToolCall]]]
        self._format: ToolCallFormat | None
        if callable(format):
            self._parse, self._format, self._markers = format, None, tuple(m for m in markers if m)
        else:
            known = _check_format(format)
            self._parse = lambda text, _partial: parse_tool_calls(text, known)
            self._format = known
            self._markers = {"hermes": (_HERMES_OPEN,), "mistral": (_MISTRAL_CALLS,), "llama3": ()}[known]
        self._text = ""
        self._shown = ""
        self._started = False

    @property
    def started(self) -> bool:
        """Whether the reply has (or may have) started a tool call: its text is held back from then on."""
        return self._started

    @property
    def text(self) -> str:
        """The reply's text so far."""
        return self._text

    def feed(self, piece: str) -> str:
        """Take the next piece of the reply; the content that can be shown now (perhaps "")."""
        self._text += piece
        if self._started:
            return ""
        visible = self._visible()
        if visible is None:
            self._started = True
            return ""
        visible = visible.rstrip()
        if not visible.startswith(self._shown) or len(visible) <= len(self._shown):
            return ""
        new, self._shown = visible[len(self._shown) :], visible
        return new

    def _visible(self) -> str | None:
        """What the content shown so far may grow to; None once a call has started."""
        text = self._text
        if self._format == "llama3":
            head = text.lstrip()
            if head.startswith(("{", _PYTHON_TAG)):
                return None
            return "" if _PYTHON_TAG.startswith(head) else head
        if any(marker in text for marker in self._markers):
            return None
        held = max((_marker_prefix_at_end(text, marker) for marker in self._markers), default=0)
        if self._format is not None:
            return text[: len(text) - held].lstrip()
        content, calls = self._parse(text[: len(text) - held], True)
        return None if calls else content

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The whole reply has arrived: the content not yet returned by :meth:`feed`, and the calls."""
        content, calls = self._parse(self._text, False)
        rest = content[len(self._shown) :] if content.startswith(self._shown) else ""
        self._shown = content
        return rest, calls
