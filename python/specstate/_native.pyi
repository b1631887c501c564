"""Type stubs of ``specstate._native``, the Rust extension module.

Integer arguments accept anything ``operator.index`` accepts except ``bool``
(a ``TypeError``). An integer outside the native type's range fails the contract's
own bound check with the contract's own message; it never raises ``OverflowError``.
"""

from collections.abc import Sequence
from os import PathLike
from typing import Final, Literal, Self, SupportsIndex, final

from typing_extensions import Unpack, disjoint_base

from specstate._typing import (
    CheckpointInfo,
    DraftPolicy,
    GeneratorConfig,
    GeneratorSettings,
    Mode,
    NativeInfo,
    SamplingSettings,
)

__all__ = [
    "DRAFT_POLICIES",
    "EMBEDDING_N_CTX",
    "EMBEDDING_POOLINGS",
    "EXACT_PROMPT_ROWS",
    "GENERATOR_DEFAULTS",
    "LLAMA_N_BATCH",
    "MAX_CHECKPOINT_BYTES",
    "MAX_EMBEDDING_FLOATS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_GRAMMAR_BYTES",
    "MAX_SEQUENCES",
    "MAX_SPECULATIVE_DRAFT_TOKENS",
    "MAX_SPECULATIVE_PROMPT_TOKENS",
    "MAX_SPECULATIVE_SEQUENCES",
    "MAX_SPECULATIVE_STATE_BYTES",
    "MAX_THREADS",
    "MODES",
    "NATIVE_MESSAGES",
    "SPECULATIVE_STATE_MESSAGES",
    "Batch",
    "BatchEngine",
    "ChatTemplate",
    "Context",
    "ContextCapacity",
    "DraftSession",
    "Embedder",
    "Generator",
    "GreedyGeneration",
    "LookupCorpus",
    "Model",
    "SharedEngine",
    "ToolRender",
    "_raise_for_status",
    "_seed_error_display",
    "check_sampling",
    "default_threads",
    "inspect_checkpoint",
    "json_schema_to_grammar",
    "machine_cpus",
    "model_fingerprint",
    "native_info",
    "threads_for",
    "threads_now",
    "validate_config",
    "validate_context_capacities",
    "validate_state_size",
]

#: The longest checkpoint the format allows: every section at its bound, header, table and
#: trailer (137,589,949,620 bytes, about 128.1 GiB). Reading a checkpoint from a path stops one byte past it.
MAX_CHECKPOINT_BYTES: Final[int]
#: The longest grammar (and JSON Schema) accepted, in bytes.
MAX_GRAMMAR_BYTES: Final[int]
#: Maximum speculative continuation bytes copied through the safe API (64 MiB).
MAX_SPECULATIVE_STATE_BYTES: Final[int]
#: Maximum concurrent sequence slots allocated by one speculative session (4,096).
MAX_SPECULATIVE_SEQUENCES: Final[int]
#: Maximum tokens requested from one speculative draft boundary (4,096).
MAX_SPECULATIVE_DRAFT_TOKENS: Final[int]
#: Maximum prompt tokens copied into one speculative session (1,048,576).
MAX_SPECULATIVE_PROMPT_TOKENS: Final[int]
#: The most threads a context may use (ggml's limit, 512); every thread count is 0 (the default,
#: :func:`default_threads`) to this.
MAX_THREADS: Final[int]
#: The most sequences one context holds (llama.cpp's ``LLAMA_MAX_SEQ``, 256): a :class:`BatchEngine`'s ``n_seq``
#: at most.
MAX_SEQUENCES: Final[int]
#: Prompt chunk rows (16) that keep a prompt's memory exact: each row gets its single decode's bits, so the cells
#: are the same however the prompt was cut, and a :class:`SharedEngine` reuses a prefix kept from an earlier
#: generation (``n_batch`` at most this, and draft lengths of at most 16) without changing a reply.
EXACT_PROMPT_ROWS: Final[int]
#: llama.cpp's default rows per compute pass: a native ``Context``'s and a batched engine's default ``n_batch``
#: (the most a joining generator's may be), and what a restore allocates for unless given ``max_n_batch``.
LLAMA_N_BATCH: Final[int]
#: The message template of each variant of the contract's ``SpeculativeStateError`` by variant name (``{field}``
#: placeholders, for ``str.format``): written once, in Rust; ``specstate.errors`` formats them.
SPECULATIVE_STATE_MESSAGES: Final[dict[str, str]]
#: The message template of the native errors whose exceptions have fields (``ModelLoad``: ``ModelLoadError``,
#: ``Decode``: ``DecodeError``, ``ModelChanged``: ``ModelChangedError``) by variant name (``{field}``
#: placeholders, for ``str.format``): written once, in Rust; ``specstate.errors`` formats them.
NATIVE_MESSAGES: Final[dict[str, str]]
#: Every defaulted parameter of ``Generator``'s constructor by name, with its default: written once, in Rust (the
#: command line's defaults; Python 3.9 cannot read an abi3 class's signature).
GENERATOR_DEFAULTS: Final[dict[str, object]]
#: The five generation modes, in the order users read them: written once, in Rust (``_typing.Mode`` names the
#: same, checked by a test).
MODES: Final[tuple[Mode, ...]]
#: The draft policies, ``fixed`` and ``adaptive``: written once, in Rust (``_typing.DraftPolicy`` names the same).
DRAFT_POLICIES: Final[tuple[DraftPolicy, ...]]
#: An ``Embedder``'s context length unless one is given (llama-cpp-python's default ``n_ctx``).
EMBEDDING_N_CTX: Final[int]
#: The poolings an ``Embedder`` takes, in llama.cpp's order.
EMBEDDING_POOLINGS: Final[tuple[Literal["none", "mean", "cls", "last"], ...]]
#: The most inputs one ``Embedder.embed_batch`` call embeds (OpenAI's bound per request).
MAX_EMBEDDING_INPUTS: Final[int]
#: The most floats one ``Embedder`` call returns (pooling ``"none"`` gives ``n_embd`` per token).
MAX_EMBEDDING_FLOATS: Final[int]

