"""The OpenAI-shaped results of :class:`~specstate.Llama`'s calls, as llama-cpp-python's ``llama_types`` has them."""

from __future__ import annotations

from typing import Literal, TypedDict

from specstate.tool_calls import ToolCall

# --- results -------------------------------------------------------------------------------------

#: Why a choice ended: ``stop`` (end-of-generation token or a stop string), ``length`` (``max_tokens`` or a full
#: context).
FinishReason = Literal["stop", "length", "tool_calls"]


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


class _Message(TypedDict):
    role: Literal["assistant"]
    content: str | None


class ChatCompletionMessage(_Message, total=False):
    """The assistant's reply: its text (None when it is only tool calls) and the tools it calls."""

    tool_calls: list[ToolCall]


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
    """What a chat chunk adds: the role (first chunk), text (then), the tool calls (at the end, each with its
    ``index``), nothing (last chunk)."""

    role: Literal["assistant"]
    content: str
    tool_calls: list[dict[str, object]]


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
