"""Chat templates: a conversation rendered as llama.cpp renders it.

The template is the model's own (``tokenizer.chat_template`` in the GGUF),
or one given in its place: Jinja source, rendered by llama.cpp's Jinja engine
(``common_chat_templates_apply``), or a chat format's name (llama-cpp-python's
``chat_format`` names, :data:`CHAT_FORMATS`, or llama.cpp's own), rendered
by llama.cpp's built-in template of that name (``llama_chat_apply_template``).
Template text is tokenized with special tokens parsed; message text is read
literally, so a message that contains ``<|im_start|>`` cannot forge a role.

A conversation is a generation that pauses for the user:
:meth:`specstate.Generator.chat` starts one and takes each next turn, and a
generation restored from a checkpoint takes its next turn decoding only the
new turn's tokens.

Tools: :func:`render_tools` renders OpenAI-shaped messages (assistant
``tool_calls``, ``tool`` messages) and ``tools`` with a Jinja template, as
llama.cpp's server does, and its :class:`ToolPrompt` reads replies with
llama.cpp's parser for that template; :func:`parse_tool_calls`,
:func:`tool_call_grammar` and :class:`ToolCallStream` (from
:mod:`specstate.tool_calls`) do the same for three formats by name.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal, Union

from specstate import _native
from specstate._native import Model
from specstate._typing import Message
from specstate.errors import ChatTemplateError
from specstate.tool_calls import (
    TOOL_CALL_FORMATS,
    ToolCall,
    ToolCallFormat,
    ToolCallStream,
    ToolChoice,
    guess_tool_call_format,
    parse_tool_calls,
    tool_call_grammar,
    with_ids,
)

__all__ = [
    "CHAT_FORMATS",
    "TOOL_CALL_FORMATS",
    "Message",
    "Messages",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallStream",
    "ToolPrompt",
    "chat_template",
    "guess_tool_call_format",
    "parse_tool_calls",
    "render_chat",
    "render_tools",
    "tool_call_grammar",
    "tool_turn_tokens",
]

Messages = Union[str, Sequence[Union[Message, Mapping[str, str]]]]
"""Messages as ``[{"role": ..., "content": ...}, ...]``; a string is one user message."""

#: llama-cpp-python's ``chat_format`` names that llama.cpp has a built-in template for, and that template's name
#: (the one table; docs/chat.md shows it). llama.cpp's own names (``ChatTemplate.builtin_names()``) are accepted
#: too. ``chatml`` is llama.cpp's Jinja ChatML (the same text as its built-in one). The prompt is llama.cpp's,
#: which may differ from llama-cpp-python's in whitespace and in where a system message goes.
CHAT_FORMATS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "chatml": "chatml",
        "llama-2": "llama2-sys",
        "llama-3": "llama3",
        "mistral-instruct": "llama2",
        "zephyr": "zephyr",
        "gemma": "gemma",
        "vicuna": "vicuna",
        "openchat": "openchat",
        "chatglm3": "chatglm3",
        "phi-3": "phi3",
    }
)

#: What a name looks like: a template given as a string is a format name when it matches (and Jinja otherwise).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def as_pairs(messages: Messages) -> list[tuple[str, str]]:
    """``(role, content)`` pairs of ``messages``, each checked."""
    if isinstance(messages, str):
        return [("user", messages)]
    pairs = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise ValueError(f"message {index}: expected a mapping with exactly 'role' and 'content'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"message {index}: 'role' and 'content' must be strings")
        pairs.append((role, content))
    if not pairs:
        raise ValueError("no messages")
    return pairs


def as_messages(pairs: Sequence[tuple[str, str]]) -> list[Message]:
    """``pairs`` as message dictionaries."""
    return [{"role": role, "content": content} for role, content in pairs]


def is_format_name(template: str) -> bool:
    """Whether a template given as a string is a chat format's name (see :data:`CHAT_FORMATS`: letters, digits,
    ``.``, ``_`` and ``-``, at most 64 characters) rather than Jinja source."""
    return _NAME.fullmatch(template) is not None


def builtin_name(name: str) -> str | None:
    """llama.cpp's built-in template that chat format ``name`` stands for (:data:`CHAT_FORMATS`, or llama.cpp's
    own name), or None."""
    resolved = CHAT_FORMATS.get(name, name)
    return resolved if resolved in _native.ChatTemplate.builtin_names() else None


def chat_template(model: Model, template: str | None = None) -> _native.ChatTemplate:
    """The chat template to use with ``model``: ``template`` -- a chat format's name (see :data:`CHAT_FORMATS`;
    llama.cpp's own names too) or Jinja source -- or else the model's own.

    A model without a template gets llama.cpp's default, ChatML (as ``llama-server`` does), with a
    ``UserWarning`` that says so: pass ``template="gemma"`` (``chat_format="gemma"`` to
    :class:`~specstate.Llama`) or the name that fits the model.

    Raises :class:`~specstate.errors.ChatTemplateError` for a name that is no chat format llama.cpp has, or a
    template that does not parse.
    """
    if template is None:
        own = model.chat_template
        if own is None:
            warnings.warn(
                "the model has no chat template (tokenizer.chat_template): using ChatML, llama.cpp's default; "
                "pass the model's chat format by name (e.g. chat_format='gemma'; see specstate.chat.CHAT_FORMATS)",
                UserWarning,
                stacklevel=2,
            )
            return _native.ChatTemplate(model, "chatml")
        # llama.cpp names a built-in template for a few models without one (Mistral Small 2503: mistral-v7-tekken).
        template = own if own in _native.ChatTemplate.builtin_names() else None
        if template is None:
            return _native.ChatTemplate(model)
    name = builtin_name(template)
    if name == "chatml":
        return _native.ChatTemplate(model, "chatml")
    if name is not None:
        return _native.ChatTemplate(model, name=name)
    if is_format_name(template):
        raise ChatTemplateError(
            f"{template!r} is not a chat format llama.cpp has: use one of {', '.join(CHAT_FORMATS)} "
            "(llama-cpp-python's names), one of llama.cpp's (specstate._native.ChatTemplate.builtin_names()), "
            "or give the template's Jinja source"
        )
    return _native.ChatTemplate(model, template)


def template_sha256(template: _native.ChatTemplate) -> str:
    """The fingerprint of a template, recorded with a conversation: of its Jinja source, or of llama.cpp's
    built-in template's name (so a Jinja template whose text is that name differs)."""
    text = template.source if template.name is None else f"llama.cpp built-in chat template {template.name}"
    return hashlib.sha256(text.encode()).hexdigest()


