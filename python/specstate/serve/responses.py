"""OpenAI's Responses API over the chat path: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A Responses request is read into the chat completion request it means (:func:`read_input`, then
:func:`chat_body` once the stored conversation it continues is known), then by the one request reader
(:func:`specstate.serve.request.read_request`): the same checks, limits, tenants, cancellation, scheduling and
backends as ``/v1/chat/completions``, and the same generation. Its answer is the chat's said as a ``response``
(:func:`response`), or as the Responses API's server-sent events (:class:`ResponseEvents`).

What is taken: ``input`` (a string, or a list of items: messages whose content is a string or ``input_text`` /
``output_text`` parts, ``function_call`` and ``function_call_output``), ``instructions``, function ``tools``,
``tool_choice``, ``text.format`` (``text``, ``json_object``, ``json_schema``), ``max_output_tokens``,
``temperature``, ``top_p``, ``stream``, ``store`` (default true, as OpenAI's), ``previous_response_id``,
``metadata``, ``user`` and ``safety_identifier`` (each narrows the tenant). Fields that change nothing here are
accepted (:data:`_IGNORED`); what would change the answer and is not supported (images, files, built-in tools,
reasoning items) is a 400.

Stored responses (:class:`ResponseStore`): each tenant's, bounded, in memory and in ``--cache-dir`` when given
(so a follow-up finds them after a restart). A follow-up with ``previous_response_id`` is its stored conversation
and the new input: the server's conversation cache (which keeps each finished chat's checkpoint, per tenant)
then decodes only the new input, and the reply is the one the whole conversation sent again would get.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specstate import _files
from specstate.serve.request import RequestError

__all__ = ["ResponseEvents", "ResponseStore", "ResponsesInput", "chat_body", "read_input", "response"]

#: Fields read below.
_READ = {
    "model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature", "top_p",
    "stream", "store", "previous_response_id", "metadata", "user", "safety_identifier", "parallel_tool_calls",
}  # fmt: skip
#: Fields that change nothing in the answer here: what to include beside it (nothing more is made), truncation
#: (a conversation longer than the context is an error either way), the caller's caching and service hints.
_IGNORED = {
    "include", "truncation", "service_tier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
    "stream_options", "background", "reasoning",
}  # fmt: skip
#: A response id: what the store accepts, so that an id never names anything but its own entry.
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")
#: Responses a store keeps in memory, and their bytes at most (the least recently used dropped first).
STORED_RESPONSES = 1024
STORED_BYTES = 64 << 20
#: Responses kept in ``--cache-dir`` at most (the oldest removed first), and the largest file read back.
STORED_FILES = 4096
MAX_STORED_FILE_BYTES = 8 << 20


@dataclass
class ResponsesInput:
    """A Responses request read, before the conversation it continues is looked up."""

    #: The chat request's fields other than its messages.
    chat: dict[str, Any]
    #: The chat messages of the new input (the instructions not among them).
    messages: list[dict[str, Any]]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    #: The request's fields a response repeats (``tools``, ``text``, ``metadata``, ...).
    echoed: dict[str, Any] = field(default_factory=dict)


def read_input(body: Mapping[str, Any]) -> ResponsesInput:
    """Check a Responses request and read its fields. Raises :class:`RequestError` (400) naming the field."""
    unknown = sorted(set(body) - _READ - _IGNORED)
    if unknown:
        raise RequestError(400, f"{unknown[0]}: not a Responses parameter specstate supports", param=unknown[0])
    chat = {name: body[name] for name in ("model", "temperature", "top_p", "stream", "user") if name in body}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("safety_identifier") is not None and "user" not in chat:
        chat["user"] = body["safety_identifier"]
    if body.get("tools"):
        chat["tools"] = [_tool(tool) for tool in _list(body["tools"], "tools")]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = _text_format(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError(400, "instructions: a string", param="instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestError(400, "previous_response_id: a string", param="previous_response_id")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise RequestError(400, "store: a boolean", param="store")
    echoed = {name: body.get(name) for name in ("tools", "tool_choice", "text", "metadata", "max_output_tokens")}
    echoed.update(temperature=body.get("temperature"), top_p=body.get("top_p"))
    return ResponsesInput(chat, list(_input(body.get("input"))), instructions, previous, store, echoed)


def chat_body(read: ResponsesInput, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request: the instructions, the conversation the request continues, its new input."""
    system = [] if read.instructions is None else [{"role": "system", "content": read.instructions}]
    return {**read.chat, "messages": [*system, *history, *read.messages]}


