"""A structured fuzzer of checkpoint restores.

Every case is one mutation of a real checkpoint, with the CRC-32 trailer (and,
in format version 2, the section bindings where the mutation says so)
recomputed, so that it reaches the content checks. A case must end in a typed
error (a subclass of :class:`specstate.errors.CheckpointError`) or in a
restore that continues as the original would. Cases run in worker
subprocesses, so a crash is a failed case, not a dead test run.

Base checkpoints: generators over the tiny models (``generator_support``; all
five modes, greedy and sampled, every one with the hybrid qwen35 MTP model as
its target) and over SmolLM2-135M (modes ``none`` and ``ngram``), each
checkpointed at two boundaries of the same run. For each base the reference
continuation is recorded: the unmodified checkpoint restored, then :data:`K`
tokens generated.

The ``memory`` class sets the fields that size a restore's contexts together
(``n_draft``, ``n_batch``, ``n_ctx``, and ``n_threads`` restored as recorded),
so that they reach the allocation limits: rows per compute pass, and the hybrid
target's rollback snapshots (one recurrent state per drafted token). Every
case runs in a worker under an address-space limit (``RLIMIT_AS``, 2 GiB by
default: the workers peak at about 0.6 GiB, and the largest contexts a restore
allows by default take about 1.3 GiB), so a configuration the library should
have refused shows up as a crash (llama.cpp aborts when an allocation fails)
or an ``over-allocation`` instead of passing unnoticed.

Expectations come from two places. :func:`predict` is an independent model of
the checkpoint validation in Python (docs/checkpoint-format.md plus the
generator's configuration bounds and the version-2 bindings): where it names a
problem, the restore must be refused with a typed error. Where it names none,
the mutation's own label decides:

``noop``
    the checkpoint means the same thing: it must be accepted and continue
    exactly;
``exact``
    only counters or informational fields changed: refused with a typed error,
    or accepted and continuing exactly;
``refuse-positions``
    a target or draft context state whose positions no longer fit the state
    (spliced from the other boundary of the same run, or ``n_past`` moved):
    the positions check must refuse it;
``any``
    the content really changed ("deep"): a typed error, or an accepted restore
    whose continuation may differ (counted as ``accepted-different``).

Outcomes that fail: ``crash`` (the worker died), ``hang`` (a case ran past the
timeout), ``untyped:<type>`` (any other exception from the restore),
``generate-error:<type>`` (an exception while generating after an accepted
restore), ``over-allocation`` (llama.cpp could not create a context under the
address-space limit), ``unexpected-accept`` / ``unexpected-accept-positions``,
``wrong-continuation``, ``refused-noop``, ``load-changed`` (a refused
``Generator.load`` changed the generator), ``harness-error``.

Usage::

    python tests/support/checkpoint_fuzz.py --cases N [--seed S] [--json OUT] [--workers 2]
        [--timeout 60] [--smollm2-share 0.2] [--load-share 0.15] [--bases DIR]
    python tests/support/checkpoint_fuzz.py worker --bases DIR --seed S --start A --stop B

``--bases DIR`` keeps the base checkpoints in DIR (and reuses them while the
native build is the same), so that a failing case can be replayed alone with
the ``worker`` command (``--start I --stop I+1``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import math
import os
import random
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, cast

import checkpoint_codec
from checkpoint_codec import reseal_sections, rewrite_meta

#: Tokens generated after each restore and compared with the reference.
K = 6
#: Generated tokens at the two checkpoints of each run.
BOUNDARIES = (6, 14)
TINY_PROMPT = "checkpoint fuzzing: the quick brown fox jumps over the lazy dog"
SMOL_PROMPT = (
    "Repeat exactly: the cat sat on the mat and the dog sat on the log. "
    "The cat sat on the mat and the dog sat on the log. The cat sat on"
)
LOAD_PROMPT = "another generation entirely"
SMOL_MODES = ("none", "ngram")
SMOL_CTX = 256

MAGIC = b"SPECSTAT"
HEADER = 32
ENTRY = 24
NAMES = {1: "meta", 2: "state", 3: "tokens", 4: "target_state", 5: "draft_state", 6: "speculative_state"}
KINDS = {name: kind for kind, name in NAMES.items()}
MAXIMUM = {1: 16 << 20, 2: 1 << 10, 3: 4 << 24, 4: 1 << 36, 5: 1 << 36, 6: 64 << 20}
STATE_V1 = 97
STATE_V2 = 117
#: Version 2: offsets in the state section of the CRC-32 of each bound section's payload.
BINDINGS = {"meta": 97, "tokens": 101, "target_state": 105, "draft_state": 109, "speculative_state": 113}
STATE_FIELDS = ("n_prompt", "n_past", "draft_past", "rounds", "drafted", "accepted", "history", "delivered")
COUNTERS = frozenset({"rounds", "drafted", "accepted"})
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
MODES = ("none", "ngram", "draft", "mtp", "eagle3")
META_KEYS = (
    "specstate_version",
    "llama_cpp_sys_version",
    "llama_cpp_build",
    "llama_cpp_commit",
    "mode",
    "ngram",
    "n_draft",
    "n_ctx",
    "n_batch",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "target_model",
    "draft_model",
    "n_threads",
)
#: The fields of meta as serde reads them: META_KEYS, then the optional conversation (format 3),
#: adaptive draft policy state (format 4) and sampler chain (format 5).
META_FIELDS = (*META_KEYS, "conversation", "adaptive", "sampler", "logprobs")
#: The keys a label compares: META_KEYS and the sampler chain.
LABEL_KEYS = (*META_KEYS, "sampler")
#: The fields of meta's ``sampler`` (format 5), in order, and their bounds (src/settings.rs, SamplingParams).
SAMPLER_FIELDS = (
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)
#: ``(low, high, low_open)`` of each real-valued sampler field.
SAMPLER_RANGES = {
    "min_p": (0.0, 1.0, False),
    "typical_p": (0.0, 1.0, True),
    "repeat_penalty": (0.0, 100.0, True),
    "presence_penalty": (-100.0, 100.0, False),
    "frequency_penalty": (-100.0, 100.0, False),
}
MAX_LOGIT_BIAS = 1 << 18
#: The sampler's optional last field: a GBNF grammar (src/native/grammar.rs, MAX_GRAMMAR_BYTES).
GRAMMAR = "grammar"
MAX_GRAMMAR_BYTES = 1 << 20
#: Grammars the fuzzer writes, each with why it must be refused (None: it parses). A grammar that parses is
#: written only as one every reply follows, so the restore goes on as before.
GRAMMARS: dict[str, str | None] = {
    "": "grammar is empty",
    "  \n": "grammar is empty",
    "root ::= foo": "grammar does not parse",
    'root ::= root "a"': "grammar is left-recursive",
    'root ::= "a"\0': "grammar contains NUL",
    "root ::= " + '"a" ' * (MAX_GRAMMAR_BYTES // 4): "grammar too long",
}
MAX_ABS_LOGIT_BIAS = 1.0e4
I32 = (-(1 << 31), (1 << 31) - 1)
ADAPTIVE_FIELDS = (
    "cost_us",
    "hits",
    "trials",
    "streak",
    "idle",
    "live",
    "unsettled",
    "draft_us",
    "estimated",
    "draft_estimated",
    "probe_after",
    "sure",
    "model_drafts",
)
#: ``live`` (whether the curve follows the rounds' timings), ``unsettled`` (a live curve's last verification
#: of several rows), ``draft_us`` (a draft model's decode), ``estimated`` (the curve's entries still estimates),
#: ``draft_estimated``, ``probe_after`` (the pause before the next probe), ``sure`` (the share of rounds the target
#: was sure of) and ``model_drafts`` (whether a draft model drafts) may be left out: serde's defaults, false,
#: [0, 0], 0, [], false, 16, 128 and false.
ADAPTIVE_REQUIRED = ADAPTIVE_FIELDS[:5]
MAX_COST_MICROS = 60_000_000
#: The adaptive policy's bounds (src/engine/policy.rs): counts in fixed point (x256), probes after 16 idle rounds.
SCALE = 256
MAX_TRIALS = (4096 + 2) * 8 * SCALE
PROBE_AFTER = 16
#: llama.cpp rounds a context's length up to a multiple of this (llama-context.cpp): the length a history must fit.
CONTEXT_PADDING = 256
MAX_PROBE_AFTER = 256
VERSION_KEYS = META_KEYS[:4]
OPTIONAL_KEYS = frozenset({"ngram", "draft_model", "n_threads"})
#: The most threads (src/settings.rs, MAX_THREADS; 0 is the default thread count).
MAX_THREADS = 512
FINGERPRINT_KEYS = ("sha256", "size", "file")
MAX_DRAFT = 4096
#: The most rows per compute pass a restore allocates unless the caller names max_n_batch
#: (src/checkpoint/operations.rs, DEFAULT_MAX_N_BATCH).
MAX_N_BATCH = 512
#: The CPUs this process may run on, as the library counts them: a restore that names no thread count uses
#: the recorded one, at most these.
AVAILABLE_CPUS = len(os.sched_getaffinity(0))

#: How a refused context reads (src/native/context.rs): under the workers' address-space limit, an
#: allocation that does not fit. A case ending so is a failure ("over-allocation"): the restore
#: should have refused the configuration before allocating.
OVER_ALLOCATION = "llama.cpp refused the parameters"

#: Environment variable of the harness's own fault injection (see :func:`worker_main`).
INJECT_ENV = "CHECKPOINT_FUZZ_INJECT"

Expect = Literal["noop", "exact", "any", "refuse", "refuse-positions"]
Section = tuple[int, int, bytes]  # (kind, flags, payload)


# --- the format, independently of specstate ---------------------------------------------------


@dataclass
class Layout:
    """A checkpoint taken apart: header fields and sections in table order."""

    version: int
    sections: list[Section]
    header_size: int = HEADER
    reserved: bytes = bytes(8)

    def payload(self, name: str) -> bytes | None:
        kind = KINDS[name]
        return next((payload for k, _, payload in self.sections if k == kind), None)

    def names(self) -> list[str]:
        return [NAMES.get(kind, f"kind{kind}") for kind, _, _ in self.sections]


def parse(data: bytes) -> Layout:
    """Take a checkpoint apart (its table read as declared)."""
    header, entries = checkpoint_codec.parse(data)
    return Layout(
        header["version"],
        [(kind, flags, payload) for kind, _, flags, payload in entries],
        header["header_size"],
        header["reserved"],
    )


def assemble(layout: Layout, *, count: int | None = None, total_delta: int = 0) -> bytes:
    """The bytes of ``layout``, payloads tiled in table order, with a correct CRC-32 trailer."""
    return checkpoint_codec.assemble(
        layout.sections,
        version=layout.version,
        header_size=layout.header_size,
        reserved=layout.reserved,
        count=count,
        total_delta=total_delta,
    )


def reseal(data: bytes, changes: dict[str, bytes], *, bind: bool = True) -> bytes:
    """``reseal_sections``; with ``bind=False`` the version-2 bindings are left as they were (stale)."""
    resealed = reseal_sections(data, changes)
    if bind:
        return resealed
    state = changes.get("state", checkpoint_codec.sections(data)["state"])
    return reseal_sections(resealed, {"state": state})


def rebind(layout: Layout, names: Iterable[str] | None = None) -> Layout:
    """Recompute the version-2 bindings of ``names`` (all by default); v1 states are left as they are."""
    state = layout.payload("state")
    if state is None or len(state) != STATE_V2:
        return layout
    buffer = bytearray(state)
    for name in BINDINGS if names is None else names:
        if name in BINDINGS:
            payload = layout.payload(name)
            struct.pack_into("<I", buffer, BINDINGS[name], 0 if payload is None else zlib.crc32(payload))
    return replaced(layout, "state", bytes(buffer))


def replaced(layout: Layout, name: str, payload: bytes) -> Layout:
    kind = KINDS[name]
    return Layout(
        layout.version,
        [(k, f, payload if k == kind else p) for k, f, p in layout.sections],
        layout.header_size,
        layout.reserved,
    )


def decode_state(payload: bytes) -> dict[str, Any]:
    """The fields of a 97- or 117-byte state section."""
    values = struct.unpack_from("<8Q", payload, 0)
    state: dict[str, Any] = dict(zip(STATE_FIELDS, values))
    state["finished"] = payload[64]
    state["rng"] = list(struct.unpack_from("<4Q", payload, 65))
    if len(payload) >= STATE_V2:
        state["bindings"] = dict(zip(BINDINGS, struct.unpack_from("<5I", payload, STATE_V1)))
    return state


def encode_state(state: dict[str, Any], template: bytes) -> bytes:
    buffer = bytearray(template)
    struct.pack_into("<8Q", buffer, 0, *(state[name] for name in STATE_FIELDS))
    buffer[64] = state["finished"]
    struct.pack_into("<4Q", buffer, 65, *state["rng"])
    if "bindings" in state and len(buffer) >= STATE_V2:
        struct.pack_into("<5I", buffer, STATE_V1, *(state["bindings"][name] for name in BINDINGS))
    return bytes(buffer)


def strict_json(payload: bytes) -> Any:
    """JSON as serde_json reads it: UTF-8, no duplicate keys, no NaN or Infinity."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key")
        return dict(items)

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(payload.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except RecursionError as error:
        raise ValueError("nested too deeply") from error


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _f32(value: int | float) -> float:
    """``value`` as serde_json reads an ``f32``: through f64, then rounded, overflowing to infinity."""
    try:
        number = float(value)
    except OverflowError:
        return math.inf
    try:
        return cast(float, struct.unpack("<f", struct.pack("<f", number))[0])
    except OverflowError:
        return math.copysign(math.inf, number)


def _as_struct(value: Any, keys: Sequence[str], required: int | None = None) -> dict[str, Any] | None:
    """A serde struct from a JSON object, or (serde's rule) an array of its fields in order; serde reads trailing
    fields with a default from a shorter array too, down to the ``required`` first ones (all unless given)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and (len(keys) if required is None else required) <= len(value) <= len(keys):
        return dict(zip(keys, value))
    return None


def _as_meta(value: Any) -> dict[str, Any] | None:
    """The meta struct."""
    return _as_struct(value, META_FIELDS, required=len(META_KEYS) - 1)


def conversation_problem(value: Any, version: int) -> str | None:
    """Why a meta ``conversation`` entry must be refused, or None (as ``Conversation::validate``)."""
    if value is None:
        return None
    if version < 3:
        return "a conversation before version 3"
    conversation = _as_struct(value, ("messages", "template_sha256"))
    if conversation is None or set(conversation) != {"messages", "template_sha256"}:
        return "conversation is not an object of messages and template_sha256"
    messages, digest = conversation["messages"], conversation["template_sha256"]
    if not isinstance(messages, list) or not messages:
        return "no messages"
    for message in messages:
        fields = _as_struct(message, ("role", "content"))
        if fields is None or set(fields) != {"role", "content"}:
            return "a message is not an object of role and content"
        role, content = fields["role"], fields["content"]
        if not isinstance(role, str) or not isinstance(content, str):
            return "a message's role or content is not a string"
        if not 1 <= len(role.encode()) <= 64 or any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in role):
            return "a bad role"
        if "\x01specstate:reply\x01" in content:
            return "the reply marker in a message"
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        return "template_sha256 is not 64 lowercase hex digits"
    return None


def _adaptive_struct(value: Any) -> dict[str, Any] | None:
    """The adaptive struct, from an object or an array of its fields (the trailing optional ones may be left out)."""
    return _as_struct(value, ADAPTIVE_FIELDS, required=len(ADAPTIVE_REQUIRED))


def adaptive_problem(value: Any, version: int) -> str | None:
    """Why a meta ``adaptive`` entry is malformed, or None (its fit to ``n_draft`` and the mode is checked later)."""
    if value is None:
        return None
    if version < 4:
        return "an adaptive policy before version 4"
    adaptive = _adaptive_struct(value)
    if adaptive is None or not set(ADAPTIVE_REQUIRED) <= set(adaptive) <= set(ADAPTIVE_FIELDS):
        return "adaptive is not an object of cost_us, hits, trials, streak, idle and its optional fields"
    if not all(isinstance(adaptive.get(flag, False), bool) for flag in ("live", "draft_estimated", "model_drafts")):
        return "live, draft_estimated or model_drafts is not a boolean"
    estimated = adaptive.get("estimated", [])
    if not isinstance(estimated, list) or not all(isinstance(mark, bool) for mark in estimated):
        return "estimated is not a list of booleans"
    if not all(
        _is_int(adaptive.get(name, 0)) and 0 <= adaptive.get(name, 0) <= U32
        for name in ("draft_us", "probe_after", "sure")
    ):
        return "draft_us, probe_after or sure is not a u32"

    def u32s(value: Any, length: int | None = None) -> bool:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            return False
        return all(_is_int(v) and 0 <= v <= U32 for v in value)

    if not u32s(adaptive["cost_us"]):
        return "cost_us is not a list of u32"
    if not (u32s(adaptive["hits"], 2) and u32s(adaptive["trials"], 2)):
        return "hits or trials is not two u32"
    if not u32s(adaptive.get("unsettled", [0, 0]), 2):
        return "unsettled is not two u32"
    if not isinstance(adaptive["streak"], bool) or not (_is_int(adaptive["idle"]) and 0 <= adaptive["idle"] <= U32):
        return "streak is not a boolean or idle not a u32"
    return None


def _sampler_real_problem(name: str, value: Any) -> str | None:
    if not _is_number(value):
        return f"sampler {name} is not a number"
    low, high, low_open = SAMPLER_RANGES[name]
    number = _f32(value)
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        return f"sampler {name} out of range"
    return None


def _logit_bias_problem(value: list[list[Any]], n_vocab: int) -> str | None:
    """Why a readable ``logit_bias`` must be refused (values, order, vocabulary), or None."""
    previous = -1
    for token, bias in value:
        if not math.isfinite(_f32(bias)) or abs(_f32(bias)) > MAX_ABS_LOGIT_BIAS:
            return "a logit bias out of range"
        if token <= previous:
            return "logit_bias tokens not distinct, ascending and >= 0"
        previous = token
    if value and value[-1][0] >= n_vocab:
        return "a logit_bias token outside the vocabulary"
    return None


def sampler_problem(value: Any, version: int, n_vocab: int) -> str | None:
    """Why a meta ``sampler`` entry must be refused, or None (as serde and ``SamplingParams::validate``)."""
    if value is None:
        return None
    if version < 5:
        return "a sampler before version 5"
    sampler = _as_sampler(value)
    if sampler is None or set(sampler) - {GRAMMAR} != set(SAMPLER_FIELDS):
        return "sampler is not an object of exactly its fields"
    grammar = sampler.get(GRAMMAR)
    if grammar is not None and not isinstance(grammar, str):
        return "grammar is not a string"
    for name in SAMPLER_RANGES:
        if not _is_number(sampler[name]):
            return f"sampler {name} is not a number"
    last_n = sampler["repeat_last_n"]
    if not (_is_int(last_n) and I32[0] <= last_n <= I32[1]):
        return "repeat_last_n is not an i32"
    problem = _logit_bias_shape_problem(sampler["logit_bias"])
    if problem is not None:
        return problem
    for name in SAMPLER_RANGES:
        problem = _sampler_real_problem(name, sampler[name])
        if problem is not None:
            return problem
    if last_n < -1:
        return "repeat_last_n below -1"
    return _logit_bias_problem(sampler["logit_bias"], n_vocab) or (None if grammar is None else GRAMMARS[grammar])


def _as_sampler(value: Any) -> dict[str, Any] | None:
    """The sampler struct: an object, or an array of its fields in order (the grammar, last, may be left out)."""
    if isinstance(value, list) and len(value) == len(SAMPLER_FIELDS) + 1:
        return dict(zip((*SAMPLER_FIELDS, GRAMMAR), value))
    return _as_struct(value, SAMPLER_FIELDS)


def _logit_bias_shape_problem(value: Any) -> str | None:
    """Why serde cannot read ``logit_bias`` at all, or None."""
    if not isinstance(value, list):
        return "logit_bias is not a list"
    if len(value) > MAX_LOGIT_BIAS:
        return "logit_bias has too many entries"
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and _is_int(entry[0]) and _is_number(entry[1])):
            return "a logit_bias entry is not [token, bias]"
        if not I32[0] <= entry[0] <= I32[1]:
            return "a logit_bias token is not an i32"
    return None


def adaptive_fit_problem(adaptive: dict[str, Any], n_draft: int) -> str | None:
    """Why a well-formed ``adaptive`` entry does not fit ``n_draft`` (``AdaptiveState::validate``), or None."""
    costs = adaptive["cost_us"]
    if len(costs) != n_draft + 1 or not all(1 <= c <= MAX_COST_MICROS for c in costs):
        return "the cost curve does not fit n_draft"
    for hits, trials in zip(adaptive["hits"], adaptive["trials"]):
        if not 1 <= trials <= MAX_TRIALS or hits > trials:
            return "adaptive counts out of range"
    rows, micros = adaptive.get("unsettled", [0, 0])
    if [rows, micros] != [0, 0] and not (2 <= rows <= n_draft + 1 and 1 <= micros <= MAX_COST_MICROS):
        return "an unsettled verification outside the curve"
    probe_after = adaptive.get("probe_after", PROBE_AFTER)
    if not PROBE_AFTER <= probe_after <= MAX_PROBE_AFTER:
        return "a probe interval out of range"
    if adaptive["idle"] > probe_after:
        return "idle rounds beyond the probe interval"
    if adaptive.get("draft_us", 0) > MAX_COST_MICROS or len(adaptive.get("estimated", [])) not in (0, n_draft + 1):
        return "a draft cost or estimate marks out of range"
    if adaptive.get("sure", 0) > SCALE:
        return "a share of sure rounds above the scale"
    return None


def fingerprint_problem(value: Any, expected: dict[str, Any] | None, role: str) -> str | None:
    if expected is None:
        return None if value is None else f"a {role} model entry where none is given"
    if value is None:
        return f"no {role} model entry"
    struct_ = _as_struct(value, FINGERPRINT_KEYS)
    if struct_ is None:
        return f"{role}_model is not an object"
    if set(struct_) - set(FINGERPRINT_KEYS):
        return f"unknown key in {role}_model"
    if set(FINGERPRINT_KEYS) - set(struct_):
        return f"missing key in {role}_model"
    sha, size, name = struct_["sha256"], struct_["size"], struct_["file"]
    if not isinstance(sha, str) or not isinstance(name, str) or not _is_int(size) or not 0 <= size <= U64:
        return f"{role}_model field of the wrong type"
    if sha != expected["sha256"] or size != expected["size"]:
        return f"{role} model fingerprint differs"
    return None


#: The most alternatives a log-probability record lists (src/sampling.rs, MAX_TOP_LOGPROBS).
MAX_TOP_LOGPROBS = 20


def logprobs_problem(value: Any, version: int, reply: int, n_vocab: int) -> str | None:
    """Why a meta ``logprobs`` entry must be refused for a reply of ``reply`` tokens, or None (as serde and
    ``LogprobsMeta::log``)."""
    if value is None:
        return None
    entry = _as_struct(value, ("top_n", "from", "records"))
    if entry is None or set(entry) != {"top_n", "from", "records"}:
        return "logprobs is not an object of exactly its fields"
    top_n, start, records = entry["top_n"], entry["from"], entry["records"]
    if not (_is_int(top_n) and 0 <= top_n <= U64 and _is_int(start) and 0 <= start <= U64):
        return "logprobs top_n or from is not a usize"
    if not isinstance(records, list) or not all(_record_shape(record) for record in records):
        return "a logprobs record is not {logprob, top}"
    if version < 5:
        return "logprobs before version 5"
    if top_n > MAX_TOP_LOGPROBS:
        return "logprobs top_n above 20"
    if start + len(records) != reply:
        return "logprobs records do not end with the reply"
    for record in records:
        record = _as_struct(record, ("logprob", "top"))
        assert record is not None
        values = [record["logprob"], *(value for _, value in record["top"])]
        if len(record["top"]) > top_n or any(not _f32(v) <= 0 for v in values):
            return "a logprobs record out of range"
        if any(not 0 <= token < n_vocab for token, _ in record["top"]):
            return "a logprobs token outside the vocabulary"
    return None


def _record_shape(record: Any) -> bool:
    """Whether serde reads ``record`` as a TokenLogprobs: ``{logprob: f32, top: [[i32, f32], ...]}``."""
    record = _as_struct(record, ("logprob", "top"))
    if record is None or set(record) != {"logprob", "top"} or not _is_number(record["logprob"]):
        return False
    top = record["top"]
    return isinstance(top, list) and all(
        isinstance(pair, list)
        and len(pair) == 2
        and _is_int(pair[0])
        and I32[0] <= pair[0] <= I32[1]
        and _is_number(pair[1])
        for pair in top
    )


def meta_problem(value: Any, base: Base, history: int, version: int = 5, threads: int | None = 1) -> str | None:
    """Why ``value`` (the parsed meta) must be refused for ``base``'s models, or None.

    ``threads`` is the restore's ``n_threads`` (None: the recorded count).
    """
    meta = _as_meta(value)
    if meta is None:
        return "meta is not an object"
    if set(meta) - set(META_FIELDS):
        return f"unknown meta key {sorted(set(meta) - set(META_FIELDS))[0]!r}"
    problem = (
        conversation_problem(meta.get("conversation"), version)
        or adaptive_problem(meta.get("adaptive"), version)
        or sampler_problem(meta.get("sampler"), version, base.n_vocab)
        or logprobs_problem(meta.get("logprobs"), version, history - base.state["n_prompt"], base.n_vocab)
    )
    if problem is not None:
        return problem
    n_threads = meta.get("n_threads")
    if n_threads is not None and not (_is_int(n_threads) and 0 <= n_threads <= U32):
        return "n_threads is not a u32"
    if n_threads is not None and (version < 3 or not 0 <= n_threads <= MAX_THREADS):
        return "n_threads out of range or before version 3"
    missing = set(META_KEYS) - OPTIONAL_KEYS - set(meta)
    if missing:
        return f"missing meta key {sorted(missing)[0]!r}"
    for key in VERSION_KEYS:
        if not isinstance(meta[key], str):
            return f"{key} is not a string"
    mode = meta["mode"]
    if not isinstance(mode, str) or mode not in MODES:
        return "unknown mode"
    ngram = meta.get("ngram")
    if ngram is not None and not (
        isinstance(ngram, list) and len(ngram) == 2 and all(_is_int(n) and 0 <= n <= U64 for n in ngram)
    ):
        return "ngram is not two integers"
    if mode == "ngram":
        if ngram is None or not 1 <= ngram[1] <= ngram[0] <= 64:
            return "ngram lengths out of range"
    elif ngram is not None:
        return "ngram lengths for another mode"
    for key in ("n_draft", "n_ctx", "n_batch", "top_k"):
        if not (_is_int(meta[key]) and 0 <= meta[key] <= U32):
            return f"{key} is not a u32"
    if not (_is_int(meta["seed"]) and 0 <= meta["seed"] <= U64):
        return "seed is not a u64"
    for key in ("temperature", "top_p"):
        if not _is_number(meta[key]):
            return f"{key} is not a number"
    temperature, top_p = _f32(meta["temperature"]), _f32(meta["top_p"])
    if not math.isfinite(temperature) or temperature < 0:
        return "temperature out of range"
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        return "top_p out of range"
    problem = fingerprint_problem(meta["target_model"], base.meta["target_model"], "target")
    if problem is None:
        problem = fingerprint_problem(meta.get("draft_model"), base.meta["draft_model"], "draft")
    if problem is not None:
        return problem
    if (mode in ("draft", "eagle3")) != (meta.get("draft_model") is not None):
        return "draft model entry does not fit the mode"
    n_ctx, n_batch, n_draft = meta["n_ctx"], meta["n_batch"], meta["n_draft"]
    if n_ctx < 2 or n_batch < 1:
        return "n_ctx below 2 or n_batch 0"
    if n_ctx > base.n_ctx_train:
        return "n_ctx beyond the model's trained context"
    if history > -(-n_ctx // CONTEXT_PADDING) * CONTEXT_PADDING:
        return "the history exceeds the context"
    if mode != "none" and not 1 <= n_draft <= MAX_DRAFT:
        return "n_draft out of range"
    if mode != "none" and n_draft + 1 > n_batch:
        return "n_batch must exceed n_draft"
    problem = allocation_problem(base, mode, n_draft, n_batch, n_ctx)
    if problem is not None:
        return problem
    adaptive = _adaptive_struct(meta.get("adaptive"))
    if adaptive is not None and mode == "none":
        return "an adaptive policy in mode none"
    return None if adaptive is None else adaptive_fit_problem(adaptive, n_draft)


def allocation_problem(base: Base, mode: str, n_draft: int, n_batch: int, n_ctx: int) -> str | None:
    """Why a restore must not allocate these contexts by default (no max_n_batch), or None.

    Compute buffers for at most MAX_N_BATCH rows per pass; on a recurrent or hybrid target in a
    speculative mode, a compute pass (at most n_ctx rows) longer than the rollback snapshots plus
    one, and the snapshots (one recurrent state per drafted token, at least one) together at most
    the model's size.
    """
    if n_batch > MAX_N_BATCH:
        return "n_batch beyond a restore's rows per pass"
    if mode != "none" and base.recurrent_state_bytes and n_ctx <= max(n_draft, 1) + 1:
        # llama.cpp caps a compute pass at n_ctx rows, and it must exceed the snapshots plus one.
        return "a hybrid target's context no longer than its rollback snapshots need"
    if mode != "none" and max(n_draft, 1) * base.recurrent_state_bytes > base.model_size:
        return "rollback snapshots outweigh the model"
    return None


def state_problem(state: dict[str, Any], n_tokens: int) -> str | None:
    """Why a state section must be refused with ``n_tokens`` history tokens, or None."""
    history = state["history"]
    if history != n_tokens or history == 0:
        return "history length does not match the tokens"
    n_prompt, n_past, draft_past = state["n_prompt"], state["n_past"], state["draft_past"]
    if n_prompt == 0 or n_prompt > n_past or n_past >= history or draft_past > history:
        return "positions inconsistent"
    if n_prompt + state["delivered"] > history:
        return "more delivered than generated"
    if state["finished"] not in (0, 1):
        return "finished flag not 0 or 1"
    if not any(state["rng"]):
        return "RNG state all zero"
    return None


def predict(data: bytes, base: Base, threads: int | None = 1) -> str | None:
    """Why the restore of ``data`` with ``base``'s models (and ``n_threads=threads``) must be refused, or None.

    An independent model of the validation: structure, checksum, bounds,
    layout, meta, state invariants, tokens, sections per mode and, in
    version 2, the section bindings.
    """
    if len(data) < HEADER or data[:8] != MAGIC:
        return "header"
    version, header_size, count = struct.unpack_from("<HHI", data, 8)
    if version not in range(1, base.version + 1):
        return f"version {version}"
    if struct.unpack_from("<Q", data, 16)[0] != len(data):
        return "total length"
    if header_size != HEADER or data[24:32] != bytes(8) or not 1 <= count <= 16:
        return "header fields"
    table_end = HEADER + ENTRY * count
    if table_end + 4 > len(data):
        return "table overruns"
    if zlib.crc32(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        return "checksum"
    payloads: dict[str, bytes] = {}
    expected_offset = table_end
    for index in range(count):
        kind, flags, offset, length = struct.unpack_from("<IIQQ", data, HEADER + ENTRY * index)
        if kind not in NAMES:
            return f"unknown kind {kind}"
        if flags:
            return "flags"
        if length > MAXIMUM[kind]:
            return f"{NAMES[kind]} too large"
        if offset != expected_offset or offset + length > len(data) - 4:
            return "out of place"
        if NAMES[kind] in payloads:
            return f"{NAMES[kind]} twice"
        payloads[NAMES[kind]] = data[offset : offset + length]
        expected_offset = offset + length
    if expected_offset != len(data) - 4:
        return "sections do not fill the file"
    for name in ("meta", "state", "tokens", "target_state"):
        if name not in payloads:
            return f"no {name}"
    try:
        meta = strict_json(payloads["meta"])
    except ValueError as error:
        return f"meta JSON: {error}"
    if len(payloads["state"]) != {1: STATE_V1, 2: STATE_V2, 3: STATE_V2, 4: STATE_V2, 5: STATE_V2}.get(version):
        return f"a state of {len(payloads['state'])} bytes in version {version}"
    tokens = payloads["tokens"]
    if len(tokens) % 4:
        return "tokens not a multiple of 4 bytes"
    state = decode_state(payloads["state"])
    problem = meta_problem(meta, base, len(tokens) // 4, version, threads)
    if problem is not None:
        return problem
    problem = state_problem(state, len(tokens) // 4)
    if problem is not None:
        return problem
    mode = _as_meta(meta)["mode"]  # type: ignore[index]
    if ("draft_state" in payloads) != (mode in ("draft", "mtp", "eagle3")) or ("speculative_state" in payloads) != (
        mode in ("mtp", "eagle3")
    ):
        return "sections do not fit the mode"
    ids = struct.unpack(f"<{len(tokens) // 4}i", tokens)
    if any(not 0 <= token < base.n_vocab for token in ids):
        return "token outside the vocabulary"
    if version >= 2:
        for name, stored in state["bindings"].items():
            payload = payloads.get(name)
            if stored != (0 if payload is None else zlib.crc32(payload)):
                return f"{name} binding"
    return None


# --- bases -------------------------------------------------------------------------------------


@dataclass
class Base:
    """One base checkpoint and what its restore continues with."""

    id: str
    family: str  # "tiny" or "smollm2"
    mode: str
    sampled: bool
    boundary: int
    run: str
    file: str
    reference: list[int]
    n_vocab: int
    n_ctx_train: int
    version: int
    meta: dict[str, Any]
    state: dict[str, Any]
    data: bytes = field(default=b"", repr=False)
    #: The target's tensor bytes and the bytes of one recurrent state (a rollback snapshot; 0 without one).
    model_size: int = 0
    recurrent_state_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "data"}

    @classmethod
    def from_json(cls, value: dict[str, Any], directory: Path) -> Base:
        base = cls(**value)
        base.data = (directory / base.file).read_bytes()
        return base


def native_build_id() -> str:
    """A fingerprint of the native extension in use (bases are rebuilt when it changes)."""
    import specstate._native as native

    return hashlib.sha256(Path(native.__file__).read_bytes()).hexdigest()[:16]


def build_tiny_models(directory: Path) -> dict[str, Path]:
    from specstate_testkit import models

    llama, eagle3_draft = models.build_eagle3_pair(directory / "llama.gguf", directory / "eagle3.gguf", seed=0)
    qwen35 = models.build_qwen35_mtp(directory / "qwen35.gguf", seed=0)
    return {"qwen35": qwen35, "llama": llama, "eagle3_draft": eagle3_draft}


def _continuation(generator: Any, n: int = K) -> list[int]:
    before = len(generator.tokens)
    generator.generate(max_tokens=n)
    return list(generator.tokens[before:])


def build_bases(
    directory: Path, tiny: dict[str, Path] | None, smollm2: Path | None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Write the base checkpoints and ``manifest.json`` into ``directory``."""
    from specstate import Generator, Model
    from specstate_testkit.generator_support import tiny_generator

    directory.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, str, bool, Callable[[], Any], str]] = []
    loaded: dict[str, Any] = {}

    def model(path: Path) -> Any:
        if str(path) not in loaded:
            loaded[str(path)] = Model(path)
        return loaded[str(path)]

    if tiny is not None:
        for mode in MODES:
            for sampled in (False, True):
                runs.append(
                    ("tiny", mode, sampled, functools.partial(tiny_generator, mode, tiny, sampled=sampled), TINY_PROMPT)
                )
    if smollm2 is not None:
        for mode in SMOL_MODES:
            runs.append(
                (
                    "smollm2",
                    mode,
                    False,
                    functools.partial(Generator, model(smollm2), mode=cast(Any, mode), n_ctx=SMOL_CTX, n_threads=1),
                    SMOL_PROMPT,
                )
            )
    bases: list[dict[str, Any]] = []
    warnings: list[str] = []
    refused: list[dict[str, Any]] = []
    for family, mode, sampled, make, prompt in runs:
        run = f"{family}-{mode}-{'sampled' if sampled else 'greedy'}"
        generator = make()
        checkpoints = []
        done = 0
        for index, boundary in enumerate(BOUNDARIES):
            generator.generate(prompt if index == 0 else None, max_tokens=boundary - done)
            done = boundary
            checkpoints.append(generator.checkpoint())
        live = _continuation(generator)
        target_model = generator.model
        draft_model = generator.draft_model
        n_ctx_train = _trained_context(target_model)
        del generator
        references = []
        for boundary, data in enumerate(checkpoints):
            try:
                restored = Generator.restore(data, target_model, draft_model=draft_model, n_threads=1)
                references.append(_continuation(restored))
                del restored
            except Exception as error:  # the build refuses its own checkpoint: a finding, not a harness error
                refused.append({"run": run, "boundary": boundary, "error": f"{type(error).__name__}: {error}"})
                log(f"  base {run}-b{boundary}: the unmodified checkpoint is refused: {type(error).__name__}: {error}")
        if len(references) < len(checkpoints):
            continue
        for boundary, (data, reference) in enumerate(zip(checkpoints, references)):
            if boundary == len(checkpoints) - 1 and reference != live:
                warnings.append(
                    f"{run}: the restored continuation {reference} differs from the uninterrupted run's {live}"
                )
            layout = parse(data)
            state_payload = layout.payload("state")
            meta_payload = layout.payload("meta")
            assert state_payload is not None and meta_payload is not None
            base = Base(
                id=f"{run}-b{boundary}",
                family=family,
                mode=mode,
                sampled=sampled,
                boundary=boundary,
                run=run,
                file=f"{run}-b{boundary}.ckpt",
                reference=reference,
                n_vocab=target_model.n_vocab,
                n_ctx_train=n_ctx_train,
                model_size=target_model.size,
                recurrent_state_bytes=_recurrent_state_bytes(target_model),
                version=layout.version,
                meta=json.loads(meta_payload),
                state=decode_state(state_payload),
            )
            (directory / base.file).write_bytes(data)
            bases.append(base.to_json())
        log(
            f"  base {run}: {len(checkpoints)} checkpoints, format v{bases[-1]['version']}, "
            f"{len(checkpoints[-1])} bytes, reference {bases[-1]['reference']}"
        )
    manifest = {
        "build": native_build_id(),
        "models": {k: str(v) for k, v in (tiny or {}).items()},
        "smollm2": str(smollm2) if smollm2 else None,
        "bases": bases,
        "warnings": warnings,
        "refused": refused,
    }
    for warning in warnings:
        log(f"  WARNING: {warning}")
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _recurrent_state_bytes(model: Any) -> int:
    """Bytes of one recurrent state of ``model`` (f32 r and s rows of each recurrent layer, as
    llama-hparams.cpp sizes them): what each rollback snapshot of a restored context holds.

    Computed from the GGUF metadata of the tiny qwen35 model, independently of the library's own
    measurement; 0 for an attention-only model.
    """
    if not (model.is_hybrid or model.is_recurrent):
        return 0
    if model.architecture != "qwen35":
        raise ValueError(f"no recurrent state size for architecture {model.architecture!r}")
    meta = model.metadata

    def get(key: str) -> int:
        return int(meta[f"qwen35.{key}"])

    inner, state, groups = get("ssm.inner_size"), get("ssm.state_size"), get("ssm.group_count")
    conv = (get("ssm.conv_kernel") - 1) * (inner + 2 * groups * state)
    trunk = get("block_count") - get("nextn_predict_layers")
    recurrent = sum(1 for il in range(trunk) if (il + 1) % get("full_attention_interval") != 0)
    return 4 * (conv + state * inner) * recurrent


