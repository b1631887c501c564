"""Slots: threads that each own a :class:`~specstate.Llama` and run jobs to completion."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from specstate._native import EXACT_PROMPT_ROWS, Model, SharedEngine
from specstate._typing import Message
from specstate.llama import (
    ChatStream,
    Llama,
    UnsupportedParameterError,
)
from specstate.llama.results import joined_chat, usage_chunk
from specstate.llama.types import CompletionUsage
from specstate.serve.cache import DEFAULT_TENANT, ConversationCache, TenantCorpora
from specstate.serve.config import ServerConfig
from specstate.serve.jobs import DONE, Completions, Job, Metrics, Snapshot
from specstate.serve.request import RequestError
from specstate.serve.scheduler import Scheduler, unspilled


class Slot(threading.Thread):
    """A thread that owns one :class:`Llama` and runs jobs to completion, one at a time. It never dies on a
    request: whatever a job raises becomes that job's error, and the slot takes the next one."""

    def __init__(
        self,
        config: ServerConfig,
        scheduler: Scheduler,
        metrics: Metrics,
        cache: ConversationCache,
        loaded: threading.Event,
        engine: SharedEngine | None = None,
        cost_curve: list[int] | None = None,
        corpora: TenantCorpora | None = None,
    ) -> None:
        super().__init__(daemon=True, name="specstate-slot")
        self.config, self.scheduler, self.metrics, self.cache, self.loaded = config, scheduler, metrics, cache, loaded
        self.engine = engine
        self.cost_curve = cost_curve
        #: Each tenant's lookup corpus (``ngram`` mode), which the slot drafts that tenant's requests from.
        self.corpora = corpora
        self.llama: Llama | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.llama = load(self.config, self.engine, self.cost_curve)
            self._serve(None if self.config.no_cross_request_reuse else DEFAULT_TENANT)
            self.cost_curve = self.llama.pin_cost_curve()
        except BaseException as error:  # reported by serve() before it listens
            self.error = error
            return
        finally:
            self.loaded.set()
        while (job := self.scheduler.take(self._holds)) is not None:
            try:
                self._run(job)
            except BaseException as error:  # the interpreter is going away: the client hears it first
                _deliver_error(job, error)
                raise
            finally:
                self.scheduler.finished(job)

    def serving(self) -> bool:
        """Whether the slot has its model and takes jobs."""
        return self.llama is not None and self.is_alive()

    def _holds(self, job: Job) -> bool:
        generator = self.llama.chat_generator if self.llama is not None else None
        if generator is None or job.kind != "chat" or job.request.tenant is None:
            return False
        if generator.reuse_key != job.request.tenant:  # another tenant's conversation is never continued
            return False
        held, pairs = _pairs(generator.messages), job.request.pairs
        return 0 < len(held) < len(pairs) and tuple(pairs[: len(held)]) == tuple(held)

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client left while it waited (parked, say)
            if job.spilled is not None:
                job.spilled.unlink(missing_ok=True)
            self.metrics.add("cancelled_requests")
            return
        try:
            self._serve(job.request.tenant)
            if job.kind == "chat" and job.parked is None and not job.request.tools and not self._holds(job):
                self._restore_cached(job)
            if self._stream(job, self._chunks(job)):
                return
            if isinstance(job.chunks, ChatStream):
                job.stop_sequence = job.chunks.stop_sequence
            if not job.stream:
                job.deliver(self._whole(job))
            elif job.request.include_usage and job.last is not None:
                job.deliver(usage_chunk(job.last, self._usage(job)))
            self._count(job)
            job.deliver(DONE)
        except Exception as error:  # the client hears it, the slot goes on
            _deliver_error(job, error)

    def _serve(self, tenant: str | None) -> None:
        """Let the next job start only from its tenant's earlier work: the cells the engine keeps and the
        conversation held under the tenant's key, and the tenant's lookup corpus (None: nothing of earlier
        requests)."""
        assert self.llama is not None
        self.llama.reuse_key = tenant
        self.llama.lookup_corpus = None if tenant is None or self.corpora is None else self.corpora.get(tenant)

    def _chunks(self, job: Job) -> Iterator[Any]:
        """The job's chunks: a new call's, or the rest of its parked reply's (every request runs as a stream,
        so that a client that leaves stops it, and a chat can park)."""
        assert self.llama is not None
        self.llama.interrupt = job.cancelled.is_set  # its client leaves: the generation stops before its next token
        if job.parked is not None:
            self.metrics.add("parked_milliseconds", int((time.monotonic() - job.parked_since) * 1000))
            resumed, job.parked = self.llama.resume_chat(unspilled(job)), None
            return resumed
        request = job.request
        if request.chat is not None:
            return self.llama.chat_stream(request.chat, request.call)
        llama, call = self.llama, request.call
        return Completions(lambda prompt: llama.completion_stream(prompt, call), list(request.prompts))

    def _stream(self, job: Job, chunks: Iterator[Any]) -> bool:
        """Deliver the chunks; True if the job stopped early (its client left, or it was parked). A stream may
        hold its text back for many tokens (a tool call, a stop string that could be starting): the generation
        of a client that left ends before its next token (:attr:`Llama.interrupt`), and the stream with it."""
        for count, chunk in enumerate(chunks, 1):
            job.last = chunk
            if job.stream:
                job.deliver(chunk)
            else:
                job.collected.append(chunk)
            if job.snapshot_every and count % job.snapshot_every == 0 and isinstance(chunks, ChatStream):
                taken = chunks.snapshot()
                if taken is not None:
                    job.deliver(Snapshot(taken))
            if job.cancelled.is_set():
                break
            if job.preempt.is_set() and isinstance(chunks, ChatStream) and (parked := chunks.park()) is not None:
                self.scheduler.park(job, parked)
                self.metrics.add("preemptions")
                self.metrics.add("spilled_checkpoints", job.spilled is not None)
                return True
        if job.cancelled.is_set():
            chunks.close()  # type: ignore[attr-defined]
            self.metrics.add("cancelled_requests")
            return True
        job.chunks = chunks
        return False

    def _usage(self, job: Job) -> CompletionUsage:
        """The finished job's usage."""
        assert isinstance(job.chunks, (Completions, ChatStream))
        return job.chunks.usage()

    def _whole(self, job: Job) -> object:
        """The whole answer that a non-streamed job's chunks make."""
        if isinstance(job.chunks, Completions):
            return job.chunks.whole(job.collected)
        return joined_chat(job.collected, self._usage(job))

    def _count(self, job: Job) -> None:
        """Count the turn's speculation, and keep a chat's checkpoint for the conversation's next turn."""
        chat = job.kind == "chat" and not job.request.tools  # a chat with tools is rendered whole, not continued
        generator = self.llama.chat_generator if self.llama is not None and chat else None
        if generator is not None:
            self.metrics.add("generated_tokens", len(generator.tokens))
            self.metrics.add("drafted_tokens", generator.drafted)
            self.metrics.add("accepted_tokens", generator.accepted)
            if job.request.tenant is not None:
                self.cache.put(_pairs(generator.messages), generator.checkpoint(), job.request.tenant)
                self.metrics.add("conversations_cached")

    def _restore_cached(self, job: Job) -> None:
        """Continue the longest cached conversation that the job's messages extend, if there is one (one of
        another model, build or chat template is passed over: the turn is decoded from its messages)."""
        assert self.llama is not None
        tenant = job.request.tenant
        found = None if tenant is None else self.cache.longest(job.request.pairs, tenant)
        if found is None:
            return
        try:
            self.llama.restore_chat(found[1])
        except Exception:
            return
        self.metrics.add("conversations_restored")


