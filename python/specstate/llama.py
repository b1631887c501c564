"""llama-cpp-python's ``Llama`` API over specstate: change the import and the constructor, keep the calls.

::

    from specstate import Llama  # was: from llama_cpp import Llama

    llm = Llama("model.gguf", n_ctx=2048, mode="ngram")  # mode, draft_model_path, n_draft: specstate's own
    out = llm("Q: Name the planets. A:", max_tokens=32, stop=["Q:"])
    print(out["choices"][0]["text"])
    reply = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    print(reply["choices"][0]["message"]["content"])

:meth:`Llama.create_completion` (and calling the object), and
:meth:`Llama.create_chat_completion` take llama-cpp-python's arguments and
return the OpenAI-shaped dictionaries it returns (:class:`Completion`,
:class:`ChatCompletion`, and with ``stream=True`` iterators of
:class:`CompletionChunk` or :class:`ChatCompletionChunk`). Every call runs on
a :class:`~specstate.Generator`, in the speculative mode chosen at
construction, so its output follows the exactness contract of
:mod:`specstate.generator`.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import secrets
import struct
import time
import uuid
from collections.abc import Generator as PyGenerator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, TypedDict, get_args, overload

from specstate._native import Model, json_schema_to_grammar
from specstate._typing import GeneratorConfig, GeneratorSettings, Mode, TokenLogprobs
from specstate.chat import as_messages, chat_template, template_sha256
from specstate.errors import ChatTemplateError
from specstate.generator import Generator, TextStream

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CHAT_TEMPERATURE",
    "COMPLETION_MAX_TOKENS",
    "COMPLETION_TEMPERATURE",
    "LAST_N_TOKENS_SIZE",
    "LLAMA_DEFAULT_SEED",
    "MIN_P",
    "NEUTRAL",
    "N_BATCH",
    "N_CTX",
    "N_DRAFT",
    "TOP_K",
    "TOP_P",
    "CallSettings",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatCompletionDelta",
    "ChatCompletionLogprobs",
    "ChatCompletionMessage",
    "ChatCompletionOptions",
    "ChatCompletionTokenLogprob",
    "ChatStream",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionOptions",
    "CompletionStream",
    "CompletionUsage",
    "FinishReason",
    "Llama",
    "LlamaGrammar",
    "ParkedChat",
    "TopLogprob",
    "UnsupportedParameterError",
    "call_settings",
    "chat_pairs",
    "joined_completion",
]

# --- defaults, each written once -----------------------------------------------------------------

#: llama-cpp-python's default seed (``llama_cpp.LLAMA_DEFAULT_SEED``): a new random seed for every call.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
#: Tokens a completion generates unless ``max_tokens`` says otherwise (llama-cpp-python's default).
COMPLETION_MAX_TOKENS = 16
#: Sampling temperature of :meth:`Llama.create_completion` (llama-cpp-python's default).
COMPLETION_TEMPERATURE = 0.8
#: Sampling temperature of :meth:`Llama.create_chat_completion` (llama-cpp-python's default).
CHAT_TEMPERATURE = 0.2
#: Nucleus mass of both (llama-cpp-python's default).
TOP_P = 0.95
#: Most likely tokens kept by both (llama-cpp-python's default).
TOP_K = 40
#: Min-p cut of both (llama-cpp-python's default).
MIN_P = 0.05
#: Tokens of the history the repetition penalties count (llama-cpp-python's ``last_n_tokens_size`` default).
LAST_N_TOKENS_SIZE = 64
#: Context length in tokens (specstate's default; llama-cpp-python's is 512).
N_CTX = 2048
#: Rows per decode (the same default as llama-cpp-python's).
N_BATCH = 512
#: Most tokens drafted per round in the speculative modes (specstate's default).
N_DRAFT = 8

#: llama-cpp-python's parameters that specstate's sampler does not implement yet, with the values that leave the
#: output unchanged: the only values accepted (anything else raises :class:`UnsupportedParameterError`).
#: ``mirostat_tau`` and ``mirostat_eta`` are accepted as any number: they do nothing while ``mirostat_mode`` is 0.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "tfs_z": (1.0,),
    "mirostat_mode": (0,),
    "logits_processor": (None,),
    "stopping_criteria": (None,),
    "suffix": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "tools": (None, []),
    "tool_choice": (None, "none"),
}


class UnsupportedParameterError(NotImplementedError):
    """A llama-cpp-python parameter given a value specstate cannot honour yet (see :data:`NEUTRAL`)."""


# --- results -------------------------------------------------------------------------------------

#: Why a choice ended: ``stop`` (end-of-generation token or a stop string), ``length`` (``max_tokens`` or a full
#: context).
FinishReason = Literal["stop", "length"]


class CompletionUsage(TypedDict):
    """Token counts of a call: the prompt's (for a chat, the whole conversation's), the reply's, their sum."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(TypedDict):
    """A completion's log-probabilities (``logprobs=n``), one entry per token of its text: the token's text,
    where it starts in the choice's text, its log-probability, and the ``n`` most likely tokens' (with the
    token itself) by their text."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict):
    """The one choice of a completion or completion chunk (``finish_reason`` is None until the last chunk)."""

    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(TypedDict):
    """One piece of a streamed completion (OpenAI's ``text_completion`` object, without usage)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]


class Completion(CompletionChunk):
    """What :meth:`Llama.create_completion` returns (OpenAI's ``text_completion`` object)."""

    usage: CompletionUsage


class ChatCompletionMessage(TypedDict):
    """The assistant's reply."""

    role: Literal["assistant"]
    content: str


class TopLogprob(TypedDict):
    """One of the most likely tokens at a position: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatCompletionTokenLogprob(TopLogprob):
    """A reply token's log-probability, with the ``top_logprobs`` most likely tokens at its position."""

    top_logprobs: list[TopLogprob]


class ChatCompletionLogprobs(TypedDict):
    """A chat reply's log-probabilities (``logprobs=True``): one entry per token of its text."""

    content: list[ChatCompletionTokenLogprob] | None
    refusal: None


class ChatCompletionChoice(TypedDict):
    """The one choice of a chat completion."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChatCompletionLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(TypedDict):
    """What :meth:`Llama.create_chat_completion` returns (OpenAI's ``chat.completion`` object)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage


class ChatCompletionDelta(TypedDict, total=False):
    """What a chat chunk adds: the role (first chunk), text (then), nothing (last chunk)."""

    role: Literal["assistant"]
    content: str


class ChatCompletionChunkChoice(TypedDict):
    """The one choice of a chat chunk (``finish_reason`` is None until the last chunk)."""

    index: int
    delta: ChatCompletionDelta
    logprobs: ChatCompletionLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(TypedDict):
    """One piece of a streamed chat completion (OpenAI's ``chat.completion.chunk`` object)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]


# --- per-call keyword arguments ------------------------------------------------------------------


class _Unsupported(TypedDict, total=False):
    """llama-cpp-python's sampling parameters specstate does not implement yet: neutral values only."""

    #: Tail-free sampling: 1.0 only.
    tfs_z: float
    #: Mirostat: 0 (off) only.
    mirostat_mode: int
    #: Mirostat's target (any number: unused while ``mirostat_mode`` is 0).
    mirostat_tau: float
    #: Mirostat's learning rate (any number: unused while ``mirostat_mode`` is 0).
    mirostat_eta: float
    #: Logits processors: None only.
    logits_processor: object


class _Common(_Unsupported, total=False):
    """The keyword arguments both calls take."""

    #: Most tokens to generate; None or at most 0: until the context is full.
    max_tokens: int | None
    #: Softmax temperature, at least 0 (0: greedy).
    temperature: float
    #: Nucleus mass, in (0, 1].
    top_p: float
    #: Keep the k most likely tokens (at most 0: all).
    top_k: int
    #: Keep the tokens at least this many times as likely as the most likely one, in [0, 1].
    min_p: float
    #: Locally typical sampling's mass, in (0, 1] (1.0: off).
    typical_p: float
    #: Repetition penalty over the last ``last_n_tokens_size`` tokens, in (0, 100] (1.0: off).
    repeat_penalty: float
    #: Subtracted from the logit of a token in that window, in [-100, 100] (0.0: off).
    presence_penalty: float
    #: Subtracted once per occurrence in that window, in [-100, 100] (0.0: off).
    frequency_penalty: float
    #: Added to these tokens' logits, each in [-10000, 10000] (None: no bias).
    logit_bias: Mapping[int, float] | None
    #: A GBNF grammar the generated text follows (:class:`LlamaGrammar`, or its text; None: none).
    grammar: LlamaGrammar | str | None
    #: A stop string or several: the text ends before the first one (which is not included).
    stop: str | Sequence[str] | None
    #: This call's seed (default: the constructor's; ``LLAMA_DEFAULT_SEED`` or -1: random).
    seed: int | None
    #: The ``model`` name the result reports (default: the model's path).
    model: str | None


class CompletionOptions(_Common, total=False):
    """The keyword arguments of :meth:`Llama.create_completion` besides ``stream``, each optional.

    Defaults: ``max_tokens`` :data:`COMPLETION_MAX_TOKENS`, ``temperature``
    :data:`COMPLETION_TEMPERATURE`, ``top_p`` :data:`TOP_P`, ``top_k``
    :data:`TOP_K`, ``min_p`` :data:`MIN_P`, ``typical_p`` and
    ``repeat_penalty`` 1.0, the other penalties 0.0, no ``logit_bias``, no
    ``stop``, ``echo`` False; the rest at :data:`NEUTRAL`.
    """

    #: Put the prompt's text in front of the generated text.
    echo: bool
    #: Text after the insertion point (infill): None only.
    suffix: str | None
    #: Report each token's log-probability and those of the ``logprobs`` most likely tokens (0 to 20; None:
    #: none). Not with ``echo`` (the prompt's own are not computed).
    logprobs: int | None
    #: Stopping criteria callbacks: None only.
    stopping_criteria: object


class ChatCompletionOptions(_Common, total=False):
    """The keyword arguments of :meth:`Llama.create_chat_completion` besides ``messages`` and ``stream``.

    Defaults: ``max_tokens`` None (until the context is full), ``temperature``
    :data:`CHAT_TEMPERATURE`, ``top_p`` :data:`TOP_P`, ``top_k`` :data:`TOP_K`,
    ``min_p`` :data:`MIN_P`, ``typical_p`` and ``repeat_penalty`` 1.0, the
    other penalties 0.0, no ``logit_bias``, no ``stop``; the rest at :data:`NEUTRAL`.
    """

    #: Report each reply token's log-probability (default False).
    logprobs: bool | None
    #: With ``logprobs``, also the log-probabilities of this many most likely tokens at each position (0 to 20).
    top_logprobs: int | None
    #: JSON output: ``{"type": "json_object"}`` (any JSON object, or with a ``"schema"``, llama-cpp-python's
    #: form, the values it describes), ``{"type": "json_schema", "json_schema": {"schema": ...}}`` (OpenAI's
    #: form), or None / ``{"type": "text"}`` (free text). Not together with ``grammar``.
    response_format: Mapping[str, object] | None
    #: Function calling: None only.
    functions: object
    #: Function calling: None or ``"none"`` only.
    function_call: object
    #: Tool calling: None only.
    tools: object
    #: Tool calling: None or ``"none"`` only.
    tool_choice: object


#: A chat message as OpenAI clients send it: ``role``, ``content`` (a string or a list of ``{"type": "text",
#: "text": ...}`` parts) and optionally ``name``.
ChatMessage = Mapping[str, object]

_FINISH: dict[str, FinishReason] = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}
#: A template that reads a message's ``name`` (which specstate's renderer does not pass).
_READS_NAME = re.compile(r"""\.name\b|\[\s*['"]name['"]\s*\]""")


# --- grammars ------------------------------------------------------------------------------------


class LlamaGrammar:
    """A GBNF grammar (start rule ``root``), made as llama-cpp-python's ``LlamaGrammar`` is made; pass it as
    ``grammar=``. The grammar is parsed against the model's vocabulary when a call uses it: one that does not
    parse raises ``ValueError`` there."""

    def __init__(self, *, _grammar: str) -> None:
        if not isinstance(_grammar, str):
            raise TypeError(f"a grammar is text, not {type(_grammar).__name__}")
        #: The GBNF text.
        self._grammar = _grammar

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """The grammar whose GBNF text is ``grammar`` (``verbose`` changes nothing)."""
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        """The grammar in the GBNF file ``file`` (``verbose`` changes nothing)."""
        with open(file, encoding="utf-8") as handle:
            return cls(_grammar=handle.read())

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        """The grammar of the JSON values the JSON Schema ``json_schema`` (JSON text) describes, by llama.cpp's
        converter (``verbose`` changes nothing)."""
        return cls(_grammar=json_schema_to_grammar(json_schema))

    def __repr__(self) -> str:
        return f"LlamaGrammar.from_string({self._grammar!r})"


def _grammar_text(grammar: object) -> str | None:
    """The GBNF text of a call's ``grammar`` (a :class:`LlamaGrammar`, its text, or None)."""
    if grammar is None or isinstance(grammar, str):
        return grammar or None
    if isinstance(grammar, LlamaGrammar):
        return grammar._grammar
    raise TypeError(f"grammar must be a LlamaGrammar, a str or None, not {type(grammar).__name__}")


def _with_response_format(sampling: _Sampling, response_format: object) -> _Sampling:
    """``sampling`` with the grammar a chat call's ``response_format`` asks for."""
    schema = _response_schema(response_format)
    if schema is None:
        return sampling
    if sampling.grammar is not None:
        raise ValueError("give grammar or response_format, not both")
    return replace(sampling, grammar=json_schema_to_grammar(json.dumps(schema)))


def _response_schema(response_format: object) -> Mapping[str, object] | None:
    """The JSON Schema of a ``response_format`` (None for free text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TypeError(f"response_format must be a mapping or None, not {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
    elif kind == "json_schema":
        inner = response_format.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, Mapping) else None
    else:
        raise ValueError(f"response_format type must be 'text', 'json_object' or 'json_schema', not {kind!r}")
    if not isinstance(schema, Mapping):
        raise ValueError("response_format: the JSON schema must be an object")
    return schema


# --- one call's settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallSettings:
    """A completion or chat call's keyword arguments, checked (types, neutral values of what is not implemented,
    unknown names) and with llama-cpp-python's defaults filled in: what :class:`Llama` generates with, and what
    ``specstate serve`` checks a request against before it is queued. The sampler chain's ranges are the
    generator's to check (when the generation is created, before anything is decoded)."""

    sampling: _Sampling
    #: Most tokens to generate (None: until the context is full).
    max_tokens: int | None
    stops: list[str]
    #: The ``model`` name the result reports (None: the model's path).
    model: str | None
    #: Log-probabilities asked for: the alternatives at each position (None: none).
    top_logprobs: int | None
    #: Whether the prompt's text goes in front of a completion's.
    echo: bool = False


