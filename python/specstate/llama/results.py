"""What a call returns: its run, log-probabilities, chunks and whole results, streams that can park.

The one builder of OpenAI-shaped results: the llama-cpp-python API's and both of ``specstate serve``'s backends'."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Generator as PyGenerator
from dataclasses import dataclass, field

from specstate._native import EXACT_PROMPT_ROWS, Context, Model
from specstate._text import StopScanner, Utf8Decoder
from specstate._typing import TokenLogprobs
from specstate.generator import Generator
from specstate.llama.types import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionDelta,
    ChatCompletionLogprobs,
    ChatCompletionMessage,
    ChatCompletionTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionUsage,
    FinishReason,
    TopLogprob,
)
from specstate.tool_calls import ToolCall, ToolCallStream

#: A result's ``id``, ``created`` and ``model``.
Labels = tuple[str, int, str]

_FINISH: dict[str, FinishReason] = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}


@dataclass
class _Run:
    """One call's generation: the generator, its text pieces, and what labels the result."""

    generator: Generator
    pieces: Iterator[str]
    model: str
    id: str
    scanner: StopScanner | None = None
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
        """Tokens of the prompt (the whole conversation, for a chat) and of the reply (see :func:`usage_of`)."""
        return usage_of(self.generator)

    @property
    def labels(self) -> Labels:
        """Its results' ``id``, ``created`` and ``model``."""
        return self.id, self.created, self.model


def reply_tokens(model: Model, tokens: Sequence[int]) -> int:
    """The reply's tokens as llama-cpp-python counts them: every token generated but an end-of-generation
    token that ended it."""
    return len(tokens) - (1 if tokens and model.is_eog(tokens[-1]) else 0)


def usage_of(generator: Generator) -> CompletionUsage:
    """The usage of ``generator``'s call: its prompt's tokens (the whole conversation, for a chat) and its
    reply's (:func:`reply_tokens`)."""
    return usage_counts(len(generator.prompt_tokens), reply_tokens(generator.model, generator.tokens))


def usage_counts(prompt: int, reply: int) -> CompletionUsage:
    """The ``usage`` of a call whose prompt has ``prompt`` tokens and whose reply has ``reply``."""
    return {"prompt_tokens": prompt, "completion_tokens": reply, "total_tokens": prompt + reply}


class _LogprobTracker:
    """The log-probabilities a call reports, token by token as the text of its tokens is sent: a token is
    reported once its text is all sent (at the end, once its text begins within what was sent: a token after a
    stop string or an end-of-generation token is not)."""

    def __init__(self, model: Model, generator: Generator, *, reported: int = 0, sent: int = 0) -> None:
        self._model, self._generator = model, generator
        #: Tokens of the reply reported so far, and characters of its text sent.
        self.reported, self.sent = reported, sent
        self._decoder = Utf8Decoder()
        self._spans: list[tuple[int, int]] = []

    def advance(self, text: str, *, final: bool = False) -> list[tuple[int, TokenLogprobs]]:
        """Once ``text`` more is sent: ``(start, record)`` of the tokens newly reported (``start``: where the
        token's text begins in the reply's)."""
        self.sent += len(text)
        tokens = self._generator.tokens
        end = self._spans[-1][1] if self._spans else 0
        for token in tokens[len(self._spans) :]:
            start, end = end, end + len(self._decoder.token(self._model, token))
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


def _piece(model: Model, token: int, special: bool = False) -> tuple[str, list[int]]:
    """A token's text (bytes that are not UTF-8 on their own left out, as llama-cpp-python does) and bytes;
    ``special``: a special token's text too."""
    data = model.token_to_piece(token, special=special)
    return data.decode("utf-8", errors="ignore"), list(data)


def _no_logprobs() -> CompletionLogprobs:
    return {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}


def _add_entry(
    result: CompletionLogprobs, model: Model, token: int, start: int, record: TokenLogprobs | None, special: bool
) -> None:
    """Add ``token``'s entry, its text starting at ``start``: its record's log-probabilities (None: none)."""
    text = _piece(model, token, special)[0]
    result["text_offset"].append(start)
    result["tokens"].append(text)
    if record is None:
        result["token_logprobs"].append(None)
        result["top_logprobs"].append(None)
        return
    top = {_piece(model, alternative)[0]: logprob for alternative, logprob in record.top}
    result["token_logprobs"].append(record.logprob)
    result["top_logprobs"].append({**top, text: record.logprob})