@final
class ContextCapacity:
    """The capacities of one llama.cpp context that bound a speculative batch.

    Immutable, hashable, comparable and picklable. Each integer field must lie
    in ``0..=2**32-1`` (``ValueError`` naming the field otherwise);
    ``recurrent_or_hybrid`` must be a ``bool`` (``TypeError`` otherwise).
    """

    def __new__(
        cls,
        batch: SupportsIndex,
        micro_batch: SupportsIndex,
        recurrent_slots: SupportsIndex,
        recurrent_or_hybrid: bool,
    ) -> ContextCapacity: ...
    @property
    def batch(self) -> int:
        """Rows one decode call may hold (``n_batch``)."""
    @property
    def micro_batch(self) -> int:
        """Rows one compute pass may hold (``n_ubatch``)."""
    @property
    def recurrent_slots(self) -> int:
        """Recurrent state slots of the context (``n_rs_seq``)."""
    @property
    def recurrent_or_hybrid(self) -> bool:
        """Whether the model has recurrent layers (recurrent or hybrid)."""
    def __getnewargs__(self) -> tuple[int, int, int, bool]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def validate_config(
    n_seq: SupportsIndex,
    n_draft_max: SupportsIndex,
    n_min: SupportsIndex,
    p_min: float | SupportsIndex,
) -> None:
    """Check a speculative session configuration against the contract's bounds.

    Checks, in order: ``1 <= n_seq <= MAX_SPECULATIVE_SEQUENCES``;
    ``1 <= n_draft_max <= MAX_SPECULATIVE_DRAFT_TOKENS``;
    ``0 <= n_min <= n_draft_max``; ``p_min`` (converted to ``f32``: round to
    nearest, overflow to infinity) finite and in ``[0, 1]``.

    Raises:
        ConfigError: with the contract's message for the first failing check.
        TypeError: for an argument of the wrong type (``bool`` included).
    """

def validate_context_capacities(
    target: ContextCapacity,
    draft: ContextCapacity,
    maximum_draft_tokens: SupportsIndex,
) -> None:
    """Check that both contexts hold a draft of ``maximum_draft_tokens`` plus one.

    Raises:
        CapacityError: with the contract's message (``maximum_draft_tokens >=
            2**32-1`` gives "n_draft_max plus one exceeds u32").
        ValueError: for a negative ``maximum_draft_tokens``.
        TypeError: for an argument of the wrong type.
    """

def validate_state_size(size: SupportsIndex) -> None:
    """Check a speculative state size against ``MAX_SPECULATIVE_STATE_BYTES``.

    Raises:
        ExcessiveStateError: carrying ``size`` (even beyond 64 bits) and
            ``maximum``.
        ValueError: for a negative size.
        TypeError: for an argument of the wrong type.
    """

def native_info() -> NativeInfo:
    """Describe the native build: the keys and what each says are :class:`specstate.NativeInfo`'s (its
    documentation, in ``specstate._typing``, is the one place they are described)."""

def json_schema_to_grammar(schema: str) -> str:
    """The GBNF grammar (start rule ``root``) of the JSON values that ``schema``, a JSON Schema given as
    JSON text, describes: llama.cpp's own converter (``json_schema_to_grammar``), as its server and
    llama-cpp-python use it.

    Raises:
        ValueError: for text that is not JSON, a schema the converter refuses, or text over 1 MiB.
    """

def default_threads(slots: SupportsIndex = 1) -> int:
    """The threads each of ``slots`` generations decoding at once in this process decodes with by default
    (``n_threads=0``): the physical cores among the CPUs this process may run on, at most its CPU quota, divided
    between the slots, at least 1 (docs/threads.md). Read from the machine at each call.

    Raises:
        ValueError: for ``slots`` outside 1 to 2**32 - 1.
    """

def machine_cpus() -> dict[str, int]:
    """What :func:`default_threads` reads of the machine: ``usable``, the CPUs this process may use (its
    affinity mask, at most its cgroup CPU quota), and ``physical_cores``, the cores among the CPUs of the
    affinity mask (0 where the topology cannot be read)."""

def threads_for(usable: SupportsIndex, physical_cores: SupportsIndex, slots: SupportsIndex = 1) -> int:
    """The rule of :func:`default_threads` over given numbers: ``min(physical_cores, usable) // slots``
    (``usable // slots`` when ``physical_cores`` is 0), at least 1 and at most :data:`MAX_THREADS`.

    Raises:
        ValueError: for a number outside 0 to 2**32 - 1, or ``slots`` 0.
    """

