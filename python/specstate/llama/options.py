"""The keyword arguments of :class:`~specstate.Llama`'s calls: llama-cpp-python's defaults, what is not
implemented yet, grammars, and the one check a call's options go through (:func:`call_settings`)."""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import struct
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypedDict, cast

from specstate import _defaults
from specstate._native import Model, check_sampling, json_schema_to_grammar
from specstate._typing import GeneratorConfig, GeneratorSettings, SamplingSettings
from specstate.chat import ToolPrompt, render_tools

if TYPE_CHECKING:
    pass

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
#: Tokens of the history the repetition penalties count (llama-cpp-python's ``last_n_tokens_size`` default,
#: which is the generator's too).
LAST_N_TOKENS_SIZE = _defaults.REPEAT_LAST_N
#: Context length in tokens: the generator's default (llama-cpp-python's is 512: specstate keeps its own, so that
#: a chat has room by default).
N_CTX = _defaults.N_CTX
#: Rows per decode: the generator's default (llama-cpp-python's is 512, whose big batches take kernels that make a
#: reply depend on how its prompt was chunked).
N_BATCH = _defaults.N_BATCH
#: How long each round's draft is in the speculative modes: the generator's default.
DRAFT_POLICY = _defaults.DRAFT_POLICY
#: Most tokens drafted per round in the speculative modes: the generator's default.
N_DRAFT = _defaults.N_DRAFT
#: Whether rounds under a grammar draft the tokens it forces: the generator's default.
GRAMMAR_DRAFTS = _defaults.GRAMMAR_DRAFTS

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
}


class UnsupportedParameterError(NotImplementedError):
    """A llama-cpp-python parameter given a value specstate cannot honour yet (see :data:`NEUTRAL`)."""


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
    #: Added to these tokens' logits, each in [-10000, 10000]; a token is its id or its decimal digits (None: no bias).
    logit_bias: Mapping[int, float] | Mapping[str, float] | None
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
    #: none); with ``echo`` the prompt's tokens' too (the first one's None, as in OpenAI's and
    #: llama-cpp-python's). Their ``text_offset`` count from the prompt's start, echoed or not.
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
    #: Tools the model may call: OpenAI's ``[{"type": "function", "function": {"name", "description",
    #: "parameters"}}]`` (None: none). The chat template receives them; calls come back in
    #: ``message.tool_calls`` (``finish_reason`` ``"tool_calls"``).
    tools: Sequence[Mapping[str, object]] | None
    #: ``"auto"`` (the default with tools: the model chooses), ``"none"``, ``"required"`` (a call, whose
    #: arguments a grammar keeps to the function's schema) or ``{"type": "function", "function": {"name": ...}}``.
    tool_choice: str | Mapping[str, object] | None
    #: Whether a reply may hold several calls (default False).
    parallel_tool_calls: bool


#: A chat message as OpenAI clients send it: ``role``, ``content`` (a string or a list of ``{"type": "text",
#: "text": ...}`` parts) and optionally ``name``.
ChatMessage = Mapping[str, object]

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


def _with_response_format(
    sampling: _Sampling, response_format: object, convert: bool = True
) -> tuple[_Sampling, str | None]:
    """``sampling`` with the grammar a chat call's ``response_format`` asks for, and None; with ``convert``
    False, ``sampling`` and the JSON Schema's text, left for :meth:`CallSettings.converted`."""
    schema = _response_schema(response_format)
    if schema is None:
        return sampling, None
    if sampling.grammar is not None:
        raise ValueError("give grammar or response_format, not both")
    text = json.dumps(schema)
    return (replace(sampling, grammar=json_schema_to_grammar(text)), None) if convert else (sampling, text)


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
    #: A chat's tools (None: none, or ``tool_choice`` ``"none"``), its choice and whether calls may be parallel.
    tools: list[Mapping[str, object]] | None = None
    tool_choice: str | Mapping[str, object] = "auto"
    parallel_tool_calls: bool = False
    #: A ``response_format``'s JSON Schema (JSON text) not converted into the grammar yet (``call_settings``
    #: with ``convert_schema=False``); None once converted, or without one.
    schema: str | None = None

    def converted(self) -> CallSettings:
        """These settings with :attr:`schema` converted into the sampling's grammar (llama.cpp's converter)."""
        if self.schema is None:
            return self
        grammar = json_schema_to_grammar(self.schema)
        return replace(self, sampling=replace(self.sampling, grammar=grammar), schema=None)


