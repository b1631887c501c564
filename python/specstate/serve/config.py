"""What ``specstate serve`` runs: :class:`ServerConfig`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specstate import _defaults
from specstate._native import MAX_THREADS, default_threads
from specstate._typing import U32_MAX, DraftPolicy, Mode
from specstate.batch_engine import BATCHED_MODES
from specstate.serve.request import RequestLimits

#: Mebibytes, the unit of the options of sizes.
MIB = 1 << 20

#: Environment variable holding the API key when ``--api-key`` is not given.
API_KEY_VARIABLE = "SPECSTATE_API_KEY"

#: The largest ``api_key_file`` read.
MAX_KEYS_FILE_BYTES = 1 << 20


class Option(NamedTuple):
    """How a :class:`ServerConfig` field is a ``specstate serve`` option."""

    help: str
    #: The option's name, underscores for dashes (default: the field's).
    name: str | None = None
    #: The option's unit, in the field's (MiB for a field in bytes, say).
    unit: int = 1
    #: The range of a number (checked before the server starts).
    low: float | None = None
    high: float | None = None
    #: A file or directory.
    path: bool = False


def _option(help: str, **how: Any) -> dict[str, Option]:
    return {"option": Option(help, **how)}


@dataclass(frozen=True)
class ServerConfig:
    """What ``specstate serve`` runs: the model, how it speculates, slots, queue and limits. The command line's
    options are made from these fields (``specstate.cli.serve``)."""

    model_path: str = field(metadata=_option("target GGUF model", name="model", path=True))
    mode: Mode = field(default=_defaults.MODE, metadata=_option("speculation mode"))
    draft_model_path: str | None = field(
        default=None, metadata=_option("draft GGUF model (draft and eagle3 modes)", name="draft_model", path=True)
    )
    n_draft: int = field(
        default=_defaults.N_DRAFT, metadata=_option("most tokens drafted per round", low=1, high=U32_MAX)
    )
    #: How long each round's draft is in speculative modes: ``adaptive`` (the server's default: chosen each round
    #: from the cost curve and the request's recent acceptance) or ``fixed`` (up to ``n_draft`` every round).
    draft_policy: DraftPolicy = field(
        default="adaptive",
        metadata=_option("adaptive: each round's draft length from a cost curve and the acceptance; fixed: n_draft"),
    )
    #: Context length of each slot (0: the model's trained length).
    n_ctx: int = field(default=_defaults.N_CTX, metadata=_option("context length of each slot (0: the model's)"))
    #: Threads of the batched engine (0: the default thread count); with separate slots, threads per slot (0: the
    #: default thread count shared out between the slots). docs/threads.md.
    n_threads: int = field(
        default=_defaults.N_THREADS,
        metadata=_option(
            "threads of the batched engine, or per slot with --separate-slots (0: the default, shared out between"
            " separate slots)",
            name="threads",
            low=0,
            high=MAX_THREADS,
        ),
    )
    #: Generations run at once (on each Ray worker, with ``ray_workers``).
    slots: int = field(default=1, metadata=_option("generations run at once (on each Ray worker)", low=1, high=64))
    #: Give each slot a model and context of its own instead of decoding every slot's generation in one batched
    #: engine (``draft``, ``mtp`` and ``eagle3`` modes always have separate slots).
    separate_slots: bool = field(
        default=False, metadata=_option("give each slot a model and context of its own (no batching)")
    )
    #: Requests that may wait for a slot; one more is refused with 429.
    queue: int = field(default=16, metadata=_option("requests that may wait for a slot", low=0, high=1 << 16))
    #: What one request may ask for: tokens, messages, stop strings, body size, ... (each an option).
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_key: str | None = field(
        default=None,
        metadata=_option(f"require 'Authorization: Bearer KEY' (default: ${API_KEY_VARIABLE}, else no key)"),
    )
    #: A file of API keys, one a line (blank lines and lines starting with ``#`` passed over), taken besides
    #: ``api_key``: each key is a tenant of its own, whose requests reuse nothing another key's left.
    api_key_file: str | None = field(
        default=None,
        metadata=_option("a file of API keys, one a line, each a tenant of its own (besides --api-key)", path=True),
    )
    #: Reuse nothing between requests: no prompt cells or states kept, no conversation held or cached, no lookup
    #: corpus (by default each is kept, and reused only between requests of the same tenant).
    no_cross_request_reuse: bool = field(
        default=False,
        metadata=_option("reuse nothing between requests (prompt cells and states, conversations, lookup corpus)"),
    )
    #: Draft nothing from grammars (by default the tokens a request's grammar, JSON schema or required tool call
    #: forces are drafted and verified as any draft: faster replies, the same text).
    no_grammar_drafts: bool = field(
        default=False, metadata=_option("draft nothing from grammars (replies are the same, under a grammar slower)")
    )
    #: Serve ``/metrics`` without the API key (for a scraper on a trusted network).
    metrics_public: bool = field(default=False, metadata=_option("serve /metrics without the API key"))
    #: A chat template's Jinja source, or ``chatml`` (None: the model's own).
    chat_template: str | None = field(
        default=None,
        metadata=_option(
            "chat template: a Jinja file, or a format's name, chatml, llama-3, ... (default: the model's)",
            name="template",
        ),
    )
    #: The model name clients use (by default the file's name).
    model_name: str | None = field(default=None, metadata=_option("the model name clients use (default: the file's)"))
    #: Bytes of conversation checkpoints kept in memory (least recently used evicted, to the directory if any).
    cache_bytes: int = field(
        default=1 << 30,
        metadata=_option("MiB of conversation checkpoints kept in memory", name="cache_mib", unit=MIB, low=0, high=MIB),
    )
    #: A directory keeping conversation checkpoints across restarts (None: memory only).
    cache_dir: str | None = field(
        default=None, metadata=_option("keep conversation checkpoints here across restarts", path=True)
    )
    #: Bytes of conversation checkpoints kept in ``cache_dir``.
    cache_dir_bytes: int = field(
        default=8 << 30,
        metadata=_option("MiB of conversation checkpoints kept in --cache-dir", name="cache_dir_mib", unit=MIB, low=0),
    )
    #: Bytes of parked replies' checkpoints kept in memory; beyond them they go to ``spill_dir``, or (without
    #: one) nothing more is parked.
    parked_bytes: int = field(
        default=1 << 30,
        metadata=_option("MiB of parked replies' checkpoints kept in memory", name="parked_mib", unit=MIB, low=0),
    )
    #: A directory for parked replies' checkpoints beyond ``parked_bytes`` (removed when resumed).
    spill_dir: str | None = field(
        default=None, metadata=_option("parked replies' checkpoints beyond --parked-mib go here", path=True)
    )
    #: The pooling of ``/v1/embeddings`` (None: the model's own, else ``mean``).
    embedding_pooling: str | None = field(
        default=None,
        metadata=_option("pooling of /v1/embeddings: none, mean, cls or last (default: the model's own, else mean)"),
    )
    #: Threads computing ``/v1/embeddings``, each with an embedding context of its own (apart from the slots).
    embedding_workers: int = field(
        default=1, metadata=_option("threads computing /v1/embeddings, each with a context of its own", low=1, high=64)
    )
    #: Embeddings requests that may wait for a worker; one more is refused with 429.
    embedding_queue: int = field(
        default=16, metadata=_option("embeddings requests that may wait for a worker", low=0, high=1 << 16)
    )
    #: Serve from this many Ray workers, each running ``slots`` slots as the server does without Ray.
    ray_workers: int = field(
        default=0, metadata=_option("serve from this many Ray workers (needs the ray extra)", low=0, high=1024)
    )
    #: The Ray cluster to join (None: a local instance).
    ray_address: str | None = field(
        default=None, metadata=_option("the Ray cluster to join (default: a local instance)")
    )

    def api_keys(self) -> tuple[str, ...]:
        """Every API key the server takes: ``api_key`` and those of ``api_key_file`` (read now, at most
        :data:`MAX_KEYS_FILE_BYTES`); empty: no key is needed. A keys file that holds none is a ``ValueError``."""
        keys = [] if self.api_key is None else [self.api_key]
        if self.api_key_file is not None:
            with open(self.api_key_file, "rb") as file:
                data = file.read(MAX_KEYS_FILE_BYTES + 1)
            if len(data) > MAX_KEYS_FILE_BYTES:
                raise ValueError(f"{self.api_key_file} is larger than {MAX_KEYS_FILE_BYTES} bytes")
            lines = (line.strip() for line in data.decode().splitlines())
            found = [line for line in lines if line and not line.startswith("#")]
            if not found:
                raise ValueError(f"{self.api_key_file} holds no API key")
            keys += found
        return tuple(dict.fromkeys(keys))

    def name(self) -> str:
        """The one model name this server answers to."""
        return self.model_name or os.path.basename(self.model_path)

    def batched(self) -> bool:
        """Whether the slots' generations decode together on one :class:`~specstate.SharedEngine`."""
        return not self.separate_slots and self.mode in BATCHED_MODES

    def policy(self) -> DraftPolicy:
        """The draft policy the slots' generations run: ``draft_policy`` when speculating, else ``fixed``."""
        return "fixed" if self.mode == "none" else self.draft_policy

    def engine_threads(self) -> int:
        """Threads of the batched engine: ``n_threads``, or the default thread count (docs/threads.md)."""
        return self.n_threads or default_threads()

    def threads_per_slot(self) -> int:
        """Threads each slot decodes with: when ``n_threads`` is 0, the default thread count of one of ``slots``
        generations decoding at once in this process (:func:`specstate.default_threads`, docs/threads.md)."""
        return self.n_threads or default_threads(self.slots)
