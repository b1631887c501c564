"""One request -> settings step for ``specstate serve``, shared by the slot and the Ray backends.

As llama.cpp's server reads every completion request with one function
(``params_from_json_cmpl``), :func:`read_request` reads a chat or completion
request once, on the event loop, before anything is cached, hashed, queued or
decoded: every field is checked (its type, its neutral value when specstate does
not implement it) and bounded (:class:`RequestLimits`), llama-cpp-python's
defaults are filled in, and a refusal is a 400 naming the field (``param``). Both
backends take the resulting :class:`ServerRequest`, so the same request means
the same generation on either. The sampler chain's ranges (a ``temperature``
below 0, say) are the generator's to check, when the generation is created and
before anything is decoded; a grammar's native cost is bounded where it is
compiled (its parse stacks, patch 0004).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from specstate._native import MAX_GRAMMAR_BYTES
from specstate.llama import (
    CallSettings,
    UnsupportedParameterError,
    call_settings,
    chat_pairs,
)
from specstate.llama.options import tool_messages, uses_tools

__all__ = ["RequestError", "RequestLimits", "ServerRequest", "read_json", "read_request"]

Kind = Literal["chat", "completion"]

#: The largest ``priority`` a request may give (and the negative of the smallest).
MAX_PRIORITY = 1000


class RequestError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error ``type`` and the field at fault (``param``)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def __reduce__(self) -> tuple[Any, ...]:
        return (RequestError, (self.status, self.message, self.kind, self.param))

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def _limit(default: int, help: str, low: int = 1, high: int = 1 << 40) -> Any:
    """A limit's field: its default, its ``specstate serve`` option's help, and the range it may be set in."""
    return field(default=default, metadata={"help": help, "low": low, "high": high})


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the server; each is a ``specstate serve`` option (``--max-tokens``, ...)."""

    max_body_bytes: int = _limit(1 << 20, "bytes of a request body (413 above)", 1024)
    max_json_depth: int = _limit(64, "nesting depth of a request's JSON (arrays and objects)", 4)
    max_tokens: int = _limit(4096, "tokens a request may generate (and what one without max_tokens gets)")
    max_messages: int = _limit(1024, "messages of a chat")
    max_stops: int = _limit(16, "stop strings of a request", 0)
    max_stop_chars: int = _limit(1024, "characters of one stop string")
    max_logit_bias: int = _limit(1024, "entries of a request's logit_bias", 0)
    max_grammar_bytes: int = _limit(256 << 10, "bytes of a request's grammar", 0, MAX_GRAMMAR_BYTES)


@dataclass(frozen=True)
class ServerRequest:
    """A chat or completion request, read and checked: what a slot or a Ray worker generates."""

    kind: Kind
    stream: bool
    #: Higher runs first; a chat of lower priority is parked to make room for a higher one.
    priority: int
    #: :class:`specstate.Llama`'s keyword arguments (``messages`` or ``prompt`` included), checked and with
    #: ``max_tokens`` resolved, ``response_format`` made into its ``grammar``.
    options: dict[str, Any]
    #: The call's settings (sampling with llama-cpp-python's defaults, stops, log-probabilities).
    call: CallSettings
    #: A chat's ``(role, text)`` pairs (what conversations are keyed by); empty for a completion.
    pairs: tuple[tuple[str, str], ...] = ()
    #: A stream ends with a chunk holding the usage (OpenAI's ``stream_options.include_usage``).
    include_usage: bool = False

    @property
    def tools(self) -> bool:
        """Whether the chat uses tools (its tools, or tool calls and results in its messages): it is rendered
        whole, not continued from a conversation held or cached."""
        return self.kind == "chat" and (self.call.tools is not None or any(role == "tool" for role, _ in self.pairs))

    @property
    def max_tokens(self) -> int:
        """Tokens the request may generate (resolved against the server's limit)."""
        return int(self.options["max_tokens"])


def read_json(data: bytes, limits: RequestLimits) -> dict[str, Any]:
    """The JSON object of a request body (already at most ``max_body_bytes``), its nesting bounded."""
    try:
        body = json.loads(data)
    except RecursionError:
        raise RequestError(400, f"the body's JSON is nested more than {limits.max_json_depth} deep") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    if _depth(body) > limits.max_json_depth:
        raise RequestError(400, f"the body's JSON is nested more than {limits.max_json_depth} deep")
    return body