def call_settings(
    options: Mapping[str, object], *, chat: bool, seed: int | None = None, last_n: int = LAST_N_TOKENS_SIZE
) -> CallSettings:
    """The :class:`CallSettings` of :meth:`Llama.create_chat_completion`'s options (``chat``) or
    :meth:`Llama.create_completion`'s; ``seed`` is the seed of a call that gives none (None: random),
    ``last_n`` the tokens the penalties count. Raises TypeError, ValueError or
    :class:`UnsupportedParameterError` for the first bad argument."""
    call = "create_chat_completion" if chat else "create_completion"
    _check_options(options, ChatCompletionOptions if chat else CompletionOptions, call)
    given = options.get("seed")
    seed = seed if given is None else _seed(given)
    temperature = _real(
        "temperature", options.get("temperature", CHAT_TEMPERATURE if chat else COMPLETION_TEMPERATURE), 0.0, math.inf
    )
    sampling = _Sampling(
        temperature=temperature,
        top_k=max(0, _integer("top_k", options.get("top_k", TOP_K))),
        top_p=_real("top_p", options.get("top_p", TOP_P), 0.0, 1.0, open_low=True),
        seed=0 if temperature == 0 else seed,  # greedy: any seed chooses alike (and continues a conversation)
        repeat_last_n=last_n,
        logit_bias=_logit_bias(options.get("logit_bias")),
        grammar=_grammar_text(options.get("grammar")),
        **_chain_reals(options),
    )
    limit = options.get("max_tokens", None if chat else COMPLETION_MAX_TOKENS)
    limit = None if limit is None else _integer("max_tokens", limit)
    model = options.get("model")
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a str or None, not {type(model).__name__}")
    max_tokens = limit if limit and limit > 0 else None
    if chat:
        sampling = _with_response_format(sampling, options.get("response_format"))
        return CallSettings(sampling, max_tokens, _stops(options.get("stop")), model, _chat_top_logprobs(options))
    echo = _flag("echo", options.get("echo", False))
    top = _count_option("logprobs", options.get("logprobs"))
    if top is not None and echo:
        raise UnsupportedParameterError("logprobs with echo=True is not supported: the prompt's are not computed")
    return CallSettings(sampling, max_tokens, _stops(options.get("stop")), model, top, echo)


