"""One request -> settings step for ``specstate serve``, shared by the slot and the Ray backends.

As llama.cpp's server reads every completion request with one function
(``params_from_json_cmpl``), :func:`read_request` reads a chat or completion
request once, off the event loop, before anything is cached, hashed, queued or
decoded: every field is checked (its type, its neutral value when specstate does
not implement it, OpenAI's ranges and roles) and bounded (:class:`RequestLimits`),
llama-cpp-python's defaults are filled in, and a refusal is a 400 naming the field
(``param``). The resulting :class:`ServerRequest` holds what the request means, typed
(its :class:`~specstate.llama.CallSettings`, its messages read as
:class:`specstate.Llama` reads them, its prompts): a slot, in the server's process or
on a Ray worker, runs it as it is (:meth:`specstate.Llama.chat_stream`,
:meth:`specstate.Llama.completion_stream`) and nothing reads the body again, so the
same request means the same generation on either backend. The sampler chain's
ranges are checked once, by the core's rule (through
:func:`~specstate.llama.call_settings`); a grammar's native cost is bounded where
it is compiled (its parse stacks, patch 0004); a ``response_format``'s JSON
schema is bounded here and converted once, by the slot that runs the request.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from specstate._native import MAX_GRAMMAR_BYTES
from specstate.llama import (
    CallSettings,
    ChatInput,
    UnsupportedParameterError,
    call_settings,
    read_chat,
)

if TYPE_CHECKING:
    from typing_extensions import TypeGuard

__all__ = ["RequestError", "RequestLimits", "ServerRequest", "prompts_of", "read_json", "read_request"]

Kind = Literal["chat", "completion"]

#: The largest ``priority`` a request may give (and the negative of the smallest).
MAX_PRIORITY = 1000

#: The most characters of a request's ``cache_salt``.
MAX_CACHE_SALT_CHARS = 256


class RequestError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error ``type`` and the field at fault (``param``)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def __reduce__(self) -> tuple[Any, ...]:
        return (RequestError, (self.status, self.message, self.kind, self.param))

    @classmethod
    def unforeseen(cls, error: BaseException) -> RequestError:
        """A 500 for an error no rule of the request foresaw (the model failed, a bug), naming its type and text."""
        return cls(500, f"{type(error).__name__}: {error}", "server_error")

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
    max_schema_bytes: int = _limit(64 << 10, "bytes of a request's JSON schemas (response_format, tools)", 0)
    max_schema_properties: int = _limit(1024, "properties of a request's JSON schemas, all objects together", 0)
    max_schema_optional: int = _limit(64, "optional properties of one object of a request's JSON schemas", 0)
    max_prompts: int = _limit(32, "prompts of a completion request (a choice each)")


@dataclass(frozen=True)
class ServerRequest:
    """A chat or completion request, read and checked: what a slot runs, on the server or on a Ray worker."""

    kind: Kind
    stream: bool
    #: Higher runs first; a chat of lower priority is parked to make room for a higher one.
    priority: int
    #: The call's settings (sampling with llama-cpp-python's defaults, ``max_tokens`` resolved against the server's
    #: limit, stops, log-probabilities, tools; a ``response_format``'s schema bounded, and converted where the
    #: request runs).
    call: CallSettings
    #: A chat's messages, read (None for a completion).
    chat: ChatInput | None = None
    #: A completion's prompts (:func:`prompts_of`), each answered by a choice of its own (empty for a chat).
    prompts: tuple[str | list[int], ...] = ()
    #: A stream ends with a chunk holding the usage (OpenAI's ``stream_options.include_usage``).
    include_usage: bool = False
    #: OpenAI's end-user id and vLLM's ``cache_salt``: each narrows the request's tenant.
    user: str | None = None
    cache_salt: str | None = None
    #: Whose earlier requests' work this one may start from (kept cells and states, cached conversations, the
    #: lookup corpus): set by the server from the API key, ``user`` and ``cache_salt``
    #: (:func:`specstate.serve.cache.tenant_of`; None: nothing is reused between requests).
    tenant: str | None = ""

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """A chat's ``(role, text)`` pairs (what conversations are keyed by); empty for a completion."""
        return () if self.chat is None else self.chat.pairs

    @property
    def tools(self) -> bool:
        """Whether the chat uses tools (its tools, or tool calls and results in its messages): it is rendered
        whole, not continued from a conversation held or cached."""
        return self.chat is not None and self.chat.tools

    @property
    def max_tokens(self) -> int:
        """Tokens the request may generate (resolved against the server's limit)."""
        assert self.call.max_tokens is not None
        return self.call.max_tokens


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
    narrowing = _narrowing(body)
    header = _header(body)
    chat = kind == "chat"
    options: dict[str, Any] = {"model": model_name, **body}
    options["max_tokens"] = _max_tokens(options.pop("max_completion_tokens", None), options, limits)
    _bound_costs(options, limits)
    _bound_schemas(options, limits)
    _openai_ranges(options, chat)
    subject = options.pop("messages" if chat else "prompt", None)
    if chat:
        _bound_messages(subject, limits)
        call = _checked_call(options, chat)
        messages = _read_messages(subject, template_source, call)
        return ServerRequest(kind, header[0], header[1], call, messages, (), header[2], *narrowing)
    prompts = _bounded_prompts(subject, limits)
    call = _checked_call(options, chat)
    return ServerRequest(kind, header[0], header[1], call, None, prompts, header[2], *narrowing)