def _trained_context(model: Any) -> int:
    metadata = model.metadata
    value = metadata.get(f"{model.architecture}.context_length")
    return int(value) if value is not None else U32


# --- mutations ---------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzz case: the mutated bytes and what must happen."""

    index: int
    base: Base
    klass: str
    detail: str
    data: bytes
    label: Expect
    problem: str | None  # predict()'s reason to refuse
    load: bool
    threads: int | None = 1  # the restore's n_threads (None: the recorded count)

    @property
    def expect(self) -> Expect:
        return "refuse" if self.problem is not None else self.label

    def describe(self) -> dict[str, Any]:
        return {
            "case": self.index,
            "base": self.base.id,
            "class": self.klass,
            "detail": self.detail,
            "expect": self.expect,
            "why": self.problem,
            "load": self.load,
            "threads": self.threads,
            "size": len(self.data),
        }


@dataclass
class Context:
    rng: random.Random
    base: Base
    bases: list[Base]
    layout: Layout
    #: The restore's n_threads; a mutation sets None to have the recorded count used.
    threads: int | None = 1

    def other_boundary(self) -> Base:
        return next(b for b in self.bases if b.run == self.base.run and b.boundary != self.base.boundary)

    def pick(self, values: Sequence[Any]) -> Any:
        return values[self.rng.randrange(len(values))]