def render_chat(
    model: Model, messages: Messages, *, add_generation_prompt: bool = True, template: str | None = None
) -> str:
    """The text ``messages`` render to with the chat template (see :func:`chat_template`);
    ``add_generation_prompt`` opens the assistant's turn."""
    return chat_template(model, template).render(as_pairs(messages), add_generation_prompt=add_generation_prompt)


# --- tools ---------------------------------------------------------------------------------------


class ToolPrompt:
    """A conversation rendered with tools (:func:`render_tools`), and how llama.cpp reads its reply.

    ``text`` is the prompt and :meth:`tokens` its tokens (BOS first if the model adds one; message text read
    literally). ``format`` is the chat format llama.cpp detected from the template (``peg-native``,
    ``peg-simple``, ``Content-only``, ...: llama.cpp builds a parser for each template from its Jinja source);
    ``tool_call_format`` the one of :data:`~specstate.tool_calls.TOOL_CALL_FORMATS` the template's markers
    name, if any (for :func:`tool_call_grammar`). ``grammar`` is llama.cpp's grammar for the reply ("" if none;
    it starts with ``generation_prompt``, the text llama.cpp's parser sees before the reply; lazy ones apply
    from a ``grammar_triggers`` word on), ``preserved_tokens`` the texts the calls are written with.
    """

    def __init__(self, native: _native.ToolRender, template_source: str) -> None:
        self._native = native
        self.text: str = native.text
        self.format: str = native.format_name
        self.tool_call_format: ToolCallFormat | None = guess_tool_call_format(template_source)
        self.grammar: str = native.grammar
        self.grammar_lazy: bool = native.grammar_lazy
        self.grammar_triggers: list[tuple[str, str, int]] = native.grammar_triggers
        self.preserved_tokens: list[str] = native.preserved_tokens
        self.additional_stops: list[str] = native.additional_stops
        self.generation_prompt: str = native.generation_prompt

    def tokens(self) -> list[int]:
        """The prompt's tokens."""
        return self._native.prompt_tokens()

    def parse(self, text: str, *, partial: bool = False) -> dict[str, Any]:
        """llama.cpp's reading of reply ``text``: an OpenAI-shaped message (``role``, ``content``,
        ``tool_calls`` and ``reasoning_content`` where there are any), each call with an ``id`` (specstate's,
        see :mod:`specstate.tool_calls`, where llama.cpp gives none). ``partial``: the reply is still arriving.
        Raises ``ValueError`` for a complete reply the template's parser does not accept."""
        message: dict[str, Any] = json.loads(self._native.parse(text, partial=partial))
        if message.get("tool_calls"):
            message["tool_calls"] = with_ids(text, message["tool_calls"], mistral=self.tool_call_format == "mistral")
        return message

    def parse_tool_calls(self, text: str, partial: bool = False) -> tuple[str, list[ToolCall]]:
        """``(content, calls)`` of reply ``text`` by llama.cpp's parser (as :func:`parse_tool_calls`). A whole
        reply the parser does not accept (a call cut short, a call of no tool, a marker in plain text) is content
        with no calls, as llama.cpp's server reads it: text that is not a call is still a reply."""
        try:
            message = self.parse(text, partial=partial)
        except ValueError:
            if partial:
                raise
            return text.lstrip(), []
        content = message.get("content")
        return content if isinstance(content, str) else "", list(message.get("tool_calls") or [])

    def stream(self) -> ToolCallStream:
        """A :class:`ToolCallStream` over llama.cpp's parser, its call openings from ``preserved_tokens`` and
        the lazy grammar's trigger words."""
        words = [value for kind, value, _ in self.grammar_triggers if kind == "word"]
        return ToolCallStream(self.parse_tool_calls, markers=[*self.preserved_tokens, *words])


