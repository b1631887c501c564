"""Deterministic builders of tiny GGUF models for specstate's tests.

Three builders write small f32 GGUF files with llama.cpp's own writer (the
``gguf`` package):

* :func:`build_llama` -- a plain ``llama`` model (4 layers, n_embd 64).
* :func:`build_qwen35_mtp` -- a hybrid ``qwen35`` model (gated-delta-net and
  full-attention trunk blocks) with one appended NextN/MTP block, for a draft
  context of type ``LLAMA_CONTEXT_TYPE_MTP`` over the same model.
* :func:`build_eagle3_pair` -- a ``llama`` target and an ``eagle3`` draft.

All of them share one tokenizer (:data:`VOCAB`): a byte-level GPT-2-style BPE
vocabulary of the 256 byte tokens, a few merges and BOS/EOS, so that any text
tokenizes and detokenizes exactly (pre-tokenizer ``qwen2``, which does not
clean up spaces).

Why the weights are not simply random
-------------------------------------
Speculative tests need drafts that are *sometimes* accepted and *sometimes*
rejected; with random weights a draft head never agrees with its target. Every
model here is built around one fixed "successor" map ``f: token -> token``
(:func:`successor`): a single cycle through all 131 printable tokens, so greedy
generation does not stop at EOS, normally runs through long stretches of that
cycle instead of collapsing into a short loop, and its text is always printable
ASCII.

* The token embedding ``E`` has i.i.d. N(0, 1) rows. Output-head row ``f(t)``
  is ``E[t] - 0.5 * E[f(t)]`` for each printable ``t`` (the second term makes
  repeating a token unlikely); other rows are zero, so control and
  non-printable tokens are never predicted. A residual stream close to
  ``E[t]`` therefore gives the greedy next token ``f(t)``.
* Every layer's output projection (attention output, gated-delta-net output,
  FFN down) is scaled by ``noise``, so each layer only perturbs the residual
  stream, by an amount that depends on the context.
* The MTP block's ``eh_proj`` passes the token-embedding half through unchanged
  and maps the hidden-state half by a ``draft_noise``-scaled random matrix; its
  attention and FFN outputs are ``draft_noise``-scaled too. It shares the
  trunk's embedding and head, so it predicts ``f(its input token)`` up to its
  own, context-dependent perturbation.
* The EAGLE-3 draft's single decoder block uses attention whose Q, K and V read
  the normalised token embedding (Q = K = 2I, V = I, plus ``draft_noise``-scaled
  randomness), so each position attends to itself or to earlier copies of its
  token and the attention output is its token's embedding; with
  ``norm_before_residual`` the fused target features only add a
  ``draft_noise``-scaled share. With the target's embedding and head it too
  predicts ``f(token)`` up to its perturbation.

A draft token is accepted when the target's greedy choice and the draft agree.
With the defaults (:data:`DEFAULT_NOISE`, :data:`DEFAULT_DRAFT_NOISE`) the
target follows ``f`` almost always and the draft heads stray often enough that
about half of the drafted tokens are accepted (greedy, 50 tokens, 3-token
drafts, seeds 0-7: MTP 33-61 %, EAGLE-3 35-53 %, every run with both accepted
and rejected drafts); ``draft_noise=0`` gives total acceptance, 3.0 almost
none. Both knobs are scaled by ``sqrt(n_embd / 64)`` internally so that their
effect does not depend much on the width. ``noise`` above about 1.0 makes the
target itself stray from ``f`` (and its greedy text may then loop).

Every builder is a pure function of its arguments: the same arguments write the
same bytes. Random values come from ``numpy.random.default_rng([seed, stream])``
with one stream for the shared structure (embedding, head, successor map) and
one per model body, so the target of :func:`build_eagle3_pair` is byte-for-byte
:func:`build_llama` with the same seed and sizes, and all builders with one seed
share the embedding, head and successor map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from specstate_testkit.gguf_files import gguf_writer
from specstate_testkit.vocab import BOS_ID as BOS_ID
from specstate_testkit.vocab import EOS_ID as EOS_ID
from specstate_testkit.vocab import N_VOCAB as N_VOCAB
from specstate_testkit.vocab import VOCAB as VOCAB
from specstate_testkit.vocab import Vocab as Vocab
from specstate_testkit.vocab import printable_tokens as printable_tokens

__all__ = [
    "BOS_ID",
    "DEFAULT_DRAFT_NOISE",
    "DEFAULT_NOISE",
    "EOS_ID",
    "N_VOCAB",
    "VOCAB",
    "Vocab",
    "build_eagle3_pair",
    "build_llama",
    "build_qwen35_mtp",
    "printable_tokens",
    "successor",
]

F32 = npt.NDArray[np.float32]

#: Default scale of the target's (trunk's) layer perturbations. At 0.75 the
#: target's greedy choice is f(last token) nearly always, so greedy text runs
#: through the whole long cycle of ``f``; from about 1.0 up the target strays
#: from ``f`` where the context pushes it, and greedy text may fall into loops.
DEFAULT_NOISE = 0.75
#: Default scale of the draft heads' perturbations (the MTP block, the EAGLE-3
#: draft). 0 makes the draft predict exactly ``f``; the default gives roughly
#: half of the greedy drafts accepted with the default target noise.
DEFAULT_DRAFT_NOISE = 1.0

# Stream ids for ``np.random.default_rng([seed, stream])``.
_STREAM_STRUCTURE = 0
_STREAM_LLAMA = 1
_STREAM_QWEN35 = 2
_STREAM_EAGLE3 = 3

# Scale of the output-norm weights: keeps the top logit around 16 rather than 64
# so that the softmax is peaked but not one-hot.
_LOGIT_SCALE = 0.25
_RMS_EPS = 1e-6
# Share of a token's own embedding subtracted from its output row.
_REPEAT_PENALTY = 0.5
# FFN output scale per unit of noise (the FFN perturbation depends on the token
# only; attention and recurrent perturbations depend on the context).
_FFN_SHARE = 0.5
# Perturbation scale of the MTP block per unit of draft noise.
_MTP_GAIN = 2.0
_CONTEXT_LENGTH = 4096

# --------------------------------------------------------------------------
# Shared structure: successor map, embedding, output head
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Structure:
    successor: tuple[int, ...]  # f(token) for every token id
    embedding: F32  # (n_vocab, n_embd), rows E[t]
    head: F32  # (n_vocab, n_embd), rows of the output matrix


@lru_cache(maxsize=32)
def _structure(seed: int, n_embd: int) -> _Structure:
    rng = np.random.default_rng([seed, _STREAM_STRUCTURE])
    cycle = [int(t) for t in rng.permutation(np.array(printable_tokens()))]
    embedding = rng.standard_normal((N_VOCAB, n_embd)).astype(np.float32)
    # Row f(t) of the head is E[t], minus a share of its own embedding so that
    # repeating the input token is disfavoured (no fixed points under noise).
    head = np.zeros((N_VOCAB, n_embd), dtype=np.float32)
    succ = [0] * N_VOCAB
    for i, t in enumerate(cycle):
        nxt = cycle[(i + 1) % len(cycle)]
        succ[t] = nxt
        head[nxt] += embedding[t]
        head[t] -= _REPEAT_PENALTY * embedding[t]
    # Other tokens (control, non-printable bytes) get whatever the noise-free
    # model predicts for them: some printable token.
    in_cycle = set(cycle)
    for t in range(N_VOCAB):
        if t not in in_cycle:
            succ[t] = int(np.argmax(head @ embedding[t]))
    embedding.setflags(write=False)
    head.setflags(write=False)
    return _Structure(tuple(succ), embedding, head)


def successor(seed: int = 0, n_embd: int = 64) -> tuple[int, ...]:
    """The map ``f`` the models built with ``seed`` and ``n_embd`` approximate.

    ``successor(seed)[t]`` is the token that a noise-free model predicts after
    ``t``. Restricted to :func:`printable_tokens` it is one cycle through all of
    them; every other token maps into that cycle.
    """
    return _structure(seed, n_embd).successor


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


class _Tensors:
    """Ordered (name -> f32 array) collection in numpy shape order.

    numpy shape is ggml's ``ne`` reversed: a ggml ``{n_in, n_out}`` matrix is
    a numpy ``(n_out, n_in)`` array, applied as ``W @ x``.
    """

    def __init__(self) -> None:
        self.items: list[tuple[str, F32]] = []

    def add(self, name: str, value: npt.ArrayLike) -> None:
        array = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
        if any(existing == name for existing, _ in self.items):
            raise AssertionError(f"duplicate tensor {name}")
        self.items.append((name, array))


def _write(
    path: Path, arch: str, fill_metadata: _MetadataFill, tensors: _Tensors, chat_template: str | None = None
) -> Path:
    """Write one GGUF file atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    with gguf_writer(path, arch) as writer:
        fill_metadata(writer)
        VOCAB.write_to(writer)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
        for name, array in tensors.items:
            writer.add_tensor(name, array)
    return path


