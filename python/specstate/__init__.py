"""specstate: speculative decoding on llama.cpp with exact, checkpointable state.

This package exposes the seed contract of speculative draft sessions: its
bounds (``MAX_SPECULATIVE_*``), its validators (:func:`validate_config`,
:func:`validate_context_capacities`, :func:`validate_state_size`), the
:class:`ContextCapacity` they take, and one typed exception per error variant
(see :mod:`specstate.errors`). :func:`native_info` describes the native build.
The dictionaries the package takes and returns are typed (``TypedDict``):
:class:`NativeInfo`, :class:`GeneratorSettings` (the keyword arguments of
:class:`Generator`), :class:`GeneratorConfig` (``Generator.config``),
:class:`CheckpointInfo` (:func:`inspect_checkpoint`) and the
:class:`ModelFingerprint` entries in it.
"""

from __future__ import annotations

from specstate._cpu import check_cpu as _check_cpu

_check_cpu()

from specstate._native import (  # noqa: E402
    MAX_SPECULATIVE_DRAFT_TOKENS,
    MAX_SPECULATIVE_PROMPT_TOKENS,
    MAX_SPECULATIVE_SEQUENCES,
    MAX_SPECULATIVE_STATE_BYTES,
    Batch,
    Context,
    ContextCapacity,
    DraftSession,
    GreedyGeneration,
    Model,
    inspect_checkpoint,
    model_fingerprint,
    native_info,
    validate_config,
    validate_context_capacities,
    validate_state_size,
)
from specstate._typing import (  # noqa: E402
    CheckpointInfo,
    GeneratorConfig,
    GeneratorSettings,
    ModelFingerprint,
    NativeInfo,
)
from specstate.errors import (  # noqa: E402
    BadSequenceError,
    BufferTooSmallError,
    CapacityError,
    CheckpointError,
    ChecksumMismatchError,
    ConfigMismatchError,
    CorruptCheckpointError,
    GenerationError,
    ModelMismatchError,
    NotACheckpointError,
    SectionTooLargeError,
    TruncatedCheckpointError,
    UnsupportedVersionError,
    ConfigError,
    ContextError,
    DecodeError,
    ExcessiveStateError,
    InvalidStateError,
    ModelLoadError,
    NativeExceptionError,
    NotQuiescentError,
    NullStateError,
    SequenceStateError,
    SessionError,
    SpeculativeStateError,
    StateOverflowError,
    StateSizeChangedError,
    StateUnavailableError,
    ThreadAffinityError,
    UnknownStatusError,
)
from specstate.generator import Generator  # noqa: E402
from specstate.sessions import Eagle3Session, MtpSession  # noqa: E402

__version__: str = native_info()["specstate_version"]

__all__ = [
    "Batch",
    "Context",
    "ContextError",
    "DecodeError",
    "DraftSession",
    "CheckpointError",
    "ChecksumMismatchError",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "Eagle3Session",
    "GenerationError",
    "Generator",
    "ModelMismatchError",
    "NotACheckpointError",
    "SectionTooLargeError",
    "TruncatedCheckpointError",
    "UnsupportedVersionError",
    "inspect_checkpoint",
    "model_fingerprint",
    "GreedyGeneration",
    "Model",
    "ModelLoadError",
    "MtpSession",
    "SequenceStateError",
    "SessionError",
    "ThreadAffinityError",
    "MAX_SPECULATIVE_DRAFT_TOKENS",
    "MAX_SPECULATIVE_PROMPT_TOKENS",
    "MAX_SPECULATIVE_SEQUENCES",
    "MAX_SPECULATIVE_STATE_BYTES",
    "BadSequenceError",
    "BufferTooSmallError",
    "CapacityError",
    "ConfigError",
    "ContextCapacity",
    "ExcessiveStateError",
    "InvalidStateError",
    "NativeInfo",
    "CheckpointInfo",
    "GeneratorConfig",
    "GeneratorSettings",
    "ModelFingerprint",
    "NativeExceptionError",
    "NotQuiescentError",
    "NullStateError",
    "SpeculativeStateError",
    "StateOverflowError",
    "StateSizeChangedError",
    "StateUnavailableError",
    "UnknownStatusError",
    "native_info",
    "validate_config",
    "validate_context_capacities",
    "validate_state_size",
]