def _completion_logprobs(model: Model, entries: list[tuple[int, TokenLogprobs]], offset: int) -> CompletionLogprobs:
    """llama-cpp-python's ``logprobs`` of a completion's reply tokens (``offset``: the prompt's text before the
    reply, whether echoed or not: offsets count from the prompt's start, as OpenAI's do)."""
    result = _no_logprobs()
    for start, record in entries:
        _add_entry(result, model, record.token, offset + start, record, False)
    return result


#: Rows of a prompt decoded at once for its log-probabilities: :data:`~specstate._native.EXACT_PROMPT_ROWS`, so
#: that each row's logits are its single decode's bits, as a generated token's are.
PROMPT_LOGPROB_ROWS = EXACT_PROMPT_ROWS


def prompt_logprobs(
    model: Model, tokens: Sequence[int], top_n: int, *, n_threads: int = 0, special: bool = True
) -> CompletionLogprobs:
    """The ``logprobs`` of an echoed prompt, as llama-cpp-python and OpenAI give them: an entry per token but a
    leading BOS, at its offset in the prompt's text (``special``: special tokens' text included, as in a prompt
    read with special tokens parsed), the first one's log-probabilities None (OpenAI's convention) and each
    other's the log-softmax of the logits after the tokens before it. The prompt is decoded for them in a
    context of its own, :data:`PROMPT_LOGPROB_ROWS` rows at a time."""
    first = 1 if tokens and tokens[0] == model.bos else 0
    records: list[TokenLogprobs | None] = [None] * len(tokens)
    scored = len(tokens) - 1  # the rows whose logits score a next prompt token
    if scored > first:
        rows = min(PROMPT_LOGPROB_ROWS, scored)
        context = Context(model, n_ctx=len(tokens), n_batch=rows, n_ubatch=rows, n_threads=n_threads)
        for start in range(0, scored, rows):
            chunk = tokens[start : min(start + rows, scored)]
            context.decode(chunk, start, all_logits=True)
            for row, token in enumerate(tokens[start + 1 : start + 1 + len(chunk)]):
                records[start + 1 + row] = TokenLogprobs(token, *context.token_logprobs(row, token, top_n))
    result, offset = _no_logprobs(), 0
    decoder = Utf8Decoder()
    for index in range(first, len(tokens)):
        record = records[index] if index > first else None
        _add_entry(result, model, tokens[index], offset, record, special)
        offset += len(decoder.token(model, tokens[index], special=special))
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
    return completion_result((last["id"], last["created"], last["model"]), choice, usage)