def call_settings(
    options: Mapping[str, object],
    *,
    chat: bool,
    seed: int | None = None,
    last_n: int = LAST_N_TOKENS_SIZE,
    convert_schema: bool = True,
) -> CallSettings:
    """The :class:`CallSettings` of :meth:`Llama.create_chat_completion`'s options (``chat``) or
    :meth:`Llama.create_completion`'s; ``seed`` is the seed of a call that gives none (None: random),
    ``last_n`` the tokens the penalties count; ``convert_schema`` False leaves a ``response_format``'s JSON
    Schema in :attr:`CallSettings.schema` (its conversion can cost seconds: ``specstate serve`` bounds it first
    and converts it in the slot). Raises TypeError, ValueError or :class:`UnsupportedParameterError` for the
    first bad argument."""
    call = "create_chat_completion" if chat else "create_completion"
    _check_options(options, ChatCompletionOptions if chat else CompletionOptions, call)
    given = options.get("seed")
    seed = seed if given is None else _seed(given)
    temperature = _number(
        "temperature", options.get("temperature", CHAT_TEMPERATURE if chat else COMPLETION_TEMPERATURE)
    )
    sampling = _Sampling(
        temperature=temperature,
        top_k=max(0, _integer("top_k", options.get("top_k", TOP_K))),
        top_p=_number("top_p", options.get("top_p", TOP_P)),
        seed=0 if temperature == 0 else seed,  # greedy: any seed chooses alike (and continues a conversation)
        repeat_last_n=last_n,
        logit_bias=_logit_bias(options.get("logit_bias")),
        grammar=_grammar_text(options.get("grammar")),
        **_chain_reals(options),
    )
    check_sampling(**cast(SamplingSettings, sampling.settings()))  # every range, once, in the core
    limit = options.get("max_tokens", None if chat else COMPLETION_MAX_TOKENS)
    limit = None if limit is None else _integer("max_tokens", limit)
    model = options.get("model")
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a str or None, not {type(model).__name__}")
    max_tokens = limit if limit and limit > 0 else None
    if chat:
        sampling, schema = _with_response_format(sampling, options.get("response_format"), convert_schema)
        tools, choice, parallel = _tools(options)
        if tools is not None and (sampling.grammar is not None or schema is not None or options.get("logprobs")):
            raise UnsupportedParameterError(
                "tools are not supported together with a grammar, response_format or logprobs"
            )
        top = _chat_top_logprobs(options)
        return CallSettings(
            sampling, max_tokens, _stops(options.get("stop")), model, top, False, tools, choice, parallel, schema
        )
    echo = _flag("echo", options.get("echo", False))
    top = _count_option("logprobs", options.get("logprobs"))
    return CallSettings(sampling, max_tokens, _stops(options.get("stop")), model, top, echo)


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
        values: dict[str, Any] = {field.name: config[field.name] for field in fields(cls)}  # type: ignore[literal-required]
        values["logit_bias"] = tuple(sorted(config["logit_bias"].items()))
        return cls(**values)

    def settings(self) -> GeneratorSettings:
        """The generator settings of these parameters (a random seed drawn now when ``seed`` is None)."""
        values: dict[str, Any] = {field.name: getattr(self, field.name) for field in fields(self)}
        values["seed"] = secrets.randbits(64) if self.seed is None else self.seed
        values["logit_bias"] = dict(self.logit_bias)
        return cast(GeneratorSettings, values)


#: The real-valued parameters (the generator keeps them in single precision).
_REAL_FIELDS = tuple(field.name for field in fields(_Sampling) if field.type == "float")


def _single(value: float) -> float:
    """``value`` rounded to single precision, as the generator stores it (beyond its range: infinite)."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


# --- checking arguments --------------------------------------------------------------------------


def _check_options(options: Mapping[str, object], allowed: type, call: str) -> None:
    """Refuse keyword arguments ``call`` does not take, and unsupported parameters at non-neutral values."""
    known: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__  # type: ignore[attr-defined]
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
    for name in ("mirostat_tau", "mirostat_eta"):
        if name in options:
            _number(name, options[name])
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


def _number(name: str, value: object) -> float:
    """``value``, a number (not a bool); its range is the core's to check."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return float(value)


