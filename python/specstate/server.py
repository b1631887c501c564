"""``specstate serve``: an OpenAI-compatible HTTP server over :class:`specstate.Llama`.

Starlette under uvicorn: a small, well-kept ASGI stack (the one FastAPI is built
on) whose streaming responses notice a client that goes away, with no framework
layer between a request and the model. Endpoints: ``POST /v1/chat/completions``
and ``POST /v1/completions`` (llama-cpp-python's parameters; ``stream`` as
server-sent events ending in ``data: [DONE]``), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text).

Slots and a queue: ``slots`` threads each own a :class:`~specstate.Llama` (a
generator's contexts belong to the thread that made it) and take requests from
one bounded queue, the highest ``priority`` first (a request field, an integer,
default 0); a full queue answers 429 with ``Retry-After``. A client that
disconnects stops its generation after the piece being made. The GIL is released
in native compute, so slots run side by side.

Preemption without loss: a request that finds every slot busy, one of them with
a chat of lower priority, has that reply parked -- checkpointed between
two chunks, its contexts freed, the checkpoint kept in memory up to
``parked_bytes`` and then in ``spill_dir`` -- and resumed in the next free slot,
its stream going on token for token with no gap and no duplicate (a whole answer
runs as a stream inside the server, so it parks too). A completion runs to its
end.

Conversations that come back: a finished chat turn's checkpoint is kept in a
bounded cache (memory, then ``cache_dir``, least recently used evicted; a
restarted server reads the directory again). A chat whose messages extend a
conversation a slot holds, or one in the cache, decodes only its new messages.

Safety: binds 127.0.0.1 unless told otherwise; an optional API key (``--api-key``
or ``SPECSTATE_API_KEY``, compared in constant time) guards every endpoint but
``/health`` (``/metrics`` too, unless ``metrics_public``); every request is read
once by :func:`specstate.server_request.read_request`, each field checked and
bounded (:class:`~specstate.server_request.RequestLimits`) before anything is
cached, hashed, queued or decoded; a request names only the server's own model;
no request field reaches the file system; bad JSON and bad parameters are 400
with an OpenAI-shaped error body naming the field. A slot never dies on a
request: whatever goes wrong becomes that request's error (a 500 with an
OpenAI-shaped body) and the slot takes the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import stat
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specstate import Generator, Model, _files
from specstate._typing import Message, Mode
from specstate.chat import chat_template
from specstate.llama import (
    ChatStream,
    CompletionStream,
    Llama,
    ParkedChat,
    UnsupportedParameterError,
    joined_completion,
)
from specstate.server_request import Kind, RequestError, RequestLimits, ServerRequest, read_json, read_request

if TYPE_CHECKING:
    from specstate.server_ray import PoolDriver

__all__ = ["RequestError", "RequestLimits", "ServerConfig", "build_app", "running", "serve"]

#: Environment variable holding the API key when ``--api-key`` is not given.
API_KEY_VARIABLE = "SPECSTATE_API_KEY"
#: Seconds a client told 429 is asked to wait.
RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class ServerConfig:
    """What ``specstate serve`` runs: the model, how it speculates, slots, queue and limits."""

    model_path: str
    mode: Mode = "none"
    draft_model_path: str | None = None
    n_draft: int = 8
    n_ctx: int = 2048
    #: Threads per slot (0: the CPUs available, shared out between the slots).
    n_threads: int = 0
    slots: int = 1
    #: Requests that may wait for a slot; one more is refused with 429.
    queue: int = 16
    #: What one request may ask for: tokens, messages, stop strings, body size, ... (each an option).
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_key: str | None = None
    #: Serve ``/metrics`` without the API key (for a scraper on a trusted network).
    metrics_public: bool = False
    chat_template: str | None = None
    #: The model name clients use (by default the file's name).
    model_name: str | None = None
    #: Bytes of conversation checkpoints kept in memory (least recently used evicted, to the directory if any).
    cache_bytes: int = 1 << 30
    #: A directory keeping conversation checkpoints across restarts (None: memory only).
    cache_dir: str | None = None
    #: Bytes of conversation checkpoints kept in ``cache_dir``.
    cache_dir_bytes: int = 8 << 30
    #: Bytes of parked replies' checkpoints kept in memory; beyond them they go to ``spill_dir``, or (without
    #: one) nothing more is parked.
    parked_bytes: int = 1 << 30
    #: A directory for parked replies' checkpoints beyond ``parked_bytes`` (removed when resumed).
    spill_dir: str | None = None
    #: Serve from a pool of this many Ray workers (``slots`` generations each) instead of slot threads.
    ray_workers: int = 0
    #: The Ray cluster to join (None: a local instance).
    ray_address: str | None = None

    def name(self) -> str:
        """The one model name this server answers to."""
        return self.model_name or os.path.basename(self.model_path)

    def threads_per_slot(self) -> int:
        """Threads each slot decodes with: the CPUs shared out when ``n_threads`` is 0."""
        return self.n_threads or max(1, len(os.sched_getaffinity(0)) // self.slots)


# --- conversations that come back -----------------------------------------------------------------


Pairs = Sequence[tuple[str, str]]


def conversation_keys(messages: Pairs) -> Iterator[tuple[int, str]]:
    """``(n, key)`` for each prefix of ``messages`` (its first ``n``), in one pass over their text: the cache key
    of a conversation is the SHA-256 of its messages' roles and texts, one JSON line each."""
    digest = hashlib.sha256()
    for n, (role, text) in enumerate(messages, 1):
        digest.update(json.dumps([role, text], ensure_ascii=False).encode() + b"\n")
        yield n, digest.copy().hexdigest()


