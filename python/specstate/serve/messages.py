"""Anthropic's Messages API over the chat path: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A Messages request is read into the chat completion request it means (:func:`chat_body`), then by the one
request reader (:func:`specstate.serve.request.read_request`): the same checks, limits, tenants, cancellation,
scheduling and backends as ``/v1/chat/completions``, and the same generation, so speculation changes nothing
here either. Its answer is the chat's said as Anthropic says it: a ``message`` (:func:`message`), or
Anthropic's server-sent events (:class:`MessageEvents`); its errors have Anthropic's shape (:func:`error_body`).

What is taken: ``system`` (a string or text blocks), ``messages`` whose content is a string or blocks of
``text``, ``tool_use`` (assistant) and ``tool_result`` (user), ``tools`` (custom tools: ``name``,
``description``, ``input_schema``), ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``), ``stop_sequences``,
``max_tokens`` (required, as Anthropic requires it), ``output_config.format`` (a JSON schema the reply follows),
``stream``, ``metadata.user_id`` (which narrows the tenant as OpenAI's ``user`` does), and the sampling fields
of Anthropic's earlier API, ``temperature`` (0 to 1, Anthropic's default 1), ``top_p`` and ``top_k``. Fields that
change nothing here are accepted (:data:`_IGNORED`); what would change the answer and is not supported
(images, documents, server tools, a container, extended thinking) is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from specstate.serve.request import RequestError

__all__ = ["MessageEvents", "chat_body", "error_body", "message", "stop_reason"]

#: Anthropic's error ``type`` for each HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
    529: "overloaded_error",
}
#: Anthropic's default ``temperature`` (the chat path's default is llama-cpp-python's).
DEFAULT_TEMPERATURE = 1.0
#: Fields read as they are, under the chat path's names.
_SAME = {"model": "model", "max_tokens": "max_tokens", "stream": "stream", "top_p": "top_p", "top_k": "top_k"}
#: Fields taken beside them, each read below.
_READ = {"messages", "system", "stop_sequences", "temperature", "tools", "tool_choice", "metadata", "output_config"}
#: Fields that change nothing in the answer here: prompt caching hints (every prefix is reused anyway, per
#: tenant), where and how fast Anthropic would serve it, diagnostics, the caller's workspace and profile.
_IGNORED = {"cache_control", "service_tier", "speed", "inference_geo", "diagnostics", "workspace_id", "user_profile_id"}
#: Anthropic's ``tool_choice`` types, as the chat path says them.
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def error_body(error: RequestError) -> dict[str, Any]:
    """Anthropic's error body for ``error``."""
    kind = ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def chat_body(body: Mapping[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """The chat completion request a Messages request means (``count_only``: a ``count_tokens`` request, which
    has no ``max_tokens``). Raises :class:`RequestError` (400) naming the first field at fault."""
    _refuse_thinking(body.get("thinking"))
    unknown = sorted(set(body) - set(_SAME) - _READ - _IGNORED - {"thinking"})
    if unknown:
        raise RequestError(400, f"{unknown[0]}: not a Messages parameter specstate supports", param=unknown[0])
    if "max_tokens" not in body and not count_only:
        raise RequestError(400, "max_tokens: field required", param="max_tokens")
    chat = {name: body[field] for field, name in _SAME.items() if field in body}
    temperature = body.get("temperature", DEFAULT_TEMPERATURE)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1:
        raise RequestError(400, "temperature: a number from 0 to 1", param="temperature")
    chat["temperature"] = temperature
    chat["messages"] = [*_system(body.get("system")), *_messages(body.get("messages"))]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise RequestError(400, "stop_sequences: a list of strings", param="stop_sequences")
        chat["stop"] = stops
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    schema = _output_schema(body.get("output_config"))
    if schema is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    user = _user(body.get("metadata"))
    if user is not None:
        chat["user"] = user
    return chat


def _refuse_thinking(thinking: object) -> None:
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise RequestError(400, "thinking: extended thinking is not supported", param="thinking")


def _output_schema(config: object) -> dict[str, Any] | None:
    """The JSON schema ``output_config.format`` asks the reply to follow, if any (``effort`` changes nothing)."""
    if config is None:
        return None
    output = config.get("format") if isinstance(config, dict) else 0
    if output is None:
        return None
    if (
        not isinstance(output, dict)
        or output.get("type") != "json_schema"
        or not isinstance(output.get("schema"), dict)
    ):
        raise RequestError(400, "output_config: its format a json_schema with a schema object", param="output_config")
    return dict(output["schema"])


def _system(system: object) -> list[dict[str, Any]]:
    if system is None:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _text(content: object, where: str) -> str:
    """The text of a string or of a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_block_text(block, where) for block in content)
    raise RequestError(400, f"{where}: a string or a list of text blocks", param=where)


def _block_text(block: object, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise RequestError(400, f"{where}: only text blocks are supported here", param=where)
    return str(block["text"])


def _messages(messages: object) -> Iterator[dict[str, Any]]:
    """Each Messages message as the chat messages it means: a user turn's ``tool_result`` blocks as ``tool``
    messages (before its text), an assistant turn's ``tool_use`` blocks as its ``tool_calls``."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages: a non-empty list of messages", param="messages")
    for turn in messages:
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise RequestError(400, "messages: each a message whose role is user or assistant", param="messages")
        content = turn.get("content")
        if isinstance(content, str):
            yield {"role": turn["role"], "content": content}
        elif isinstance(content, list):
            yield from _blocks(turn["role"], content)
        else:
            raise RequestError(400, "messages: each content a string or a list of blocks", param="messages")


def _blocks(role: str, blocks: list[object]) -> Iterator[dict[str, Any]]:
    texts, calls = [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_block_text(block, "messages"))
        elif kind == "tool_result" and role == "user":
            assert isinstance(block, dict)
            yield _tool_result(block)
        elif kind == "tool_use" and role == "assistant":
            assert isinstance(block, dict)
            calls.append(_tool_use(block))
        else:
            raise RequestError(
                400, f"messages: a {kind!r} block in a {role} message is not supported", param="messages"
            )
    if calls:
        yield {"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls}
    elif texts or role == "assistant":
        yield {"role": role, "content": "".join(texts)}


def _tool_result(block: Mapping[str, Any]) -> dict[str, Any]:
    ident = block.get("tool_use_id")
    if not isinstance(ident, str):
        raise RequestError(400, "messages: a tool_result block needs its tool_use_id", param="messages")
    content = block.get("content", "")
    text = _text(content, "messages")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": ident, "content": text}


def _tool_use(block: Mapping[str, Any]) -> dict[str, Any]:
    ident, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise RequestError(400, "messages: a tool_use block needs an id, a name and an input object", param="messages")
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RequestError(400, "tools: a list of tools", param="tools")
    converted = []
    for tool in tools:
        if (
            not isinstance(tool, dict)
            or tool.get("type", "custom") != "custom"
            or not isinstance(tool.get("name"), str)
        ):
            raise RequestError(400, "tools: each a custom tool with a name and an input_schema", param="tools")
        function = {"name": tool["name"], "parameters": tool.get("input_schema", {"type": "object"})}
        if "description" in tool:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: object) -> object:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in _CHOICES:
        return _CHOICES[str(kind)]
    if kind == "tool" and isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(400, "tool_choice: auto, any, none, or a tool by name", param="tool_choice")


def _user(metadata: object) -> str | None:
    if metadata is None:
        return None
    user = metadata.get("user_id") if isinstance(metadata, dict) else 0
    if user is not None and not isinstance(user, str):
        raise RequestError(400, "metadata: an object whose user_id is a string", param="metadata")
    return user


def stop_reason(finish: str | None, stop_sequence: str | None) -> str:
    """Anthropic's ``stop_reason`` for a chat's ``finish_reason`` (and the stop sequence that ended it, if one did)."""
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message(whole: Mapping[str, Any], stop_sequence: str | None) -> dict[str, Any]:
    """The ``message`` a whole chat completion is."""
    choice = whole["choices"][0]
    reply = choice["message"]
    content: list[dict[str, Any]] = [{"type": "text", "text": reply["content"]}] if reply.get("content") else []
    content += [_tool_use_block(call) for call in reply.get("tool_calls") or []]
    usage = whole["usage"]
    return {
        "id": _message_id(whole["id"]),
        "type": "message",
        "role": "assistant",
        "model": whole["model"],
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"], stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    }


def _tool_use_block(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": json.loads(function["arguments"])}


def _message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


class MessageEvents:
    """Anthropic's server-sent events for a streamed chat's chunks: ``message_start``, then each content block
    (``content_block_start``, its deltas -- ``text_delta``, or a tool's ``input_json_delta`` --,
    ``content_block_stop``), then ``message_delta`` (the stop reason and the usage) and ``message_stop``."""

    def __init__(self) -> None:
        self._block: str | None = None  # the open block's type
        self._index = -1
        self._finish: str | None = None
        self._usage = {"input_tokens": 0, "output_tokens": 0}
        self._started = False

    def chunk(self, chunk: Mapping[str, Any]) -> list[str]:
        """The events of one chat chunk (the usage chunk included)."""
        events = [] if self._started else [self._start(chunk)]
        self._started = True
        if chunk.get("usage"):
            usage = chunk["usage"]
            self._usage = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content"):
                events += self._open("text", {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            self._finish = choice.get("finish_reason") or self._finish
        return events

    def end(self, stop_sequence: str | None) -> list[str]:
        """The events that end the message."""
        events = self._close()
        delta = {"stop_reason": stop_reason(self._finish, stop_sequence), "stop_sequence": stop_sequence}
        events.append(_event({"type": "message_delta", "delta": delta, "usage": self._usage}))
        events.append(_event({"type": "message_stop"}))
        return events

    def _start(self, chunk: Mapping[str, Any]) -> str:
        start = {
            "id": _message_id(chunk["id"]),
            "type": "message",
            "role": "assistant",
            "model": chunk["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _event({"type": "message_start", "message": start})

    def _call(self, call: Mapping[str, Any]) -> list[str]:
        function = call.get("function") or {}
        events = []
        if call.get("id"):  # a new call
            events += self._open(
                "tool_use", {"type": "tool_use", "id": call["id"], "name": function["name"], "input": {}}
            )
        if function.get("arguments"):
            events.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return events

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        if self._block == kind and kind == "text":
            return []
        events = self._close()
        self._block, self._index = kind, self._index + 1
        events.append(_event({"type": "content_block_start", "index": self._index, "content_block": block}))
        return events

    def _close(self) -> list[str]:
        if self._index < 0 or self._block == "closed":
            return []
        self._block = "closed"
        return [_event({"type": "content_block_stop", "index": self._index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return _event({"type": "content_block_delta", "index": self._index, "delta": delta})


def error_event(error: RequestError) -> str:
    """An error in the middle of a stream, as Anthropic sends it."""
    return _event(error_body(error))


def _event(payload: Mapping[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
