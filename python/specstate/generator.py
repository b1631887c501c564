"""One generator, five modes, exact checkpoints.

:class:`Generator` drives a generation over a target model in one of these
modes, all under the same exactness contract:

========  ==================================================================
``none``   plain decoding, one token per target pass
``ngram``  prompt lookup: drafts what followed the latest repeat of the last
           n tokens of the history (no extra model)
``draft``  a separate draft model with the same vocabulary drafts
           autoregressively; where the history's last 8 tokens repeat an
           earlier passage, prompt lookup drafts its continuation instead
           (copied text costs no draft model decode)
``mtp``    the target's own multi-token-prediction head (llama.cpp MTP)
``eagle3`` a separate EAGLE-3 draft model (llama.cpp EAGLE-3)
========  ==================================================================

What each mode guarantees:

* Greedy decoding (``temperature=0``, the default): every committed token is
  the target's own argmax at verification, so every mode commits the tokens
  ``none`` mode does, token for token: on the CPU, specstate's llama.cpp
  patch gives a row verified inside a batch the logits, bit for bit, of the
  same token decoded alone, at any thread count (on a GPU, batched kernels
  can part at near-ties).
* Seeded sampling (``temperature > 0``, ``top_k``, ``top_p``, ``seed``):
  in ``ngram``, ``mtp`` and ``eagle3`` modes (drafts without a distribution)
  each verified row's token is drawn as plain sampling draws it and the
  draft kept while it matches, so a seeded reply is ``none`` mode's, token for
  token, whatever the drafts. ``draft`` mode verifies by speculative
  rejection sampling against the draft model's distribution (more drafts
  accepted; a copied draft is verified as ``ngram`` mode's): committed
  tokens follow the target's sampling distribution exactly, but the samples
  differ from ``none`` mode's (the RNG is consumed differently). Every mode
  is reproducible from its seed.
* Every mode: a checkpoint taken between rounds resumes bit for bit -- the
  continuation equals the uninterrupted run token for token, in any process
  that has the same model files, at any thread count. The RNG state is part
  of the checkpoint.
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Generator as PyGenerator
from pathlib import Path
from typing import TYPE_CHECKING

from specstate import _defaults, _files, _native
from specstate._native import Model
from specstate._text import StopMatcher, Utf8Decoder
from specstate._typing import GeneratorConfig, GeneratorSettings, Message, Mode, SamplingSettings, TokenLogprobs
from specstate.chat import Messages, as_messages, as_pairs, chat_template, template_sha256
from specstate.errors import ChatTemplateError, GenerationError

TextStream = PyGenerator[str, None, None]
"""A stream of text pieces; ``close()`` it to stop early (the text it held back waits for the next call)."""

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Generator", "Mode", "encode_prompt"]


def encode_prompt(model: Model, text: str, *, literal: bool = False) -> list[int]:
    """The tokens of a text prompt, read as llama.cpp's own tools read it.

    Special-token text (``<|im_start|>``, ``<|im_end|>``, ...) becomes the
    special token it names, and BOS is added or not as the model's metadata
    says. With ``literal``, special-token text is read as plain text.
    """
    return model.tokenize(text, add_special=True, parse_special=not literal)


def _read(source: bytes | bytearray | memoryview | str | os.PathLike[str]) -> bytes:
    """A checkpoint's bytes, given as bytes or read from a path (see :func:`specstate._files.read_checkpoint`)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return _files.read_checkpoint(source)