def conversation_key(messages: Pairs) -> str:
    """The cache key of a whole conversation (see :func:`conversation_keys`)."""
    keys = [key for _, key in conversation_keys(messages)]
    return keys[-1] if keys else hashlib.sha256().hexdigest()


class ConversationCache:
    """Checkpoints of finished chat turns, by the conversation they hold (its messages, the reply included).

    In memory up to ``memory_bytes``, the least recently used moved to ``directory`` when there is one (up to
    ``directory_bytes``, the least recently used file removed), else dropped. A directory's files are found
    again by a restarted server: ``<key>.ckpt``, written atomically, read back only as checkpoints (anything
    else there, a link or a FIFO named so included, is passed over)."""

    def __init__(self, memory_bytes: int, directory: str | None = None, directory_bytes: int = 0) -> None:
        self.memory_bytes, self.directory_bytes = memory_bytes, directory_bytes
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._files: OrderedDict[str, int] = OrderedDict()  # key -> size, least recently used first
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            for key, size in _checkpoint_files(self.directory):
                self._files[key] = size

    def put(self, messages: Pairs, checkpoint: bytes) -> None:
        key = conversation_key(messages)
        with self._lock:
            self._memory[key] = checkpoint
            self._memory.move_to_end(key)
            while sum(len(data) for data in self._memory.values()) > self.memory_bytes and self._memory:
                old, data = self._memory.popitem(last=False)
                self._spill(old, data)

    def get(self, key: str) -> bytes | None:
        """The checkpoint cached under ``key`` (None if none, or if its file is gone or damaged)."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
            if key not in self._files or self.directory is None:
                return None
            self._files.move_to_end(key)
            path = self.directory / f"{key}.ckpt"
        try:
            return _files.read_checkpoint(path)
        except Exception:  # removed or damaged behind the server's back: as if never cached
            return None

    def longest(self, messages: Pairs) -> tuple[int, bytes] | None:
        """The longest cached conversation that ``messages`` extend (it ends with a reply): its length and bytes."""
        ends = [(n, key) for n, key in conversation_keys(messages[:-1]) if messages[n - 1][0] == "assistant"]
        for n, key in reversed(ends):
            if (data := self.get(key)) is not None:
                return n, data
        return None

    def _spill(self, key: str, data: bytes) -> None:
        if self.directory is None or len(data) > self.directory_bytes:
            return
        _files.replace_atomically(self.directory / f"{key}.ckpt", data, 0o600)
        self._files[key] = len(data)
        self._files.move_to_end(key)
        while sum(self._files.values()) > self.directory_bytes:
            old, _ = self._files.popitem(last=False)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / f"{old}.ckpt").unlink()

    def flush(self) -> None:
        """Move every checkpoint held in memory to the directory (at shutdown, so a restart finds them)."""
        with self._lock:
            while self._memory:
                key, data = self._memory.popitem(last=False)
                self._spill(key, data)


def _checkpoint_files(directory: Path) -> list[tuple[str, int]]:
    """``(key, size)`` of the regular files ``<key>.ckpt`` in ``directory``, oldest first (links, FIFOs, devices
    and files that vanish while being looked at are passed over)."""
    found = []
    for path in directory.glob("*.ckpt"):
        try:
            status = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode) and len(path.stem) == 64:
            found.append((status.st_mtime, path.stem, status.st_size))
    return [(key, size) for _, key, size in sorted(found)]


# --- jobs and slots --------------------------------------------------------------------------------


@dataclass
class Job:
    """One request on its way through a slot: what to call, and where its results go."""

    request: ServerRequest
    deliver: Callable[[object], None]  # called from the slot thread with each chunk, an exception, or DONE
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Set by the scheduler: park at the next chunk boundary.
    preempt: threading.Event = field(default_factory=threading.Event)
    #: The paused reply, while the job waits to be resumed (its checkpoint in ``spilled`` when that is set).
    parked: ParkedChat | None = None
    spilled: Path | None = None
    parked_since: float = 0.0
    #: When it was submitted (oldest first among equal priorities).
    order: int = 0
    #: The chunks of a whole (non-streamed) answer so far: every request runs as a stream, so that it can stop
    #: when its client leaves (and a chat can park).
    collected: list[Any] = field(default_factory=list)
    #: The stream that made them, once it is done.
    chunks: Iterator[Any] | None = None

    @property
    def kind(self) -> str:
        """``chat`` or ``completion``."""
        return self.request.kind

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def priority(self) -> int:
        """Higher runs first; a chat of lower priority is parked to make room for a higher one."""
        return self.request.priority

    def preemptible(self) -> bool:
        """Only a chat is parked, streamed or not (a completion runs to its end)."""
        return self.kind == "chat"


DONE = object()


class Metrics:
    """Counters for ``/metrics``, updated from the slot threads and the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.counts: Counter[str] = Counter()

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            self.counts[name] += value

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def text(self, queued: int, busy: int, parked_bytes: int) -> str:
        lines = ["# TYPE specstate_requests_total counter"]
        with self._lock:
            for (endpoint, status), count in sorted(self.requests.items()):
                lines.append(f'specstate_requests_total{{endpoint="{endpoint}",status="{status}"}} {count}')
            for name, value in sorted(self.counts.items()):
                lines += [f"# TYPE specstate_{name}_total counter", f"specstate_{name}_total {value}"]
        lines += ["# TYPE specstate_queue_depth gauge", f"specstate_queue_depth {queued}"]
        lines += ["# TYPE specstate_slots_busy gauge", f"specstate_slots_busy {busy}"]
        lines += ["# TYPE specstate_parked_bytes gauge", f"specstate_parked_bytes {parked_bytes}"]
        return "\n".join(lines) + "\n"


