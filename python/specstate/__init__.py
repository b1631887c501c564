"""specstate: speculative decoding on llama.cpp with exact, checkpointable state.

This package exposes the speculative-session contract of speculative draft sessions: its
bounds (``MAX_SPECULATIVE_*``), its validators (:func:`validate_config`,
:func:`validate_context_capacities`, :func:`validate_state_size`), the
:class:`ContextCapacity` they take, and one typed exception per error variant
(see :mod:`specstate.errors`). :func:`native_info` describes the native build, and
:func:`default_threads` the thread count a generation decodes with when it is given none.
The dictionaries the package takes and returns are typed (``TypedDict``):
:class:`NativeInfo`, :class:`GeneratorSettings` (the keyword arguments of
:class:`Generator`), :class:`SamplingSettings` (its sampling ones, which
:meth:`Generator.set_sampling` changes), :class:`GeneratorConfig` (``Generator.config``),
:class:`CheckpointInfo` (:func:`inspect_checkpoint`) and the
:class:`ModelFingerprint` entries in it.
"""

from __future__ import annotations

import importlib.metadata

from specstate._cpu import check_cpu as _check_cpu

_check_cpu()

from specstate import errors  # noqa: E402
from specstate._native import (  # noqa: E402
    MAX_SPECULATIVE_DRAFT_TOKENS,
    MAX_SPECULATIVE_PROMPT_TOKENS,
    MAX_SPECULATIVE_SEQUENCES,
    MAX_SPECULATIVE_STATE_BYTES,
    Batch,
    ChatTemplate,
    Context,
    ContextCapacity,
    DraftSession,
    GreedyGeneration,
    LookupCorpus,
    Model,
    default_threads,
    inspect_checkpoint,
    json_schema_to_grammar,
    model_fingerprint,
    native_info,
    validate_config,
    validate_context_capacities,
    validate_state_size,
)
from specstate._typing import (  # noqa: E402
    CheckpointInfo,
    DeviceInfo,
    DraftPolicy,
    GeneratorConfig,
    GeneratorSettings,
    Message,
    ModelFingerprint,
    NativeInfo,
    SamplingSettings,
    TokenLogprobs,
)
from specstate.batch_engine import BatchEngine, SharedEngine, StepReport  # noqa: E402
from specstate.chat import chat_template, render_chat  # noqa: E402
from specstate.embeddings import CreateEmbeddingResponse, Embedder  # noqa: E402
from specstate.errors import *  # noqa: E402, F403 (every exception class, as errors.__all__ lists them)
from specstate.generator import Generator, encode_prompt  # noqa: E402
from specstate.llama import Llama as Llama  # noqa: E402 (llama-cpp-python's API; see specstate.llama)
from specstate.llama import LlamaCache as LlamaCache  # noqa: E402
from specstate.llama import LlamaDiskCache as LlamaDiskCache  # noqa: E402
from specstate.llama import LlamaGrammar as LlamaGrammar  # noqa: E402
from specstate.llama import LlamaRAMCache as LlamaRAMCache  # noqa: E402
from specstate.llama import LlamaState as LlamaState  # noqa: E402
from specstate.llama import UnsupportedParameterError as UnsupportedParameterError  # noqa: E402
from specstate.sessions import Eagle3Session, MtpSession  # noqa: E402


def _version() -> str:
    try:
        return importlib.metadata.version("specstate")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return native_info()["specstate_version"]


#: From the installed metadata rather than native_info(): that lists the devices, and on a CUDA build asking a GPU
#: for its free memory creates a CUDA context on it, which an import must not do.
__version__: str = _version()

__all__ = [
    "MAX_SPECULATIVE_DRAFT_TOKENS",
    "MAX_SPECULATIVE_PROMPT_TOKENS",
    "MAX_SPECULATIVE_SEQUENCES",
    "MAX_SPECULATIVE_STATE_BYTES",
    "Batch",
    "BatchEngine",
    "ChatTemplate",
    "CheckpointInfo",
    "Context",
    "ContextCapacity",
    "CreateEmbeddingResponse",
    "DeviceInfo",
    "DraftPolicy",
    "DraftSession",
    "Eagle3Session",
    "Embedder",
    "Generator",
    "GeneratorConfig",
    "GeneratorSettings",
    "GreedyGeneration",
    "LookupCorpus",
    "Message",
    "Model",
    "ModelFingerprint",
    "MtpSession",
    "NativeInfo",
    "SamplingSettings",
    "SharedEngine",
    "StepReport",
    "TokenLogprobs",
    "chat_template",
    "default_threads",
    "encode_prompt",
    "inspect_checkpoint",
    "json_schema_to_grammar",
    "model_fingerprint",
    "native_info",
    "render_chat",
    "validate_config",
    "validate_context_capacities",
    "validate_state_size",
]
__all__ += errors.__all__