# --- the class -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sampling:
    """A call's sampling parameters; ``seed`` None draws a random seed for each new generator."""

    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    min_p: float = MIN_P
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = LAST_N_TOKENS_SIZE
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: ``(token, bias)`` pairs by token.
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: The GBNF grammar replies follow (None: none).
    grammar: str | None = None

    def __post_init__(self) -> None:
        # The generator keeps its real parameters in single precision: so do these, so that the sampling of
        # a call and the one a checkpoint records compare equal.
        for name in _REAL_FIELDS:
            object.__setattr__(self, name, _single(getattr(self, name)))
        object.__setattr__(self, "logit_bias", tuple((t, _single(b)) for t, b in self.logit_bias))

    @classmethod
    def of(cls, config: GeneratorConfig) -> _Sampling:
        """The sampling a generator runs with (what its checkpoint records)."""
        fields = {name: config[name] for name in _REAL_FIELDS}  # type: ignore[literal-required]
        bias = tuple(sorted(config["logit_bias"].items()))
        return cls(
            top_k=config["top_k"],
            seed=config["seed"],
            repeat_last_n=config["repeat_last_n"],
            logit_bias=bias,
            grammar=config["grammar"],
            **fields,
        )

    def settings(self) -> GeneratorSettings:
        """The generator settings of these parameters (a random seed drawn now when ``seed`` is None)."""
        seed = secrets.randbits(64) if self.seed is None else self.seed
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": seed,
            "min_p": self.min_p,
            "typical_p": self.typical_p,
            "repeat_penalty": self.repeat_penalty,
            "repeat_last_n": self.repeat_last_n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": dict(self.logit_bias),
            "grammar": self.grammar,
        }