class Scheduler:
    """The bounded queue the slots take jobs from: the highest priority first, then a chat that extends the
    slot's conversation, then the oldest. A job that finds every slot busy with a chat of lower
    priority has the lowest of them parked (checkpointed between two chunks); a parked job waits in the queue
    with its checkpoint (up to ``parked_bytes`` of them) and resumes token for token in the next free slot."""

    def __init__(self, capacity: int, slots: int, parked_bytes: int = 1 << 30, spill: str | None = None) -> None:
        self.capacity, self.slots, self.parked_bytes = capacity, slots, parked_bytes
        self.spill = None if spill is None else Path(spill)
        if self.spill is not None:
            self.spill.mkdir(parents=True, exist_ok=True)
        self._jobs: list[Job] = []
        self._running: list[Job] = []
        self._ready = threading.Condition()
        self._submitted = 0
        self.closed = False

    @property
    def busy(self) -> int:
        with self._ready:
            return len(self._running)

    def submit(self, job: Job) -> None:
        with self._ready:
            idle = self.slots - len(self._running)
            if sum(j.parked is None for j in self._jobs) >= self.capacity + idle:
                raise RequestError(429, "the server is busy: every slot is taken and the queue is full", "rate_limit")
            self._submitted += 1
            job.order = self._submitted
            self._jobs.append(job)
            if idle <= 0:
                self._make_room(job.priority)
            self._ready.notify_all()

    def _make_room(self, priority: int) -> None:
        """Ask the lowest-priority streamed chat running below ``priority`` (the newest of them) to park."""
        if self.spill is None and self.parked() >= self.parked_bytes:
            return
        below = [j for j in self._running if j.preemptible() and j.priority < priority and not j.preempt.is_set()]
        if below:
            min(below, key=lambda j: (j.priority, -j.order)).preempt.set()

    def park(self, job: Job, parked: ParkedChat) -> None:
        """A running job paused: back in the queue with its checkpoint (in the spill directory beyond the budget)."""
        if self.spill is not None and self.parked() + len(parked.checkpoint) > self.parked_bytes:
            job.spilled = self.spill / f"parked-{os.getpid()}-{job.order}.ckpt"
            _files.replace_atomically(job.spilled, parked.checkpoint, 0o600)
            parked = dataclasses.replace(parked, checkpoint=b"")
        with self._ready:
            job.parked, job.parked_since = parked, time.monotonic()
            job.preempt.clear()
            self._running.remove(job)
            self._jobs.append(job)
            self._ready.notify_all()

    def parked(self) -> int:
        """Bytes of the parked jobs' checkpoints."""
        with self._ready:
            return sum(len(j.parked.checkpoint) for j in self._jobs if j.parked is not None)

    def take(self, holds: Callable[[Job], bool]) -> Job | None:
        """The next job for a slot (``holds``: whether the slot holds that job's conversation); None once closed."""
        with self._ready:
            while not self._jobs and not self.closed:
                self._ready.wait()
            if self.closed:
                return None
            job = min(self._jobs, key=lambda j: (-j.priority, not holds(j), j.order))
            self._jobs.remove(job)
            self._running.append(job)
            return job

    def finished(self, job: Job) -> None:
        with self._ready:
            if job in self._running:
                self._running.remove(job)

    def depth(self) -> int:
        with self._ready:
            return len(self._jobs)

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()