class _MetadataFill:
    """Callable that adds architecture metadata (keys are ``{arch}.*``)."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.u32: list[tuple[str, int]] = []
        self.f32: list[tuple[str, float]] = []
        self.boolean: list[tuple[str, bool]] = []
        self.i32_arrays: list[tuple[str, list[int]]] = []

    def uint32(self, key: str, value: int) -> None:
        self.u32.append((f"{self.arch}.{key}", int(value)))

    def float32(self, key: str, value: float) -> None:
        self.f32.append((f"{self.arch}.{key}", float(value)))

    def bool_(self, key: str, value: bool) -> None:
        self.boolean.append((f"{self.arch}.{key}", bool(value)))

    def int32_array(self, key: str, values: Sequence[int]) -> None:
        self.i32_arrays.append((f"{self.arch}.{key}", [int(v) for v in values]))

    def __call__(self, writer: gguf.GGUFWriter) -> None:
        writer.add_name(f"specstate-test-{self.arch}")
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        for key, value in self.u32:
            writer.add_uint32(key, value)
        for key, fvalue in self.f32:
            writer.add_float32(key, fvalue)
        for key, bvalue in self.boolean:
            writer.add_bool(key, bvalue)
        for key, values in self.i32_arrays:
            writer.add_array(key, values)


@dataclass(frozen=True)
class _Sizes:
    """The widths of a model's blocks (checked by :func:`_check_sizes`)."""

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _common_metadata(
    arch: str, sizes: _Sizes, *, n_layer_all: int, rope_dims: int, context_length: int = _CONTEXT_LENGTH
) -> _MetadataFill:
    meta = _MetadataFill(arch)
    meta.uint32("context_length", context_length)
    meta.uint32("embedding_length", sizes.n_embd)
    meta.uint32("block_count", n_layer_all)
    meta.uint32("feed_forward_length", sizes.n_ff)
    meta.uint32("attention.head_count", sizes.n_head)
    meta.uint32("attention.head_count_kv", sizes.n_head_kv)
    meta.float32("attention.layer_norm_rms_epsilon", _RMS_EPS)
    meta.float32("rope.freq_base", 10000.0)
    meta.uint32("rope.dimension_count", rope_dims)
    meta.uint32("vocab_size", N_VOCAB)
    return meta