def threads_now(configured: SupportsIndex) -> int:
    """The threads a graph of a context configured for ``configured`` threads (0: :func:`default_threads`) runs
    with now: at most the machine's online CPUs less the other tasks runnable (the kernel's count, smoothed over
    the last readings, this one included), at least 1; ``configured`` itself with ``SPECSTATE_FIXED_THREADS=1``.
    Every decode asks the same before it runs (docs/threads.md); every kernel gives the same bits at any count.

    Raises:
        ValueError: for a count outside 0 to :data:`MAX_THREADS`.
    """

def check_sampling(**settings: Unpack[SamplingSettings]) -> None:
    """Check sampling settings as ``Generator(...)`` checks them, with no model: every range (one rule, in the
    core), the logit bias's entries and values, the grammar's text. What needs a model (the bias's tokens
    against its vocabulary, whether the grammar parses) is the generator's to check. Settings left out take
    the constructor's defaults.

    Raises:
        ValueError: with the message ``Generator(...)`` gives for the same value (``temperature must be
            finite and >= 0, not inf``, ``top_p must be in (0, 1], not 2``, ...).
        TypeError: for an argument of the wrong type, as ``Generator(...)``.
    """

def _raise_for_status(status: int) -> None:
    """Raise what the contract maps native status ``status`` to (testing aid)."""

def _seed_error_display(variant: str, first: int = 0, second: int = 0) -> str:
    """The Rust ``Display`` text of a seed error variant (testing aid)."""

@final
class Model:
    """A GGUF model loaded by llama.cpp. Immutable; usable from any thread.

    Raises ``ModelLoadError`` (an ``OSError``) naming the path for a missing,
    unreadable, non-GGUF, truncated or unsupported file. MTP (nextn) heads are
    loaded where the model has them. ``n_gpu_layers`` layers are offloaded to a
    GPU backend when one is built in and finds a device (``-1``: all; 0, the
    default: none); below ``-1`` raises ``ValueError``.

    The weights are read into memory (``use_mmap=False``, the default), so a
    later write to the file changes nothing. ``use_mmap=True`` maps the file
    instead, as llama.cpp does by default (faster to load, pages shared
    between processes): then a write into the file changes the live weights
    and truncating it kills the process with ``SIGBUS`` at the next decode,
    so a checkpoint written or restored with a model whose file changed since
    it was loaded (size, modification or status-change time) is refused with
    ``ModelChangedError``. The fingerprint (SHA-256) is of the bytes loaded.
    """

    def __new__(cls, path: str | PathLike[str], *, n_gpu_layers: int = 0, use_mmap: bool = False) -> Model: ...
    @property
    def path(self) -> str:
        """The path the model was loaded from."""
    @property
    def use_mmap(self) -> bool:
        """Whether the weights are computed from a mapping of the file (``use_mmap=True``)."""
    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
    @property
    def n_embd(self) -> int:
        """Embedding width."""
    @property
    def n_layer(self) -> int:
        """Layer count."""
    @property
    def n_layer_nextn(self) -> int:
        """Number of MTP (nextn) layers."""
    @property
    def n_ctx_train(self) -> int:
        """The context length the model was trained with (0 if it records none): what ``n_ctx=0`` means."""
    @property
    def is_recurrent(self) -> bool:
        """Whether every layer is recurrent."""
    @property
    def is_hybrid(self) -> bool:
        """Whether recurrent and attention layers are mixed."""
    @property
    def architecture(self) -> str:
        """The architecture (``general.architecture``)."""
    @property
    def size(self) -> int:
        """Bytes of the model's tensors."""
    @property
    def eos(self) -> int:
        """End-of-sequence token id."""
    @property
    def bos(self) -> int:
        """Beginning-of-sequence token id."""
    @property
    def chat_template(self) -> str | None:
        """The model's chat template (``tokenizer.chat_template``), or ``None``."""
    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata as text values."""
    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (EOS, EOT, ...)."""
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``."""
    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (``ValueError`` outside the vocabulary)."""
    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """The text of ``tokens`` (invalid UTF-8 replaced)."""

