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
or ``SPECSTATE_API_KEY``, compared in constant time); bodies and ``max_tokens``
bounded; a request names only the server's own model; no request field reaches
the file system; bad JSON and bad parameters are 400 with an OpenAI-shaped error
body, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specstate import Generator, _files
from specstate._typing import Mode
from specstate.llama import ChatStream, Llama, ParkedChat, UnsupportedParameterError

if TYPE_CHECKING:
    from specstate.server_ray import PoolDriver

__all__ = ["ServerConfig", "build_app", "running", "serve"]

#: Largest request body accepted, in bytes.
MAX_BODY_BYTES = 1 << 20
#: Environment variable holding the API key when ``--api-key`` is not given.
API_KEY_VARIABLE = "SPECSTATE_API_KEY"
#: Seconds a client told 429 is asked to wait.
RETRY_AFTER_SECONDS = 1
#: The largest ``priority`` a request may give (and the negative of the smallest).
MAX_PRIORITY = 1000


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
    #: The most tokens one request may ask for (and what a chat without ``max_tokens`` gets at most).
    max_tokens: int = 4096
    api_key: str | None = None
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


class RequestError(Exception):
    """A request the server refuses: its HTTP status and OpenAI error ``type``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def __reduce__(self) -> tuple[Any, ...]:
        return (RequestError, (self.status, self.message, self.kind, self.param))

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=headers)


# --- conversations that come back -----------------------------------------------------------------


def conversation_key(messages: list[tuple[str, str]]) -> str:
    """The cache key of a conversation: the SHA-256 of its roles and texts."""
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()


class ConversationCache:
    """Checkpoints of finished chat turns, by the conversation they hold (its messages, the reply included).

    In memory up to ``memory_bytes``, the least recently used moved to ``directory`` when there is one (up to
    ``directory_bytes``, the least recently used file removed), else dropped. A directory's files are found
    again by a restarted server: ``<key>.ckpt``, written atomically, read back only as checkpoints."""

    def __init__(self, memory_bytes: int, directory: str | None = None, directory_bytes: int = 0) -> None:
        self.memory_bytes, self.directory_bytes = memory_bytes, directory_bytes
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._files: OrderedDict[str, int] = OrderedDict()  # key -> size, least recently used first
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            found = sorted(self.directory.glob("*.ckpt"), key=lambda path: path.stat().st_mtime)
            for path in found:
                if path.is_file() and len(path.stem) == 64:
                    self._files[path.stem] = path.stat().st_size

    def put(self, messages: list[tuple[str, str]], checkpoint: bytes) -> None:
        key = conversation_key(messages)
        with self._lock:
            self._memory[key] = checkpoint
            self._memory.move_to_end(key)
            while sum(len(data) for data in self._memory.values()) > self.memory_bytes and self._memory:
                old, data = self._memory.popitem(last=False)
                self._spill(old, data)

    def get(self, messages: list[tuple[str, str]]) -> bytes | None:
        key = conversation_key(messages)
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

    def longest(self, messages: list[tuple[str, str]]) -> tuple[int, bytes] | None:
        """The longest cached conversation that ``messages`` extend (it ends with a reply): its length and bytes."""
        for end in range(len(messages) - 1, 0, -1):
            if messages[end - 1][0] == "assistant" and (data := self.get(messages[:end])) is not None:
                return end, data
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


# --- jobs and slots --------------------------------------------------------------------------------


@dataclass
class Job:
    """One request on its way through a slot: what to call, and where its results go."""

    kind: str  # "chat" or "completion"
    body: dict[str, Any]
    stream: bool
    deliver: Callable[[object], None]  # called from the slot thread with each chunk, an exception, or DONE
    #: Higher runs first; a chat of lower priority is parked to make room for a higher one.
    priority: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Set by the scheduler: park at the next chunk boundary.
    preempt: threading.Event = field(default_factory=threading.Event)
    #: The paused reply, while the job waits to be resumed (its checkpoint in ``spilled`` when that is set).
    parked: ParkedChat | None = None
    spilled: Path | None = None
    parked_since: float = 0.0
    #: When it was submitted (oldest first among equal priorities).
    order: int = 0
    #: The chunks of a whole (non-streamed) chat answer so far: a chat always runs as a stream, so it can park.
    collected: list[Any] = field(default_factory=list)

    def preemptible(self) -> bool:
        """Only a chat is parked, streamed or not (a completion runs to its end)."""
        return self.kind == "chat"

    def messages(self) -> list[Any]:
        return list(self.body.get("messages", [])) if self.kind == "chat" else []


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
    """A thread that owns one :class:`Llama` and runs jobs to completion, one at a time."""

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
            finally:
                self.scheduler.finished(job)

    def _holds(self, job: Job) -> bool:
        generator = self.llama.chat_generator if self.llama is not None else None
        if generator is None or job.kind != "chat":
            return False
        held = generator.messages
        return 0 < len(held) < len(job.messages()) and _plain(job.messages()[: len(held)]) == _plain(held)

    def _run(self, job: Job) -> None:
        assert self.llama is not None
        if job.cancelled.is_set():  # its client left while it waited (parked, say)
            if job.spilled is not None:
                job.spilled.unlink(missing_ok=True)
            self.metrics.add("cancelled_requests")
            return
        if job.kind == "chat" and job.parked is None and not self._holds(job):
            self._restore_cached(job)
        try:
            if job.kind == "completion" and not job.stream:
                job.deliver(self.llama.create_completion(stream=False, **job.body))
            elif self._stream(job, self._chunks(job)):
                return
            elif not job.stream:
                job.deliver(_whole_chat(job.collected, self.llama.chat_generator))
            self._count(job)
            job.deliver(DONE)
        except (TypeError, ValueError, UnsupportedParameterError) as error:
            job.deliver(RequestError(400, str(error)))
        except Exception as error:  # the model failed (a full context, say): the client hears it, the slot goes on
            job.deliver(RequestError(500, f"{type(error).__name__}: {error}", "server_error"))

    def _chunks(self, job: Job) -> Iterator[Any]:
        """The job's chunks: a new call's, or the rest of its parked reply's."""
        assert self.llama is not None
        if job.parked is not None:
            self.metrics.add("parked_milliseconds", int((time.monotonic() - job.parked_since) * 1000))
            resumed, job.parked = self.llama.resume_chat(_unspilled(job)), None
            return resumed
        call = self.llama.create_chat_completion if job.kind == "chat" else self.llama.create_completion
        chunks: Iterator[Any] = call(stream=True, **job.body)
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
        return False

    def _count(self, job: Job) -> None:
        """Count the turn's speculation, and keep a chat's checkpoint for the conversation's next turn."""
        generator = self.llama.chat_generator if self.llama is not None and job.kind == "chat" else None
        if generator is not None:
            self.metrics.add("generated_tokens", len(generator.tokens))
            self.metrics.add("drafted_tokens", generator.drafted)
            self.metrics.add("accepted_tokens", generator.accepted)
            self.cache.put(_plain(generator.messages), generator.checkpoint())
            self.metrics.add("conversations_cached")

    def _restore_cached(self, job: Job) -> None:
        """Continue the longest cached conversation that the job's messages extend, if there is one."""
        assert self.llama is not None
        found = self.cache.longest(_plain(job.messages()))
        if found is None:
            return
        try:
            self.llama.restore_chat(found[1])
        except Exception:  # a checkpoint of another build or model: the turn is decoded from its messages
            return
        self.metrics.add("conversations_restored")


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