def lookup_corpora(config: ServerConfig) -> TenantCorpora | None:
    """The tenants' lookup corpora that ``ngram`` mode's prompt lookup copies from, each tenant's from its own
    finished prompts and replies (None in the other modes, and when nothing is reused between requests)."""
    return TenantCorpora() if config.mode == "ngram" and not config.no_cross_request_reuse else None


def start_slots(
    config: ServerConfig,
    scheduler: Scheduler,
    metrics: Metrics,
    cache: ConversationCache,
    corpora: TenantCorpora | None,
    cost_curve: list[int] | None,
) -> tuple[list[Slot], SharedEngine | None]:
    """Start ``config.slots`` slots taking jobs from ``scheduler`` (on one batched engine when the mode batches,
    which is returned too), each once the one before has loaded its model; with the adaptive draft policy, the
    cost curve ``cost_curve`` pinned in each (None: measured by the first slot, then pinned in the others).
    The first slot's failure to load is raised (the scheduler closed)."""
    engine = shared_engine(config)
    slots: list[Slot] = []
    for _ in range(config.slots):
        loaded = threading.Event()
        slot = Slot(config, scheduler, metrics, cache, loaded, engine, cost_curve, corpora)
        slot.start()
        loaded.wait()
        if slot.error is not None:
            scheduler.close()
            raise slot.error
        slots.append(slot)
        cost_curve = slot.cost_curve
    return slots, engine