def _list(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestError(400, f"{name}: a list", param=name)
    return value


def _input(items: object) -> Iterator[dict[str, Any]]:
    """The chat messages of ``input``: consecutive ``function_call`` items as one assistant message's calls."""
    if isinstance(items, str):
        yield {"role": "user", "content": items}
        return
    calls: list[dict[str, Any]] = []
    for item in _list(items, "input"):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "function_call":
            calls.append(_call(item))
            continue
        if calls:
            yield {"role": "assistant", "content": None, "tool_calls": calls}
            calls = []
        if kind == "message":
            yield _message(item)
        elif kind == "function_call_output":
            yield _call_output(item)
        else:
            raise RequestError(400, f"input: a {kind!r} item is not supported", param="input")
    if calls:
        yield {"role": "assistant", "content": None, "tool_calls": calls}


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    role = {"developer": "system"}.get(item.get("role"), item.get("role"))  # type: ignore[arg-type]
    if role not in ("user", "assistant", "system"):
        raise RequestError(400, "input: a message's role is user, assistant, system or developer", param="input")
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(_part(part) for part in content)
    if not isinstance(content, str):
        raise RequestError(400, "input: a message's content is a string or a list of text parts", param="input")
    return {"role": role, "content": content}


def _part(part: object) -> str:
    if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
        raise RequestError(400, "input: only input_text and output_text parts are supported", param="input")
    text = part.get("text")
    if not isinstance(text, str):
        raise RequestError(400, "input: a text part's text is a string", param="input")
    return text


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    ident, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(ident, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise RequestError(400, "input: a function_call has a call_id, a name and arguments", param="input")
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_output(item: Mapping[str, Any]) -> dict[str, Any]:
    ident, output = item.get("call_id"), item.get("output")
    if not isinstance(ident, str) or not isinstance(output, str):
        raise RequestError(400, "input: a function_call_output has a call_id and an output", param="input")
    return {"role": "tool", "tool_call_id": ident, "content": output}


def _tool(tool: object) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise RequestError(400, "tools: each a function tool with a name", param="tools")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    if choice in ("auto", "required", "none"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(400, "tool_choice: auto, required, none, or a function by name", param="tool_choice")


def _text_format(text: object) -> dict[str, Any] | None:
    """The chat's ``response_format`` for ``text.format``."""
    if text is None:
        return None
    form = text.get("format") if isinstance(text, dict) else 0
    kind = form.get("type") if isinstance(form, dict) else None if form is None else 0
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(form, dict) and isinstance(form.get("schema"), dict):
        schema = {"name": form.get("name", "output"), "schema": form["schema"], "strict": form.get("strict", False)}
        return {"type": "json_schema", "json_schema": schema}
    raise RequestError(400, "text: its format text, json_object, or json_schema with a schema", param="text")


def response(
    whole: Mapping[str, Any], read: ResponsesInput, ident: str, *, created: float | None = None
) -> dict[str, Any]:
    """The ``response`` a whole chat completion is (``ident``: its id)."""
    choice = whole["choices"][0]
    usage = whole["usage"]
    reply = choice["message"]
    return _response_object(
        ident,
        read,
        whole["model"],
        output=list(_output_items(reply.get("content"), reply.get("tool_calls") or [])),
        finish=choice["finish_reason"],
        tokens=(usage["prompt_tokens"], usage["completion_tokens"]),
        created=created,
    )


def _response_object(
    ident: str,
    read: ResponsesInput,
    model: str,
    *,
    output: list[dict[str, Any]],
    finish: str | None,
    tokens: tuple[int, int] | None,
    created: float | None = None,
) -> dict[str, Any]:
    done = finish is not None
    status = "incomplete" if finish == "length" else "completed" if done else "in_progress"
    echoed = read.echoed
    return {
        "id": ident,
        "object": "response",
        "created_at": created if created is not None else time.time(),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "instructions": read.instructions,
        "max_output_tokens": echoed["max_output_tokens"],
        "model": model,
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": read.previous_response_id,
        "store": read.store,
        "temperature": echoed["temperature"],
        "top_p": echoed["top_p"],
        "text": echoed["text"] or {"format": {"type": "text"}},
        "tool_choice": echoed["tool_choice"] or "auto",
        "tools": echoed["tools"] or [],
        "metadata": echoed["metadata"] or {},
        "usage": None if tokens is None else _usage(*tokens),
    }


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _output_items(text: str | None, calls: list[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    if text:
        yield _text_item(f"msg_{uuid.uuid4().hex}", text)
    for call in calls:
        yield _call_item(f"fc_{uuid.uuid4().hex}", call["id"], call["function"]["name"], call["function"]["arguments"])


def _text_item(ident: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": ident, "status": status, "role": "assistant", "content": [part]}


def _call_item(ident: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": ident,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def conversation(read: ResponsesInput, history: list[dict[str, Any]], answer: Mapping[str, Any]) -> list[Any]:
    """The chat messages a stored response continues with: those it continued, its input, its output."""
    reply: dict[str, Any] = {"role": "assistant", "content": ""}
    calls = []
    for item in answer["output"]:
        if item["type"] == "message":
            reply["content"] += "".join(part["text"] for part in item["content"])
        else:
            calls.append({"id": item["call_id"], "type": "function", "function": _call_function(item)})
    if calls:
        reply = {"role": "assistant", "content": reply["content"] or None, "tool_calls": calls}
    return [*history, *read.messages, reply]


def _call_function(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": item["name"], "arguments": item["arguments"]}


class ResponseEvents:
    """The Responses API's server-sent events for a streamed chat's chunks: ``response.created`` and
    ``response.in_progress``; for each output item ``response.output_item.added``, its deltas
    (``response.output_text.delta`` after ``response.content_part.added``, or
    ``response.function_call_arguments.delta``), their ``...done`` events and ``response.output_item.done``;
    then ``response.completed`` (``response.incomplete`` when the reply reached ``max_output_tokens``) with the
    whole response, which :attr:`final` keeps."""

    def __init__(self, read: ResponsesInput, ident: str) -> None:
        self._read, self._ident = read, ident
        self._sequence = 0
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._finish: str | None = None
        self._tokens: tuple[int, int] | None = None
        self._model = ""
        self._created = time.time()
        #: The whole response, once :meth:`end` has made it.
        self.final: dict[str, Any] | None = None

    def chunk(self, chunk: Mapping[str, Any]) -> list[str]:
        """The events of one chat chunk (the usage chunk included)."""
        events = []
        if not self._sequence:
            self._model = chunk["model"]
            events += [self._event("response.created", response=self._now()), self._in_progress()]
        if chunk.get("usage"):
            self._tokens = (chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            self._finish = choice.get("finish_reason") or self._finish
        return events

    def end(self) -> list[str]:
        """The events that end the response."""
        events = self._close()
        self.final = _response_object(
            self._ident,
            self._read,
            self._model,
            output=self._items,
            finish=self._finish or "stop",
            tokens=self._tokens,
            created=self._created,
        )
        kind = "response.incomplete" if self._finish == "length" else "response.completed"
        return [*events, self._event(kind, response=self.final)]

    def _now(self) -> dict[str, Any]:
        return _response_object(
            self._ident, self._read, self._model, output=[], finish=None, tokens=None, created=self._created
        )

    def _in_progress(self) -> str:
        return self._event("response.in_progress", response=self._now())

    def _text(self, text: str) -> list[str]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            item = _text_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
            events += self._add(item)
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._event("response.content_part.added", **self._at(), content_index=0, part=part))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        events.append(self._event("response.output_text.delta", **self._at(), content_index=0, delta=text))
        return events

    def _call(self, call: Mapping[str, Any]) -> list[str]:
        function = call.get("function") or {}
        events = []
        if call.get("id"):  # a new call
            events += self._close()
            events += self._add(_call_item(f"fc_{uuid.uuid4().hex}", call["id"], function["name"], "", "in_progress"))
        arguments = function.get("arguments")
        if arguments and self._open is not None:
            self._open["arguments"] += arguments
            events.append(self._event("response.function_call_arguments.delta", **self._at(), delta=arguments))
        return events

    def _add(self, item: dict[str, Any]) -> list[str]:
        self._open = item
        self._items.append(item)
        return [self._event("response.output_item.added", output_index=len(self._items) - 1, item=item)]

    def _at(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self._items) - 1}

    def _close(self) -> list[str]:
        item, events = self._open, list[str]()
        if item is None:
            return events
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", **self._at(), content_index=0, text=part["text"]))
            events.append(self._event("response.content_part.done", **self._at(), content_index=0, part=part))
        else:
            arguments = item["arguments"]
            events.append(self._event("response.function_call_arguments.done", **self._at(), arguments=arguments))
        item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=len(self._items) - 1, item=item))
        self._open = None
        return events

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def error_event(error: RequestError, sequence: int = 0) -> str:
    """An error in the middle of a stream, as the Responses API sends it."""
    payload = {"type": "error", "sequence_number": sequence, "code": error.kind, "message": error.message}
    payload["param"] = error.param
    return f"event: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def new_id() -> str:
    """A fresh response id (:data:`RESPONSE_ID`)."""
    return f"resp_{uuid.uuid4().hex}"


class ResponseStore:
    """Stored responses, each with the conversation it continues with, kept per tenant: in memory (at most
    :data:`STORED_RESPONSES`, :data:`STORED_BYTES`) and, with a ``folder``, in files there (at most
    :data:`STORED_FILES`), which a restarted server reads again. A response of another tenant is not found."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self._entries: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._folder = None if folder is None else Path(folder) / "responses"
        #: The ids of the responses in the folder, oldest written first (read from it once, then kept up to date).
        self._files: OrderedDict[str, None] = OrderedDict()
        if self._folder is not None:
            self._folder.mkdir(parents=True, exist_ok=True)
            self._files = OrderedDict.fromkeys(_stored_ids(self._folder))

    def put(self, tenant: str, answer: Mapping[str, Any], messages: list[Any]) -> None:
        """Keep ``answer`` and the chat ``messages`` it continues with, for ``tenant``."""
        data = json.dumps({"tenant": tenant, "response": answer, "messages": messages}).encode()
        if len(data) > MAX_STORED_FILE_BYTES:
            return  # larger than any entry read back: not kept
        ident = str(answer["id"])
        with self._lock:
            self._remember(ident, tenant, data)
        if self._folder is not None:
            _files.replace_atomically(self._folder / f"{ident}.json", data, 0o600)
            self._trim_folder(ident)

    def get(self, tenant: str, ident: str) -> tuple[dict[str, Any], list[Any]] | None:
        """The response ``ident`` of ``tenant`` and its conversation, or None."""
        if not RESPONSE_ID.fullmatch(ident):
            return None
        with self._lock:
            entry = self._entries.get(ident)
            if entry is not None:
                self._entries.move_to_end(ident)
        data = entry[1] if entry is not None else self._read(ident)
        if data is None:
            return None
        stored = json.loads(data)
        if stored.get("tenant") != tenant:
            return None
        return stored["response"], stored["messages"]

    def delete(self, tenant: str, ident: str) -> bool:
        """Forget the response ``ident`` of ``tenant``; False if there is none."""
        if self.get(tenant, ident) is None:
            return False
        with self._lock:
            entry = self._entries.pop(ident, None)
            self._bytes -= len(entry[1]) if entry is not None else 0
        if self._folder is not None:
            with self._lock:
                self._files.pop(ident, None)
            (self._folder / f"{ident}.json").unlink(missing_ok=True)
        return True

    def _remember(self, ident: str, tenant: str, data: bytes) -> None:
        old = self._entries.pop(ident, None)
        self._bytes += len(data) - (len(old[1]) if old is not None else 0)
        self._entries[ident] = (tenant, data)
        while len(self._entries) > STORED_RESPONSES or self._bytes > STORED_BYTES:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= len(dropped)

    def _read(self, ident: str) -> bytes | None:
        if self._folder is None:
            return None
        try:
            return _files.read_small_file(self._folder / f"{ident}.json", MAX_STORED_FILE_BYTES, "a stored response")
        except (OSError, ValueError):
            return None

    def _trim_folder(self, written: str) -> None:
        """Count ``written`` as the newest file, and remove the oldest beyond :data:`STORED_FILES`."""
        assert self._folder is not None
        with self._lock:
            self._files.pop(written, None)
            self._files[written] = None
            dropped = [self._files.popitem(last=False)[0] for _ in range(len(self._files) - STORED_FILES)]
        for ident in dropped:
            (self._folder / f"{ident}.json").unlink(missing_ok=True)


def _stored_ids(folder: Path) -> list[str]:
    """The ids of the responses stored in ``folder``, oldest written first (a file that went meanwhile, passed
    over)."""
    found = []
    for path in folder.glob("resp_*.json"):
        try:
            found.append((path.stat().st_mtime, path.stem))
        except OSError:
            continue
    return [ident for _, ident in sorted(found) if RESPONSE_ID.fullmatch(ident)]