def _plain(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """Role and text of each message (text parts joined as :class:`Llama` joins them)."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            content = "\n".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        out.append((str(message.get("role")) if isinstance(message, Mapping) else "", str(content)))
    return out


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

    async def body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, read up to :data:`MAX_BODY_BYTES`; the model checked and removed."""
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > MAX_BODY_BYTES:
                raise RequestError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RequestError(400, f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        return self._checked(body)

    def _checked(self, body: dict[str, Any]) -> dict[str, Any]:
        model = body.pop("model", None)
        if model is not None and model != self.config.name():
            raise RequestError(
                404,
                f"the model {model!r} does not exist; this server has {self.config.name()!r}",
                "invalid_request_error",
                "model",
            )
        n = body.pop("n", 1)
        if n != 1 or isinstance(n, bool):
            raise RequestError(400, "n must be 1: one choice per request", param="n")
        body.pop("user", None)  # OpenAI's end-user id: nothing to do with it
        body.pop("stream_options", None)
        limit = self.config.max_tokens
        tokens = body.get("max_tokens", body.pop("max_completion_tokens", None))
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > limit:
            raise RequestError(400, f"max_tokens must be at most {limit}, not {tokens}", param="max_tokens")
        body["max_tokens"] = limit if tokens is None else tokens
        return body


def build_app(config: ServerConfig) -> tuple[Starlette, Server]:
    """The ASGI application and its state (the slots start with the application)."""
    server = Server(config)

    async def completions(request: Request, kind: str, endpoint: str) -> Response:
        try:
            server.authorize(request)
            body = await server.body(request)
            stream = body.pop("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(400, "stream must be a boolean", param="stream")
            response = await _answer(server, Job(kind, body, stream, _no_delivery, _priority(body)))
        except RequestError as error:
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.status == 429 else None
            server.metrics.request(endpoint, error.status)
            return error.response(headers)
        server.metrics.request(endpoint, 200)
        return response

    async def chat(request: Request) -> Response:
        return await completions(request, "chat", "chat")

    async def completion(request: Request) -> Response:
        return await completions(request, "completion", "completions")

    async def models(request: Request) -> Response:
        try:
            server.authorize(request)
        except RequestError as error:
            return error.response()
        entry = {"id": server.config.name(), "object": "model", "created": server.started, "owned_by": "specstate"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "slots": len(server.slots)})

    async def metrics(request: Request) -> Response:
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


def _priority(body: dict[str, Any]) -> int:
    """The request's ``priority`` (an integer, higher first; default 0), removed from the body."""
    priority = body.pop("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise RequestError(400, f"priority must be an integer from {-MAX_PRIORITY} to {MAX_PRIORITY}", param="priority")
    return priority


async def _answer(server: Server, job: Job) -> Response:
    """Queue the job, wait for its first result (so a refusal is an error status), then answer."""
    loop = asyncio.get_running_loop()
    results: asyncio.Queue[object] = asyncio.Queue()

    def deliver(item: object) -> None:
        loop.call_soon_threadsafe(results.put_nowait, item)

    job.deliver = deliver
    server.submit(job)
    first = await results.get()
    if isinstance(first, RequestError):
        raise first
    if job.stream:
        return StreamingResponse(_events(job, first, results, server), media_type="text/event-stream")
    return JSONResponse(first)


async def _events(job: Job, first: object, results: asyncio.Queue[object], server: Server) -> AsyncIterator[str]:
    """Server-sent events: each chunk as ``data: {json}``, then ``data: [DONE]``; a client gone cancels the job."""
    item = first
    try:
        while item is not DONE:
            if isinstance(item, RequestError):
                yield _event({"error": {"message": item.message, "type": item.kind}})
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