_REAL_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def _single(value: float) -> float:
    """``value`` rounded to single precision, as the generator stores it (beyond its range: infinite)."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


@dataclass
class _Conversation:
    """The chat :class:`Llama` can continue: its generator and the sampling it was started with."""

    generator: Generator
    sampling: _Sampling


@dataclass
class _Run:
    """One call's generation: the generator, its text pieces, and what labels the result."""

    generator: Generator
    pieces: Iterator[str]
    model: str
    id: str
    scanner: _StopScanner | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    #: The reply's token budget (a chat's).
    limit: int = 0
    #: The log-probabilities reported, when the call asks for them.
    logprobs: _LogprobTracker | None = None

    def finish_reason(self) -> FinishReason:
        """``stop`` or ``length``, once the pieces are all read."""
        if self.scanner is not None and self.scanner.stopped:
            return "stop"
        return _FINISH.get(self.generator.stopped_by or "", "length")

    def usage(self) -> CompletionUsage:
        """Tokens of the prompt (the whole conversation, for a chat) and of the reply (every token generated,
        the end-of-generation token included when one ended it; llama-cpp-python leaves that one out)."""
        prompt, reply = len(self.generator.prompt_tokens), len(self.generator.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": reply, "total_tokens": prompt + reply}


class _LogprobTracker:
    """The log-probabilities a call reports, token by token as the text of its tokens is sent: a token is
    reported once its text is all sent (at the end, once its text begins within what was sent: a token after a
    stop string or an end-of-generation token is not)."""

    def __init__(self, model: Model, generator: Generator, *, reported: int = 0, sent: int = 0) -> None:
        self._model, self._generator = model, generator
        #: Tokens of the reply reported so far, and characters of its text sent.
        self.reported, self.sent = reported, sent
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._spans: list[tuple[int, int]] = []

    def advance(self, text: str, *, final: bool = False) -> list[tuple[int, TokenLogprobs]]:
        """Once ``text`` more is sent: ``(start, record)`` of the tokens newly reported (``start``: where the
        token's text begins in the reply's)."""
        self.sent += len(text)
        tokens = self._generator.tokens
        end = self._spans[-1][1] if self._spans else 0
        for token in tokens[len(self._spans) :]:
            start, end = end, end + len(self._decoder.decode(self._model.token_to_piece(token)))
            self._spans.append((start, end))
        ready = self.reported
        while ready < len(self._spans) and self._spans[ready][0] < self.sent:
            if not final and self._spans[ready][1] > self.sent:
                break
            ready += 1
        records = self._generator.token_logprobs(self.reported)[: ready - self.reported]
        reported = [(self._spans[self.reported + i][0], r) for i, r in enumerate(records) if r is not None]
        self.reported = ready
        return reported


def _piece(model: Model, token: int) -> tuple[str, list[int]]:
    """A token's text (bytes that are not UTF-8 on their own left out, as llama-cpp-python does) and bytes."""
    data = model.token_to_piece(token)
    return data.decode("utf-8", errors="ignore"), list(data)


def _completion_logprobs(model: Model, entries: list[tuple[int, TokenLogprobs]], offset: int) -> CompletionLogprobs:
    """llama-cpp-python's ``logprobs`` of a completion (``offset``: text before the reply, echoed)."""
    result: CompletionLogprobs = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for start, record in entries:
        text = _piece(model, record.token)[0]
        top = {_piece(model, token)[0]: logprob for token, logprob in record.top}
        result["text_offset"].append(offset + start)
        result["token_logprobs"].append(record.logprob)
        result["tokens"].append(text)
        result["top_logprobs"].append({**top, text: record.logprob})
    return result


def _top(model: Model, token: int, logprob: float) -> TopLogprob:
    text, data = _piece(model, token)
    return {"token": text, "logprob": logprob, "bytes": data}


def _chat_logprobs(model: Model, entries: list[tuple[int, TokenLogprobs]]) -> ChatCompletionLogprobs:
    """OpenAI's ``logprobs`` of a chat reply."""
    content: list[ChatCompletionTokenLogprob] = [
        {
            **_top(model, record.token, record.logprob),
            "top_logprobs": [_top(model, token, logprob) for token, logprob in record.top],
        }
        for _, record in entries
    ]
    return {"content": content, "refusal": None}


class Llama:
    """A model with llama-cpp-python's ``Llama`` calls, generating with a :class:`~specstate.Generator`.

    Args:
        model_path: the GGUF model.
        n_ctx: context length in tokens of each generation (default :data:`N_CTX`, 2048;
            llama-cpp-python's is 512).
        n_batch: rows per decode (default :data:`N_BATCH`).
        n_threads: threads per context (None: the CPUs available).
        seed: the seed of every call that does not give one; :data:`LLAMA_DEFAULT_SEED` (the default)
            or -1: a random seed for each call, as in llama-cpp-python.
        n_gpu_layers: layers offloaded to a GPU when the build has one (-1: all).
        use_mmap: map the model file instead of reading it (default False; llama-cpp-python's is True).
        mode: specstate's speculative mode: ``none`` (default), ``ngram``, ``draft``, ``mtp``, ``eagle3``.
        draft_model_path: the draft model of the ``draft`` and ``eagle3`` modes.
        n_draft: most tokens drafted per round (default :data:`N_DRAFT`).
        last_n_tokens_size: tokens of the history the repetition penalties count
            (default :data:`LAST_N_TOKENS_SIZE`; 0: none, -1: the whole history).
        chat_format: None (the model's own template) or ``"chatml"``; llama-cpp-python's other
            format names are not available (give the template's Jinja source as ``chat_template``).
        chat_template: a Jinja chat template used instead of the model's own.
        verbose: accepted for compatibility; it changes nothing (llama-cpp-python's default is True).

    Sampling: specstate's sampler chain (llama.cpp's order: logit bias,
    repetition penalties over the last ``last_n_tokens_size`` tokens of the
    history, grammar, top-k, typical-p, top-p, min-p, temperature) takes
    ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``,
    ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``,
    ``logit_bias`` and ``grammar`` (a :class:`LlamaGrammar`; chats also take
    ``response_format`` JSON modes, made into a grammar by llama.cpp's
    JSON-schema converter), with llama-cpp-python's defaults: ``temperature``
    :data:`COMPLETION_TEMPERATURE` (0.8) for completions and
    :data:`CHAT_TEMPERATURE` (0.2) for chats, ``top_p`` :data:`TOP_P`,
    ``top_k`` :data:`TOP_K`, ``min_p`` :data:`MIN_P`, ``typical_p`` and
    ``repeat_penalty`` 1.0, the other penalties 0.0; ``max_tokens``
    :data:`COMPLETION_MAX_TOKENS` (16) for completions and None (until the
    context is full) for chats. Greedy calls (``temperature`` 0) apply the
    bias, penalties and grammar too, as llama.cpp does. The parameters the chain lacks
    (:data:`NEUTRAL`: tail-free sampling, mirostat, log-probabilities, ...) are
    accepted at their neutral values and raise
    :class:`UnsupportedParameterError` otherwise. ``top_k`` at most 0 keeps
    every token, as in llama.cpp. Every argument after the prompt or the
    messages is keyword-only.

    Chat: llama-cpp-python callers send the whole history each turn. When the
    messages extend the conversation held from the last chat call (the same
    earlier messages, the assistant replies as returned, the same sampling
    parameters), only the new messages are decoded after it, its random
    stream going on where the last reply left it; otherwise a new generation
    starts on all of them (greedy calls continue whatever the seed). A reply cut by a ``stop`` string is
    recorded by the generator with the text its last round committed after the
    stop, so a history sent back with the cut reply starts a new generation.
    :attr:`chat_generator` is that conversation's generator (to checkpoint it).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int = N_CTX,
        n_batch: int = N_BATCH,
        n_threads: int | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_gpu_layers: int = 0,
        use_mmap: bool = False,
        mode: Mode = "none",
        draft_model_path: str | os.PathLike[str] | None = None,
        n_draft: int = N_DRAFT,
        last_n_tokens_size: int = LAST_N_TOKENS_SIZE,
        chat_format: str | None = None,
        chat_template: str | None = None,
        verbose: bool = False,
    ) -> None:
        if mode not in get_args(Mode):
            raise ValueError(f"mode must be one of {', '.join(get_args(Mode))}, not {mode!r}")
        threads = 0 if n_threads is None else n_threads
        for name, value in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_draft", n_draft), ("n_threads", threads)):
            _integer(name, value)  # the ranges are the generator's to check
        self._seed = _seed(seed)
        self._last_n = _integer("last_n_tokens_size", last_n_tokens_size)
        self._template = _template_source(chat_format, chat_template)
        #: Accepted for compatibility; nothing reads it.
        self.verbose = verbose
        #: The path the model was loaded from.
        self.model_path = os.fspath(model_path)
        #: The target model.
        self.model = Model(model_path, n_gpu_layers=n_gpu_layers, use_mmap=use_mmap)
        draft = None if draft_model_path is None else Model(draft_model_path, n_gpu_layers=n_gpu_layers)
        self._settings: GeneratorSettings = {
            "mode": mode,
            "draft_model": draft,
            "n_draft": n_draft,
            "n_ctx": n_ctx,
            "n_batch": n_batch,
            "n_threads": threads,
        }
        self._conversation: _Conversation | None = None

    # --- llama-cpp-python's helpers --------------------------------------------------------------

    def n_ctx(self) -> int:
        """The context length each generation is created with: as given, or the model's trained length for 0
        (llama.cpp may round it up)."""
        return self._settings["n_ctx"] or self.model.n_ctx_train

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text``; ``add_bos`` adds BOS as the model says, ``special`` parses special tokens."""
        return self.model.tokenize(text.decode("utf-8", errors="replace"), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The UTF-8 bytes of ``tokens``; ``special`` includes the text of special tokens."""
        return b"".join(self.model.token_to_piece(token, special=special) for token in tokens)

    def reset(self) -> None:
        """Forget the held conversation: the next chat call starts a new generation."""
        self._conversation = None

    def release(self, generator: Generator) -> None:
        """Forget the held conversation if it is ``generator``'s (a parked reply's, say)."""
        if self._conversation is not None and self._conversation.generator is generator:
            self._conversation = None

    @property
    def chat_generator(self) -> Generator | None:
        """The generator of the conversation the next chat call can continue (None before a chat call)."""
        return None if self._conversation is None else self._conversation.generator

    def restore_chat(self, checkpoint: bytes | str | os.PathLike[str]) -> Generator:
        """Continue a saved chat: ``checkpoint`` (bytes, or a file) of a :attr:`chat_generator` is restored with
        this object's models and thread count and becomes the conversation the next chat call continues when
        its messages extend it with the sampling parameters the checkpoint records. Returns the generator.
        Raises :class:`~specstate.ChatTemplateError` for a conversation rendered with another chat template
        than this object's (nothing changes)."""
        settings = self._settings
        generator = Generator.restore(
            checkpoint, self.model, draft_model=settings["draft_model"], n_threads=settings["n_threads"]
        )
        if not generator.messages:
            raise ValueError("the checkpoint holds a generation started with a prompt, not a chat")
        if generator.chat_template_sha256 != template_sha256(chat_template(self.model, self._template)):
            raise ChatTemplateError("the checkpoint's conversation was rendered with another chat template")
        self._conversation = _Conversation(generator, _Sampling.of(generator.config))
        return generator

    # --- completions -----------------------------------------------------------------------------

    @overload
    def create_completion(
        self, prompt: str | Sequence[int], *, stream: Literal[False] = ..., **options: Unpack[CompletionOptions]
    ) -> Completion: ...
    @overload
    def create_completion(
        self, prompt: str | Sequence[int], *, stream: Literal[True], **options: Unpack[CompletionOptions]
    ) -> CompletionStream: ...
    @overload
    def create_completion(
        self, prompt: str | Sequence[int], *, stream: bool, **options: Unpack[CompletionOptions]
    ) -> Completion | CompletionStream: ...
    def create_completion(
        self, prompt: str | Sequence[int], *, stream: bool = False, **options: Unpack[CompletionOptions]
    ) -> Completion | CompletionStream:
        """Continue ``prompt`` (text, read with special tokens parsed, or token ids) in a new generation.

        The keyword arguments are :class:`CompletionOptions`. Returns a
        :class:`Completion`, or with ``stream=True`` an iterator of
        :class:`CompletionChunk` (the last one, with empty text, carries the
        ``finish_reason``). Every argument is checked before anything is decoded.
        """
        streaming = _flag("stream", stream)
        call = call_settings(options, chat=False, seed=self._seed, last_n=self._last_n)
        generator = self._generator(call.sampling)
        generator.set_logprobs(call.top_logprobs)
        limit = call.max_tokens or generator.context_length
        pieces = generator.stream(prompt, max_tokens=limit, stop=call.stops)
        run = _Run(generator, pieces, call.model or self.model_path, f"cmpl-{uuid.uuid4()}")
        run.logprobs = None if call.top_logprobs is None else _LogprobTracker(self.model, generator)
        front = (prompt if isinstance(prompt, str) else self.model.detokenize(list(prompt))) if call.echo else ""
        chunks = CompletionStream(run, front)
        return chunks if streaming else chunks.whole()

    @overload
    def __call__(
        self, prompt: str | Sequence[int], *, stream: Literal[False] = ..., **options: Unpack[CompletionOptions]
    ) -> Completion: ...
    @overload
    def __call__(
        self, prompt: str | Sequence[int], *, stream: Literal[True], **options: Unpack[CompletionOptions]
    ) -> CompletionStream: ...
    @overload
    def __call__(
        self, prompt: str | Sequence[int], *, stream: bool, **options: Unpack[CompletionOptions]
    ) -> Completion | CompletionStream: ...
    def __call__(
        self, prompt: str | Sequence[int], *, stream: bool = False, **options: Unpack[CompletionOptions]
    ) -> Completion | CompletionStream:
        """:meth:`create_completion`."""
        return self.create_completion(prompt, stream=stream, **options)

    # --- chat ------------------------------------------------------------------------------------

    @overload
    def create_chat_completion(
        self, messages: Sequence[ChatMessage], *, stream: Literal[False] = ..., **options: Unpack[ChatCompletionOptions]
    ) -> ChatCompletion: ...
    @overload
    def create_chat_completion(
        self, messages: Sequence[ChatMessage], *, stream: Literal[True], **options: Unpack[ChatCompletionOptions]
    ) -> ChatStream: ...
    @overload
    def create_chat_completion(
        self, messages: Sequence[ChatMessage], *, stream: bool, **options: Unpack[ChatCompletionOptions]
    ) -> ChatCompletion | ChatStream: ...
    def create_chat_completion(
        self, messages: Sequence[ChatMessage], *, stream: bool = False, **options: Unpack[ChatCompletionOptions]
    ) -> ChatCompletion | ChatStream:
        """The assistant's reply to ``messages``, the whole conversation so far (see the class docstring).

        Messages are ``{"role", "content"}`` mappings; ``content`` may be a
        list of ``{"type": "text", "text": ...}`` parts (joined with newlines);
        ``name`` is accepted when the chat template does not read it. The
        keyword arguments are :class:`ChatCompletionOptions`. Returns a
        :class:`ChatCompletion`, or with ``stream=True`` an iterator of
        :class:`ChatCompletionChunk` (the role first, then the text, then the
        ``finish_reason``). Every argument is checked before anything changes.
        """
        streaming = _flag("stream", stream)
        call = call_settings(options, chat=True, seed=self._seed, last_n=self._last_n)
        template = chat_template(self.model, self._template)
        generator, new = self._pick(chat_pairs(messages, template.source), call.sampling)
        generator.set_logprobs(call.top_logprobs)
        limit = call.max_tokens or generator.context_length
        text = generator.stream_chat(as_messages(new), max_tokens=limit, template=self._template)
        self._conversation = _Conversation(generator, call.sampling)
        scanner = _StopScanner(text, call.stops)
        model = call.model or self.model_path
        run = _Run(generator, self._watch(iter(scanner)), model, f"chatcmpl-{uuid.uuid4()}", scanner, limit=limit)
        run.logprobs = None if call.top_logprobs is None else _LogprobTracker(self.model, generator)
        return ChatStream(self, run) if streaming else _chat_completion(run)

    def resume_chat(self, parked: ParkedChat) -> ChatStream:
        """The rest of a streamed chat reply that :meth:`ChatStream.park` paused: restored from its checkpoint
        with this object's models (any :class:`Llama` over the same files), the chunks go on token for token
        where the paused stream left them, without a second role chunk."""
        generator = self.restore_chat(parked.checkpoint)
        text = generator.continue_reply(max_tokens=parked.remaining)
        scanner = _StopScanner(text, parked.stops, parked.held)
        run = _Run(generator, self._watch(iter(scanner)), parked.model, parked.id, scanner, parked.created)
        run.limit = parked.remaining + len(generator.tokens)
        if parked.reported is not None:
            run.logprobs = _LogprobTracker(self.model, generator, reported=parked.reported[0], sent=parked.reported[1])
        return ChatStream(self, run, started=True)

    def _pick(self, pairs: list[tuple[str, str]], sampling: _Sampling) -> tuple[Generator, list[tuple[str, str]]]:
        """The held generator and the new messages, when ``pairs`` extend its conversation; else a new one and all."""
        held = self._conversation
        if held is not None and held.sampling == sampling:
            before = [(message["role"], message["content"]) for message in held.generator.messages]
            if before and len(pairs) > len(before) and pairs[: len(before)] == before:
                return held.generator, pairs[len(before) :]
        return self._generator(sampling), pairs

    def _generator(self, sampling: _Sampling) -> Generator:
        """A new generator with this object's settings and ``sampling``."""
        settings: GeneratorSettings = {**self._settings, **sampling.settings()}
        return Generator(self.model, **settings)

    def _watch(self, pieces: Iterator[str]) -> Iterator[str]:
        """``pieces``, forgetting the held conversation if generating them fails."""
        try:
            yield from pieces
        except Exception:
            self._conversation = None
            raise


# --- results from runs ---------------------------------------------------------------------------


def joined_completion(chunks: Sequence[CompletionChunk], usage: CompletionUsage) -> Completion:
    """The whole completion that a streamed completion's chunks make (``usage``: :meth:`CompletionStream.usage`)."""
    last = chunks[-1]
    choice: CompletionChoice = {
        "text": "".join(chunk["choices"][0]["text"] for chunk in chunks),
        "index": 0,
        "logprobs": None,
        "finish_reason": last["choices"][0]["finish_reason"],
    }
    parts = [chunk["choices"][0]["logprobs"] for chunk in chunks if chunk["choices"][0]["logprobs"] is not None]
    if parts:  # the call asked for log-probabilities: the last chunk carries them at least
        joined: CompletionLogprobs = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for part in parts:
            for key in joined:
                joined[key] += part[key]  # type: ignore[literal-required]
        choice["logprobs"] = joined
    return {
        "id": last["id"],
        "object": "text_completion",
        "created": last["created"],
        "model": last["model"],
        "choices": [choice],
        "usage": usage,
    }


def _completion_logprobs_of(run: _Run, sent: str, offset: int, *, final: bool = False) -> CompletionLogprobs | None:
    """The completion ``logprobs`` of the tokens ``sent`` more reply text covers (None if not asked for)."""
    if run.logprobs is None:
        return None
    return _completion_logprobs(run.generator.model, run.logprobs.advance(sent, final=final), offset)


def _completion_chunk(
    run: _Run, text: str, finish_reason: FinishReason | None, logprobs: CompletionLogprobs | None = None
) -> CompletionChunk:
    """One chunk of a streamed completion."""
    choice: CompletionChoice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"id": run.id, "object": "text_completion", "created": run.created, "model": run.model, "choices": [choice]}