Mutation = tuple[str, bytes, Expect]  # (detail, data, label)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value) if _jsonable(value) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _meta_label(original: dict[str, Any], meta: Any) -> Expect:
    """How an accepted meta change must continue: same meaning, informational change, or deep."""
    new = _as_meta(meta)
    if new is None:
        return "any"
    keys = set(original)
    full = {key: new.get(key) for key in LABEL_KEYS}
    original = {key: original.get(key) for key in LABEL_KEYS}
    for role in ("target_model", "draft_model"):
        if isinstance(full[role], list):
            full[role] = _as_struct(full[role], FINGERPRINT_KEYS)
    if isinstance(full["sampler"], list):
        full["sampler"] = _as_sampler(full["sampler"])
    if isinstance(full["sampler"], dict) and full["sampler"].get(GRAMMAR, 0) is None:
        full["sampler"] = {k: v for k, v in full["sampler"].items() if k != GRAMMAR}
    if full == original and all(type(full[k]) is type(original[k]) for k in LABEL_KEYS if k != "temperature"):
        # Same values; a key left out or an array for an object is lenient, refusing it is fine too.
        complete = (
            isinstance(meta, dict)
            and set(meta) == keys
            and all(isinstance(v, dict) for v in (meta["target_model"], meta["draft_model"]) if v is not None)
        )
        return "noop" if complete else "exact"
    informational = set(VERSION_KEYS) | {"n_threads"}  # the harness restores with n_threads=1
    for key in LABEL_KEYS:
        if key in informational or full[key] == original[key]:
            continue
        mine, theirs = full[key], original[key]
        if (
            key.endswith("_model")
            and isinstance(mine, dict)
            and isinstance(theirs, dict)
            and {k: v for k, v in mine.items() if k != "file"} == {k: v for k, v in theirs.items() if k != "file"}
        ):
            continue
        return "any"
    return "exact"