def _depth(value: object) -> int:
    """How deep objects and arrays nest in ``value`` (iteratively: no recursion to exhaust)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in children)
    return deepest


def read_request(
    kind: Kind, body: dict[str, Any], limits: RequestLimits, *, model_name: str, template_source: str
) -> ServerRequest:
    """Check, bound and default every field of a chat (``kind`` "chat") or completion request.

    ``model_name``: the one model the server has (the ``model`` a request may name, and the one results
    report); ``template_source``: the chat template's (a message's ``name`` is refused when it reads it).
    Raises :class:`RequestError` (400, or 404 for another model) for the first field at fault."""
    body = dict(body)
    _check_model(body.pop("model", None), model_name)
    header = _header(body)
    chat = kind == "chat"
    options: dict[str, Any] = {"model": model_name, **body}
    options["max_tokens"] = _max_tokens(options.pop("max_completion_tokens", None), options, limits)
    _bound_costs(options, limits)
    subject = options.pop("messages" if chat else "prompt", None)
    pairs = _messages(subject, limits, template_source) if chat else ()
    if not chat:
        _prompt(subject)
    call = _checked_call(options, chat)
    if call.sampling.grammar is not None and "response_format" in options:
        options.pop("response_format")
        options["grammar"] = call.sampling.grammar
    options["messages" if chat else "prompt"] = subject
    return ServerRequest(kind, header[0], header[1], options, call, pairs, header[2])


def _check_model(model: object, name: str) -> None:
    if model is not None and model != name:
        raise RequestError(404, f"the model {model!r} does not exist; this server has {name!r}", param="model")


def _header(body: dict[str, Any]) -> tuple[bool, int, bool]:
    """``stream``, ``priority`` and ``stream_options.include_usage``, and OpenAI's other fields about the exchange
    rather than the generation, removed."""
    n = body.pop("n", 1)
    if n != 1 or isinstance(n, bool):
        raise RequestError(400, "n must be 1: one choice per request", param="n")
    user = body.pop("user", None)  # OpenAI's end-user id: nothing to do with it
    if user is not None and not isinstance(user, str):
        raise RequestError(400, "user must be a string", param="user")
    options = body.pop("stream_options", None)
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, "stream_options must be an object", param="stream_options")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise RequestError(400, "stream_options.include_usage must be a boolean", param="stream_options")
    stream = body.pop("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be a boolean", param="stream")
    priority = body.pop("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise RequestError(400, f"priority must be an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}", param="priority")
    if include_usage and not stream:
        raise RequestError(400, "stream_options is only for stream=true", param="stream_options")
    return stream, priority, include_usage


def _max_tokens(alias: object, options: dict[str, Any], limits: RequestLimits) -> int:
    """The tokens the request may generate: its ``max_tokens`` (or OpenAI's ``max_completion_tokens``), None or
    0 or less meaning as many as the server allows; more than that is refused."""
    tokens = options.get("max_tokens", alias)
    name = "max_tokens" if "max_tokens" in options else "max_completion_tokens"
    if tokens is None:
        return limits.max_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise RequestError(400, f"{name} must be an integer, not {type(tokens).__name__}", param=name)
    if tokens > limits.max_tokens:
        raise RequestError(400, f"{name} must be at most {limits.max_tokens}, not {tokens}", param=name)
    return tokens if tokens > 0 else limits.max_tokens


def _bound_costs(options: dict[str, Any], limits: RequestLimits) -> None:
    """Refuse what would cost more than the limits allow: stop strings, logit bias entries, a grammar."""
    stop = options.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > limits.max_stops:
        raise RequestError(400, f"stop may hold at most {limits.max_stops} strings, not {len(stops)}", param="stop")
    if any(isinstance(s, str) and len(s) > limits.max_stop_chars for s in stops):
        raise RequestError(400, f"a stop string may be at most {limits.max_stop_chars} characters", param="stop")
    bias = options.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > limits.max_logit_bias:
        message = f"logit_bias may hold at most {limits.max_logit_bias} entries, not {len(bias)}"
        raise RequestError(400, message, param="logit_bias")
    grammar = options.get("grammar")
    if isinstance(grammar, str) and len(grammar.encode()) > limits.max_grammar_bytes:
        raise RequestError(400, f"grammar may be at most {limits.max_grammar_bytes} bytes", param="grammar")


def _messages(messages: object, limits: RequestLimits, template_source: str) -> tuple[tuple[str, str], ...]:
    """A chat's messages as ``(role, text)`` pairs, their number bounded before anything else reads them."""
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        message = f"messages may hold at most {limits.max_messages} messages, not {len(messages)}"
        raise RequestError(400, message, param="messages")
    if not isinstance(messages, list):
        raise RequestError(400, f"messages must be a list of messages, not {_json_type(messages)}", param="messages")
    with _field("messages"):
        if uses_tools(messages):
            return tuple((m["role"], _text_of(m)) for m in tool_messages(messages))  # type: ignore[misc]
        return tuple(chat_pairs(messages, template_source))


def _text_of(message: Mapping[str, object]) -> str:
    """A message of a chat with tools as the text its conversation key reads: its content, or its calls."""
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(message.get("tool_calls"), sort_keys=True)


def _prompt(prompt: object) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return
    raise RequestError(400, "prompt must be a string or a list of token ids", param="prompt")


def _checked_call(options: dict[str, Any], chat: bool) -> CallSettings:
    """The call's settings; a refusal names the first field refused on its own (else none: fields that do not
    go together)."""
    try:
        return call_settings(options, chat=chat)
    except (TypeError, ValueError, UnsupportedParameterError) as error:
        for name, value in options.items():
            alone = {"logprobs": True, name: value} if name == "top_logprobs" else {name: value}
            with _field(name):
                call_settings(alone, chat=chat)
        raise RequestError(400, str(error)) from None


@contextlib.contextmanager
def _field(name: str | None) -> Iterator[None]:
    """A bad value of ``name`` as a 400 naming it."""
    try:
        yield
    except (TypeError, ValueError, UnsupportedParameterError) as error:
        raise RequestError(400, str(error), param=name) from None


def _json_type(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