def _completion_chunks(run: _Run, front: str) -> PyGenerator[CompletionChunk, None, None]:
    """The chunks of a streamed completion: the echoed prompt if any, each piece, then the finish reason."""
    if front:
        yield _completion_chunk(run, front, None)
    for piece in run.pieces:
        yield _completion_chunk(run, piece, None, _completion_logprobs_of(run, piece, len(front)))
    yield _completion_chunk(run, "", run.finish_reason(), _completion_logprobs_of(run, "", len(front), final=True))


class CompletionStream(Iterator[CompletionChunk]):
    """The chunks of a streamed completion: the echoed prompt (with ``echo``), each piece of text, then the
    ``finish_reason``; :meth:`usage` counts the tokens once they are read."""

    def __init__(self, run: _Run, front: str) -> None:
        self._run = run
        self._chunks = _completion_chunks(run, front)

    def __next__(self) -> CompletionChunk:
        return next(self._chunks)

    def close(self) -> None:
        """Stop the stream (what was generated stays generated)."""
        self._chunks.close()

    def usage(self) -> CompletionUsage:
        """Tokens of the prompt and of the reply so far."""
        return self._run.usage()

    def whole(self) -> Completion:
        """Read every chunk and join them into the whole :class:`Completion`."""
        return joined_completion(list(self), self.usage())


