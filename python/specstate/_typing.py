"""Typed shapes of values the native module takes and returns.

Every key of these dictionaries is a string literal; at runtime they are plain
``dict``\\ s (``TypedDict``), so ``json.dumps`` takes them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple, TypedDict

from specstate._native import Model, SharedEngine

__all__ = [
    "U32_MAX",
    "U64_MAX",
    "CheckpointInfo",
    "DeviceInfo",
    "DraftPolicy",
    "GeneratorConfig",
    "GeneratorSettings",
    "Message",
    "Mode",
    "ModelFingerprint",
    "NativeInfo",
    "SamplingSettings",
]

#: The five generation modes.
Mode = Literal["none", "ngram", "draft", "mtp", "eagle3"]
#: How long each round's draft is: ``fixed`` (up to ``n_draft`` every round) or ``adaptive`` (chosen each
#: round from a measured cost curve and the recent acceptance, up to ``n_draft``; see ``docs/adaptive-draft.md``).
DraftPolicy = Literal["fixed", "adaptive"]
#: The largest 32-bit and 64-bit unsigned integers: the bounds of the core's counts and seeds.
U32_MAX, U64_MAX = 2**32 - 1, 2**64 - 1


class Message(TypedDict):
    """One message of a conversation: ``role`` (``system``, ``user``, ``assistant``, ...) and ``content``."""

    role: str
    content: str


class DeviceInfo(TypedDict):
    """One device llama.cpp sees (an entry of :class:`NativeInfo`'s ``devices``).

    ``name`` is ggml's short name (``CPU``, ``CUDA0``); ``description`` the
    CPU's or GPU's model; ``type`` one of ``cpu``, ``gpu``, ``igpu``,
    ``accel``, ``meta``; ``memory_total`` and ``memory_free`` in bytes (system
    memory for the CPU).
    """

    name: str
    description: str
    type: str
    memory_total: int
    memory_free: int


class NativeInfo(TypedDict):
    """What :func:`specstate.native_info` returns.

    Keys: ``specstate_version``; ``llama_cpp_sys_version`` (the pinned
    ``llama-cpp-sys-4``); ``llama_cpp_build`` and ``llama_cpp_commit`` (the
    llama.cpp it vendors); ``backends`` compiled in (``cpu``, ``cuda``,
    ``metal``); ``cpu_baseline`` and the ``simd_features`` ggml's CPU kernels
    were compiled for; ``exact_sums``, how verification's exact multi-column
    kernels sum on this CPU (``avx2``, ``avxvnni`` or ``avx512vnni``, chosen at
    run time, the same bits every way; ``none``); ``exact_attention``, how
    decodes and verified rows attend (``shared``: the queries reading one
    K/V head convert each cell once for all of them; ``rows``: each query
    alone; the same bits either way); ``exact_tiles``, the registers of
    verification's exact tiles (``avx512``: two weight rows per 512-bit
    register, Q4_1, Q8_0 and Q5_0, Q4_1 products of up to 4 columns in 256-bit
    ones; ``avx2``: 256-bit, Q4_1; ``none``; the same bits either way);
    ``exact_q4_k``, how verification's products of repacked Q4_K weights
    run (``cols``: every column at once, the weights unpacked once;
    ``rows``: the gemv once per column, ``GGML_CPU_EXACT_Q4_K=rows``;
    ``none``; the same bits either way); ``exact_q4_k_cols_chunks``, the
    chunks of such products the multi-column kernel computed so far in this
    process; ``exact_q6_k`` and ``exact_q6_k_cols_chunks``, the same for
    verification's products of Q6_K weights (``cols``: every column at once,
    each weight row unpacked once; ``rows``: vec_dot once per column,
    ``GGML_CPU_EXACT_Q6_K=rows``; ``none``); ``exact_q5_0`` and
    ``exact_q5_0_cols_chunks``, the same for Q5_0 weights (the bulk of
    Qwen2.5's and Gemma 3's Q4_K_M files: ``cols``: every column at once,
    each weight block unpacked once; ``rows``: vec_dot once per column,
    ``GGML_CPU_EXACT_Q5_0=rows``; ``none``); ``exact_q4_0``, ``exact_q5_1``,
    ``exact_q5_k`` and their ``..._cols_chunks``, the same for Q4_0 weights
    (repacked on AVX2: the gemv), Q5_1 and Q5_K ones
    (``GGML_CPU_EXACT_Q4_0=rows``, ``..._Q5_1=rows``, ``..._Q5_K=rows``);
    ``system_info``, llama.cpp's own summary; ``devices``,
    the devices llama.cpp sees (:class:`DeviceInfo`; a CUDA build on a
    machine without a GPU or driver lists the CPU alone).
    """

    specstate_version: str
    llama_cpp_sys_version: str
    llama_cpp_build: str
    llama_cpp_commit: str
    backends: list[str]
    cpu_baseline: str
    simd_features: list[str]
    exact_sums: str
    exact_attention: str
    exact_tiles: str
    exact_q4_k: str
    exact_q4_k_cols_chunks: int
    exact_q6_k: str
    exact_q6_k_cols_chunks: int
    exact_q5_0: str
    exact_q5_0_cols_chunks: int
    exact_q4_0: str
    exact_q4_0_cols_chunks: int
    exact_q5_1: str
    exact_q5_1_cols_chunks: int
    exact_q5_k: str
    exact_q5_k_cols_chunks: int
    system_info: str
    devices: list[DeviceInfo]


class _NgramLengths(TypedDict, total=False):
    """The n-gram lengths of ``ngram`` mode."""

    #: Longest n-gram looked up (default 4). Kept for checkpoints and llama.cpp's habits: the occurrence copied is
    #: the one whose context agrees longest (up to 64 tokens), so proposals do not depend on it.
    ngram_max: int
    #: Shortest n-gram looked up (default 3: a match of at least 3 tokens; docs/measured.md, "Prompt lookup").
    ngram_min: int


class SamplingSettings(TypedDict, total=False):
    """How tokens are chosen: the sampling keyword arguments of :class:`specstate.Generator` and of
    :meth:`specstate.Generator.set_sampling`, every one optional.

    One chain, in llama.cpp's order, for greedy and sampled decoding and every
    mode: ``logit_bias``, the penalties over the last ``repeat_last_n`` tokens
    of the history (prompt and committed tokens), the ``grammar``, then, when
    sampling, ``top_k``, ``typical_p``, ``top_p``, ``min_p`` and ``temperature``.
    Greedy decoding takes the most likely token after bias, penalties and grammar.
    The defaults (the native constructor's) leave every sampler but the
    temperature neutral.
    """

    #: Softmax temperature (default 0.0: greedy).
    temperature: float
    #: Keep the k most likely tokens (default 0: all).
    top_k: int
    #: Nucleus mass, in (0, 1] (default 1.0: all).
    top_p: float
    #: RNG seed (default 0); :meth:`~specstate.Generator.set_sampling` restarts the RNG only when it changes.
    seed: int
    #: Keep the tokens at least ``min_p`` times as likely as the most likely one, in [0, 1] (default 0.0: all).
    min_p: float
    #: Locally typical sampling's mass, in (0, 1] (default 1.0: off).
    typical_p: float
    #: Repetition penalty, in (0, 100]: a repeated token's logit is divided by it when positive,
    #: multiplied when not (default 1.0: off).
    repeat_penalty: float
    #: Tokens of the history the penalties count (default 64; 0: none, -1: the whole history).
    repeat_last_n: int
    #: Subtracted from a repeated token's logit, in [-100, 100] (default 0.0: off).
    presence_penalty: float
    #: Subtracted once per repetition, in [-100, 100] (default 0.0: off).
    frequency_penalty: float
    #: Added to the logits of these tokens, each in [-10000, 10000] (default None: no bias);
    #: token ids must be in the model's vocabulary.
    logit_bias: Mapping[int, float] | None
    #: A GBNF grammar (llama.cpp's; start rule ``root``) that every reply follows: the tokens generated
    #: after the prompt or after each new turn (default None: no grammar; in
    #: :meth:`~specstate.Generator.set_sampling`, ``""`` takes it away). A drafted token it forbids is
    #: rejected; checkpoints carry it, and a restore follows the reply with it again.
    #: :func:`specstate.json_schema_to_grammar` makes one from a JSON Schema.
    grammar: str | None


class GeneratorSettings(_NgramLengths, SamplingSettings, total=False):
    """The keyword arguments of :class:`specstate.Generator`, every one optional.

    The one statement of them in Python: the wrapper and the command line take
    them as they are, and ``stubtest`` checks that the native constructor has
    exactly these keyword arguments. The defaults are the native constructor's.
    """

    #: ``none`` (the default), ``ngram``, ``draft``, ``mtp`` or ``eagle3``.
    mode: Mode
    #: The draft model (``draft`` and ``eagle3`` modes; default None).
    draft_model: Model | None
    #: Most tokens drafted per round (default 8).
    n_draft: int
    #: Context length in tokens (default 2048; 0: the target model's trained length).
    n_ctx: int
    #: Rows per decode (default: the most whose rows get their single decode's bits, so that a reply does not
    #: depend on how its prompt was chunked or cached; at most ``n_ctx``, a larger one is clamped to it).
    n_batch: int
    #: Threads per context (default 0: the default thread count, docs/threads.md).
    n_threads: int
    #: Draft the tokens a grammar forces (default True; docs/generating.md): a runtime choice, never recorded in
    #: checkpoints, that changes the speed of a reply under a grammar and never its text.
    grammar_drafts: bool
    #: ``fixed`` (the default: every round drafts up to ``n_draft``) or ``adaptive`` (each round drafts what
    #: pays); ``none`` mode's is ``fixed``.
    draft_policy: DraftPolicy
    #: The adaptive policy's cost curve, pinned instead of estimated or timed: microseconds to verify 1, 2, ...
    #: ``n_draft + 1`` rows (default None: see docs/adaptive-draft.md). Two runs pinned alike choose alike.
    cost_curve: Sequence[int] | None
    #: A :class:`~specstate.SharedEngine` to decode on (default None: a context of its own). The generator
    #: takes one of its sequences and its rounds are decoded together with those of the other generators
    #: attached to it (used from other threads), each reply token for token the one it gives alone. Modes
    #: ``none`` and ``ngram``; ``n_ctx`` must be the engine's, and the engine's threads decode.
    engine: SharedEngine | None


class GeneratorConfig(_NgramLengths):
    """What :attr:`specstate.Generator.config` returns and a checkpoint records.

    The settings a generation runs with: ``mode``, ``n_draft``, ``n_ctx``,
    ``n_batch``, ``draft_policy``, the sampling parameters in force
    (:class:`SamplingSettings`; ``logit_bias`` a dict, empty for none;
    ``grammar`` None for none), and
    only in ``ngram`` mode ``ngram_max`` and ``ngram_min``.
    """

    mode: Mode
    n_draft: int
    n_ctx: int
    n_batch: int
    draft_policy: DraftPolicy
    temperature: float
    top_k: int
    top_p: float
    seed: int
    min_p: float
    typical_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    logit_bias: dict[int, float]
    grammar: str | None


class TokenLogprobs(NamedTuple):
    """A generated token's log-probability under the target's distribution at its position (the log-softmax of
    the model's logits, before the sampler chain: what llama-cpp-python and OpenAI report) and the most likely
    tokens there. Speculation does not change them: a verified row's logits are those of a plain decode."""

    #: The token.
    token: int
    #: Its log-probability.
    logprob: float
    #: ``(token, logprob)`` of the most likely tokens, most likely first.
    top: list[tuple[int, float]]


class ModelFingerprint(TypedDict):
    """A model file as a checkpoint records it: its ``file`` name, ``size`` in bytes and ``sha256`` (hex)."""

    file: str
    size: int
    sha256: str


class CheckpointInfo(TypedDict):
    """What :func:`specstate.inspect_checkpoint` returns.

    Keys: ``format_version``; the writer's ``specstate_version``,
    ``llama_cpp_sys_version``, ``llama_cpp_build`` and ``llama_cpp_commit``;
    the generation's ``config``; ``target_model`` and ``draft_model`` (None
    when the mode has none); ``n_prompt`` (prompt tokens), ``n_tokens``
    (prompt and committed), ``n_generated`` (committed), ``n_delivered``
    (handed out), ``n_past`` (in the target's memory), ``finished``;
    ``n_messages``, the messages of the conversation that led to the current
    reply (``None`` when the generation is not a chat); ``n_threads``, the
    threads it decoded with (``None`` before format 3); ``cost_curve``, the
    adaptive draft policy's (``None`` for the fixed policy); the
    counters ``rounds``, ``drafted`` and ``accepted``; ``sections`` as
    ``(name, bytes)`` pairs in file order; ``checksum`` (the CRC-32 over the
    file, 8 hex digits) and ``size`` (bytes of the file).
    """

    format_version: int
    specstate_version: str
    llama_cpp_sys_version: str
    llama_cpp_build: str
    llama_cpp_commit: str
    config: GeneratorConfig
    target_model: ModelFingerprint
    draft_model: ModelFingerprint | None
    n_prompt: int
    n_tokens: int
    n_generated: int
    n_delivered: int
    n_past: int
    finished: bool
    n_messages: int | None
    n_threads: int | None
    cost_curve: list[int] | None
    rounds: int
    drafted: int
    accepted: int
    sections: list[tuple[str, int]]
    checksum: str
    size: int