# --------------------------------------------------------------------------
# Weight helpers
# --------------------------------------------------------------------------


def _dense(rng: np.random.Generator, n_out: int, n_in: int, scale: float = 1.0) -> F32:
    """(n_out, n_in) matrix with N(0, scale^2 / n_in) entries: unit-rms input -> rms ``scale``."""
    return (rng.standard_normal((n_out, n_in)) * (scale / math.sqrt(n_in))).astype(np.float32)


def _ones(n: int, value: float = 1.0) -> F32:
    return np.full((n,), value, dtype=np.float32)


def _check_sizes(n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> _Sizes:
    if n_embd <= 0 or n_head <= 0 or n_head_kv <= 0:
        raise ValueError("sizes must be positive")
    if n_embd % n_head != 0:
        raise ValueError("n_embd must be a multiple of n_head")
    if n_head % n_head_kv != 0:
        raise ValueError("n_head must be a multiple of n_head_kv")
    if (n_embd // n_head) % 2 != 0:
        raise ValueError("head width must be even for RoPE")
    return _Sizes(n_embd, n_head, n_head_kv, n_ff)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError("seed must be a non-negative int")
    return seed


def _check_noise(noise: float, n_embd: int) -> float:
    """Validate a noise knob and scale it for the model width.

    The logit margin of ``f(t)`` grows like ``n_embd`` and a perturbation's
    effect like ``sqrt(n_embd)`` times its per-component size, so scaling by
    ``sqrt(n_embd / 64)`` keeps a knob's effect roughly independent of width.
    """
    noise = float(noise)
    if not math.isfinite(noise) or noise < 0.0:
        raise ValueError("noise must be finite and non-negative")
    return noise * math.sqrt(n_embd / 64)


def _embedding_and_head(t: _Tensors, structure: _Structure) -> None:
    """The shared token embedding, the output norm and the shared output head."""
    t.add("token_embd.weight", structure.embedding)
    t.add("output_norm.weight", _ones(structure.embedding.shape[1], _LOGIT_SCALE))
    t.add("output.weight", structure.head)


def _attention(
    t: _Tensors, rng: np.random.Generator, il: int, sizes: _Sizes, noise: float, *, gated: bool = False
) -> None:
    """A block's attention tensors; ``gated`` (Qwen3.5): Q carries the output gate, Q and K are normalised."""
    n_q = (2 if gated else 1) * sizes.n_head * sizes.head_dim
    t.add(f"blk.{il}.attn_q.weight", _dense(rng, n_q, sizes.n_embd))
    t.add(f"blk.{il}.attn_k.weight", _dense(rng, sizes.n_head_kv * sizes.head_dim, sizes.n_embd))
    t.add(f"blk.{il}.attn_v.weight", _dense(rng, sizes.n_head_kv * sizes.head_dim, sizes.n_embd))
    t.add(f"blk.{il}.attn_output.weight", _dense(rng, sizes.n_embd, sizes.n_head * sizes.head_dim, noise))
    if gated:
        t.add(f"blk.{il}.attn_q_norm.weight", _ones(sizes.head_dim))
        t.add(f"blk.{il}.attn_k_norm.weight", _ones(sizes.head_dim))


def _ffn(tensors: _Tensors, rng: np.random.Generator, il: int, n_embd: int, n_ff: int, down_scale: float) -> None:
    """SwiGLU FFN tensors; ``down_scale`` is the output's rms for a unit-rms input."""
    tensors.add(f"blk.{il}.ffn_gate.weight", _dense(rng, n_ff, n_embd))
    tensors.add(f"blk.{il}.ffn_up.weight", _dense(rng, n_ff, n_embd))
    tensors.add(f"blk.{il}.ffn_down.weight", _dense(rng, n_embd, n_ff, down_scale))


# --------------------------------------------------------------------------
# llama
# --------------------------------------------------------------------------


def _llama_tensors(seed: int, n_layer: int, sizes: _Sizes, noise: float) -> _Tensors:
    rng = np.random.default_rng([seed, _STREAM_LLAMA])
    t = _Tensors()
    _embedding_and_head(t, _structure(seed, sizes.n_embd))
    for il in range(n_layer):
        t.add(f"blk.{il}.attn_norm.weight", _ones(sizes.n_embd))
        _attention(t, rng, il, sizes, noise)
        t.add(f"blk.{il}.ffn_norm.weight", _ones(sizes.n_embd))
        _ffn(t, rng, il, sizes.n_embd, sizes.n_ff, _FFN_SHARE * noise)
    return t


def build_llama(
    path: Path,
    *,
    seed: int = 0,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    noise: float = DEFAULT_NOISE,
    chat_template: str | None = None,
    context_length: int = _CONTEXT_LENGTH,
) -> Path:
    """Write a tiny ``llama`` model to ``path`` and return ``path``.

    Tensors: ``token_embd``, ``output_norm``, ``output`` and per block
    ``attn_norm``, ``attn_q``/``attn_k``/``attn_v``/``attn_output``,
    ``ffn_norm``, ``ffn_gate``/``ffn_up``/``ffn_down`` (all f32). ``noise``
    scales every block's attention-output and FFN-down projections.
    ``chat_template`` goes to ``tokenizer.chat_template``; ``context_length``
    is the trained context length (the most ``n_ctx`` a model accepts).
    """
    seed = _check_seed(seed)
    sizes = _check_sizes(n_embd, n_head, n_head_kv, n_ff)
    noise = _check_noise(noise, n_embd)
    if n_layer <= 0 or n_ff <= 0:
        raise ValueError("n_layer and n_ff must be positive")
    if not 1 <= context_length < 2**32:
        raise ValueError(f"context_length must be between 1 and 2**32 - 1, not {context_length}")
    meta = _common_metadata(
        "llama", sizes, n_layer_all=n_layer, rope_dims=sizes.head_dim, context_length=context_length
    )
    return _write(path, "llama", meta, _llama_tensors(seed, n_layer, sizes, noise), chat_template)


# --------------------------------------------------------------------------
# qwen35 with one MTP block
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ssm:
    """The gated-delta-net sizes of a Qwen3.5 model."""

    state_size: int
    group_count: int  # key heads
    time_step_rank: int  # value heads
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.state_size * self.group_count

    @property
    def value_dim(self) -> int:  # == ssm.inner_size
        return self.state_size * self.time_step_rank

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def _gated_delta_net(t: _Tensors, rng: np.random.Generator, il: int, n_embd: int, ssm: _Ssm, noise: float) -> None:
    """A recurrent Qwen3.5 block's gated-delta-net tensors."""
    t.add(f"blk.{il}.attn_qkv.weight", _dense(rng, ssm.conv_dim, n_embd))
    t.add(f"blk.{il}.attn_gate.weight", _dense(rng, ssm.value_dim, n_embd))
    t.add(f"blk.{il}.ssm_conv1d.weight", _dense(rng, ssm.conv_dim, ssm.conv_kernel))
    t.add(f"blk.{il}.ssm_dt.bias", (rng.standard_normal(ssm.time_step_rank) * 0.5).astype(np.float32))
    t.add(f"blk.{il}.ssm_a", (-rng.uniform(0.5, 1.5, ssm.time_step_rank)).astype(np.float32))
    t.add(f"blk.{il}.ssm_beta.weight", _dense(rng, ssm.time_step_rank, n_embd))
    t.add(f"blk.{il}.ssm_alpha.weight", _dense(rng, ssm.time_step_rank, n_embd))
    t.add(f"blk.{il}.ssm_norm.weight", _ones(ssm.state_size))
    t.add(f"blk.{il}.ssm_out.weight", _dense(rng, n_embd, ssm.value_dim, noise))


def _qwen35_mtp_block(t: _Tensors, rng: np.random.Generator, il: int, sizes: _Sizes, mtp_noise: float) -> None:
    """The MTP block: a full-attention block behind eh_proj.

    It shares the trunk's token embedding, output norm and output head (no
    nextn.embed_tokens / nextn.shared_head_* tensors).
    """
    n_embd = sizes.n_embd
    t.add(f"blk.{il}.attn_norm.weight", _ones(n_embd))
    t.add(f"blk.{il}.post_attention_norm.weight", _ones(n_embd))
    _attention(t, rng, il, sizes, mtp_noise, gated=True)
    _ffn(t, rng, il, n_embd, sizes.n_ff, _FFN_SHARE * mtp_noise)
    # eh_proj @ concat(enorm(embedding), hnorm(hidden)): identity on the
    # embedding half, a noise-scaled random map on the hidden half.
    eh_proj = np.concatenate([np.eye(n_embd, dtype=np.float32), _dense(rng, n_embd, n_embd, mtp_noise)], axis=1)
    t.add(f"blk.{il}.nextn.eh_proj.weight", eh_proj)
    t.add(f"blk.{il}.nextn.enorm.weight", _ones(n_embd))
    t.add(f"blk.{il}.nextn.hnorm.weight", _ones(n_embd))


def _qwen35_tensors(
    seed: int, n_layer: int, sizes: _Sizes, ssm: _Ssm, full_attention_interval: int, noise: float, mtp_noise: float
) -> _Tensors:
    """The trunk (gated delta net, full attention every ``full_attention_interval``-th block) and the MTP block."""
    rng = np.random.default_rng([seed, _STREAM_QWEN35])
    t = _Tensors()
    _embedding_and_head(t, _structure(seed, sizes.n_embd))
    for il in range(n_layer):
        t.add(f"blk.{il}.attn_norm.weight", _ones(sizes.n_embd))
        t.add(f"blk.{il}.post_attention_norm.weight", _ones(sizes.n_embd))
        if (il + 1) % full_attention_interval == 0:
            _attention(t, rng, il, sizes, noise, gated=True)
        else:
            _gated_delta_net(t, rng, il, sizes.n_embd, ssm, noise)
        _ffn(t, rng, il, sizes.n_embd, sizes.n_ff, _FFN_SHARE * noise)
    _qwen35_mtp_block(t, rng, n_layer, sizes, mtp_noise)
    return t


def _qwen35_metadata(n_layer: int, sizes: _Sizes, ssm: _Ssm, full_attention_interval: int) -> _MetadataFill:
    # RoPE over half of each head (as Qwen3.5 does); the M-RoPE sections count
    # rotated pairs, split about 2:1:1:0 (text positions are equal in all four).
    rope_dims = sizes.head_dim // 2
    pairs = rope_dims // 2
    sections = [pairs - 2 * (pairs // 4), pairs // 4, pairs // 4, 0]
    meta = _common_metadata("qwen35", sizes, n_layer_all=n_layer + 1, rope_dims=rope_dims)
    meta.uint32("nextn_predict_layers", 1)
    meta.uint32("full_attention_interval", full_attention_interval)
    meta.int32_array("rope.dimension_sections", sections)
    meta.uint32("ssm.conv_kernel", ssm.conv_kernel)
    meta.uint32("ssm.state_size", ssm.state_size)
    meta.uint32("ssm.group_count", ssm.group_count)
    meta.uint32("ssm.time_step_rank", ssm.time_step_rank)
    meta.uint32("ssm.inner_size", ssm.value_dim)
    return meta


def build_qwen35_mtp(
    path: Path,
    *,
    seed: int = 0,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    full_attention_interval: int = 2,
    ssm_state_size: int = 16,
    ssm_group_count: int = 2,
    ssm_time_step_rank: int = 4,
    ssm_conv_kernel: int = 4,
    noise: float = DEFAULT_NOISE,
    draft_noise: float = DEFAULT_DRAFT_NOISE,
) -> Path:
    """Write a tiny hybrid ``qwen35`` model with one MTP (NextN) block.

    ``n_layer`` is the number of trunk blocks; the file's ``block_count`` is
    ``n_layer + 1`` and ``nextn_predict_layers`` is 1, so block ``n_layer`` is
    the MTP block. Trunk block ``i`` is full attention when
    ``(i + 1) % full_attention_interval == 0`` and gated delta net otherwise.
    ``noise`` scales the trunk's perturbations and ``draft_noise`` the MTP
    block's.

    Load it with ``llama_model_params.load_mtp = true`` for MTP drafting:
    otherwise llama.cpp skips the MTP block's tensors (logging "unused tensor"
    for each), and creating a ``LLAMA_CONTEXT_TYPE_MTP`` context on that model
    aborts the process in a ``GGML_ASSERT`` (qwen35.cpp, missing eh_proj).
    """
    seed = _check_seed(seed)
    sizes = _check_sizes(n_embd, n_head, n_head_kv, n_ff)
    noise = _check_noise(noise, n_embd)
    mtp_noise = _MTP_GAIN * _check_noise(draft_noise, n_embd)
    if n_layer <= 0 or n_ff <= 0 or full_attention_interval <= 0:
        raise ValueError("n_layer, n_ff and full_attention_interval must be positive")
    if ssm_time_step_rank % ssm_group_count != 0:
        raise ValueError("ssm_time_step_rank must be a multiple of ssm_group_count")
    if sizes.head_dim % 4 != 0:
        raise ValueError("head width must be a multiple of 4 (RoPE over half of it)")
    ssm = _Ssm(ssm_state_size, ssm_group_count, ssm_time_step_rank, ssm_conv_kernel)
    tensors = _qwen35_tensors(seed, n_layer, sizes, ssm, full_attention_interval, noise, mtp_noise)
    return _write(path, "qwen35", _qwen35_metadata(n_layer, sizes, ssm, full_attention_interval), tensors)


# --------------------------------------------------------------------------
# EAGLE-3 pair
# --------------------------------------------------------------------------

# Q/K gain of the EAGLE-3 draft's self-matching attention: the score of a
# position against itself is ~QK_GAIN^2 * head_dim / sqrt(head_dim) higher than
# against an unrelated token.
_EAGLE3_QK_GAIN = 2.0
# Perturbation scale of the EAGLE-3 draft per unit of draft noise.
_EAGLE3_GAIN = 2.5
# Weight of the normalised fused target features in the draft's residual, per
# unit of scaled noise, and its cap (it must stay under 1: from the second draft
# step on, those features are the previous step's hidden state, which points
# at the previous token).
_EAGLE3_G_SHARE = 0.25
_EAGLE3_G_MAX = 0.9
# Random parts of the draft's Q and attention output, per unit of scaled noise.
_EAGLE3_Q_SHARE = 0.5
_EAGLE3_O_SHARE = 0.5


def _eagle3_tensors(seed: int, sizes: _Sizes, draft_noise: float, own_head: bool) -> _Tensors:
    """The draft's fused-feature projection and its one decoder block (``draft_noise`` scaled)."""
    n_embd, dn = sizes.n_embd, draft_noise
    structure = _structure(seed, n_embd)
    rng = np.random.default_rng([seed, _STREAM_EAGLE3])
    eye = np.eye(n_embd, dtype=np.float32)
    zero = np.zeros((n_embd, n_embd), dtype=np.float32)
    t = _Tensors()
    # fc: concat(3 target layer inputs) -> draft width. Its output only enters
    # through attn_norm_2 (an RMS norm), so its scale is irrelevant.
    t.add("fc.weight", _dense(rng, n_embd, 3 * n_embd))
    t.add("output_norm.weight", _ones(n_embd, _LOGIT_SCALE))
    if own_head:
        t.add("output.weight", structure.head)
        t.add("token_embd.weight", structure.embedding)
    t.add("blk.0.attn_norm.weight", _ones(n_embd))
    t.add("blk.0.attn_norm_2.weight", _ones(n_embd, min(_EAGLE3_G_MAX, _EAGLE3_G_SHARE * dn)))
    # Attention input is concat(attn_norm(embedding), attn_norm_2(g)); Q, K and
    # V read the embedding half only, so each position attends to itself (or
    # to earlier copies of its token) and V carries its embedding.
    qk = np.concatenate([eye * _EAGLE3_QK_GAIN, zero], axis=1)
    t.add("blk.0.attn_q.weight", qk + _dense(rng, n_embd, 2 * n_embd, _EAGLE3_Q_SHARE * dn))
    t.add("blk.0.attn_k.weight", qk.copy())
    t.add("blk.0.attn_v.weight", np.concatenate([eye, zero], axis=1))
    t.add("blk.0.attn_output.weight", eye + _dense(rng, n_embd, n_embd, _EAGLE3_O_SHARE * dn))
    t.add("blk.0.ffn_norm.weight", _ones(n_embd))
    _ffn(t, rng, 0, n_embd, sizes.n_ff, dn)
    return t


def _check_target_layers(target_layers: Sequence[int] | None, n_layer: int) -> list[int]:
    """The three target layers an EAGLE-3 draft reads (default ``(1, n_layer // 2, n_layer - 1)``)."""
    if target_layers is None:
        target_layers = (min(1, n_layer - 1), n_layer // 2, n_layer - 1)
    layers = [int(x) for x in target_layers]
    if len(layers) != 3 or any(not 0 <= x < n_layer for x in layers):
        raise ValueError("target_layers must be three layer ids in [0, n_layer)")
    return layers


def build_eagle3_pair(
    target_path: Path,
    draft_path: Path,
    *,
    seed: int = 0,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    draft_n_head: int = 4,
    draft_n_ff: int = 128,
    target_layers: Sequence[int] | None = None,
    noise: float = DEFAULT_NOISE,
    draft_noise: float = DEFAULT_DRAFT_NOISE,
    draft_own_head: bool = True,
) -> tuple[Path, Path]:
    """Write a ``llama`` target and an ``eagle3`` draft; return both paths.

    The target is exactly :func:`build_llama` with the same seed and sizes.
    The draft has one decoder block of width ``n_embd`` and reads the target's
    layer inputs ``target_layers`` (default ``(1, n_layer // 2, n_layer - 1)``,
    each below ``n_layer``: llama targets expose no NextN hidden state).

    With ``draft_own_head`` (the default) the draft carries copies of the
    target's ``token_embd`` and ``output``; without, it has neither, and its
    context must be created with ``ctx_other`` set to the target context.

    Because every builder with one seed and width shares the embedding, head
    and successor map, the draft also works against :func:`build_qwen35_mtp`
    with the same ``seed`` and ``n_embd`` (a hybrid target, whose EAGLE-3
    session state carries the deferred boundary row), as long as every target
    layer id is below that model's trunk ``n_layer``.
    ``noise`` scales the target's perturbations and ``draft_noise`` the
    draft's.
    """
    seed = _check_seed(seed)
    _check_noise(noise, n_embd)
    dn = _EAGLE3_GAIN * _check_noise(draft_noise, n_embd)
    if n_layer <= 0 or n_ff <= 0 or draft_n_ff <= 0:
        raise ValueError("n_layer, n_ff and draft_n_ff must be positive")
    layers = _check_target_layers(target_layers, n_layer)
    draft_sizes = _check_sizes(n_embd, draft_n_head, draft_n_head, draft_n_ff)

    build_llama(
        target_path,
        seed=seed,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        noise=noise,
    )
    meta = _common_metadata("eagle3", draft_sizes, n_layer_all=1, rope_dims=draft_sizes.head_dim)
    meta.int32_array("target_layers", layers)
    meta.uint32("target_hidden_size", n_embd)
    meta.bool_("norm_before_residual", True)
    _write(draft_path, "eagle3", meta, _eagle3_tensors(seed, draft_sizes, dn, draft_own_head))
    return Path(target_path), Path(draft_path)