@final
class ChatTemplate:
    """A model's chat template, rendered by llama.cpp: the model's own, ``source`` (Jinja; ``"chatml"`` for
    ChatML) in its place, or llama.cpp's built-in template ``name`` (one of :meth:`builtin_names`, rendered by
    ``llama_chat_apply_template``; not with ``source``). Raises ``ChatTemplateError`` for a template that does
    not parse or an unknown name."""

    def __new__(cls, model: Model, source: str | None = None, *, name: str | None = None) -> ChatTemplate: ...
    @staticmethod
    def builtin_names() -> list[str]:
        """The names of llama.cpp's built-in templates (``llama_chat_builtin_templates``), sorted."""
    @property
    def source(self) -> str:
        """The Jinja source in use (a built-in template's name)."""
    @property
    def name(self) -> str | None:
        """The built-in template's name, or None for a Jinja template."""
    def render(self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The conversation ``(role, content)`` pairs as text."""
    def prompt_tokens(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """The first turn's prompt: template text with special tokens parsed, message text literally."""
    def next_turn_tokens(
        self, before: Sequence[tuple[str, str]], last_token: int, new: Sequence[tuple[str, str]]
    ) -> list[int]:
        """The tokens that follow a reply ending with ``last_token``: the end of its turn, ``new``, the next opening."""
    def render_tools(
        self,
        messages_json: str,
        tools_json: str | None = None,
        *,
        tool_choice: Literal["auto", "required", "none"] = "auto",
        parallel_tool_calls: bool = False,
        add_generation_prompt: bool = True,
    ) -> ToolRender:
        """OpenAI-shaped messages and tools (JSON arrays) rendered by this Jinja template as llama.cpp's server
        renders them (``common_chat_templates_apply``). Raises ``ChatTemplateError`` for a built-in template or
        messages and tools llama.cpp refuses, ``ValueError`` for another ``tool_choice`` or over 64 MiB of JSON."""
    def tool_next_turn_tokens(
        self,
        before_json: str,
        last_token: int,
        new_json: str,
        tools_json: str | None = None,
        *,
        tool_choice: Literal["auto", "required", "none"] = "auto",
        parallel_tool_calls: bool = False,
    ) -> list[int]:
        """The tokens of a next turn of a conversation with tools after a reply ending with ``last_token``:
        ``before_json`` (the messages before the reply), the reply as written, ``new_json`` (the next turn's
        messages), rendered with ``tools_json``; what follows the reply, tokenized."""

@final
class ToolRender:
    """A conversation rendered with tools (:meth:`ChatTemplate.render_tools`), and llama.cpp's parser of its
    replies."""

    @property
    def text(self) -> str:
        """The prompt's text."""
    @property
    def format(self) -> int:
        """llama.cpp's chat format (``common_chat_format``)."""
    @property
    def format_name(self) -> str:
        """Its name (``peg-native``, ``Content-only``, ...)."""
    @property
    def grammar(self) -> str:
        """llama.cpp's grammar for the reply ("" for none)."""
    @property
    def grammar_lazy(self) -> bool:
        """Whether the grammar applies only from a trigger on."""
    @property
    def grammar_triggers(self) -> list[tuple[str, str, int]]:
        """The lazy grammar's triggers: ``(type, value, token)``."""
    @property
    def preserved_tokens(self) -> list[str]:
        """Texts the calls are written with."""
    @property
    def additional_stops(self) -> list[str]:
        """More stop strings."""
    @property
    def generation_prompt(self) -> str:
        """What llama.cpp's parser sees before the reply."""
    def prompt_tokens(self) -> list[int]:
        """The prompt's tokens: BOS if the model adds one, template text with special tokens parsed, message text
        literally."""
    def parse(self, text: str, *, partial: bool = False) -> str:
        """llama.cpp's reading of a reply: an OpenAI-shaped JSON message. Raises ``ValueError`` for a complete
        reply the parser does not accept."""

@final
class Batch:
    """A reusable batch of token rows to decode (``Context.decode_batch``).

    Usable from any thread: a change made while a decode (or a session's
    ``process``) reads the batch waits for that call to end.
    """

    def __new__(cls, capacity: int) -> Batch: ...
    def add(self, token: int, pos: int, *, seq_id: int = 0, logits: bool = False) -> None:
        """Append ``token`` at ``pos`` of ``seq_id``; ``logits`` keeps its output row."""
    def clear(self) -> None:
        """Remove every row."""
    @property
    def capacity(self) -> int:
        """Row capacity."""
    def __len__(self) -> int: ...

@final
class Context:
    """A llama.cpp context over a model, used from the thread that created it.

    ``kind`` is ``"default"`` or ``"mtp"`` (the model's nextn head, as an MTP
    draft context); ``n_rs_seq`` keeps recurrent-state snapshots for rollback
    (recurrent and hybrid models; then ``n_ubatch > n_rs_seq + 1``);
    ``other`` links a source context (EAGLE-3 drafts without their own
    embedding or head read the target's). Use from another thread raises
    ``ThreadAffinityError`` (``model``, ``n_ctx``, ``kind`` and ``capacity``,
    fixed at creation, read from any thread); ``decode`` releases the GIL.
    """

    def __new__(
        cls,
        model: Model,
        *,
        n_ctx: int = 2048,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_seq_max: int = 1,
        n_rs_seq: int = 0,
        kind: Literal["default", "mtp"] = "default",
        n_threads: int = 0,
        other: Context | None = None,
    ) -> Context: ...
    @property
    def model(self) -> Model:
        """The model this context runs."""
    @property
    def n_ctx(self) -> int:
        """Context length in tokens."""
    @property
    def kind(self) -> Literal["default", "mtp"]:
        """The context kind."""
    @property
    def capacity(self) -> ContextCapacity:
        """The capacities that bound a speculative batch, read from llama.cpp."""
    def decode(self, tokens: Sequence[int], start_pos: int, *, seq_id: int = 0, all_logits: bool = False) -> None:
        """Decode ``tokens`` at ``start_pos..`` of ``seq_id`` (logits of the last row, or all)."""
    def decode_batch(self, batch: Batch) -> None:
        """Decode a prepared batch."""
    def logits(self, row: int = -1) -> list[float]:
        """The logits of output row ``row`` of the last decode (``-1``: the last)."""
    def argmax(self, row: int = -1) -> int:
        """The greedy choice of output row ``row`` (lowest id on ties)."""
    def top_logits(self, row: int = -1, k: int = 2) -> list[tuple[int, float]]:
        """The ``k`` largest logits of ``row`` as ``(token, logit)``, largest first."""
    def token_logprobs(self, row: int, token: int, top_n: int = 0) -> tuple[float, list[tuple[int, float]]]:
        """The log-probability of ``token`` at output row ``row`` (the log-softmax of its logits, as a
        generator's records compute it) and the ``top_n`` (at most 20) most likely tokens' ``(token, logprob)``."""
    def seq_state(self, seq_id: int = 0) -> bytes:
        """The exact state of one sequence (KV cells and recurrent state; no logits)."""
    def set_seq_state(self, seq_id: int, data: bytes) -> None:
        """Replace one sequence's state; on failure (``SequenceStateError``) it is left as it was.

        A recurrent or hybrid model's state is read first, far enough to count
        its recurrent cells: one claiming more than the one a sequence holds,
        or not laid out as llama.cpp writes such a state, is refused before
        llama.cpp sees it.
        """
    def seq_rm(self, seq_id: int = 0, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions ``p0..p1`` of ``seq_id`` (``-1``: open end); False if refused."""
    def seq_clear(self, seq_id: int = 0) -> None:
        """Clear one sequence."""
    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The highest position stored for ``seq_id``, or -1 when empty."""

@final
class Embedder:
    """A llama.cpp embedding context over a model (``embeddings = true``), which embeds one token sequence at a
    time: each decoded alone, from an empty memory, in one batch (the same input gives the same bits, alone or
    in a batch).

    ``n_ctx`` is the longest input (0: the model's trained length); ``pooling`` is ``None`` (the model's own,
    from its GGUF metadata; ``"none"`` for a generative model, which records none), ``"none"`` (one vector per
    token), ``"mean"``, ``"cls"`` (the first token's) or ``"last"``; a model whose own pooling is a reranker's
    (``rank``) needs one of these. ``n_threads`` 0 uses :func:`default_threads`. Usable from any thread: calls run
    one at a time, each with the GIL released while it decodes.

    Raises:
        ValueError: for a pooling name, ``n_ctx`` or ``n_threads`` outside its range.
        ContextError: when llama.cpp refuses the context (an encoder-decoder model included).
    """

    def __new__(
        cls,
        model: Model,
        *,
        n_ctx: int = 512,
        pooling: Literal["none", "mean", "cls", "last"] | None = None,
        n_threads: int = 0,
    ) -> Embedder: ...
    @property
    def model(self) -> Model:
        """The model this embedder runs."""
    @property
    def n_ctx(self) -> int:
        """The context length: the most tokens an input may have."""
    @property
    def n_embd(self) -> int:
        """Floats in one embedding (the model's output width)."""
    @property
    def n_threads(self) -> int:
        """The threads decoding uses."""
    @property
    def pooling(self) -> Literal["none", "mean", "cls", "last"]:
        """The pooling in effect (the model's own when none was asked for)."""
    def embed(self, tokens: Sequence[int]) -> list[float] | list[list[float]]:
        """The embedding of one token sequence: ``n_embd`` floats, or with pooling ``"none"`` one such list
        per token.

        Raises:
            ValueError: for an empty sequence, one longer than ``n_ctx`` (``"Requested tokens (N) exceed
                context window of n_ctx (input 0)"``, llama-cpp-python's words), or a token outside the
                vocabulary; nothing is decoded then.
            TypeError: for a string or anything else that is not a sequence of integers.
            DecodeError: when llama.cpp fails to decode.
        """
    def embed_batch(self, inputs: Sequence[Sequence[int]]) -> list[list[float] | list[list[float]]]:
        """The embeddings of ``inputs``, in order, each computed alone as ``embed`` computes it.

        Every input is checked (as ``embed`` checks it, the message naming its index) and their count (at most
        ``MAX_EMBEDDING_INPUTS``) and total size (at most ``MAX_EMBEDDING_FLOATS`` floats) bounded before any
        is decoded.
        """

@disjoint_base
class DraftSession:
    """A speculative draft session pairing a target context with a draft context.

    Use :class:`specstate.MtpSession` or :class:`specstate.Eagle3Session`. The
    configuration passes the contract's ``validate_config`` and the contexts' real
    capacities the contract's ``validate_context_capacities`` before anything
    native is allocated. Lifecycle errors raise ``SessionError``; a sequence id
    out of range ``BadSequenceError``; state capture or restore while a
    proposal is pending ``NotQuiescentError``. Bound, with its contexts, to
    the thread that created it: elsewhere every method and the counters
    raise ``ThreadAffinityError`` (the configuration and the two contexts
    read from any thread).
    """

    def __new__(
        cls,
        target: Context,
        draft: Context,
        *,
        spec_type: Literal["mtp", "eagle3"],
        n_seq: int = 1,
        n_draft_max: int = 3,
        n_min: int = 0,
        p_min: float | SupportsIndex | None = None,
    ) -> Self: ...
    @property
    def target(self) -> Context:
        """The target context."""
    @property
    def draft_context(self) -> Context:
        """The draft context."""
    @property
    def spec_type(self) -> Literal["mtp", "eagle3"]:
        """The draft strategy."""
    @property
    def n_seq(self) -> int:
        """Sequence slots."""
    @property
    def n_draft_max(self) -> int:
        """Most tokens one draft proposes."""
    @property
    def n_min(self) -> int:
        """Fewest tokens a draft must have."""
    @property
    def p_min(self) -> float:
        """Smallest draft-token probability kept (as the f32 llama.cpp uses)."""
    @property
    def n_drafted(self) -> int:
        """Tokens drafted so far."""
    @property
    def n_accepted(self) -> int:
        """Drafted tokens accepted so far."""
    @property
    def need_embd(self) -> bool:
        """Whether the target must keep post-norm embeddings."""
    @property
    def need_embd_pre_norm(self) -> bool:
        """Whether the target must keep pre-norm hidden states."""
    def begin(self, prompt: Sequence[int], *, seq_id: int = 0) -> None:
        """Start a generation on ``seq_id`` whose ``prompt`` the target has decoded."""
    def decode(self, tokens: Sequence[int], start_pos: int, *, seq_id: int = 0, all_logits: bool = False) -> None:
        """Decode ``tokens`` on the target, then process that batch."""
    def process(self, batch: Batch) -> None:
        """Tell the session about ``batch``, which the target decoded last."""
    def draft(self, n_past: int, id_last: int, *, seq_id: int = 0) -> list[int]:
        """Draft up to ``n_draft_max`` tokens after ``id_last`` at position ``n_past``."""
    def accept(self, n_accepted: int, *, seq_id: int = 0) -> None:
        """Complete the pending proposal: ``n_accepted`` of its tokens were verified."""
    def is_quiescent(self) -> bool:
        """Whether no sequence has a pending proposal."""
    def has_pending_proposal(self, seq_id: int = 0) -> bool:
        """Whether ``seq_id`` has a pending proposal."""
    def speculative_state(self, seq_id: int = 0) -> bytes:
        """The exact speculative state of ``seq_id`` (quiescent sessions only).

        ``StateUnavailableError`` for EAGLE-3 over a transformer target: the
        pinned llama.cpp leaves that state incomplete.
        """
    def restore_speculative_state(self, seq_id: int, data: bytes) -> None:
        """Restore ``seq_id``'s speculative state; invalid bytes leave it exactly as it was."""

@final
class GreedyGeneration:
    """A greedy speculative generation on one sequence of a session.

    Each round drafts, verifies every draft in one target batch, accepts the
    matching prefix, commits the target's own token after it, and rolls back
    the rejected positions of both contexts. Every committed token is the
    target's greedy choice at verification. The rounds are the same engine's
    as ``Generator``'s: a committed end-of-generation token or a full context
    ends the generation (rounds then commit nothing); a prompt that is empty,
    too long or outside the vocabulary is a ``ValueError``; a failed decode
    is a ``DecodeError``. Bound to its session's thread: elsewhere everything
    but ``seq_id`` raises ``ThreadAffinityError``.
    """

    def __new__(cls, session: DraftSession, *, seq_id: int = 0) -> GreedyGeneration: ...
    def prefill(self, prompt: Sequence[int]) -> int:
        """Decode ``prompt``, begin the session, return the first generated token."""
    def resume(self, n_past: int, id_last: int, tokens: Sequence[int] | None = None) -> None:
        """Continue from a restored boundary of ``n_past`` decoded tokens and ``id_last``.

        ``tokens`` (the committed tokens so far) must end with ``id_last``.
        """
    def step(self) -> list[int]:
        """Run one round; return the tokens it committed (none once finished or full)."""
    def generate(self, n_tokens: int) -> list[int]:
        """Run rounds until ``n_tokens`` tokens are committed, the generation ends or the context is full."""
    @property
    def tokens(self) -> list[int]:
        """Every committed token, the first generated one included."""
    @property
    def n_past(self) -> int | None:
        """Tokens in the contexts' memory (None before prefill)."""
    @property
    def id_last(self) -> int | None:
        """The last committed token, decoded by the next round (None before prefill)."""
    @property
    def finished(self) -> bool:
        """Whether an end-of-generation token was committed (no round commits after it)."""
    @property
    def seq_id(self) -> int:
        """The sequence generated on."""
    @property
    def rounds(self) -> int:
        """Rounds run."""
    @property
    def n_drafted(self) -> int:
        """Tokens drafted and verified by this generation."""
    @property
    def n_accepted(self) -> int:
        """Drafted tokens accepted by this generation."""

@final
class BatchEngine:
    """Many generations (modes ``none`` and ``ngram``) over one target context: continuous batching in which
    every reply is, token for token, the one the same :class:`Generator` gives alone (see
    :class:`specstate.BatchEngine`). Use from the creating thread only."""

    def __new__(
        cls, target: Model, *, n_seq: int = 4, n_ctx: int = 2048, n_batch: int = 512, n_threads: int = 0
    ) -> BatchEngine: ...
    def join(self, generator: Generator) -> int:
        """A copy of ``generator``'s generation (prefilled or not) as a new sequence; returns its id."""
    def snapshot(self, seq: int) -> Generator:
        """A copy of sequence ``seq`` as a generator of its own; the sequence stays."""
    def leave(self, seq: int) -> Generator:
        """Sequence ``seq`` taken out of the batch as a generator of its own."""
    def remove(self, seq: int) -> None:
        """Drop sequence ``seq``."""
    def prefill(self, seq: int, prompt: Sequence[int]) -> None:
        """Decode the prompt of ``seq`` in decodes of its own and commit the first generated token."""
    def set_budget(self, seq: int, max_commit: int | None) -> None:
        """The most tokens the next round of ``seq`` may commit (``None``: no bound)."""
    def set_lead(self, seq: int, lead: int) -> None:
        """Let the rounds of ``seq`` run while it holds fewer than ``lead`` tokens not yet handed out."""
    def step(self) -> tuple[int, int, int, int]:
        """One step for every sequence that needs a round: ``(sequences, rows, decodes, committed)``."""
    def take(self, seq: int, max_n: int = ...) -> list[int]:
        """Committed tokens of ``seq`` not yet handed out (never runs a round), or its last round's failure."""
    def done(self, seq: int) -> bool:
        """Whether ``seq`` is finished (or its context full) with every token handed out."""
    def history(self, seq: int) -> list[int]:
        """The prompt and committed tokens of ``seq``."""
    def __len__(self) -> int: ...
    @property
    def n_seq(self) -> int:
        """Sequences the engine holds at most."""
    @property
    def n_ctx(self) -> int:
        """Context length of every sequence."""
    @property
    def n_threads(self) -> int:
        """The threads the target decodes with."""
    @property
    def target(self) -> Model:
        """The target model."""

@final
class SharedEngine:
    """A target context whose sequences generators attach to (``Generator(model, engine=...)``), each generator
    used from its own thread as usual: the rounds they run at about the same time are decoded together, and each
    reply is token for token the one the generator gives alone (see :class:`specstate.SharedEngine`)."""

    def __new__(
        cls,
        target: Model,
        *,
        n_seq: int = 4,
        n_ctx: int = 2048,
        n_batch: int = 512,
        n_threads: int = 0,
        prompt_cache_bytes: int = 0,
    ) -> SharedEngine: ...
    @property
    def n_seq(self) -> int:
        """Sequences the engine holds at most."""
    @property
    def n_ctx(self) -> int:
        """Context length of every sequence."""
    @property
    def n_batch(self) -> int:
        """Most rows of one prompt chunk."""
    @property
    def n_threads(self) -> int:
        """The threads the target decodes with."""
    @property
    def attached(self) -> int:
        """Sequences attached now."""
    @property
    def stats(self) -> tuple[int, int, int]:
        """``(decodes, rows, sequences)`` of the shared decodes so far."""
    @property
    def reused_tokens(self) -> int:
        """Prompt tokens not decoded so far: their cells kept from an earlier generation's exact decodes (a
        prompt that starts the same way)."""
    @property
    def decode_seconds(self) -> float:
        """Seconds the shared decodes took so far."""
    @property
    def target(self) -> Model:
        """The target model."""

@final
class LookupCorpus:
    """Earlier texts (token ids) that ``ngram`` mode's prompt lookup may copy besides a generation's own history:
    in a server, the prompts and replies of earlier requests. Kept up to ``max_tokens`` tokens in all, the oldest
    texts dropped first; shared by any number of generators and threads.

    A corpus changes what ``ngram`` mode proposes, never what it generates: verification commits what plain
    decoding would, so the text is the same with or without one, and checkpoints do not carry it.
    """

    def __new__(cls, max_tokens: int = 65536) -> LookupCorpus: ...
    def add(self, tokens: Sequence[int]) -> None:
        """Add a text (its last ``max_tokens`` tokens when longer), dropping the oldest texts beyond the budget.
        Negative ids raise ``ValueError`` and add nothing; a draft copied from the corpus stops before an id
        outside the target's vocabulary."""
    @staticmethod
    def check_mode(mode: str) -> None:
        """Raise ``ValueError`` unless generators of ``mode`` draft from a corpus (only ``ngram`` mode's prompt
        lookup does)."""
    def clear(self) -> None:
        """Forget every text."""
    @property
    def max_tokens(self) -> int:
        """The token budget."""
    @property
    def n_tokens(self) -> int:
        """Tokens held, in all."""
    @property
    def n_documents(self) -> int:
        """Texts held."""

@final
class Generator:
    """The native five-mode generator behind :class:`specstate.Generator`.

    Rounds run with the GIL released; use from the creating thread only.
    """

    # Keyword arguments: GeneratorSettings, which documents the defaults (stubtest checks its keys against the
    # runtime signature).
    def __new__(cls, target: Model, **settings: Unpack[GeneratorSettings]) -> Generator: ...
    def set_sampling(self, **params: Unpack[SamplingSettings]) -> None:
        """Change the sampling parameters given (the others stay), all checked before anything changes;
        the RNG restarts from ``seed`` only when it changes. Checkpoints record the parameters in force."""
    def prefill(self, prompt: Sequence[int], conversation: tuple[Sequence[tuple[str, str]], str] | None = None) -> None:
        """Decode the prompt and commit the first generated token; ``conversation``
        (messages, template SHA-256) records the chat the prompt renders."""
    def extend(self, tokens: Sequence[int], conversation: tuple[Sequence[tuple[str, str]], str] | None = None) -> int:
        """Continue with a new turn: decode ``tokens`` after every committed token, commit and
        return the first token after them (``n_prompt`` moves to the new turn's end).
        ``conversation`` (messages, template SHA-256) is recorded in the same call."""
    @property
    def conversation(self) -> tuple[list[tuple[str, str]], str] | None:
        """The messages that led to the current reply and the template's SHA-256, or ``None``."""
    def take(self, max_n: int = ..., *, max_commit: int | None = None) -> list[int]:
        """Up to ``max_n`` generated tokens, running a round when none are waiting.

        With ``max_commit``, a round run for this call commits at most that
        many tokens (its draft is shortened), so nothing beyond it is left
        waiting; the rounds then depend on ``max_commit``.

        Empty once finished (or the context is full) and all are handed out.
        Rounds never depend on ``max_n``, so how a generation is split into
        calls does not change what it generates.
        """
    @property
    def context_length(self) -> int:
        """The target context's real length in tokens."""
    @property
    def n_threads(self) -> int:
        """The threads the contexts decode with (resolved, never 0); recorded in checkpoints."""
    @property
    def grammar_drafts(self) -> bool:
        """Whether rounds under a grammar draft the tokens it forces (settable; never changes the reply)."""
    @grammar_drafts.setter
    def grammar_drafts(self, on: bool) -> None: ...
    @property
    def cost_curve(self) -> list[int] | None:
        """The adaptive draft policy's cost curve: microseconds to verify 1, 2, ... ``n_draft + 1`` rows
        (``None`` for the fixed policy, or before it is measured)."""
    @property
    def draft_acceptance(self) -> float | None:
        """The adaptive draft policy's estimate of a draft token's acceptance (``None`` without one)."""
    @property
    def delivered(self) -> int:
        """Generated tokens handed out so far."""
    @property
    def undelivered(self) -> int:
        """Committed tokens not yet handed out."""
    def checkpoint(self) -> bytes:
        """The whole checkpoint of the current boundary (``ModelChangedError`` for a changed mapped model)."""
    @staticmethod
    def restore(
        data: bytes,
        target: Model,
        *,
        draft_model: Model | None = None,
        n_threads: int | None = None,
        max_n_ctx: int | None = None,
        max_n_batch: int | None = None,
    ) -> Generator:
        """A generator continuing a checkpoint on these models (validated first).

        The checkpoint's context length may be at most `max_n_ctx` (default:
        the target model's trained context length), its `n_batch` at most
        `max_n_batch` (default: 512), and, unless `max_n_batch` is given, a
        recurrent or hybrid target's rollback snapshots may take at most the
        model's size (`AllocationLimitError`). Without `n_threads`, the
        recorded thread count is used, at most :func:`default_threads`; any count
        continues exactly (verification does not depend on it).
        """
    def release_sequence(self) -> None:
        """Give this generation's sequence of a shared engine back at once: it can no longer decode or
        checkpoint (``GenerationError``). Nothing for a generator with a context of its own."""
    def attach(self, engine: SharedEngine) -> None:
        """Move this generation onto a sequence of ``engine`` (its target state copied there, its own context
        freed); it goes on exactly as before. Refused, changing nothing, for modes other than ``none`` and
        ``ngram``, another model, another ``n_ctx``, a larger ``n_batch`` or a full engine."""
    def load(self, data: bytes) -> None:
        """Replace this generation with a checkpoint, reusing the contexts; on failure nothing changes."""
    @property
    def memory_positions(self) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """The lowest and highest positions of sequence 0 in the target context
        and in the draft context, if the mode has one (`(-1, -1)` when empty)."""
    @property
    def history(self) -> list[int]:
        """Prompt and committed tokens."""
    def set_lookup_corpus(self, corpus: LookupCorpus | None) -> None:
        """Let ``ngram`` mode's prompt lookup copy from ``corpus`` besides the history (None: the history alone).
        Other modes raise ``ValueError``. Proposals only: the generated text is the same either way."""
    def set_reuse_key(self, key: str | None) -> None:
        """On a shared engine, keep this generation's exact cells under ``key`` when it gives its sequence back,
        and let its prompt reuse only cells kept under the same key (None: it keeps none and reuses none). A key
        of more than 1,024 bytes raises ``ValueError``."""
    @property
    def reuse_key(self) -> str | None:
        """The key of the cells this generation keeps and reuses on a shared engine (``""`` unless set; None:
        none)."""
    def set_logprobs(self, top_n: int | None) -> None:
        """Record the log-probability of every token committed from now on with its ``top_n`` (0 to 20) most
        likely alternatives (None: stop recording; the same ``top_n`` again keeps the records)."""
    def logprobs(self, start: int = 0) -> tuple[int, list[tuple[float, list[tuple[int, float]]]]] | None:
        """The records of reply positions ``start`` on: ``(from, records)``, a record per reply token from reply
        position ``from`` (at least ``start``) on, each ``(logprob, [(token, logprob), ...])``; None when not
        recording."""
    @property
    def n_prompt(self) -> int:
        """Prompt tokens at the start of ``history``."""
    @property
    def n_past(self) -> int:
        """Tokens in the target's memory."""
    @property
    def finished(self) -> bool:
        """Whether an end-of-generation token was committed."""
    @property
    def rounds(self) -> int:
        """Rounds run."""
    @property
    def n_drafted(self) -> int:
        """Draft tokens verified."""
    @property
    def n_accepted(self) -> int:
        """Draft tokens accepted."""
    @property
    def mode(self) -> str:
        """The mode's name."""
    @property
    def target(self) -> Model:
        """The target model."""
    @property
    def draft_model(self) -> Model | None:
        """The draft model, if the mode has one."""
    @property
    def config(self) -> GeneratorConfig:
        """Mode, draft length, context, batch and sampling parameters."""

def inspect_checkpoint(data: bytes) -> CheckpointInfo:
    """Validate a checkpoint and describe it (no model needed).

    Keys: see :class:`specstate.CheckpointInfo`. Raises ``CheckpointError``
    subclasses like a restore.
    """

def model_fingerprint(model: Model) -> tuple[str, int]:
    """The SHA-256 (hex) and size of a model's file, as checkpoints record them."""