class Generator:
    """A generation over ``model`` in one mode; see the module docstring.

    Args:
        model: the target model.
        settings: the generation's settings, keyword-only and each optional, as
            :class:`~specstate.GeneratorSettings` describes them: mode, draft model, draft length,
            context and batch sizes, sampling, n-gram lengths, threads (by default greedy
            ``none`` mode).
    """

    #: Asked before each token a stream takes (in the thread reading it): True ends the stream there, as closing
    #: it would (what was committed stays, the text held back waits for the next call), :attr:`stopped_by`
    #: ``"interrupted"``. A server stops so the generation of a client that left, even while the stream holds
    #: its text back (a stop string that could be starting, a tool call not yet whole).
    interrupt: Callable[[], bool] | None = None

    def __init__(self, model: Model, **settings: Unpack[GeneratorSettings]) -> None:
        self._native = _native.Generator(model, **settings)
        self._reset_text()

    # --- construction from checkpoints -----------------------------------------------------------

    @classmethod
    def _wrap(cls, native: _native.Generator) -> Generator:
        """A generator over ``native`` (one a :class:`~specstate.BatchEngine` hands back, say)."""
        generator = cls.__new__(cls)
        generator._native = native
        generator._reset_text()
        return generator

    @classmethod
    def restore(
        cls,
        source: bytes | bytearray | memoryview | str | os.PathLike[str],
        model: Model,
        *,
        draft_model: Model | None = None,
        n_threads: int | None = None,
        max_n_ctx: int | None = None,
        max_n_batch: int | None = None,
        grammar_drafts: bool = _defaults.GRAMMAR_DRAFTS,
    ) -> Generator:
        """A generator continuing a checkpoint (bytes or a path) on these models.

        A checkpoint is untrusted input: everything in it is bounded and
        checked before use, and every way it can be wrong raises a
        :class:`~specstate.errors.CheckpointError` subclass: not one,
        unsupported version, truncated, checksum mismatch, corrupt content
        (settings out of range, states llama.cpp refuses, positions that do not
        match the generator state, sections spliced from another checkpoint),
        a section too large, other model files, or a context longer than
        ``max_n_ctx`` (``ConfigMismatchError``; default: the target model's
        trained context length) or larger than ``max_n_batch`` allows
        (:class:`~specstate.errors.AllocationLimitError`), so a file cannot
        make the process allocate memory the caller did not choose.

        The contexts' other allocations are bounded before they are created:
        their compute buffers hold ``n_batch`` rows per pass, at most
        ``max_n_batch`` (default 512, llama.cpp's default batch);
        and on a recurrent or hybrid target, whose contexts keep one rollback
        snapshot of the recurrent state per drafted token (``n_draft``), the
        snapshots may take at most as much memory as the model's weights,
        unless ``max_n_batch`` is given (the caller then accepts up to
        ``max_n_batch - 1`` snapshots).

        A path (symbolic links followed) must be a regular file: its type is
        checked before it is opened and on the file opened, without blocking,
        so a FIFO, a device or a socket raises
        :class:`~specstate.errors.NotARegularFileError` (a directory
        :class:`IsADirectoryError`) instead of hanging or reading forever, and
        at most one byte past the largest checkpoint the format allows
        (``specstate._native.MAX_CHECKPOINT_BYTES``) is read: a longer file
        raises :class:`~specstate.errors.CheckpointTooLargeError`. A long file
        that does not start as a checkpoint is refused from its first bytes.

        ``n_threads`` defaults to the thread count the checkpoint was taken
        with, at most :func:`~specstate.default_threads` (0: that default). Any count
        continues exactly: on the CPU a verified row gets its single-token
        decode's logits bit for bit whatever the thread count. ``grammar_drafts``
        is the runtime choice :attr:`grammar_drafts` (checkpoints do not record it).
        """
        native = _native.Generator.restore(
            _read(source),
            model,
            draft_model=draft_model,
            n_threads=n_threads,
            max_n_ctx=max_n_ctx,
            max_n_batch=max_n_batch,
        )
        native.grammar_drafts = grammar_drafts
        return cls._wrap(native)

    def attach(self, engine: _native.SharedEngine) -> None:
        """Move this generation onto a sequence of ``engine`` (a :class:`~specstate.SharedEngine`): its target
        state is copied there and its own context freed, and it goes on exactly as before, its rounds decoded
        together with the other attached generators'. Refused, changing nothing, for modes other than ``none``
        and ``ngram``, another model, another ``n_ctx``, a larger ``n_batch`` or a full engine."""
        self._native.attach(engine)

    def load(self, source: bytes | bytearray | memoryview | str | os.PathLike[str]) -> None:
        """Replace this generation with a checkpoint of the same mode, configuration and models.

        The fast way to restore: this generator's contexts are reused.
        Everything is validated before anything changes, and should llama.cpp
        still refuse a state, the previous one is put back: on any error
        (``CheckpointError`` subclasses, ``ConfigMismatchError`` for another
        mode or configuration) this generator is left exactly as it was.
        A path is read as :meth:`restore` reads it.
        """
        self._native.load(_read(source))
        self._reset_text()

    def checkpoint(self) -> bytes:
        """Everything the generation needs to resume, in one versioned, checksummed blob.

        A model loaded with ``use_mmap=True`` whose file has been written since
        raises :class:`~specstate.errors.ModelChangedError`: nothing is written.
        """
        return self._native.checkpoint()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`checkpoint` to ``path`` atomically.

        The bytes go to a temporary file in the destination's directory, which
        is flushed, fsynced and renamed over the destination (then the
        directory is fsynced): a crash leaves either the old file or the new one.

        * An existing file keeps its permission bits (``rwx`` for user, group
          and others); a new file gets ``0o666`` less the process umask, as
          ``open()`` would give it. Owner and group are the writer's.
        * If ``path`` is a symbolic link, the file it finally points to is
          replaced (the link stays a link); a dangling link creates its target.
        * A missing directory raises :class:`FileNotFoundError` (a path that
          is not a directory: :class:`NotADirectoryError`) naming it, before
          the checkpoint is taken; so does a destination that is a directory
          (:class:`IsADirectoryError`) or that exists and is not a regular
          file, links followed (``/dev/null``, ``/dev/full``, a FIFO, a socket:
          :class:`~specstate.errors.NotARegularFileError`). A special file is
          never replaced (it is checked again right before the rename).
        * The temporary is ``.NAME.specstate-PID@HOST-XXXXXXXX.tmp``, locked
          until it is renamed. Any exception during the save removes it
          (``KeyboardInterrupt`` included, and a ``SIGTERM`` handler that
          raises, as the ``specstate`` command installs; Python's default
          ``SIGTERM`` ends the process at once, before any cleanup). A process
          killed during a save leaves it; the next save of the same path
          removes every such leftover it can prove is one: this host's name
          for ``path``, a regular file of this user, its writer's process gone
          and no lock held on it.
        """
        target = Path(os.path.realpath(path))
        _files.check_destination(target)
        mode = _files.mode_for(target)
        data = self.checkpoint()
        _files.replace_atomically(target, data, mode)

    # --- generation ------------------------------------------------------------------------------

    def _reset_text(self) -> None:
        self._decoder = Utf8Decoder()
        model = self._native.target
        for token in self.tokens:
            self._decoder.token(model, token)
        self._elapsed = 0.0
        self._timed_tokens = 0
        self._held = ""  # text of handed-out tokens not yet yielded (after a stop string, or a stream closed early)
        self.stopped_by: str | None = None
        """Why the last call stopped: ``"eos"``, ``"stop"``, ``"max_tokens"``, ``"context"``, ``"interrupted"``."""

    def _start(self, prompt: str | Sequence[int] | None, literal: bool) -> None:
        """Decode ``prompt`` if given; without one, there must be a generation to continue."""
        native = self._native
        if prompt is None:
            if not native.history:
                raise ValueError("a prompt is needed to start a generation")
            return
        if native.history:
            raise GenerationError("this generator already has a prompt; omit it to continue")
        tokens = encode_prompt(native.target, prompt, literal=literal) if isinstance(prompt, str) else list(prompt)
        native.prefill(tokens)

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        max_tokens: int,
        stop: str | Sequence[str] = (),
        literal: bool = False,
    ) -> TextStream:
        """Yield text pieces as tokens are committed, up to ``max_tokens`` new tokens.

        ``prompt`` starts the generation (text or token ids); omit it to
        continue one (for instance after :meth:`restore`). Text is read as
        llama.cpp's tools read it (see :func:`encode_prompt`); ``literal``
        reads special-token text as plain text. Stops at an end-of-generation
        token, at the first of the ``stop`` strings (a string or several; not
        included in the text), or after ``max_tokens`` tokens.

        Tokens are handed out one at a time, so a stop string leaves every
        token after the one that completes it undelivered: the next call (or
        a checkpoint taken now) continues right after it, and the text that
        token holds after the stop string is the next call's first text. A
        stream closed early keeps the text it held back for the next call too.
        Every argument is checked before anything is decoded.
        """
        max_tokens = _count("max_tokens", max_tokens, minimum=0)
        stops = _stop_strings(stop)
        start = self._starter(prompt, literal)
        return self._stream(start, max_tokens, stops)

    def _starter(self, prompt: str | Sequence[int] | None, literal: bool) -> Callable[[], None]:
        """What starts the generation with ``prompt``, after checking the arguments."""
        if not isinstance(literal, bool):
            raise TypeError(f"literal must be a bool, not {type(literal).__name__}")
        if prompt is None or isinstance(prompt, str):
            return lambda: self._start(prompt, literal)
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Iterable):
            raise TypeError(f"prompt must be a str or a sequence of token ids, not {type(prompt).__name__}")
        tokens = [_count("prompt token", token, minimum=0) for token in prompt]
        return lambda: self._start(tokens, literal)

    def _stream(self, start: Callable[[], None], max_tokens: int, stop: list[str], within: bool = False) -> TextStream:
        """Run ``start``, then yield text pieces as tokens are committed (see :meth:`stream`);
        ``within``: rounds commit nothing beyond ``max_tokens``."""
        native, model = self._native, self._native.target
        matcher = StopMatcher(stop)
        self.stopped_by = None
        remaining = max_tokens
        started = time.perf_counter()
        delivered = 0
        held = ""
        try:
            start()  # a new chat turn drops the text the last reply held back: it is in that reply
            held, self._held = self._held, ""  # text held back while it could begin a stop string
            cut = _stop_in(matcher, held, held)
            while cut is None:
                if remaining <= 0:
                    self.stopped_by = "max_tokens"
                    break
                if self.interrupt is not None and self.interrupt():
                    self.stopped_by = "interrupted"
                    return
                committed = native.take(1, max_commit=remaining if within else None)
                if not committed:
                    self.stopped_by = "eos" if native.finished else "context"
                    break
                remaining -= 1
                delivered += 1
                text = self._decoder.token(model, committed[0])
                held += text
                cut = _stop_in(matcher, held, text)
                if cut is None and self.finished:
                    self.stopped_by = "eos"
                    break
                ready = len(held) - matcher.partial
                if cut is None and ready > 0:
                    piece, held = held[:ready], held[ready:]
                    yield piece
            if cut is not None:
                held, self._held = held[: cut[0]], held[cut[1] :]
                self.stopped_by = "stop"
            piece, held = held, ""
            if piece:
                yield piece
        finally:
            self._held = held + self._held  # text not yet yielded waits for the next call
            self._elapsed += time.perf_counter() - started
            self._timed_tokens += delivered

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        max_tokens: int,
        stop: str | Sequence[str] = (),
        literal: bool = False,
    ) -> str:
        """The text of up to ``max_tokens`` new tokens (see :meth:`stream`)."""
        return "".join(self.stream(prompt, max_tokens=max_tokens, stop=stop, literal=literal))

    # --- conversations ---------------------------------------------------------------------------

    def stream_chat(
        self, messages: Messages, *, max_tokens: int, template: str | None = None, stop: str | Sequence[str] = ()
    ) -> TextStream:
        """Yield the assistant's reply to ``messages`` as it is committed.

        On a new generator, ``messages`` is the conversation so far (system,
        user, ... messages; a string is one user message): it is rendered with
        the chat template (see :func:`specstate.chat.chat_template`; the
        model's own unless ``template`` is given) and becomes the prompt. On a
        generator that already holds a conversation -- after a previous
        ``chat`` call, or restored from a checkpoint taken after one --
        ``messages`` are the next turn's new messages: only their tokens (and
        the template text around them) are decoded after the tokens already
        held, in every mode. The reply stops at the end-of-generation token or
        after ``max_tokens`` (at least 1) tokens -- the last round drafts no
        further, so nothing beyond the reply is committed; a reply cut short is
        closed as the template closes a turn. :attr:`messages` is the whole
        conversation, reply included, and travels in checkpoints.

        ``stop`` (a string or several) ends the text yielded before the first
        of them. The reply in :attr:`messages`, what the next turn follows, is
        every token committed: the stop string and what the last round
        committed after it included (a round's tokens are never taken back).
        """
        max_tokens = _count("max_tokens", max_tokens, minimum=1, what="for a chat reply")
        stops = _stop_strings(stop)
        new = as_pairs(messages)
        if template is not None and not isinstance(template, str):
            raise TypeError(f"template must be a str or None, not {type(template).__name__}")
        template_ = chat_template(self._native.target, template)
        return self._stream(lambda: self._start_turn(template_, new), max_tokens, stops, within=True)

    def stream_after(self, tokens: Sequence[int], *, max_tokens: int, stop: str | Sequence[str] = ()) -> TextStream:
        """Go on with more prompt: ``tokens`` are decoded after every committed token (as a chat's next turn
        is, so the prompt of what follows is everything so far), then up to ``max_tokens`` new tokens are
        generated as :meth:`stream` generates them. For a generation started with a prompt, not a chat.
        Every argument is checked before anything is decoded."""
        max_tokens = _count("max_tokens", max_tokens, minimum=0)
        stops = _stop_strings(stop)
        more = [_count("prompt token", token, minimum=0) for token in tokens]
        native = self._native
        if not native.history or native.conversation is not None:
            raise GenerationError("stream_after continues a generation started with a prompt (not a chat)")
        if not more:
            raise ValueError("stream_after needs at least one token")

        def start() -> None:
            native.extend(more)
            self._reset_text()

        return self._stream(start, max_tokens, stops)

    def continue_reply(self, *, max_tokens: int) -> TextStream:
        """Go on with the current chat reply by up to ``max_tokens`` tokens, as :meth:`stream_chat` runs it.

        For a reply stopped before its end: a stream closed early, or a
        checkpoint taken mid-reply and restored (the server parks and resumes
        replies so). With the budget the reply had left, the text is token for
        token what the uninterrupted reply would have been.
        """
        max_tokens = _count("max_tokens", max_tokens, minimum=1, what="for a chat reply")
        if self._native.conversation is None:
            raise GenerationError("this generation is not a conversation: it was started with a prompt, not chat()")
        return self._stream(lambda: None, max_tokens, [], within=True)

    def chat(
        self, messages: Messages, *, max_tokens: int, template: str | None = None, stop: str | Sequence[str] = ()
    ) -> str:
        """The assistant's reply to ``messages`` (see :meth:`stream_chat`)."""
        return "".join(self.stream_chat(messages, max_tokens=max_tokens, template=template, stop=stop))

    @property
    def messages(self) -> list[Message]:
        """The conversation: its messages and the current reply (empty if this generation is not a chat).

        The reply is every token committed for it: a reply stream closed early (Ctrl-C in ``specstate chat``)
        may have committed up to a round's tokens it did not yield, and they are part of the conversation that
        the next turn continues."""
        native = self._native
        conversation = native.conversation
        if conversation is None:
            return []
        return as_messages([*conversation[0], ("assistant", self._reply_text())])

    @property
    def chat_template_sha256(self) -> str | None:
        """The SHA-256 of the chat template source the conversation was rendered with (None if this generation
        is not a chat): a next turn must be rendered with the same template."""
        conversation = self._native.conversation
        return None if conversation is None else conversation[1]

    def _reply_text(self) -> str:
        """The text of every token committed for the current reply."""
        native = self._native
        return native.target.detokenize(native.history[native.n_prompt :])

    def _start_turn(self, template: _native.ChatTemplate, new: list[tuple[str, str]]) -> None:
        """Decode the first turn's prompt, or the next turn's tokens, and record the conversation."""
        native = self._native
        digest = template_sha256(template)
        if not native.history:
            native.prefill(template.prompt_tokens(new), (new, digest))
            return
        conversation = native.conversation
        if conversation is None:
            raise GenerationError("this generation is not a conversation: it was started with a prompt, not chat()")
        before, recorded = conversation
        if recorded != digest:
            raise ChatTemplateError("this conversation was rendered with another chat template")
        reply = self._reply_text()
        tokens = template.next_turn_tokens(before, native.history[-1], new)
        native.extend(tokens, ([*before, ("assistant", reply), *new], digest))
        self._reset_text()

    # --- what it has done ------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The mode."""
        return self._native.mode

    @property
    def config(self) -> GeneratorConfig:
        """Mode, draft length, context, batch and sampling parameters."""
        return self._native.config

    def set_sampling(self, **params: Unpack[SamplingSettings]) -> None:
        """Choose the following tokens with these sampling parameters (the others stay as they are).

        Everything is checked before anything changes (``ValueError`` naming
        the parameter). The RNG goes on where it is, or restarts from ``seed``
        when it changes; checkpoints record the parameters in force, so a
        restore continues with them.
        """
        self._native.set_sampling(**params)

    def set_lookup_corpus(self, corpus: _native.LookupCorpus | None) -> None:
        """Let ``ngram`` mode's prompt lookup copy from ``corpus`` (earlier texts, e.g. other requests' prompts
        and replies) besides this generation's history; None: the history alone. Other modes raise ValueError.
        Only proposals change: the generated text is the same with or without a corpus."""
        self._native.set_lookup_corpus(corpus)

    def set_reuse_key(self, key: str | None) -> None:
        """On a :class:`~specstate.SharedEngine`, keep this generation's exact prompt and reply cells under ``key``
        when it gives its sequence back, and let its prompt reuse only the cells kept under the same key (by
        default ``""``, which every generation has unless told otherwise; None: it keeps none and reuses none).
        A server gives each tenant its key, so that no request starts from cells another tenant's text left.
        At most 1,024 bytes (ValueError beyond)."""
        self._native.set_reuse_key(key)

    @property
    def reuse_key(self) -> str | None:
        """The key of the cells this generation keeps and reuses on a shared engine (:meth:`set_reuse_key`)."""
        return self._native.reuse_key

    def set_logprobs(self, top_n: int | None) -> None:
        """Record the log-probability of every token generated from now on, with its ``top_n`` most likely
        alternatives (0 to 20; None: stop). :attr:`logprobs` reads them; checkpoints carry the records of
        committed tokens not yet handed out."""
        self._native.set_logprobs(top_n)

    @property
    def logprobs(self) -> list[TokenLogprobs | None]:
        """One entry per token of :attr:`tokens`: its :class:`~specstate.TokenLogprobs`, or None where none was
        recorded (before :meth:`set_logprobs`, or handed out before a restore)."""
        return self.token_logprobs(0)

    def token_logprobs(self, start: int) -> list[TokenLogprobs | None]:
        """:attr:`logprobs` of ``tokens[start:]`` (reading only those)."""
        tokens = self.tokens[start:]
        recorded = self._native.logprobs(start)
        if recorded is None:
            return [None] * len(tokens)
        first, records = recorded
        return [
            TokenLogprobs(token, *records[index - first]) if first <= index < first + len(records) else None
            for index, token in enumerate(tokens, start)
        ]

    @property
    def model(self) -> Model:
        """The target model."""
        return self._native.target

    @property
    def draft_model(self) -> Model | None:
        """The draft model, if the mode has one."""
        return self._native.draft_model

    @property
    def context_length(self) -> int:
        """The context's real length in tokens (llama.cpp may round ``n_ctx`` up)."""
        return self._native.context_length

    @property
    def grammar_drafts(self) -> bool:
        """Whether rounds under a grammar draft the tokens it forces (docs/generating.md). Settable between
        calls: the reply is the same either way, only its speed changes; checkpoints do not record it."""
        return self._native.grammar_drafts

    @grammar_drafts.setter
    def grammar_drafts(self, on: bool) -> None:
        self._native.grammar_drafts = on

    @property
    def prompt_tokens(self) -> list[int]:
        """The prompt's token ids."""
        return self._native.history[: self._native.n_prompt]

    @property
    def tokens(self) -> list[int]:
        """Every generated token handed out so far (across calls and restores)."""
        start = self._native.n_prompt
        return self._native.history[start : start + self._native.delivered]

    @property
    def text(self) -> str:
        """The text of every generated token so far."""
        return self._native.target.detokenize(self.tokens)

    @property
    def finished(self) -> bool:
        """Whether the end-of-generation token has been handed out."""
        return self._native.finished and self._native.undelivered == 0

    @property
    def drafted(self) -> int:
        """Draft tokens verified so far."""
        return self._native.n_drafted

    @property
    def accepted(self) -> int:
        """Draft tokens accepted so far."""
        return self._native.n_accepted

    @property
    def cost_curve(self) -> list[int] | None:
        """The adaptive draft policy's cost curve: microseconds to verify 1, 2, ... ``n_draft + 1`` rows.

        ``None`` for the fixed policy, or before the prompt (when it is measured). Pass it as
        ``cost_curve=`` to another generator to make the same draft-length choices.
        """
        return self._native.cost_curve

    @property
    def draft_acceptance(self) -> float | None:
        """The adaptive draft policy's current estimate of a draft token's acceptance, or ``None``."""
        return self._native.draft_acceptance

    @property
    def acceptance_rate(self) -> float:
        """``accepted / drafted`` (0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def rounds(self) -> int:
        """Target verification passes after the prompt."""
        return self._native.rounds

    @property
    def tokens_per_second(self) -> float:
        """Tokens committed per second of this object's generation calls (prefill included)."""
        return self._timed_tokens / self._elapsed if self._elapsed > 0 else 0.0


def _stop_in(matcher: StopMatcher, held: str, text: str) -> tuple[int, int] | None:
    """Feed ``text``, the end of ``held``, to ``matcher``: where in ``held`` the first stop string begins and
    ends, if ``text`` completes one."""
    found = matcher.feed(text)
    if found is None:
        return None
    begin = len(held) - len(text) + found[0]
    return begin, begin + len(found[1])


def _count(name: str, value: object, *, minimum: int, what: str = "") -> int:
    """``value`` as an integer of at least ``minimum``: a ``TypeError`` or ``ValueError`` naming ``name`` if not."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    number = operator.index(value)
    if number < minimum:
        rule = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
        raise ValueError(" ".join(filter(None, [name, rule, what])) + f", not {number}")
    return number


def _stop_strings(stop: str | Sequence[str]) -> list[str]:
    """The stop strings: one string, or a sequence of them (a ``TypeError`` naming ``stop`` if not)."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, Sequence) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise TypeError("stop must be a string or a sequence of strings")