def _chat_logprobs_of(run: _Run, sent: str, *, final: bool = False) -> ChatCompletionLogprobs | None:
    """The chat ``logprobs`` of the tokens ``sent`` more reply text covers (None if not asked for)."""
    if run.logprobs is None:
        return None
    return _chat_logprobs(run.generator.model, run.logprobs.advance(sent, final=final))


def _chat_completion(run: _Run) -> ChatCompletion:
    """The whole chat completion of ``run``."""
    content = "".join(run.pieces)
    message: ChatCompletionMessage = {"role": "assistant", "content": content}
    choice: ChatCompletionChoice = {
        "index": 0,
        "message": message,
        "logprobs": _chat_logprobs_of(run, content, final=True),
        "finish_reason": run.finish_reason(),
    }
    return {
        "id": run.id,
        "object": "chat.completion",
        "created": run.created,
        "model": run.model,
        "choices": [choice],
        "usage": run.usage(),
    }


def _chat_chunk(
    run: _Run,
    delta: ChatCompletionDelta,
    finish_reason: FinishReason | None,
    logprobs: ChatCompletionLogprobs | None = None,
) -> ChatCompletionChunk:
    """One chunk of a streamed chat completion."""
    choice: ChatCompletionChunkChoice = {
        "index": 0,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    return {
        "id": run.id,
        "object": "chat.completion.chunk",
        "created": run.created,
        "model": run.model,
        "choices": [choice],
    }


def _chat_chunks(run: _Run, role: bool = True) -> PyGenerator[ChatCompletionChunk, None, None]:
    """The chunks of a streamed chat completion: the role (unless ``role`` is False: a resumed stream), each
    piece of text, then the finish reason."""
    if role:
        yield _chat_chunk(run, {"role": "assistant"}, None)
    for piece in run.pieces:
        yield _chat_chunk(run, {"content": piece}, None, _chat_logprobs_of(run, piece))
    yield _chat_chunk(run, {}, run.finish_reason(), _chat_logprobs_of(run, "", final=True))


@dataclass(frozen=True)
class ParkedChat:
    """A streamed chat reply paused between two chunks (:meth:`ChatStream.park`): the generation's checkpoint
    and what the rest of its chunks need. :meth:`Llama.resume_chat` continues it, in any thread or process."""

    #: The generation's checkpoint (its conversation, tokens, sampling and RNG).
    checkpoint: bytes
    #: Tokens the reply may still generate.
    remaining: int
    #: The call's stop strings.
    stops: list[str]
    #: Text generated and not yet sent (it could begin a stop string).
    held: str
    #: The chunks' ``id``, ``created`` and ``model``.
    id: str
    created: int
    model: str
    #: When the call asked for log-probabilities: the reply tokens reported and the reply characters sent.
    reported: tuple[int, int] | None = None


class ChatStream(Iterator[ChatCompletionChunk]):
    """The chunks of a streamed chat completion (the role, each piece of text, then the finish reason); between
    two chunks a running reply can be paused with :meth:`park` and continued later by :meth:`Llama.resume_chat`."""

    def __init__(self, llama: Llama, run: _Run, *, started: bool = False) -> None:
        self._llama, self._run, self._started = llama, run, started
        self._chunks = _chat_chunks(run, role=not started)

    def __next__(self) -> ChatCompletionChunk:
        chunk = next(self._chunks)
        self._started = True
        return chunk

    def close(self) -> None:
        """Stop the stream (the generation keeps what it committed)."""
        self._chunks.close()

    def park(self) -> ParkedChat | None:
        """Pause the reply: its checkpoint and state, the stream closed and the generation let go (its contexts
        freed once nothing else holds it). None, and nothing changes, if the reply is complete but for its last
        chunks (it ended, or a stop string cut it) or no chunk was taken yet."""
        run, generator = self._run, self._run.generator
        scanner = run.scanner
        if not self._started or scanner is None or scanner.stopped or generator.finished:
            return None
        remaining = run.limit - len(generator.tokens)
        if remaining <= 0:
            return None
        tracker = run.logprobs
        parked = ParkedChat(
            generator.checkpoint(),
            remaining,
            scanner.stops,
            scanner.held,
            run.id,
            run.created,
            run.model,
            None if tracker is None else (tracker.reported, tracker.sent),
        )
        self._chunks.close()
        self._llama.release(generator)
        return parked


class _StopScanner:
    """A reply's text pieces cut before the first stop string; text that could begin one is held back.

    Linear in the text and the stop strings: each stop string's longest partial match at the end of the text
    is kept up to date character by character (Knuth-Morris-Pratt), never searched for again."""

    def __init__(self, pieces: TextStream, stops: list[str], held: str = "") -> None:
        self._pieces = pieces
        self.stops = stops
        self._partials = [_PartialMatch(stop) for stop in stops]
        #: Whether a stop string ended the text.
        self.stopped = False
        #: Text read and not yet yielded: it could begin a stop string.
        self.held = ""
        self._read(held)

    def _read(self, text: str) -> None:
        self.held += text
        for partial in self._partials:
            partial.feed(text)

    def __iter__(self) -> Iterator[str]:
        try:
            for piece in self._pieces:
                self._read(piece)
                cut = _first_stop(self.held, self.stops)
                if cut is not None:
                    self.stopped = True
                    self.held = self.held[:cut]
                    break
                ready = len(self.held) - max((partial.length for partial in self._partials), default=0)
                if ready > 0:
                    piece, self.held = self.held[:ready], self.held[ready:]
                    yield piece
            if self.held:
                piece, self.held = self.held, ""
                yield piece
        finally:
            self._pieces.close()


class _PartialMatch:
    """How much of ``stop`` the text read so far ends with (short of the whole of it), kept as text is read."""

    def __init__(self, stop: str) -> None:
        self._stop = stop
        #: ``_fallback[i]``: the longest proper prefix of ``stop[: i + 1]`` that is also its suffix.
        self._fallback = [0] * len(stop)
        length = 0
        for index in range(1, len(stop)):
            while length and stop[index] != stop[length]:
                length = self._fallback[length - 1]
            length += stop[index] == stop[length]
            self._fallback[index] = length
        #: The longest end of the text that begins ``stop`` (a whole match is the scanner's to find).
        self.length = 0

    def feed(self, text: str) -> None:
        stop, length = self._stop, self.length
        for char in text:
            while length and (length == len(stop) or stop[length] != char):
                length = self._fallback[length - 1]
            length += stop[length] == char
        self.length = length if length < len(stop) else self._fallback[length - 1]


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in ``text`` begins, or None."""
    found = [index for index in (text.find(stop) for stop in stops) if index >= 0]
    return min(found) if found else None


# --- checking arguments --------------------------------------------------------------------------


def _check_options(options: Mapping[str, object], allowed: type, call: str) -> None:
    """Refuse keyword arguments ``call`` does not take, and unsupported parameters at non-neutral values."""
    known: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__  # type: ignore[attr-defined]
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
    for name in ("mirostat_tau", "mirostat_eta"):
        if name in options:
            _real(name, options[name], -math.inf, math.inf)
    for name, value in options.items():
        neutral = NEUTRAL.get(name)
        if neutral is not None and not any(_same(value, choice) for choice in neutral):
            accepted = " or ".join(repr(choice) for choice in neutral)
            raise UnsupportedParameterError(
                f"{name}={value!r} is not supported yet: specstate's sampler accepts only {name}={accepted}"
            )


def _same(value: object, neutral: object) -> bool:
    """``value == neutral``, a bool never standing for a number."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def _flag(name: str, value: object) -> bool:
    """``value``, which must be a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _integer(name: str, value: object) -> int:
    """``value``, which must be an int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def _real(name: str, value: object, low: float, high: float, *, open_low: bool = False) -> float:
    """``value``, a number (not a bool) in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if math.isnan(number) or number < low or number > high or (open_low and number == low):
        bounds = f"{'(' if open_low else '['}{low}, {high}]"
        raise ValueError(f"{name} must be in {bounds}, not {value!r}")
    return number


#: The sampler chain's real-valued parameters and llama-cpp-python's defaults (the generator checks their ranges).
_CHAIN_REALS = {
    "min_p": MIN_P,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def _chain_reals(options: Mapping[str, object]) -> dict[str, float]:
    """The chain's real-valued parameters of a call's options (numbers, not bools), defaults filled in."""
    return {
        name: _real(name, options.get(name, default), -math.inf, math.inf) for name, default in _CHAIN_REALS.items()
    }


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """``{token: bias}`` (or None) as pairs by token; the generator checks the tokens and the values."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a mapping of token ids to numbers, not {type(value).__name__}")
    pairs = (
        (_integer("a logit_bias token", token), _real("logit_bias", bias, -math.inf, math.inf))
        for token, bias in value.items()
    )
    return tuple(sorted(pairs))