def _deliver_error(job: Job, error: BaseException) -> None:
    """Tell the job's client why it failed: a bad argument is a 400, anything else a 500."""
    if isinstance(error, RequestError):
        job.deliver(error)
    elif isinstance(error, (TypeError, ValueError, UnsupportedParameterError)):
        job.deliver(RequestError(400, str(error)))
    else:  # the model failed (a full context, say)
        job.deliver(RequestError.unforeseen(error))


def _pairs(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """Role and text of each of a generator's messages."""
    return [(message["role"], message["content"]) for message in messages]


def load(
    config: ServerConfig,
    engine: SharedEngine | None = None,
    cost_curve: list[int] | None = None,
) -> Llama:
    """A slot's :class:`Llama`: its generations on ``engine``'s sequences, or a model and contexts of its own;
    with the adaptive draft policy, ``cost_curve`` pinned (None: the slot measures it, and the server gives it to
    the next slots). The slot gives it each job's tenant (its reuse key and, in ``ngram`` mode, its lookup
    corpus) before the job runs."""
    return Llama(
        config.model_path,
        engine=engine,
        n_ctx=config.n_ctx,
        n_threads=config.threads_per_slot(),
        mode=config.mode,
        draft_model_path=config.draft_model_path,
        n_draft=config.n_draft,
        draft_policy=config.policy(),
        cost_curve=cost_curve,
        grammar_drafts=not config.no_grammar_drafts,
        chat_template=config.chat_template,
        seed=-1,
    )


#: The batched engine's memory for the states of given-back sequences (prompts that start like an earlier one of
#: the same tenant, once that one's sequence has been taken): about 23 KiB a token of SmolLM2, some 1,400 tokens;
#: none when nothing is reused between requests.
PROMPT_CACHE_BYTES = 32 << 20


def shared_engine(config: ServerConfig) -> SharedEngine | None:
    """The engine the slots share when their generations are batched: one sequence a slot (a slot's Llama gives
    its earlier generation's sequence back before it starts the next one), the threads sized to the machine; each
    tenant's kept cells and states serve only that tenant (the slots give each generation its tenant's key)."""
    if not config.batched():
        return None
    return SharedEngine(
        Model(config.model_path),
        n_seq=config.slots,
        n_ctx=config.n_ctx,
        n_batch=max(EXACT_PROMPT_ROWS, config.n_draft + 1),  # exact prompts: a prefix serves the next one
        n_threads=config.engine_threads(),
        prompt_cache_bytes=0 if config.no_cross_request_reuse else PROMPT_CACHE_BYTES,
    )