def completion_result(labels: Labels, choice: CompletionChoice, usage: CompletionUsage) -> Completion:
    """The ``text_completion`` with its one ``choice``."""
    id_, created, model = labels
    return {
        "id": id_,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def _completion_logprobs_of(run: _Run, sent: str, offset: int, *, final: bool = False) -> CompletionLogprobs | None:
    """The completion ``logprobs`` of the tokens ``sent`` more reply text covers (None if not asked for)."""
    if run.logprobs is None:
        return None
    return _completion_logprobs(run.generator.model, run.logprobs.advance(sent, final=final), offset)


def completion_chunk(
    labels: Labels, text: str, finish_reason: FinishReason | None, logprobs: CompletionLogprobs | None = None
) -> CompletionChunk:
    """One chunk of a streamed completion."""
    choice: CompletionChoice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
    id_, created, model = labels
    return {"id": id_, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def _completion_chunks(
    run: _Run, front: str, offset: int, echoed: CompletionLogprobs | None
) -> PyGenerator[CompletionChunk, None, None]:
    """The chunks of a streamed completion: the echoed prompt if any (with its ``echoed`` log-probabilities),
    each piece, then the finish reason; ``offset``: characters of the prompt's text before the reply."""
    if front or (echoed is not None and echoed["tokens"]):
        yield completion_chunk(run.labels, front, None, echoed)
    for piece in run.pieces:
        yield completion_chunk(run.labels, piece, None, _completion_logprobs_of(run, piece, offset))
    yield completion_chunk(run.labels, "", run.finish_reason(), _completion_logprobs_of(run, "", offset, final=True))


class CompletionStream(Iterator[CompletionChunk]):
    """The chunks of a streamed completion: the echoed prompt (with ``echo``), each piece of text, then the
    ``finish_reason``; :meth:`usage` counts the tokens once they are read. ``prompt_length``: characters of the
    prompt's text (log-probabilities' ``text_offset`` count from the prompt's start, echoed or not);
    ``echoed``: the echoed prompt's log-probabilities (:func:`prompt_logprobs`), when asked for."""

    def __init__(self, run: _Run, front: str, prompt_length: int = 0, echoed: CompletionLogprobs | None = None) -> None:
        self._run = run
        self._chunks = _completion_chunks(run, front, prompt_length, echoed)

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
    return chat_result(run.labels, choice, run.usage())


def chat_result(labels: Labels, choice: ChatCompletionChoice, usage: CompletionUsage) -> ChatCompletion:
    """The ``chat.completion`` with its one ``choice``."""
    id_, created, model = labels
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def joined_chat(chunks: Sequence[ChatCompletionChunk], usage: CompletionUsage) -> ChatCompletion:
    """The ``chat.completion`` that a streamed chat's chunks make (``usage``: the stream's): the content joined,
    the tool calls (without their ``index``) and the log-probabilities of every chunk."""
    last = chunks[-1]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    text = "".join(delta.get("content") or "" for delta in deltas)
    message: ChatCompletionMessage = {"role": "assistant", "content": text}
    calls = [
        {k: v for k, v in call.items() if k != "index"} for delta in deltas for call in delta.get("tool_calls", [])
    ]
    if calls:  # a reply of tool calls: no content unless it had some
        message["tool_calls"] = calls  # type: ignore[typeddict-item]
        message["content"] = text or None
    parts = [chunk["choices"][0]["logprobs"] for chunk in chunks if chunk["choices"][0]["logprobs"] is not None]
    logprobs: ChatCompletionLogprobs | None = None
    if parts:  # the call asked for log-probabilities: every chunk carries its tokens'
        logprobs = {"content": [entry for part in parts for entry in part["content"] or []], "refusal": None}
    choice: ChatCompletionChoice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": last["choices"][0]["finish_reason"],  # type: ignore[typeddict-item]
    }
    counts = usage_counts(usage["prompt_tokens"], usage["completion_tokens"])
    return chat_result((last["id"], last["created"], last["model"]), choice, counts)


def usage_chunk(last: Mapping[str, object], usage: CompletionUsage) -> dict[str, object]:
    """The chunk that ends a stream whose request asked ``stream_options.include_usage``: no choices, the
    usage (OpenAI's shape), labelled as ``last``, the stream's last chunk."""
    labels = {key: last[key] for key in ("id", "object", "created", "model")}
    return {**labels, "choices": [], "usage": dict(usage)}


def chat_chunk(
    labels: Labels,
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
    id_, created, model = labels
    return {"id": id_, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def _chat_chunks(run: _Run, role: bool = True) -> PyGenerator[ChatCompletionChunk, None, None]:
    """The chunks of a streamed chat completion: the role (unless ``role`` is False: a resumed stream), each
    piece of text, then the finish reason."""
    if role:
        yield chat_chunk(run.labels, {"role": "assistant"}, None)
    for piece in run.pieces:
        yield chat_chunk(run.labels, {"content": piece}, None, _chat_logprobs_of(run, piece))
    yield chat_chunk(run.labels, {}, run.finish_reason(), _chat_logprobs_of(run, "", final=True))


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
    two chunks a running reply can be paused with :meth:`park` and continued later by :meth:`Llama.resume_chat`.
    ``release``: lets a parked reply's generation go (:meth:`Llama.release`)."""

    def __init__(self, release: Callable[[Generator], None], run: _Run, *, started: bool = False) -> None:
        self._release, self._run, self._started = release, run, started
        self._chunks = _chat_chunks(run, role=not started)

    def __next__(self) -> ChatCompletionChunk:
        chunk = next(self._chunks)
        self._started = True
        return chunk

    def close(self) -> None:
        """Stop the stream (the generation keeps what it committed)."""
        self._chunks.close()

    def usage(self) -> CompletionUsage:
        """Tokens of the conversation and of the reply so far."""
        return self._run.usage()

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the reply, if one did (Anthropic's ``stop_sequence``)."""
        scanner = self._run.scanner
        return None if scanner is None else scanner.matched

    def snapshot(self) -> ParkedChat | None:
        """The reply's state between two chunks, as :meth:`park` gives it, the stream going on: what
        :meth:`Llama.resume_chat` continues from, token for token, in any process (``specstate serve``'s Ray
        driver keeps the latest one of a sampled stream, to resume it elsewhere if its worker dies). None where
        :meth:`park` gives None."""
        run, generator = self._run, self._run.generator
        scanner = run.scanner
        if not self._started or scanner is None or scanner.stopped or generator.finished:
            return None
        remaining = run.limit - len(generator.tokens)
        if remaining <= 0:
            return None
        tracker = run.logprobs
        return ParkedChat(
            generator.checkpoint(),
            remaining,
            scanner.stops,
            scanner.held,
            run.id,
            run.created,
            run.model,
            None if tracker is None else (tracker.reported, tracker.sent),
        )

    def park(self) -> ParkedChat | None:
        """Pause the reply: its checkpoint and state (:meth:`snapshot`), the stream closed and the generation let
        go (its contexts freed once nothing else holds it). None, and nothing changes, if the reply is complete but
        for its last chunks (it ended, or a stop string cut it) or no chunk was taken yet."""
        parked = self.snapshot()
        if parked is not None:
            self._chunks.close()
            self._release(self._run.generator)
        return parked


# --- replies with tool calls ---------------------------------------------------------------------

#: A reply's ``(content, tool calls)`` from its text (``partial``: more is coming).
ToolParser = Callable[[str, bool], tuple[str, list[ToolCall]]]


def _tool_message(content: str, calls: list[ToolCall]) -> ChatCompletionMessage:
    message: ChatCompletionMessage = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_chat_completion(run: _Run, parse: ToolParser) -> ChatCompletion:
    """The whole chat completion of a reply that may call tools."""
    content, calls = parse("".join(run.pieces), False)
    choice: ChatCompletionChoice = {
        "index": 0,
        "message": _tool_message(content, calls),
        "logprobs": None,
        "finish_reason": "tool_calls" if calls else run.finish_reason(),
    }
    return chat_result(run.labels, choice, run.usage())


def _tool_chat_chunks(run: _Run, reader: ToolCallStream) -> PyGenerator[ChatCompletionChunk, None, None]:
    """The chunks of a reply that may call tools: the role, its content as far as it cannot begin a call, the
    calls once the reply is whole (each with its ``index``), then the finish reason."""
    yield chat_chunk(run.labels, {"role": "assistant"}, None)
    for piece in run.pieces:
        shown = reader.feed(piece)
        if shown:
            yield chat_chunk(run.labels, {"content": shown}, None)
    rest, calls = reader.finish()
    if rest:
        yield chat_chunk(run.labels, {"content": rest}, None)
    if calls:
        yield chat_chunk(run.labels, {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}, None)
    yield chat_chunk(run.labels, {}, "tool_calls" if calls else run.finish_reason())


class ToolChatStream(ChatStream):
    """The chunks of a streamed chat completion with tools (:func:`_tool_chat_chunks`). It does not park
    (:meth:`park` and :meth:`snapshot` are always None): a reply with tools is rendered whole from its messages."""

    def __init__(self, run: _Run, reader: ToolCallStream) -> None:
        self._run, self._started = run, False
        self._chunks = _tool_chat_chunks(run, reader)

    def snapshot(self) -> ParkedChat | None:
        return None

    def park(self) -> ParkedChat | None:
        return None