#: The sampler chain's real-valued parameters with llama-cpp-python's defaults (the generator checks their ranges).
_CHAIN_REALS: dict[str, float] = {
    field.name: field.default
    for field in fields(_Sampling)
    if field.name in _REAL_FIELDS and field.default is not MISSING
}


def _chain_reals(options: Mapping[str, object]) -> dict[str, float]:
    """The chain's real-valued parameters of a call's options (numbers, not bools), defaults filled in."""
    return {name: _number(name, options.get(name, default)) for name, default in _CHAIN_REALS.items()}


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """``{token: bias}`` (or None) as pairs by token; a token may be its id or the id's decimal digits (JSON's
    keys are strings: ``{"19556": -100}``, as llama-cpp-python reads them). The generator checks the tokens and
    the values."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a mapping of token ids to numbers, not {type(value).__name__}")
    pairs = ((_token_id(token), _number("logit_bias", bias)) for token, bias in value.items())
    return tuple(sorted(pairs))


def _token_id(token: object) -> int:
    """A ``logit_bias`` key: an int, or a string of decimal digits."""
    if isinstance(token, str):
        if not (token.isascii() and token.isdigit() and len(token) <= 20):
            raise ValueError(f"a logit_bias key must be a token id (decimal digits), not {token[:40]!r}")
        return int(token)
    return _integer("a logit_bias token", token)


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


def _tools(options: Mapping[str, object]) -> tuple[list[Mapping[str, object]] | None, str | Mapping[str, object], bool]:
    """A chat call's tools (None without any, or with ``tool_choice`` ``"none"``), choice and parallelism."""
    tools = options.get("tools")
    if tools is not None and (
        isinstance(tools, (str, bytes))
        or not isinstance(tools, Sequence)
        or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise TypeError("tools must be a list of {'type': 'function', 'function': {...}} mappings, or None")
    choice = options.get("tool_choice") or "auto"
    if not (choice in ("auto", "none", "required") or isinstance(choice, Mapping)):
        raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or a named function, not {choice!r}")
    parallel = _flag("parallel_tool_calls", options.get("parallel_tool_calls", False))
    if not tools or choice == "none":
        return None, choice, parallel
    return list(tools), choice, parallel


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
    """The chat template to render with: None (the model's own), a chat format's name (llama-cpp-python's names
    that llama.cpp has a built-in template for, :data:`specstate.chat.CHAT_FORMATS`, or llama.cpp's own names),
    or Jinja source (given as ``chat_format``, when it is not a name, or as ``chat_template``)."""
    from specstate.chat import CHAT_FORMATS, builtin_name, is_format_name

    if template is not None and not isinstance(template, str):
        raise TypeError(f"chat_template must be a str or None, not {type(template).__name__}")
    if chat_format is None:
        return template
    if not isinstance(chat_format, str):
        raise TypeError(f"chat_format must be a str or None, not {type(chat_format).__name__}")
    if template is not None:
        raise ValueError("give chat_format or chat_template, not both")
    if is_format_name(chat_format) and builtin_name(chat_format) is None:
        raise ValueError(
            f"chat_format {chat_format!r} is not available: use None (the model's template), one of "
            f"{', '.join(CHAT_FORMATS)} (or a name of llama.cpp's built-in templates), or the template's Jinja source"
        )
    return chat_format


#: What a message of a chat with tools may hold (OpenAI's shape).
_TOOL_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})


def uses_tools(messages: object) -> bool:
    """Whether ``messages`` hold tool calls or tool results (they are then rendered with the tools' machinery)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return False
    return any(isinstance(m, Mapping) and (m.get("role") == "tool" or "tool_calls" in m) for m in messages)


def tool_messages(messages: object) -> list[dict[str, object]]:
    """The messages of a chat with tools as the template receives them (OpenAI's shape: an assistant message
    may hold ``tool_calls`` and no content, a ``tool`` message a ``tool_call_id``), each checked; text parts are
    joined as :func:`chat_pairs` joins them."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of messages, not {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    return [_tool_message(index, message) for index, message in enumerate(messages)]


