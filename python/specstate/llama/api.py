"""The :class:`Llama` class: llama-cpp-python's calls over a :class:`~specstate.Generator`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args, overload

from specstate._native import Model
from specstate._typing import GeneratorSettings, Mode
from specstate.chat import as_messages, chat_template, template_sha256
from specstate.errors import ChatTemplateError
from specstate.generator import Generator
from specstate.llama.options import (
    LAST_N_TOKENS_SIZE,
    LLAMA_DEFAULT_SEED,
    N_BATCH,
    N_CTX,
    N_DRAFT,
    ChatCompletionOptions,
    ChatMessage,
    CompletionOptions,
    _flag,
    _integer,
    _Sampling,
    _seed,
    _template_source,
    call_settings,
    chat_pairs,
)
from specstate.llama.results import (
    ChatStream,
    CompletionStream,
    ParkedChat,
    _chat_completion,
    _LogprobTracker,
    _Run,
    _StopScanner,
)
from specstate.llama.types import ChatCompletion, Completion

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass
class _Conversation:
    """The chat :class:`Llama` can continue: its generator and the sampling it was started with."""

    generator: Generator
    sampling: _Sampling


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