class Slot(threading.Thread):
    """A thread that owns one :class:`Llama` and runs jobs to completion, one at a time. It never dies on a
    request: whatever a job raises becomes that job's error, and the slot takes the next one."""

    def __init__(self, server: Server, loaded: threading.Event) -> None:
        super().__init__(daemon=True, name="specstate-slot")
        self.config, self.scheduler, self.metrics = server.config, server.scheduler, server.metrics
        self.cache, self.loaded = server.cache, loaded
        self.llama: Llama | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.llama = _load(self.config)
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
        if generator is None or job.kind != "chat":
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
            if job.kind == "chat" and job.parked is None and not self._holds(job):
                self._restore_cached(job)
            if self._stream(job, self._chunks(job)):
                return
            if not job.stream:
                job.deliver(self._whole(job))
            self._count(job)
            job.deliver(DONE)
        except Exception as error:  # the client hears it, the slot goes on
            _deliver_error(job, error)

    def _chunks(self, job: Job) -> Iterator[Any]:
        """The job's chunks: a new call's, or the rest of its parked reply's (every request runs as a stream,
        so that a client that leaves stops it, and a chat can park)."""
        assert self.llama is not None
        if job.parked is not None:
            self.metrics.add("parked_milliseconds", int((time.monotonic() - job.parked_since) * 1000))
            resumed, job.parked = self.llama.resume_chat(_unspilled(job)), None
            return resumed
        options = dict(job.request.options)
        chunks: Iterator[Any]
        if job.kind == "chat":
            chunks = self.llama.create_chat_completion(options.pop("messages"), stream=True, **options)
        else:
            chunks = self.llama.create_completion(options.pop("prompt"), stream=True, **options)
        return chunks

    def _stream(self, job: Job, chunks: Iterator[Any]) -> bool:
        """Deliver the chunks; True if the job stopped early (its client left, or it was parked)."""
        for chunk in chunks:
            if job.stream:
                job.deliver(chunk)
            else:
                job.collected.append(chunk)
            if job.cancelled.is_set():
                chunks.close()  # type: ignore[attr-defined]
                self.metrics.add("cancelled_requests")
                return True
            if job.preempt.is_set() and isinstance(chunks, ChatStream) and (parked := chunks.park()) is not None:
                self.scheduler.park(job, parked)
                self.metrics.add("preemptions")
                self.metrics.add("spilled_checkpoints", job.spilled is not None)
                return True
        job.chunks = chunks
        return False

    def _whole(self, job: Job) -> dict[str, Any]:
        """The whole answer that a non-streamed job's chunks make."""
        if isinstance(job.chunks, CompletionStream):
            return dict(joined_completion(job.collected, job.chunks.usage()))
        assert self.llama is not None
        return _whole_chat(job.collected, self.llama.chat_generator)

    def _count(self, job: Job) -> None:
        """Count the turn's speculation, and keep a chat's checkpoint for the conversation's next turn."""
        generator = self.llama.chat_generator if self.llama is not None and job.kind == "chat" else None
        if generator is not None:
            self.metrics.add("generated_tokens", len(generator.tokens))
            self.metrics.add("drafted_tokens", generator.drafted)
            self.metrics.add("accepted_tokens", generator.accepted)
            self.cache.put(_pairs(generator.messages), generator.checkpoint())
            self.metrics.add("conversations_cached")

    def _restore_cached(self, job: Job) -> None:
        """Continue the longest cached conversation that the job's messages extend, if there is one (one of
        another model, build or chat template is passed over: the turn is decoded from its messages)."""
        assert self.llama is not None
        found = self.cache.longest(job.request.pairs)
        if found is None:
            return
        try:
            self.llama.restore_chat(found[1])
        except Exception:
            return
        self.metrics.add("conversations_restored")