def _tool_message(index: int, message: object) -> dict[str, object]:
    if not isinstance(message, Mapping):
        raise TypeError(f"messages[{index}] must be a mapping, not {type(message).__name__}")
    extra = sorted(set(message) - _TOOL_MESSAGE_KEYS)
    if extra:
        raise ValueError(f"messages[{index}]: {extra[0]!r} is not supported")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str):
        raise ValueError(f"messages[{index}]: 'role' must be a string")
    entry: dict[str, object] = {"role": role, "content": None if content is None else _content(index, content)}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, Sequence) or isinstance(calls, str) or not all(isinstance(c, Mapping) for c in calls):
            raise ValueError(f"messages[{index}]: 'tool_calls' must be a list of calls")
        entry["tool_calls"] = [dict(call) for call in calls]
    for key in ("tool_call_id", "name"):
        if key in message:
            if not isinstance(message[key], str):
                raise ValueError(f"messages[{index}]: {key!r} must be a string")
            entry[key] = message[key]
    return entry


@dataclass(frozen=True)
class ChatInput:
    """A chat's messages, read once (:func:`read_chat`): what :meth:`Llama.chat_stream` generates a reply to."""

    #: Each message's ``(role, text)`` (a call's or tool result's text for a message with tools): what a held or
    #: cached conversation is compared with.
    pairs: tuple[tuple[str, str], ...]
    #: A chat with tools (its tools, or tool calls and results in its messages): the messages as the template
    #: receives them (:func:`tool_messages`), rendered whole; None for a plain chat, rendered from :attr:`pairs`.
    rendered: tuple[dict[str, object], ...] | None = None

    @property
    def tools(self) -> bool:
        """Whether the chat is rendered with the tools' machinery (not continued from a held conversation)."""
        return self.rendered is not None


def read_chat(messages: object, template_source: str, *, tools: bool) -> ChatInput:
    """A chat's messages, each checked (see :meth:`Llama.create_chat_completion`): rendered with the tools'
    machinery when the call gives ``tools`` or the messages hold tool calls or results, else as
    :func:`chat_pairs` reads them (``template_source``: the chat template's)."""
    if tools or uses_tools(messages):
        rendered = tool_messages(messages)
        return ChatInput(tuple((str(m["role"]), _text_of(m)) for m in rendered), tuple(rendered))
    return ChatInput(tuple(chat_pairs(messages, template_source)))


def tool_prompt(
    model: Model, messages: Sequence[Mapping[str, object]], call: CallSettings, template: str | None
) -> ToolPrompt:
    """The prompt of a chat with tools (:attr:`ChatInput.rendered`) with ``call``'s tools, choice and parallelism,
    rendered by the chat template (``template``: a Jinja source or a format's name; None: the model's own), as
    :meth:`Llama.chat_stream` decodes it (``specstate serve`` counts its tokens for Anthropic's
    ``count_tokens``)."""
    return render_tools(
        model,
        list(messages),
        call.tools,
        tool_choice=call.tool_choice if call.tools is not None else "none",
        parallel_tool_calls=call.parallel_tool_calls,
        template=template,
    )


def _text_of(message: Mapping[str, object]) -> str:
    """A message of a chat with tools as the text its conversation key reads: its content, or its calls."""
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(message.get("tool_calls"), sort_keys=True)


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


def call_defaults(chat: bool) -> dict[str, object]:
    """Each keyword argument's default in a chat call (``chat``) or a completion call: what ``help()`` shows."""
    defaults: dict[str, object] = {name: values[0] for name, values in NEUTRAL.items()}
    defaults.update(_CHAIN_REALS)
    defaults.update(
        max_tokens=None if chat else COMPLETION_MAX_TOKENS,
        temperature=CHAT_TEMPERATURE if chat else COMPLETION_TEMPERATURE,
        top_p=TOP_P,
        top_k=TOP_K,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        logit_bias=None,
        grammar=None,
        stop=None,
        seed=None,
        model=None,
        logprobs=None,
    )
    if chat:
        defaults.update(
            top_logprobs=None, response_format=None, tools=None, tool_choice=None, parallel_tool_calls=False
        )
    else:
        defaults.update(echo=False)
    return defaults