def _check_model(model: object, name: str) -> None:
    if model is not None and model != name:
        raise RequestError(404, f"the model {model!r} does not exist; this server has {name!r}", param="model")


def _header(body: dict[str, Any]) -> tuple[bool, int, bool]:
    """``stream``, ``priority`` and ``stream_options.include_usage``, and OpenAI's other fields about the exchange
    rather than the generation, removed."""
    n = body.pop("n", 1)
    if n != 1 or isinstance(n, bool):
        raise RequestError(400, "n must be 1: one choice per request", param="n")
    user = body.pop("user", None)  # OpenAI's end-user id: it narrows the tenant (_narrowing)
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


def _narrowing(body: dict[str, Any]) -> tuple[str | None, str | None]:
    """The request's ``user`` (a string, else None: :func:`_header` checks it) and its ``cache_salt`` (checked
    and removed): what narrows its tenant below its API key's."""
    salt = body.pop("cache_salt", None)
    if salt is not None and (not isinstance(salt, str) or len(salt) > MAX_CACHE_SALT_CHARS):
        message = f"cache_salt must be a string of at most {MAX_CACHE_SALT_CHARS} characters"
        raise RequestError(400, message, param="cache_salt")
    user = body.get("user")
    return (user if isinstance(user, str) else None), salt


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


def _bound_schemas(options: dict[str, Any], limits: RequestLimits) -> None:
    """Refuse JSON schemas whose conversion into a grammar would cost too much, before anything converts them:
    their bytes (``response_format``'s and the tools' together), their properties, and the optional properties
    of one object (llama.cpp's converter takes time about the cube of those)."""
    size = properties = 0
    for name in ("response_format", "tools"):
        value = options.get(name)
        if value is None:
            continue
        size += len(json.dumps(value, separators=(",", ":")).encode())
        if size > limits.max_schema_bytes:
            message = f"a request's JSON schemas may hold at most {limits.max_schema_bytes} bytes"
            raise RequestError(400, message, param=name)
        counted, optional = _properties(value)
        properties += counted
        if properties > limits.max_schema_properties:
            message = f"a request's JSON schemas may have at most {limits.max_schema_properties} properties"
            raise RequestError(400, message, param=name)
        if optional > limits.max_schema_optional:
            message = f"an object of a JSON schema may have at most {limits.max_schema_optional} optional properties"
            raise RequestError(400, f"{message}, not {optional}", param=name)