def _deliver_error(job: Job, error: BaseException) -> None:
    """Tell the job's client why it failed: a bad argument is a 400, anything else a 500."""
    if isinstance(error, RequestError):
        job.deliver(error)
    elif isinstance(error, (TypeError, ValueError, UnsupportedParameterError)):
        job.deliver(RequestError(400, str(error)))
    else:  # the model failed (a full context, say)
        job.deliver(RequestError(500, f"{type(error).__name__}: {error}", "server_error"))


def _whole_chat(chunks: list[Any], generator: Generator | None) -> dict[str, Any]:
    """The ``chat.completion`` that a whole answer's chunks make (usage from the generation that made them)."""
    last = chunks[-1]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    prompt, reply = (len(generator.prompt_tokens), len(generator.tokens)) if generator is not None else (0, 0)
    labels = (last["id"], last["created"], last["model"])
    whole = openai_result(True, labels, text, last["choices"][0]["finish_reason"], usage=(prompt, reply))
    parts = [chunk["choices"][0]["logprobs"] for chunk in chunks if chunk["choices"][0]["logprobs"] is not None]
    if parts:  # the call asked for log-probabilities: every chunk carries its tokens'
        content = [entry for part in parts for entry in part["content"] or []]
        whole["choices"][0]["logprobs"] = {"content": content, "refusal": None}
    return whole


def openai_result(
    chat: bool,
    labels: tuple[str, int, str],
    text: str,
    finish: str | None,
    *,
    usage: tuple[int, int] | None = None,
    first: bool = False,
) -> dict[str, Any]:
    """An OpenAI result: with ``usage`` (prompt and reply tokens) a whole one (``chat.completion`` or
    ``text_completion``), else a streamed chunk (``first``: a chat's, carrying the role). ``labels``: its
    ``id``, ``created`` and ``model``."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if not chat:
        kind = "text_completion"
        choice["text"] = text
    elif usage is not None:
        kind = "chat.completion"
        choice["message"] = {"role": "assistant", "content": text}
    else:
        kind = "chat.completion.chunk"
        choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    result: dict[str, Any] = {"id": labels[0], "object": kind, "created": labels[1], "model": labels[2]}
    result["choices"] = [choice]
    if usage is not None:
        result["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return result


def _unspilled(job: Job) -> ParkedChat:
    """The job's parked reply, its checkpoint read back (and the file removed) if it was spilled."""
    assert job.parked is not None
    if job.spilled is None:
        return job.parked
    path, job.spilled = job.spilled, None
    try:
        return dataclasses.replace(job.parked, checkpoint=_files.read_checkpoint(path))
    finally:
        path.unlink(missing_ok=True)