def _tool_choice(tool_choice: ToolChoice) -> Literal["auto", "required", "none"]:
    """llama.cpp's choice for OpenAI's: a named function renders as ``required`` (the grammar picks the name)."""
    if isinstance(tool_choice, Mapping) or tool_choice == "required":
        return "required"
    if tool_choice == "auto":
        return "auto"
    if tool_choice == "none":
        return "none"
    raise ValueError(f"tool_choice must be 'auto', 'required', 'none' or a named function, not {tool_choice!r}")


def render_tools(
    model: Model,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    tool_choice: ToolChoice = "auto",
    parallel_tool_calls: bool = False,
    template: str | None = None,
    add_generation_prompt: bool = True,
) -> ToolPrompt:
    """``messages`` and ``tools`` (OpenAI's shapes: assistant messages with ``tool_calls``, ``tool`` messages with
    ``tool_call_id``, tools as ``{"type": "function", "function": {"name", "description", "parameters"}}``)
    rendered by the chat template (:func:`chat_template`; a Jinja one: the template receives ``tools``), as
    llama.cpp's server renders them (``common_chat_templates_apply``).

    ``tool_choice``: ``"auto"``, ``"required"``, ``"none"`` or ``{"type": "function", "function": {"name":
    ...}}`` (rendered as ``required``; :func:`tool_call_grammar` forces the name). Raises
    :class:`~specstate.errors.ChatTemplateError` for a built-in (named) template, which has no tools, or for
    messages or tools llama.cpp refuses.
    """
    chosen = _tool_choice(tool_choice)
    chat = chat_template(model, template)
    if chat.name is not None:
        raise ChatTemplateError(
            f"tools need a Jinja chat template, and llama.cpp's built-in {chat.name!r} is not one: "
            "give the template's Jinja source"
        )
    try:
        messages_json = json.dumps(list(messages))
        tools_json = None if tools is None else json.dumps(list(tools))
    except (TypeError, ValueError) as error:
        raise ValueError(f"messages and tools must be JSON values: {error}") from None
    native = chat.render_tools(
        messages_json,
        tools_json,
        tool_choice=chosen,
        parallel_tool_calls=parallel_tool_calls,
        add_generation_prompt=add_generation_prompt,
    )
    return ToolPrompt(native, chat.source)


def _json_messages(messages: Sequence[Mapping[str, Any]], what: str) -> str:
    try:
        return json.dumps(list(messages))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be JSON values: {error}") from None


def tool_turn_tokens(
    model: Model,
    before: Sequence[Mapping[str, Any]],
    last_token: int,
    new: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    tool_choice: ToolChoice = "auto",
    parallel_tool_calls: bool = False,
    template: str | None = None,
) -> list[int]:
    """The tokens of the next turn of a conversation with tools, to decode after a reply ending with
    ``last_token`` (as a :class:`~specstate.Generator` conversation's next turn is, without re-reading the
    conversation): ``before`` are the messages that led to the reply (the messages of the
    :func:`render_tools` call that started it, and of the turns since), ``new`` the next turn's (``tool``
    results, a user message). The template renders ``before``, the reply as written (a marker in its place) and
    ``new``; what follows the marker (the end of the reply's turn, without an end-of-generation token the
    reply already holds; the new messages; the next reply's opening) is tokenized as :meth:`ToolPrompt.tokens`
    tokenizes. The reply stays as the model wrote it: a tool call in it is the call's text, not the template's
    rendering of a ``tool_calls`` message."""
    chosen = _tool_choice(tool_choice)
    chat = chat_template(model, template)
    if chat.name is not None:
        raise ChatTemplateError(f"tools need a Jinja chat template, and llama.cpp's built-in {chat.name!r} is not one")
    return chat.tool_next_turn_tokens(
        _json_messages(before, "before"),
        last_token,
        _json_messages(new, "new"),
        None if tools is None else _json_messages(tools, "tools"),
        tool_choice=chosen,
        parallel_tool_calls=parallel_tool_calls,
    )