def _properties(value: object) -> tuple[int, int]:
    """The properties of every object schema in ``value`` together, and the most optional properties (not
    ``required``) of one (iteratively: no recursion to exhaust)."""
    total = most = 0
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            found, required = item.get("properties"), item.get("required")
            if isinstance(found, dict):
                needed = {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
                total += len(found)
                most = max(most, sum(name not in needed for name in found))
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return total, most


#: OpenAI's ranges of its sampling fields: a request over HTTP is held to them (the Python API, llama-cpp-python's
#: own, takes what the sampler chain takes). ``logprobs`` is a completion's count; ``logit_bias`` its values'.
OPENAI_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0, 2),
    "top_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
    "top_logprobs": (0, 20),
    "logprobs": (0, 5),
    "logit_bias": (-100, 100),
}

#: The roles of OpenAI's chat messages.
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _openai_ranges(options: dict[str, Any], chat: bool) -> None:
    """Refuse a number outside :data:`OPENAI_RANGES` (another type is :func:`_checked_call`'s to refuse)."""
    for name, (low, high) in OPENAI_RANGES.items():
        if name == "logprobs" and chat:
            continue  # a chat's logprobs is a boolean
        value = options.get(name)
        values = value.values() if name == "logit_bias" and isinstance(value, dict) else [value]
        for number in values:
            if isinstance(number, (int, float)) and not isinstance(number, bool) and not low <= number <= high:
                raise RequestError(400, f"{name} must be from {low:g} to {high:g}, not {number!r}", param=name)


def _bound_messages(messages: object, limits: RequestLimits) -> None:
    """Refuse a chat's messages that are not a list, too many of them, or a role OpenAI does not have, before
    anything else reads them."""
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        message = f"messages may hold at most {limits.max_messages} messages, not {len(messages)}"
        raise RequestError(400, message, param="messages")
    if not isinstance(messages, list):
        raise RequestError(400, f"messages must be a list of messages, not {_json_type(messages)}", param="messages")
    for index, each in enumerate(messages):
        role = each.get("role") if isinstance(each, dict) else None
        if isinstance(role, str) and role not in OPENAI_ROLES:
            refusal = f"messages[{index}]: role must be one of {', '.join(OPENAI_ROLES)}, not {role[:40]!r}"
            raise RequestError(400, refusal, param="messages")


def _read_messages(messages: object, template_source: str, call: CallSettings) -> ChatInput:
    """A chat's messages as :class:`specstate.Llama` reads them (:func:`specstate.llama.read_chat`)."""
    with _field("messages"):
        return read_chat(messages, template_source, tools=call.tools is not None)


def prompts_of(prompt: object) -> list[str | list[int]]:
    """A completion's prompts: a string or a list of token ids is one; a list of strings or of lists of token ids
    is several (OpenAI's), each answered by a choice of its own. :class:`RequestError` for anything else."""
    if isinstance(prompt, str) or _token_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(each, str) or _token_ids(each) for each in prompt):
        return list(prompt)
    raise RequestError(400, "prompt must be a string, a list of token ids, or a list of either", param="prompt")


def _token_ids(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _bounded_prompts(prompt: object, limits: RequestLimits) -> tuple[str | list[int], ...]:
    """A completion's prompts, their number bounded."""
    prompts = prompts_of(prompt)
    if len(prompts) > limits.max_prompts:
        message = f"prompt may hold at most {limits.max_prompts} prompts, not {len(prompts)}"
        raise RequestError(400, message, param="prompt")
    return tuple(prompts)


def _checked_call(options: dict[str, Any], chat: bool) -> CallSettings:
    """The call's settings; a refusal names the first field refused on its own (else none: fields that do not
    go together)."""
    try:
        return call_settings(options, chat=chat, convert_schema=False)  # converted once, in the slot
    except (TypeError, ValueError, UnsupportedParameterError) as error:
        for name, value in options.items():
            alone = {"logprobs": True, name: value} if name == "top_logprobs" else {name: value}
            with _field(name):
                call_settings(alone, chat=chat, convert_schema=False)
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