def _pairs(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """Role and text of each of a generator's messages."""
    return [(message["role"], message["content"]) for message in messages]


def _load(config: ServerConfig) -> Llama:
    return Llama(
        config.model_path,
        n_ctx=config.n_ctx,
        n_threads=config.threads_per_slot(),
        mode=config.mode,
        draft_model_path=config.draft_model_path,
        n_draft=config.n_draft,
        chat_template=config.chat_template,
        seed=-1,
    )


# --- HTTP ------------------------------------------------------------------------------------------


class Server:
    """The application's state: configuration, slots, queue, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.scheduler = Scheduler(config.queue, config.slots, config.parked_bytes, config.spill_dir)
        self.cache = ConversationCache(config.cache_bytes, config.cache_dir, config.cache_dir_bytes)
        self.slots: list[Slot] = []
        self.driver: PoolDriver | None = None
        self.started = int(time.time())
        #: The chat template's source, once the model is loaded ("" for a model without one).
        self.template = ""

    def submit(self, job: Job) -> None:
        """Queue ``job`` on the slots or the Ray pool (:class:`RequestError` 429 when full)."""
        if self.driver is not None:
            self.driver.submit(job)
        else:
            self.scheduler.submit(job)

    def gauges(self) -> tuple[int, int, int]:
        """Requests waiting, generations running, bytes parked."""
        if self.driver is not None:
            return self.driver.depth(), self.driver.busy(), 0
        return self.scheduler.depth(), self.scheduler.busy, self.scheduler.parked()

    def start(self) -> None:
        """Start the slots (or the Ray pool) and wait until each has loaded its model (raising the first failure)."""
        if self.config.ray_workers:
            from specstate.server_ray import PoolDriver

            self.driver = PoolDriver(self.config, self.metrics, self.config.ray_workers, self.config.ray_address)
            self.driver.start()
            self.driver.loaded.wait()
            if self.driver.error is not None:
                raise self.driver.error
            self.template = _template_source(self.driver.model, self.config.chat_template)
            return
        for _ in range(self.config.slots):
            loaded = threading.Event()
            slot = Slot(self, loaded)
            slot.start()
            loaded.wait()
            if slot.error is not None:
                self.scheduler.close()
                raise slot.error
            self.slots.append(slot)
        assert self.slots[0].llama is not None
        self.template = _template_source(self.slots[0].llama.model, self.config.chat_template)

    def stop(self) -> None:
        self.scheduler.close()
        if self.driver is not None:
            self.driver.closed = True
            self.driver.join(timeout=60)
        self.cache.flush()

    def authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise RequestError(401, "a valid API key is needed (Authorization: Bearer ...)", "authentication_error")

    async def read(self, request: Request, kind: Kind) -> ServerRequest:
        """The request's body, read up to the limit, as a checked :class:`ServerRequest` (off the event loop)."""
        limits = self.config.limits
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limits.max_body_bytes:
                raise RequestError(413, f"the request body is larger than {limits.max_body_bytes} bytes")
        return await asyncio.to_thread(self._read, bytes(data), kind)

    def _read(self, data: bytes, kind: Kind) -> ServerRequest:
        limits = self.config.limits
        body = read_json(data, limits)
        return read_request(kind, body, limits, model_name=self.config.name(), template_source=self.template)

    def health(self) -> tuple[dict[str, Any], int]:
        """``/health``'s body and status: 503 when nothing serves, "degraded" when a slot does not."""
        if self.driver is not None:
            total = serving = int(self.driver.is_alive())
        else:
            total, serving = len(self.slots), sum(slot.serving() for slot in self.slots)
        status = "ok" if serving == total else "degraded" if serving else "unavailable"
        return {"status": status, "slots": total, "slots_serving": serving}, 200 if serving else 503


def build_app(config: ServerConfig) -> tuple[Starlette, Server]:
    """The ASGI application and its state (the slots start with the application)."""
    server = Server(config)

    async def completions(request: Request, kind: Kind, endpoint: str) -> Response:
        try:
            server.authorize(request)
            job = Job(await server.read(request, kind), _no_delivery)
            response = await _answer(server, job, request)
        except RequestError as error:
            server.metrics.request(endpoint, error.status)
            return _error_response(error)
        except Exception as error:  # never a bare 500: an OpenAI-shaped body says what failed
            server.metrics.request(endpoint, 500)
            return _error_response(RequestError(500, f"{type(error).__name__}: {error}", "server_error"))
        server.metrics.request(endpoint, response.status_code)
        return response

    async def chat(request: Request) -> Response:
        return await completions(request, "chat", "chat")

    async def completion(request: Request) -> Response:
        return await completions(request, "completion", "completions")

    async def models(request: Request) -> Response:
        try:
            server.authorize(request)
        except RequestError as error:
            return _error_response(error)
        entry = {"id": server.config.name(), "object": "model", "created": server.started, "owned_by": "specstate"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        body, status = server.health()
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        try:
            if not server.config.metrics_public:
                server.authorize(request)
        except RequestError as error:
            return _error_response(error)
        return PlainTextResponse(server.metrics.text(*server.gauges()))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(server.start)
        try:
            yield
        finally:
            server.stop()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completion, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan), server


def _no_delivery(item: object) -> None:
    raise AssertionError("a job delivers only once _answer has connected it")


def _error_response(error: RequestError) -> JSONResponse:
    """OpenAI's error body, with ``Retry-After`` on a 429."""
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.status == 429 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _template_source(model: Model, template: str | None) -> str:
    """The source of the chat template the server renders with ("" for a model without one: its chats fail)."""
    try:
        return chat_template(model, template).source
    except Exception:
        return ""


async def _answer(server: Server, job: Job, request: Request) -> Response:
    """Queue the job, wait for its first result (so a refusal is an error status), then answer; a client that
    leaves before then cancels the job (a streamed one's later chunks notice it in :func:`_events`)."""
    loop = asyncio.get_running_loop()
    results: asyncio.Queue[object] = asyncio.Queue()

    def deliver(item: object) -> None:
        loop.call_soon_threadsafe(results.put_nowait, item)

    job.deliver = deliver
    server.submit(job)
    try:
        first = await _unless_gone(results.get(), request)
    finally:
        if not job.stream:
            job.cancelled.set()  # a no-op once the job is done; else its client went away
    if first is _GONE:
        return Response(status_code=CLIENT_GONE)
    if isinstance(first, RequestError):
        raise first
    if job.stream:
        return StreamingResponse(_events(job, first, results, server), media_type="text/event-stream")
    return JSONResponse(first)


#: The status recorded for a request whose client left before its answer (nginx's "client closed request").
CLIENT_GONE = 499
_GONE = object()


async def _unless_gone(result: Awaitable[object], request: Request) -> object:
    """``result``, or :data:`_GONE` once the client disconnects."""
    waiting = asyncio.ensure_future(result)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, gone):
            task.cancel()
    return waiting.result() if waiting.done() and not waiting.cancelled() else _GONE


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body is read by then: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(job: Job, first: object, results: asyncio.Queue[object], server: Server) -> AsyncIterator[str]:
    """Server-sent events: each chunk as ``data: {json}``, then ``data: [DONE]``; a client gone cancels the job."""
    item = first
    try:
        while item is not DONE:
            if isinstance(item, RequestError):
                yield _event(item.body())
                break
            server.metrics.add("chunks")
            yield _event(item)
            item = await results.get()
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # a no-op once the job is done; else the client went away


def _event(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


@contextlib.contextmanager
def running(config: ServerConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[tuple[str, Server]]:
    """Serve in a thread of this process (``port`` 0: a free one) until the block ends; yields the base URL
    (``http://HOST:PORT/v1``) and the server's state."""
    import uvicorn

    app, state = build_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="specstate-serve")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{bound}/v1", state
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the server until interrupted."""
    import uvicorn

    app, _ = build_app(config)
    uvicorn.run(app, host=host, port=port, log_level="warning")