def _seed(value: object) -> int | None:
    """A seed from 0 to 2**64 - 1, or None (random) for :data:`LLAMA_DEFAULT_SEED` or -1."""
    seed = _integer("seed", value)
    if seed in (LLAMA_DEFAULT_SEED, -1):
        return None
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be from 0 to 2**64 - 1 (or -1: random), not {seed}")
    return seed


def _count_option(name: str, value: object) -> int | None:
    """An optional count (None, or an int; the generator checks its range)."""
    return None if value is None else _integer(name, value)


def _chat_top_logprobs(options: Mapping[str, object]) -> int | None:
    """The alternatives a chat call's ``logprobs``/``top_logprobs`` ask for (None: no log-probabilities)."""
    top = _count_option("top_logprobs", options.get("top_logprobs"))
    wanted = options.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise TypeError(f"logprobs must be a bool or None, not {type(wanted).__name__}")
    if not wanted:
        if top:
            raise ValueError("top_logprobs needs logprobs=True")
        return None
    return top or 0


def _stops(stop: object) -> list[str]:
    """The stop strings of ``stop`` (None, a string, or a sequence of strings); empty strings are dropped."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise TypeError("stop must be a string, a sequence of strings, or None")
    return [s for s in stop if s]


def _template_source(chat_format: object, template: object) -> str | None:
    """The chat template to render with: None (the model's own), ``"chatml"``, or Jinja source."""
    if template is not None and not isinstance(template, str):
        raise TypeError(f"chat_template must be a str or None, not {type(template).__name__}")
    if chat_format is None:
        return template
    if chat_format != "chatml":
        raise ValueError(
            f"chat_format {chat_format!r} is not available: use None (the model's template), 'chatml', "
            "or give the template's Jinja source as chat_template"
        )
    if template is not None:
        raise ValueError("give chat_format or chat_template, not both")
    return "chatml"


def chat_pairs(messages: object, template_source: str) -> list[tuple[str, str]]:
    """``(role, content)`` of each message, checked (see :meth:`Llama.create_chat_completion`); ``template_source``:
    the chat template's (a message's ``name`` is refused when it reads it)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of messages, not {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    return [_pair(index, message, template_source) for index, message in enumerate(messages)]


def _pair(index: int, message: object, source: str) -> tuple[str, str]:
    """``(role, content)`` of message ``index``."""
    if not isinstance(message, Mapping):
        raise TypeError(f"messages[{index}] must be a mapping, not {type(message).__name__}")
    extra = sorted(set(message) - {"role", "content", "name"})
    if extra:
        raise ValueError(f"messages[{index}]: {extra[0]!r} is not supported (only role, content and name)")
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError(f"messages[{index}]: 'role' must be a string")
    if "name" in message:
        if not isinstance(message["name"], str):
            raise ValueError(f"messages[{index}]: 'name' must be a string")
        if _READS_NAME.search(source):
            raise ValueError(f"messages[{index}]: 'name' is not supported: this chat template reads it")
    return role, _content(index, message.get("content"))


def _content(index: int, content: object) -> str:
    """A message's text: a string, or its ``text`` parts joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise ValueError(f"messages[{index}]: 'content' must be a string or a list of text parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        text = part.get("text") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(text, str):
            raise ValueError(f"messages[{index}]: content part of type {kind!r} is not supported (only text parts)")
        texts.append(text)
    return "\n".join(texts)