def _meta_bytes(meta: Any, rng: random.Random) -> bytes:
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(meta, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(meta, indent=1).encode()
    if isinstance(meta, dict):
        items = list(meta.items())
        rng.shuffle(items)
        return json.dumps(dict(items)).encode()
    return json.dumps(meta).encode()


def _with_meta(ctx: Context, payload: bytes, *, bind: bool = True) -> bytes:
    return reseal(ctx.base.data, {"meta": payload}, bind=bind)


def _bound_values(ctx: Context, key: str) -> list[Any]:
    meta, state = ctx.base.meta, ctx.base.state
    history, train = state["history"], ctx.base.n_ctx_train
    n_draft, n_batch = meta["n_draft"], meta["n_batch"]
    return {
        "n_ctx": [
            0,
            1,
            2,
            history - 1,
            history,
            history + 1,
            300,
            train,
            train + 1,
            1 << 20,
            2**31 - 1,
            2**32 - 1,
            2**32,
            -1,
            1e6,
            float(meta["n_ctx"]),
            2**64,
        ],
        "n_batch": [0, 1, 2, n_draft, n_draft + 1, 4096, 2**31 - 1, 2**32 - 1, 2**32, -1],
        "n_draft": [0, 1, 2, n_batch - 1, n_batch, MAX_DRAFT, MAX_DRAFT + 1, 2**32 - 1, -1],
        "temperature": [-1, -1e-30, "nan", 1e39, 3.4e38, 1e308, 0, 0.0, 1e-45, 0.5, 2.0, 1e400],
        "top_p": [0, 0.0, 1e-46, 1e-30, 0.5, 1, 1.0000001, 2, -0.1, "1"],
        "top_k": [0, 1, 7, 2**32 - 1, 2**32, 2**40, -1],
        "seed": [-1, 0, 1, 2**63, 2**64 - 1, 2**64, 2**70],
        "ngram": [
            [0, 0],
            [65, 1],
            [1, 2],
            [64, 1],
            [64, 64],
            [1, 1],
            [4, 3],
            [3, 3],
            [2**64, 1],
            [3],
            [1, 2, 3],
            None,
            [-1, 1],
        ],
        "mode": ["unknown", "", "NONE", "none", "ngram", "draft", "mtp", "eagle3", "none\u0000"],
    }[key]


def mutate_meta_bound(ctx: Context) -> Mutation:
    key = ctx.pick(
        ["n_ctx", "n_ctx", "n_batch", "n_batch", "n_draft", "temperature", "top_p", "top_k", "seed", "ngram", "mode"]
    )
    value = ctx.pick(_bound_values(ctx, key))
    meta = dict(ctx.base.meta)
    if key == "mode" and value == "ngram" and meta["ngram"] is None:
        meta["ngram"] = [4, 3]
    if key == "ngram" and value is not None and ctx.rng.random() < 0.5:
        meta["mode"] = "ngram"
    meta[key] = value
    if value == 1e400 or (key == "temperature" and ctx.rng.random() < 0.2 and value == "nan"):
        # Non-JSON number tokens.
        token = "1e400" if value == 1e400 else ctx.pick(["NaN", "Infinity", "-Infinity"])
        meta[key] = 12345.5
        payload = json.dumps(meta).replace("12345.5", token).encode()
        return f"meta {key}={token}", _with_meta(ctx, payload), "any"
    if ctx.rng.random() < 0.5:
        data = rewrite_meta(ctx.base.data, **{k: v for k, v in meta.items() if v != ctx.base.meta[k] or k == key})
    else:
        data = _with_meta(ctx, _meta_bytes(meta, ctx.rng))
    return f"meta {key}={_short(value)}", data, _meta_label(ctx.base.meta, meta)


def _deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def mutate_meta_type(ctx: Context) -> Mutation:
    key = ctx.pick(META_KEYS)
    original = ctx.base.meta[key]
    choice = ctx.rng.randrange(12)
    mib = 1 << 20
    raw: str | None = None
    value: Any
    if choice == 0:
        value = str(original) if original is not None else "null"
        what = "string"
    elif choice == 1:
        value = [original] if not isinstance(original, dict) else list(original.values())
        what = "list"
    elif choice == 2:
        value = {"value": original}
        what = "dict"
    elif choice == 3:
        value = None
        what = "null"
    elif choice == 4:
        value = ctx.pick([True, False])
        what = "bool"
    elif choice == 5:
        depth = ctx.pick([64, 127, 128, 129, 1000, 100_000])
        raw, value = _deep_array(depth), None
        what = f"array nested {depth} deep"
    elif choice == 6:
        value = list(range(ctx.pick([1000, 100_000])))
        what = f"array of {len(value)}"
    elif choice == 7:
        value = "x" * ctx.pick([mib, mib - 2048, mib + 1, 700_000])
        what = f"string of {len(value)}"
    elif choice == 8:
        value = 1.5
        what = "float"
    elif choice == 9:
        value = ctx.pick([-(2**63) - 1, 2**64, 2**100, -1])
        what = f"integer {value}"
    elif choice == 10:
        value = []
        what = "empty list"
    else:
        # For the fingerprints: a wrong type of one field inside them.
        if isinstance(original, dict):
            inner = ctx.pick(FINGERPRINT_KEYS)
            value = dict(original)
            value[inner] = ctx.pick([None, 1, "1", [], {}, "x" * 1000, -1, 2**64])
            what = f"{inner}={_short(value[inner])}"
        else:
            value = {} if original is not None else "text"
            what = "object"
    meta = dict(ctx.base.meta)
    meta[key] = value
    if raw is not None:
        meta[key] = "@@RAW@@"
        payload = json.dumps(meta, separators=(",", ":")).replace('"@@RAW@@"', raw).encode()
        return f"meta {key}: {what}", _with_meta(ctx, payload), "any"
    return f"meta {key}: {what}", _with_meta(ctx, _meta_bytes(meta, ctx.rng)), _meta_label(ctx.base.meta, meta)


def mutate_meta_keys(ctx: Context) -> Mutation:
    meta: dict[str, Any] = dict(ctx.base.meta)
    choice = ctx.rng.randrange(8)
    if choice == 0:
        key = ctx.pick(META_KEYS)
        del meta[key]
        detail = f"meta without {key}"
    elif choice == 1:
        role = ctx.pick(["target_model", "draft_model"])
        if not isinstance(meta[role], dict):
            role = "target_model"
        inner = ctx.pick(FINGERPRINT_KEYS)
        meta[role] = {k: v for k, v in meta[role].items() if k != inner}
        detail = f"meta {role} without {inner}"
    elif choice == 1 + 1:
        extra = ctx.pick(["extra", "Mode", "n_ubatch", "", "specstate_version ", "max_n_ctx"])
        meta[extra] = ctx.pick([1, None, "x", [], {}])
        detail = f"meta with extra key {extra!r}"
    elif choice == 3:
        meta["target_model"] = dict(meta["target_model"], extra=ctx.pick([1, None, "x"]))
        detail = "meta target_model with an extra key"
    elif choice == 4:
        # Duplicate key: serde refuses a duplicate field.
        key = ctx.pick(["mode", "n_ctx", "seed", "target_model"])
        text = json.dumps(meta, separators=(",", ":"))
        payload = (text[:-1] + "," + json.dumps(key) + ":" + json.dumps(meta[key]) + "}").encode()
        return f"meta with {key!r} twice", _with_meta(ctx, payload), "any"
    elif choice == 5:
        # The whole meta as an array of its fields in order (serde reads structs from arrays).
        values = [meta[key] for key in META_KEYS]
        if ctx.rng.random() < 0.5:
            values = values[:-1] if ctx.rng.random() < 0.5 else [*values, None]
        return (
            f"meta as an array of {len(values)}",
            _with_meta(ctx, json.dumps(values).encode()),
            _meta_label(ctx.base.meta, values),
        )
    elif choice == 6:
        payload = ctx.pick(
            [
                b"",
                b"{}",
                b"[]",
                b"null",
                b"{",
                b"\xff\xfe",
                json.dumps(meta).encode()[:-1],
                json.dumps(meta).encode() + b" x",
                json.dumps(meta).encode() + b"\n\t ",
                b"\xef\xbb\xbf" + json.dumps(meta).encode(),
            ]
        )
        label: Expect = "noop" if payload.strip() == json.dumps(meta).encode() else "any"
        return f"meta payload {_short(payload.decode('latin-1'), 30)}", _with_meta(ctx, payload), label
    else:
        # Same meaning, other bytes.
        return "meta re-serialised", _with_meta(ctx, _meta_bytes(meta, ctx.rng)), "noop"
    return detail, _with_meta(ctx, _meta_bytes(meta, ctx.rng)), _meta_label(ctx.base.meta, meta)


def _sampler_values(ctx: Context, key: str) -> list[Any]:
    n_vocab = ctx.base.n_vocab
    values: dict[str, list[Any]] = {
        "min_p": [-0.1, 0, 0.0, 0.05, 1, 1.0000001, 2, 1e39, "0"],
        "typical_p": [0, 0.0, 1e-46, 0.5, 1, 1.5, -1, True],
        "repeat_penalty": [0, -1, 1e-30, 1.0, 1.3, 100, 100.001, 1e39],
        "repeat_last_n": [-2, -1, 0, 1, 64, 2**31 - 1, 2**31, 1.0, None],
        "presence_penalty": [-100, -100.5, 0, 0.5, 100, 101, 1e39],
        "frequency_penalty": [-101, -0.5, 0.0, 99.9, 1e40, "x"],
        "logit_bias": [
            [],
            [[0, 1.0]],
            [[n_vocab - 1, -5.0]],
            [[n_vocab, 1.0]],
            [[-1, 1.0]],
            [[3, 1.0], [3, 2.0]],
            [[4, 1.0], [3, 2.0]],
            [[1, 10000]],
            [[1, 10001]],
            [[1, 1e39]],
            [[1]],
            [[1, 2, 3]],
            [{"token": 1, "bias": 1.0}],
            [[2**31, 1.0]],
            [[t, 0.5] for t in range(min(n_vocab, 300))],
            [[t, 0.5] for t in range(MAX_LOGIT_BIAS + 1)],
            {"1": 1.0},
        ],
        GRAMMAR: [None, 3, ["root ::= foo"], *GRAMMARS],
    }
    return values[key]


def mutate_meta_sampler(ctx: Context) -> Mutation:
    """The sampler chain's entry (format 5): a bound value, a missing or extra field, or no entry at all."""
    meta: dict[str, Any] = dict(ctx.base.meta)
    sampler = dict(meta.get("sampler") or {})
    choice = ctx.rng.randrange(6)
    if choice == 0 or not sampler:
        meta.pop("sampler", None)
        detail = "meta without sampler"
    elif choice == 1:
        key = ctx.pick(SAMPLER_FIELDS)
        del sampler[key]
        meta["sampler"] = sampler
        detail = f"meta sampler without {key}"
    elif choice == 2:
        meta["sampler"] = dict(sampler, **{ctx.pick(["extra", "top_k", "min_p "]): 1})
        detail = "meta sampler with an extra key"
    elif choice == 3:
        meta["sampler"] = [sampler[key] for key in SAMPLER_FIELDS]
        detail = "meta sampler as an array"
    else:
        key = ctx.pick((*SAMPLER_FIELDS, GRAMMAR))
        value = ctx.pick(_sampler_values(ctx, key))
        meta["sampler"] = dict(sampler, **{key: value})
        detail = f"meta sampler {key}={_short(value)}"
    return detail, _with_meta(ctx, _meta_bytes(meta, ctx.rng)), _meta_label(ctx.base.meta, meta)


def mutate_meta_logprobs(ctx: Context) -> Mutation:
    """A log-probability entry: records that fit the reply, or that do not (count, bounds, shape)."""
    meta: dict[str, Any] = dict(ctx.base.meta)
    reply = ctx.base.state["history"] - ctx.base.state["n_prompt"]
    record = {"logprob": -0.5, "top": [[0, -0.25], [1, -1.0]]}
    start = ctx.rng.randint(0, reply)
    entry: dict[str, Any] = {"top_n": 2, "from": start, "records": [record] * (reply - start)}
    change = ctx.rng.randrange(8)
    if change == 1:
        entry["top_n"] = ctx.pick([1, 21, -1, 2**64])
    elif change == 2:
        entry["from"] = ctx.pick([start + 1, max(start - 1, 0) if start else reply + 1, -1])
    elif change == 3:
        entry["records"] = [{"logprob": ctx.pick([0.5, 1e39, "x", None]), "top": []}] * (reply - start)
    elif change == 4:
        entry["records"] = [{"logprob": -1.0, "top": [[ctx.base.n_vocab, -1.0]]}] * (reply - start)
    elif change == 5:
        entry = ctx.pick([[], 3, {"top_n": 0, "from": start}, {**entry, "extra": 1}, [2, start, entry["records"]]])
    elif change == 6:
        entry["records"] = [[-0.5, [[0, -0.5]]]] * (reply - start)  # records as arrays
    meta["logprobs"] = entry
    detail = f"meta logprobs {_short(entry)}"
    return detail, _with_meta(ctx, _meta_bytes(meta, ctx.rng)), _meta_label(ctx.base.meta, meta)


def mutate_meta_stale(ctx: Context) -> Mutation:
    """A meta change whose binding is left as it was (version 2: must be refused)."""
    meta = dict(ctx.base.meta)
    key = ctx.pick(["n_ctx", "top_k", "seed", "specstate_version"])
    meta[key] = {"n_ctx": 300, "top_k": 7, "seed": 99, "specstate_version": "9.9.9"}[key]
    data = _with_meta(ctx, _meta_bytes(meta, ctx.rng), bind=False)
    return f"meta {key}={meta[key]} with the old binding", data, _meta_label(ctx.base.meta, meta)


def _state_values(ctx: Context, name: str) -> list[int]:
    state = ctx.base.state
    value, history, n_prompt = state[name], state["history"], state["n_prompt"]
    values = [
        0,
        1,
        2,
        value - 1,
        value + 1,
        history - 1,
        history,
        history + 1,
        n_prompt,
        state["n_past"],
        2**31,
        2**32,
        2**63,
        U64,
        U64 - 1,
    ]
    if name == "delivered":
        values += [
            2**64 - n_prompt,
            2**64 - n_prompt + 1,
            2**64 - n_prompt + history,
            history - n_prompt,
            history - n_prompt + 1,
        ]
    if name == "n_prompt":
        values += [2**64 - state["delivered"], state["n_past"] + 1]
    return [v for v in values if 0 <= v <= U64]


def mutate_state(ctx: Context) -> Mutation:
    state = dict(ctx.base.state)
    state["rng"] = list(state["rng"])
    name = ctx.pick(
        ["n_prompt", "n_past", "n_past", "draft_past", "history", "delivered", "delivered", "finished", "rng", "rng"]
    )
    if name == "finished":
        state["finished"] = ctx.pick([ctx.rng.randrange(2, 256), 255, 2, 1 - state["finished"]])
        detail = f"state finished={state['finished']}"
    elif name == "rng":
        choice = ctx.rng.randrange(3)
        if choice == 0:
            state["rng"] = [0, 0, 0, 0]
        elif choice == 1:
            state["rng"][ctx.rng.randrange(4)] ^= 1 << ctx.rng.randrange(64)
        else:
            state["rng"] = [U64, 0, 0, 0]
        detail = f"state rng={state['rng']}"
    else:
        state[name] = ctx.pick(_state_values(ctx, name))
        detail = f"state {name}={state[name]} (was {ctx.base.state[name]})"
    label: Expect
    if state == ctx.base.state:
        label = "noop"
    elif name == "n_past" or (name == "draft_past" and ctx.base.mode == "draft"):
        label = "refuse-positions"
    else:
        label = "any"
    payload = encode_state(state, _state_payload(ctx))
    data = reseal_sections(ctx.base.data, {"state": payload})
    return detail, data, label


def _state_payload(ctx: Context) -> bytes:
    payload = ctx.layout.payload("state")
    assert payload is not None
    return payload


def mutate_counters(ctx: Context) -> Mutation:
    state = dict(ctx.base.state)
    names = ctx.rng.sample(sorted(COUNTERS), ctx.rng.randrange(1, 4))
    for name in names:
        state[name] = ctx.pick([0, 1, state[name] + 1, 2**32, 2**63, U64, ctx.rng.randrange(1 << 64)])
    detail = "state " + ", ".join(f"{name}={state[name]}" for name in names)
    data = reseal_sections(ctx.base.data, {"state": encode_state(state, _state_payload(ctx))})
    return detail, data, "noop" if state == ctx.base.state else "exact"


def mutate_binding(ctx: Context) -> Mutation:
    if ctx.base.version < 2:
        return mutate_counters(ctx)
    state = dict(ctx.base.state)
    bindings = dict(state["bindings"])
    name = ctx.pick(list(BINDINGS))
    choice = ctx.rng.randrange(5)
    if choice == 0:
        return ("bindings recomputed", assemble(rebind(ctx.layout)), "noop")
    if choice == 1:
        bindings[name] ^= 1 << ctx.rng.randrange(32)
    elif choice == 2:
        bindings[name] = 0 if bindings[name] else ctx.rng.randrange(1, 1 << 32)
    elif choice == 3:
        other = ctx.pick([n for n in BINDINGS if n != name])
        bindings[name] = bindings[other]
    else:
        bindings[name] = U32
    state["bindings"] = bindings
    payload = encode_state(state, _state_payload(ctx))
    data = assemble(replaced(ctx.layout, "state", payload))
    return (
        f"binding {name}={bindings[name]:#010x} (was {ctx.base.state['bindings'][name]:#010x})",
        data,
        "noop" if bindings == ctx.base.state["bindings"] else "any",
    )


SPLICEABLE = ("target_state", "draft_state", "speculative_state", "tokens")


def _splice(ctx: Context, donor: Base, same_run: bool) -> Mutation:
    donor_layout = parse(donor.data)
    names = [n for n in SPLICEABLE if donor_layout.payload(n) is not None]
    name = ctx.pick(names)
    payload = donor_layout.payload(name)
    assert payload is not None
    deep = ctx.rng.random() < 0.5
    kind = "deep" if deep else "shallow"
    detail = f"{kind} splice of {name} from {donor.id}"
    if ctx.layout.payload(name) is None:
        # A section the recipient's mode does not have.
        sections = sorted([*ctx.layout.sections, (KINDS[name], 0, payload)], key=lambda s: s[0])
        layout = Layout(ctx.layout.version, sections)
        return detail + " (added)", assemble(rebind(layout, [name]) if deep else layout), "any"
    if payload == ctx.layout.payload(name):
        label: Expect = "noop"
    elif (same_run and name == "target_state" and donor.state["n_past"] != ctx.base.state["n_past"]) or (
        same_run
        and name == "draft_state"
        and (
            donor.state["draft_past"] != ctx.base.state["draft_past"]
            if ctx.base.mode == "draft"
            else donor.state["n_past"] != ctx.base.state["n_past"]
        )
    ):
        label = "refuse-positions"
    else:
        label = "any"
    return detail, reseal(ctx.base.data, {name: payload}, bind=deep), label


def mutate_splice_boundary(ctx: Context) -> Mutation:
    return _splice(ctx, ctx.other_boundary(), same_run=True)


def mutate_splice_run(ctx: Context) -> Mutation:
    others = [b for b in ctx.bases if b.run != ctx.base.run]
    if ctx.rng.random() < 0.7:
        same_family = [b for b in others if b.family == ctx.base.family]
        others = same_family or others
    return _splice(ctx, ctx.pick(others), same_run=False)


def mutate_state_bytes(ctx: Context) -> Mutation:
    names = [n for n in ("target_state", "draft_state", "speculative_state") if ctx.layout.payload(n)]
    name = ctx.pick(names)
    payload = bytearray(ctx.layout.payload(name) or b"")
    deep = ctx.rng.random() < 0.8
    choice = ctx.rng.randrange(10)
    if choice < 8 and payload:
        offset = ctx.rng.randrange(min(256, len(payload)))
        old = payload[offset]
        new = ctx.pick(
            [old ^ (1 << ctx.rng.randrange(8)), 0, 0xFF, (old + 1) % 256, (old - 1) % 256, ctx.rng.randrange(256)]
        )
        if new == old:
            new = old ^ 0x80
        payload[offset] = new
        detail = f"{name}[{offset}] {old:#04x}->{new:#04x}"
    elif choice == 8:
        cut = ctx.pick([1, 4, len(payload) // 2, len(payload)])
        del payload[len(payload) - cut :]
        detail = f"{name} cut by {cut} bytes"
    else:
        extra = ctx.pick([1, 4, 64])
        payload += bytes(ctx.rng.randrange(256) for _ in range(extra))
        detail = f"{name} extended by {extra} bytes"
    detail = f"{'deep' if deep else 'shallow'} {detail}"
    return detail, reseal(ctx.base.data, {name: bytes(payload)}, bind=deep), "any"


def mutate_tokens(ctx: Context) -> Mutation:
    tokens = list(struct.unpack(f"<{len(_tokens(ctx)) // 4}i", _tokens(ctx)))
    state = dict(ctx.base.state)
    choice = ctx.rng.randrange(6)
    update = True
    if choice == 0:
        position = ctx.rng.randrange(len(tokens))
        tokens[position] = ctx.pick([ctx.base.n_vocab, ctx.base.n_vocab + 1, 2**31 - 1, -1, -(2**31)])
        detail = f"tokens[{position}]={tokens[position]} (out of vocabulary)"
    elif choice == 1:
        position = ctx.pick([len(tokens) - 1, ctx.rng.randrange(len(tokens))])
        tokens[position] = (tokens[position] + ctx.rng.randrange(1, ctx.base.n_vocab)) % ctx.base.n_vocab
        detail = f"tokens[{position}]={tokens[position]}"
    elif choice in (2, 3):
        cut = ctx.pick([1, 2, len(tokens) - state["n_past"], len(tokens)])
        tokens = tokens[: len(tokens) - cut]
        update = ctx.rng.random() < 0.6
        detail = f"tokens cut by {cut}" + ("" if update else ", history length kept")
    elif choice == 4:
        extra = ctx.pick([1, 2, 8, SMOL_CTX])
        tokens += [ctx.rng.randrange(ctx.base.n_vocab) for _ in range(extra)]
        update = ctx.rng.random() < 0.6
        detail = f"tokens extended by {extra}" + ("" if update else ", history length kept")
    else:
        payload = _tokens(ctx) + bytes(ctx.rng.randrange(1, 4))
        return f"tokens payload of {len(payload)} bytes", reseal_sections(ctx.base.data, {"tokens": payload}), "any"
    payload = struct.pack(f"<{len(tokens)}i", *tokens)
    changes = {"tokens": payload}
    if update:
        state["history"] = len(tokens)
        changes["state"] = encode_state(state, _state_payload(ctx))
    deep = ctx.rng.random() < 0.85
    return (f"{'deep' if deep else 'shallow'} {detail}", reseal(ctx.base.data, changes, bind=deep), "any")


def _tokens(ctx: Context) -> bytes:
    payload = ctx.layout.payload("tokens")
    assert payload is not None
    return payload


def mutate_layout(ctx: Context) -> Mutation:
    layout = ctx.layout
    sections = list(layout.sections)
    choice = ctx.rng.randrange(12)
    if choice == 0:
        index = ctx.rng.randrange(len(sections))
        detail = f"without {layout.names()[index]}"
        del sections[index]
    elif choice == 1:
        index = ctx.rng.randrange(len(sections))
        detail = f"{layout.names()[index]} twice"
        sections.insert(index + 1, sections[index])
    elif choice == 2:
        i, j = ctx.rng.sample(range(len(sections)), 2)
        sections[i], sections[j] = sections[j], sections[i]
        detail = f"{layout.names()[i]} and {layout.names()[j]} swapped in the table"
        return detail, assemble(Layout(layout.version, sections)), "exact"
    elif choice == 3:
        kind = ctx.pick([0, 7, 8, 255, U32])
        sections.insert(ctx.rng.randrange(len(sections) + 1), (kind, 0, bytes(ctx.rng.randrange(0, 9))))
        detail = f"a section of unknown kind {kind}"
    elif choice == 4:
        index = ctx.rng.randrange(len(sections))
        kind, _, payload = sections[index]
        sections[index] = (kind, ctx.pick([1, 0x80000000, U32]), payload)
        detail = f"flags of {layout.names()[index]} set"
    elif choice == 5:
        reserved = bytearray(8)
        reserved[ctx.rng.randrange(8)] = ctx.rng.randrange(1, 256)
        return "reserved header bytes set", assemble(Layout(layout.version, sections, HEADER, bytes(reserved))), "any"
    elif choice == 6:
        size = ctx.pick([0, 31, 33, 64, 0xFFFF])
        return f"header size {size}", assemble(Layout(layout.version, sections, size)), "any"
    elif choice == 7:
        version = ctx.pick([0, 1, 2, 3, 4, 5, 6, 0xFFFF])
        if version == 1 and layout.version >= 2 and ctx.rng.random() < 0.5:
            # A true version-1 file of the same content: a reader of both versions may accept it.
            state = _state_payload(ctx)[:STATE_V1]
            return "downgraded to version 1", assemble(replaced(Layout(1, sections), "state", state)), "exact"
        return f"version {version}", assemble(Layout(version, sections)), "noop" if version == layout.version else "any"
    elif choice == 8:
        count = ctx.pick([0, len(sections) - 1, len(sections) + 1, 17, U32])
        return f"section count {count}", assemble(layout, count=count), "any"
    elif choice == 9:
        delta = ctx.pick([-1, 1, -4, 1 << 40])
        return f"total length {delta:+}", assemble(layout, total_delta=delta), "any"
    elif choice == 10:
        state = _state_payload(ctx)
        size = ctx.pick([0, STATE_V1 - 1, STATE_V1, STATE_V1 + 1, STATE_V2 - 1, STATE_V2, STATE_V2 + 1, 1024, 1025])
        payload = state[:size] + bytes(max(0, size - len(state)))
        label: Expect = "noop" if payload == state else "any"
        return f"state section of {size} bytes", assemble(replaced(layout, "state", payload)), label
    else:
        # Everything but the trailer: a too-large declared section.
        index = ctx.rng.randrange(len(sections))
        kind = sections[index][0]
        detail = f"{layout.names()[index]} declared {MAXIMUM[kind] + 1} bytes"
        data = bytearray(assemble(layout))
        struct.pack_into("<Q", data, HEADER + ENTRY * index + 16, MAXIMUM[kind] + 1)
        struct.pack_into("<I", data, len(data) - 4, zlib.crc32(bytes(data[:-4])))
        return detail, bytes(data), "any"
    return detail, assemble(Layout(layout.version, sections)), "any"


def mutate_memory(ctx: Context) -> Mutation:
    """The fields that size a restore's contexts (n_draft, n_batch, n_ctx; n_threads with the
    recorded count used), set together so that they pass the other checks and reach the
    allocation limits: rows per pass and, on the hybrid target, rollback snapshots."""
    meta, history, train = ctx.base.meta, ctx.base.state["history"], ctx.base.n_ctx_train
    n_draft = meta["n_draft"]
    if meta["mode"] != "none":
        n_draft = ctx.pick([n_draft, 8, 40, 89, 90, 91, 200, 511, 1000, MAX_DRAFT - 1])
    n_batch = ctx.pick([n_draft + 1, 64, MAX_N_BATCH, MAX_N_BATCH + 1, 1001, 2048, MAX_DRAFT, train])
    n_ctx = ctx.pick([max(history, n_batch), max(history, n_batch), max(history, n_batch), 1024, train, train + 1])
    changes: dict[str, Any] = {"n_draft": n_draft, "n_batch": n_batch, "n_ctx": n_ctx}
    if ctx.rng.random() < 0.5:
        # A recorded count within the CPUs or past them. One past them is capped to the CPUs when the restore
        # names none (tests/engine/test_checkpoint.py); here it names 1, since more would spin threads against the
        # other worker on the same cores, seconds per token.
        changes["n_threads"] = ctx.pick([1, AVAILABLE_CPUS + 1, 64, MAX_THREADS])
        ctx.threads = None if changes["n_threads"] == 1 else 1
    detail = "memory " + " ".join(f"{key}={value}" for key, value in changes.items())
    return detail, rewrite_meta(ctx.base.data, **changes), "any"


def mutate_noop(ctx: Context) -> Mutation:
    choice = ctx.rng.randrange(3)
    if choice == 0:
        return "unchanged", ctx.base.data, "noop"
    if choice == 1:
        return "resealed unchanged", reseal_sections(ctx.base.data, {}), "noop"
    return "reassembled", assemble(rebind(ctx.layout)), "noop"


#: Mutation classes and their weights.
CLASSES: dict[str, tuple[int, Callable[[Context], Mutation]]] = {
    "meta-bound": (10, mutate_meta_bound),
    "meta-type": (7, mutate_meta_type),
    "meta-keys": (5, mutate_meta_keys),
    "meta-sampler": (4, mutate_meta_sampler),
    "meta-logprobs": (2, mutate_meta_logprobs),
    "meta-stale-binding": (2, mutate_meta_stale),
    "state-field": (10, mutate_state),
    "state-counters": (3, mutate_counters),
    "binding": (4, mutate_binding),
    "splice-boundary": (8, mutate_splice_boundary),
    "splice-run": (7, mutate_splice_run),
    "state-bytes": (8, mutate_state_bytes),
    "tokens": (6, mutate_tokens),
    "layout": (6, mutate_layout),
    "memory": (5, mutate_memory),
    "noop": (1, mutate_noop),
}


def make_case(seed: int, index: int, bases: list[Base], *, smollm2_share: float, load_share: float) -> Case:
    """Case ``index`` of the run seeded ``seed``: a pure function of both (and the bases)."""
    rng = random.Random(f"specstate-fuzz/{seed}/{index}")
    smol = [b for b in bases if b.family == "smollm2"]
    tiny = [b for b in bases if b.family == "tiny"]
    family = smol if smol and (not tiny or rng.random() < smollm2_share) else tiny
    base = family[rng.randrange(len(family))]
    names = list(CLASSES)
    klass = rng.choices(names, weights=[CLASSES[n][0] for n in names])[0]
    load = rng.random() < load_share
    ctx = Context(rng, base, bases, parse(base.data))
    detail, data, label = CLASSES[klass][1](ctx)
    return Case(index, base, klass, detail, data, label, predict(data, base, ctx.threads), load, ctx.threads)


# --- running cases (in a worker) ---------------------------------------------------------------


def _error_name(error: BaseException) -> str:
    return type(error).__name__


class Runner:
    """Runs cases in this process against the bases' models."""

    def __init__(self, directory: Path) -> None:
        from specstate import Model

        manifest = json.loads((directory / "manifest.json").read_text())
        self.bases = [Base.from_json(b, directory) for b in manifest["bases"]]
        self.paths = {k: Path(v) for k, v in manifest["models"].items()}
        self.models: dict[str, Any] = {k: Model(v) for k, v in self.paths.items()}
        if manifest["smollm2"]:
            self.models["smollm2"] = Model(manifest["smollm2"])

    def models_for(self, base: Base) -> tuple[Any, Any]:
        if base.family == "smollm2":
            return self.models["smollm2"], None
        draft = {"draft": "llama", "eagle3": "eagle3_draft"}.get(base.mode)
        return self.models["qwen35"], self.models[draft] if draft else None

    def fresh_generator(self, base: Base) -> Any:
        """A generator of ``base``'s configuration, somewhere else in another generation."""
        from specstate import Generator
        from specstate_testkit.generator_support import tiny_generator

        if base.family == "smollm2":
            generator = Generator(self.models["smollm2"], mode=cast(Any, base.mode), n_ctx=SMOL_CTX, n_threads=1)
        else:
            generator = tiny_generator(base.mode, self.paths, sampled=base.sampled)
        generator.generate(LOAD_PROMPT, max_tokens=3)
        return generator

    def run(self, case: Case, phase: Callable[[str], None]) -> dict[str, Any]:
        from specstate import Generator

        target, draft = self.models_for(case.base)
        phase("restore")
        result = self._attempt(
            case, lambda: Generator.restore(case.data, target, draft_model=draft, n_threads=case.threads), phase, ""
        )
        if case.load:
            phase("load")
            holder: list[Any] = [self.fresh_generator(case.base)]
            before = holder[0].checkpoint()

            def load() -> Any:
                holder[0].load(case.data)
                return holder[0]

            loaded = self._attempt(case, load, phase, "load-")
            if loaded["outcome"].startswith("typed:") and holder[0].checkpoint() != before:
                loaded.update(outcome="load-changed", ok=False)
            elif loaded["outcome"].startswith("untyped:") and holder[0].checkpoint() != before:
                loaded["detail"] = f"{loaded.get('detail', '')}; and the generator changed"
            del holder
            result["load"] = loaded["outcome"]
            if not loaded["ok"]:
                if result["ok"]:
                    result["failure"] = f"load {loaded['outcome']}"
                result.update(ok=False, load_detail=loaded.get("detail"))
        return result

    def _attempt(
        self, case: Case, restore: Callable[[], Any], phase: Callable[[str], None], prefix: str
    ) -> dict[str, Any]:
        from specstate.errors import CheckpointError

        expect = case.expect
        try:
            generator = restore()
        except CheckpointError as error:
            outcome = f"typed:{_error_name(error)}"
            if OVER_ALLOCATION in str(error):
                # llama.cpp could not create a context: its allocation failed under the address-space limit.
                return {"outcome": "over-allocation", "ok": False, "detail": f"{outcome}: {str(error)[:300]}"}
            if expect == "noop":
                return {"outcome": "refused-noop", "ok": False, "detail": f"{outcome}: {error}"}
            return {"outcome": outcome, "ok": True, "detail": str(error)[:200]}
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # PyO3 panics are BaseExceptions
            return {"outcome": f"untyped:{_error_name(error)}", "ok": False, "detail": str(error)[:300]}
        phase(f"{prefix}generate")
        try:
            continuation = _continuation(generator)
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            return {"outcome": f"generate-error:{_error_name(error)}", "ok": False, "detail": str(error)[:300]}
        finally:
            del generator
        same = continuation == case.base.reference
        detail = None if same else f"continued {continuation}, reference {case.base.reference}"
        if expect in ("refuse", "refuse-positions"):
            outcome = "unexpected-accept" + ("-positions" if expect == "refuse-positions" else "")
            return {"outcome": outcome, "ok": False, "detail": f"{'same' if same else 'different'} continuation"}
        if same:
            return {"outcome": "exact", "ok": True}
        if expect in ("noop", "exact"):
            return {"outcome": "wrong-continuation", "ok": False, "detail": detail}
        return {"outcome": "accepted-different", "ok": True, "detail": detail}


def _vm_peak_mb() -> int:
    """The worker's peak address space so far (VmPeak), in MiB: what the address-space limit bounds."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmPeak:"):
            return int(line.split()[1]) >> 10
    return 0


def worker_main(args: argparse.Namespace) -> int:
    """Run cases ``start..stop``: one JSON line when a case starts and one when it ends."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything native code prints goes to stderr, not into the protocol
    # AddressSanitizer (make asan) maps terabytes of shadow memory: no address-space limit there.
    under_asan = "libasan" in os.environ.get("LD_PRELOAD", "")
    if args.memory_limit_mb and not under_asan:
        limit = args.memory_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def emit(message: dict[str, Any]) -> None:
        protocol.write("@@fuzz " + json.dumps(message) + "\n")
        protocol.flush()

    runner = Runner(Path(args.bases))
    # Test hook of the harness itself: "crash@3,hang@5,exit@7" makes those cases abort, hang or exit.
    injected: dict[str, str] = {}
    for item in os.environ.get(INJECT_ENV, "").split(","):
        if "@" in item:
            what, case_index = item.split("@", 1)
            injected[case_index] = what
    emit({"ready": os.getpid(), "build": native_build_id()})
    for index in range(args.start, args.stop):
        try:
            case = make_case(
                args.seed, index, runner.bases, smollm2_share=args.smollm2_share, load_share=args.load_share
            )
        except Exception as error:  # a bug of the harness: report it, do not stop
            emit({"start": index, "case": {"case": index, "class": "harness"}})
            emit({"done": index, "outcome": "harness-error", "ok": False, "detail": f"{_error_name(error)}: {error}"})
            continue
        emit({"start": index, "case": case.describe()})
        injection = injected.get(str(index))
        if injection == "crash":
            os.abort()
        elif injection == "hang":
            time.sleep(1e6)
        elif injection == "exit":
            os._exit(3)

        def phase(name: str, index: int = index) -> None:
            emit({"phase": name, "case": index})

        began = time.perf_counter()
        try:
            result = runner.run(case, phase)
        except Exception:  # outside the attempts themselves: a bug of the harness
            result = {"outcome": "harness-error", "ok": False, "detail": traceback.format_exc()[-1500:]}
        del case
        gc.collect()
        ms = round(1000 * (time.perf_counter() - began), 1)
        emit({"done": index, **result, "ms": ms, "vm_peak_mb": _vm_peak_mb()})
    protocol.close()
    return 0


# --- the parent: bases, workers, summary -------------------------------------------------------


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    start: int
    stop: int
    stderr: Path
    stderr_file: IO[bytes]
    buffer: bytes = b""
    current: int | None = None
    description: dict[str, Any] | None = None
    phase: str = ""
    started_at: float = 0.0
    next_index: int = 0
    stderr_offset: int = 0
    ready: bool = False
    spawned_at: float = field(default_factory=time.monotonic)


@dataclass
class FuzzConfig:
    cases: int
    seed: int = 0
    workers: int = 2
    timeout: float = 60.0
    startup_timeout: float = 300.0
    smollm2_share: float = 0.2
    load_share: float = 0.15
    memory_limit_mb: int = 2048
    chunk: int = 0  # cases per worker start (0: automatic)


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


_CRASH_MARKS = ("GGML_ASSERT", "panicked", "Assertion", "terminate called", "Fatal Python error", "Sanitizer", "error")


def _crash_line(stderr: str) -> str:
    """The line of a worker's stderr that most likely says why it died."""
    lines = stderr.splitlines()
    for mark in _CRASH_MARKS:
        for line in lines:
            if mark in line:
                return line.strip()[-200:]
    return ""


def _stderr_since(path: Path, offset: int, head: int = 1200, tail: int = 400) -> str:
    """What a worker wrote to stderr from ``offset`` on: its beginning (the assertion) and its end."""
    try:
        data = path.read_bytes()[offset:]
    except OSError:
        return ""
    if len(data) > head + tail:
        data = data[:head] + b"\n[...]\n" + data[-tail:]
    return data.decode("utf-8", "replace")


def run_cases(
    config: FuzzConfig, bases_dir: Path, build: str, log: Callable[[str], None] = print
) -> dict[int, dict[str, Any]]:
    """Run cases ``0..config.cases`` in worker subprocesses; the record of each case by index.

    Records of failures that belong to no case (a worker that died between
    cases, a native build changed during the run) get negative indexes.
    """
    chunk = config.chunk or max(1, min(400, -(-config.cases // (config.workers * 4))))
    pending = [(start, min(start + chunk, config.cases)) for start in range(0, config.cases, chunk)]
    results: dict[int, dict[str, Any]] = {}
    extra_failures: list[dict[str, Any]] = []
    selector = selectors.DefaultSelector()
    active: list[Worker] = []
    startup_failures = 0
    logdir = bases_dir / "workers"
    logdir.mkdir(exist_ok=True)
    spawned = 0
    last_report = time.monotonic()
    builds: set[str] = set()

    def spawn(start: int, stop: int) -> None:
        nonlocal spawned
        spawned += 1
        stderr = logdir / f"worker-{spawned}.err"
        handle = stderr.open("wb")
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "worker",
            "--bases",
            str(bases_dir),
            "--seed",
            str(config.seed),
            "--start",
            str(start),
            "--stop",
            str(stop),
            "--smollm2-share",
            str(config.smollm2_share),
            "--load-share",
            str(config.load_share),
            "--memory-limit-mb",
            str(config.memory_limit_mb),
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=handle, stdin=subprocess.DEVNULL)
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        worker = Worker(process, start, stop, stderr, handle, next_index=start)
        active.append(worker)
        selector.register(process.stdout, selectors.EVENT_READ, worker)

    def finish(worker: Worker, *, hang: bool = False) -> None:
        nonlocal startup_failures
        assert worker.process.stdout is not None
        selector.unregister(worker.process.stdout)
        if hang:
            worker.process.kill()
        returncode = worker.process.wait()
        worker.process.stdout.close()
        worker.stderr_file.close()
        active.remove(worker)
        resume = worker.next_index
        if worker.current is not None:
            index = worker.current
            outcome = "hang" if hang else "crash"
            stderr = _stderr_since(worker.stderr, worker.stderr_offset)
            why = _crash_line(stderr)
            results[index] = {
                "outcome": outcome,
                "ok": False,
                "case": worker.description,
                "phase": worker.phase,
                "detail": (f"no result after {config.timeout:.0f} s" if hang else _signal_name(returncode)),
                "stderr": stderr,
                **({"why": why} if why and not hang else {}),
            }
            resume = index + 1
        elif returncode != 0 and not hang:
            if not worker.ready:
                startup_failures += 1
                if startup_failures >= 3:
                    raise RuntimeError(
                        f"workers fail to start ({_signal_name(returncode)}):\n{_stderr_since(worker.stderr, 0)}"
                    )
            extra_failures.append(
                {
                    "outcome": "worker-exit",
                    "ok": False,
                    "case": None,
                    "detail": f"{_signal_name(returncode)} after case {resume - 1}",
                    "stderr": _stderr_since(worker.stderr, 0),
                }
            )
        elif hang:
            raise RuntimeError(
                f"a worker did not start within {config.startup_timeout:.0f} s:\n{_stderr_since(worker.stderr, 0)}"
            )
        if worker.ready:
            startup_failures = 0
        if resume < worker.stop:
            pending.insert(0, (resume, worker.stop))

    def handle(worker: Worker, line: bytes) -> None:
        if not line.startswith(b"@@fuzz "):
            return
        message = json.loads(line[7:])
        if "ready" in message:
            worker.ready = True
            builds.add(message["build"])
        elif "start" in message:
            worker.current, worker.description = message["start"], message["case"]
            worker.stderr_offset = worker.stderr.stat().st_size
            worker.phase, worker.started_at = "", time.monotonic()
        elif "phase" in message:
            worker.phase = message["phase"]
        elif "done" in message:
            index = message.pop("done")
            message["case"] = worker.description
            results[index] = message
            worker.current, worker.description, worker.next_index = None, None, index + 1

    try:
        while pending or active:
            while pending and len(active) < config.workers:
                spawn(*pending.pop(0))
            now = time.monotonic()
            deadlines = [
                w.started_at + config.timeout
                if w.current is not None
                else (w.spawned_at + config.startup_timeout if not w.ready else math.inf)
                for w in active
            ]
            wait = max(0.0, min(deadlines, default=1.0) - now)
            for key, _ in selector.select(timeout=min(wait, 5.0)):
                worker = cast(Worker, key.data)
                stream = cast(IO[bytes], key.fileobj)
                chunk_bytes = os.read(stream.fileno(), 1 << 16)
                if not chunk_bytes:
                    finish(worker)
                    continue
                worker.buffer += chunk_bytes
                *lines, worker.buffer = worker.buffer.split(b"\n")
                for line in lines:
                    handle(worker, line)
            now = time.monotonic()
            for worker in list(active):
                if (worker.current is not None and now - worker.started_at > config.timeout) or (
                    not worker.ready and now - worker.spawned_at > config.startup_timeout
                ):
                    finish(worker, hang=True)
            if now - last_report > 30:
                last_report = now
                failing = sum(1 for r in results.values() if not r["ok"])
                log(f"  {len(results)}/{config.cases} cases, {failing} failing")
    finally:
        for worker in list(active):
            worker.process.kill()
            worker.process.wait()
            worker.stderr_file.close()
    for number, failure in enumerate(extra_failures):
        results[-1 - number] = failure
    if builds - {build}:
        results[-1 - len(extra_failures)] = {
            "outcome": "build-changed",
            "ok": False,
            "case": None,
            "detail": f"workers ran native builds {sorted(builds)}, the bases were made by {build}: "
            "the extension was rebuilt during the run; run again",
        }
    return results


def summarize(
    results: dict[int, dict[str, Any]], config: FuzzConfig, elapsed: float, manifest: dict[str, Any]
) -> dict[str, Any]:
    outcomes = Counter(r["outcome"] for index, r in results.items() if index >= 0)
    loads = Counter(r["load"] for r in results.values() if "load" in r)
    failing = sorted((index, r) for index, r in results.items() if not r["ok"])
    failures = Counter(r.get("failure", r["outcome"]) for _, r in failing)
    refused = manifest.get("refused", [])
    if refused:
        failures["base-refused"] = len(refused)
    by_class: dict[str, Counter[str]] = {}
    timing: dict[str, list[float]] = {}
    for index, r in results.items():
        if index >= 0 and r.get("case"):
            by_class.setdefault(r["case"].get("class", "?"), Counter())[r["outcome"]] += 1
            if "ms" in r:
                timing.setdefault(str(r["case"].get("base", "?")).split("-")[0], []).append(r["ms"])
    return {
        "cases": config.cases,
        "seed": config.seed,
        "elapsed_s": round(elapsed, 1),
        "bases": [b["id"] for b in manifest["bases"]],
        "format_versions": sorted({b["version"] for b in manifest["bases"]}),
        "base_warnings": manifest.get("warnings", []),
        "refused_bases": refused,
        "outcomes": dict(outcomes.most_common()),
        "load_outcomes": dict(loads.most_common()),
        "by_class": {k: dict(v.most_common()) for k, v in sorted(by_class.items())},
        "mean_ms_by_family": {k: round(sum(v) / len(v), 1) for k, v in sorted(timing.items())},
        "memory_limit_mb": config.memory_limit_mb,
        "peak_vm_mb": max((r.get("vm_peak_mb", 0) for r in results.values()), default=0),
        "failures": dict(failures.most_common()),
        "failing_cases": [{"index": index, **r} for index, r in failing[:50]],
        "crashes": outcomes["crash"],
        "hangs": outcomes["hang"],
        "untyped": sum(n for k, n in outcomes.items() if k.startswith(("untyped:", "generate-error:"))),
        "unexpected_accepts": sum(n for k, n in outcomes.items() if k.startswith("unexpected-accept")),
        "failed": len(failing) + len(refused),
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"checkpoint fuzz: {summary['cases']} cases, seed {summary['seed']}, "
        f"format v{'/v'.join(map(str, summary['format_versions']))}, {len(summary['bases'])} bases, "
        f"{summary['elapsed_s']} s"
    ]
    lines += [f"  base warning: {w}" for w in summary["base_warnings"]]
    lines += [
        f"  BASE REFUSED (run left out): {r['run']}-b{r['boundary']}: {r['error']}" for r in summary["refused_bases"]
    ]
    lines.append("  outcomes:")
    lines += [f"    {count:7d}  {outcome}" for outcome, count in summary["outcomes"].items()]
    if summary["load_outcomes"]:
        lines.append("  Generator.load outcomes (sampled cases):")
        lines += [f"    {count:7d}  {outcome}" for outcome, count in summary["load_outcomes"].items()]
    lines.append("  mean ms per case: " + ", ".join(f"{k} {v}" for k, v in summary["mean_ms_by_family"].items()))
    lines.append(
        f"  largest worker address space {summary['peak_vm_mb']} MiB, "
        f"under a limit of {summary['memory_limit_mb']} MiB per worker"
    )
    lines.append(
        f"  crashes {summary['crashes']}, hangs {summary['hangs']}, untyped errors {summary['untyped']}, "
        f"unexpected accepts {summary['unexpected_accepts']}, failing cases {summary['failed']}"
    )
    if summary["failures"]:
        lines.append("  failing by class:")
        lines += [f"    {count:7d}  {failure}" for failure, count in summary["failures"].items()]
        seen: set[str] = set()
        lines.append("  first failing case of each class:")
        for case in summary["failing_cases"]:
            key = case.get("failure", case["outcome"])
            if key in seen:
                continue
            seen.add(key)
            description = case.get("case") or {}
            lines.append(
                f"    #{case['index']} {key}: {description.get('base')} {description.get('class')} "
                f"[{description.get('detail')}] expect {description.get('expect')}"
                f"{' (' + str(description.get('why')) + ')' if description.get('why') else ''}"
                f"{' phase ' + case['phase'] if case.get('phase') else ''}: "
                f"{_short(case.get('detail') or case.get('load_detail') or '', 160)}"
                f"{' -- ' + case['why'] if case.get('why') else ''}"
            )
    return "\n".join(lines)


def prepare_bases(
    directory: Path, tiny: dict[str, Path] | None, smollm2: Path | None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The bases in ``directory``: reused when built by this native build, else built."""
    manifest_path = directory / "manifest.json"
    if manifest_path.exists():
        manifest = cast(dict[str, Any], json.loads(manifest_path.read_text()))
        if (
            manifest.get("build") == native_build_id()
            and bool(manifest.get("smollm2")) == bool(smollm2)
            and all(Path(p).exists() for p in manifest["models"].values())
        ):
            log(f"reusing the base checkpoints in {directory}")
            return manifest
        shutil.rmtree(directory)  # ours (it has our manifest), built by another native build
    directory.mkdir(parents=True, exist_ok=True)
    if tiny is None:
        tiny = build_tiny_models(directory / "models")
    log(f"building base checkpoints in {directory}")
    return build_bases(directory, tiny, smollm2, log)


def fuzz(
    config: FuzzConfig,
    *,
    tiny: dict[str, Path] | None = None,
    smollm2: Path | None = None,
    bases_dir: Path | None = None,
    cases_log: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build (or reuse) the bases, run the cases, and summarize."""
    started = time.monotonic()
    scratch = None
    if bases_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="specstate-fuzz-")
        bases_dir = Path(scratch.name) / "bases"
    try:
        manifest = prepare_bases(bases_dir, tiny, smollm2 if config.smollm2_share > 0 else None, log)
        if manifest["bases"]:
            results = run_cases(config, bases_dir, manifest["build"], log)
        else:
            log("no base checkpoint is restorable: no cases run")
            results = {}
        summary = summarize(results, config, time.monotonic() - started, manifest)
        if cases_log is not None:
            with cases_log.open("w") as out:
                for index in sorted(results):
                    out.write(json.dumps({"index": index, **results[index]}) + "\n")
        summary["bases_dir"] = None if scratch else str(bases_dir)
        return summary
    finally:
        if scratch is not None:
            scratch.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smollm2-share", type=float, default=0.2, help="share of the cases over SmolLM2 bases (0: no SmolLM2)"
    )
    parser.add_argument(
        "--load-share", type=float, default=0.15, help="share of the cases also loaded into a fresh generator"
    )
    parser.add_argument("--memory-limit-mb", type=int, default=2048, help="address-space limit per worker")
    if argv and argv[0] == "worker":
        parser.add_argument("worker")
        parser.add_argument("--bases", required=True)
        parser.add_argument("--start", type=int, required=True)
        parser.add_argument("--stop", type=int, required=True)
        return worker_main(parser.parse_args(argv))
    parser.add_argument("--cases", type=int, required=True)
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it is a hang")
    parser.add_argument("--bases", type=Path, help="keep (and reuse) the base checkpoints here")
    parser.add_argument("--cases-log", type=Path, help="write every case's record here (JSON lines)")
    args = parser.parse_args(argv)
    config = FuzzConfig(
        cases=args.cases,
        seed=args.seed,
        workers=args.workers,
        timeout=args.timeout,
        smollm2_share=args.smollm2_share,
        load_share=args.load_share,
        memory_limit_mb=args.memory_limit_mb,
    )
    smollm2 = None
    if args.smollm2_share > 0:
        from specstate.smollm2 import smollm2_path

        smollm2 = smollm2_path()
    summary = fuzz(
        config, smollm2=smollm2, bases_dir=args.bases.resolve() if args.bases else None, cases_log=args.cases_log
    )
    print(format_summary(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
