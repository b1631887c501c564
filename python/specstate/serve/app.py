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
in native compute, so slots run side by side. With ``ray_workers``, each of that
many Ray workers runs slots of its own, as these do, on the same requests
(:mod:`specstate.serve.ray`).

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
What is kept between requests (prompt cells and states, conversations, lookup
corpora) is kept by tenant, the API key narrowed by ``user`` and ``cache_salt``,
and reused only by that tenant (none of it with ``no_cross_request_reuse``).

Safety: binds 127.0.0.1 unless told otherwise; an optional API key (``--api-key``
or ``SPECSTATE_API_KEY``, compared in constant time) guards every endpoint but
``/health`` (``/metrics`` too, unless ``metrics_public``); every request is read
once by :func:`specstate.serve.request.read_request`, each field checked and
bounded (:class:`~specstate.serve.request.RequestLimits`) before anything is
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
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specstate import Model, SharedEngine
from specstate.chat import chat_template
from specstate.errors import ChatTemplateError
from specstate.llama.options import tool_prompt
from specstate.serve import messages, responses
from specstate.serve.cache import DEFAULT_TENANT, ConversationCache, TenantCorpora, key_identity, tenant_of
from specstate.serve.config import ServerConfig
from specstate.serve.embeddings import EmbeddingJob, Embeddings, read_embedding_request
from specstate.serve.jobs import DONE, Job, Metrics, engine_counters
from specstate.serve.request import Kind, RequestError, ServerRequest, read_json, read_request
from specstate.serve.scheduler import Scheduler
from specstate.serve.slots import Slot, lookup_corpora, start_slots

if TYPE_CHECKING:
    from specstate.serve.ray import RayDriver

__all__ = ["Server", "build_app", "running", "serve"]

#: Seconds a client told 429 is asked to wait.
RETRY_AFTER_SECONDS = 1

#: Threads reading requests (their bodies' JSON and fields: linear work, bounded by the request limits).
READER_THREADS = 4

T = TypeVar("T")
#: Another API's request body made into the chat or completion request it means.
Translation = Callable[[dict[str, Any]], dict[str, Any]]


# --- HTTP ------------------------------------------------------------------------------------------


class Server:
    """The application's state: configuration, slots, queue, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.scheduler = Scheduler(config.queue, config.slots, config.parked_bytes, config.spill_dir)
        self.cache = ConversationCache(config.cache_bytes, config.cache_dir, config.cache_dir_bytes)
        self.slots: list[Slot] = []
        #: The engine the slots' generations decode on together (None: separate slots, or the Ray workers).
        self.engine: SharedEngine | None = None
        self.driver: RayDriver | None = None
        self.started = int(time.time())
        #: The chat template's source, once the model is loaded ("" for a model without one).
        self.template = ""
        #: The target model, once loaded.
        self.model: Model | None = None
        self.embeddings = Embeddings(
            config.embedding_pooling,
            config.n_ctx,
            config.threads_per_slot(),
            workers=config.embedding_workers,
            capacity=config.embedding_queue,
            metrics=self.metrics,
        )
        #: The threads that read requests (bodies parsed, every field checked), and nothing else: no model work
        #: waits there, so a request is read however busy the slots and the embedding workers are.
        self.reader = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="specstate-read")
        #: The slots' lookup corpora, once started (:func:`~specstate.serve.slots.lookup_corpora`; the Ray workers
        #: keep their own).
        self.corpora: TenantCorpora | None = None
        #: Stored responses (``/v1/responses``), each API key's, in ``cache_dir`` too when it is given.
        self.responses = responses.ResponseStore(config.cache_dir)
        keys = config.api_keys()
        #: Each API key's ``Authorization`` header and identity (one key: the default tenant's).
        self.keys = [(f"Bearer {key}".encode(), key_identity(key) if len(keys) > 1 else DEFAULT_TENANT) for key in keys]

    def submit(self, job: Job) -> None:
        """Queue ``job`` on the slots or the Ray workers (:class:`RequestError` 429 when full)."""
        if self.driver is not None:
            self.driver.submit(job)
        else:
            self.scheduler.submit(job)

    def corpus_documents(self) -> dict[str, int] | None:
        """The documents of each tenant's lookup corpus (on the Ray backend, the workers' summed); None: requests
        keep none."""
        if self.driver is not None:
            return self.driver.corpus_documents()
        return None if self.corpora is None else self.corpora.documents()

    def engine_counters(self) -> dict[str, int] | None:
        """The batched engine's counters (on the Ray backend, the workers' summed); None: no batched engine."""
        if self.driver is not None:
            return self.driver.engine_counters()
        return engine_counters(self.engine)

    def gauges(self) -> tuple[int, int, int]:
        """Requests waiting, generations running, bytes parked."""
        if self.driver is not None:
            return self.driver.depth(), self.driver.busy(), 0
        return self.scheduler.depth(), self.scheduler.busy, self.scheduler.parked()

    def start(self) -> None:
        """Start the slots (or the Ray workers, each with slots of its own) and wait until each has loaded its model
        (raising the first failure)."""
        if self.config.ray_workers:
            from specstate.serve.ray import RayDriver

            self.driver = RayDriver(
                self.config, self.metrics, self.cache, self.config.ray_workers, self.config.ray_address
            )
            self.driver.start()
            self.driver.loaded.wait()
            if self.driver.error is not None:
                raise self.driver.error
            assert self.driver.model is not None
            self.model = self.driver.model
            self.template = _template_source(self.model, self.config)
            return
        self.corpora = lookup_corpora(self.config)
        self.slots, self.engine = start_slots(self.config, self.scheduler, self.metrics, self.cache, self.corpora, None)
        assert self.slots[0].llama is not None
        self.model = self.slots[0].llama.model
        self.template = _template_source(self.model, self.config)

    def stop(self) -> None:
        self.scheduler.close()
        self.embeddings.close()
        self.reader.shutdown(wait=False, cancel_futures=True)
        if self.driver is not None:
            self.driver.closed = True
            self.driver.join(timeout=60)
        self.cache.flush()

    def authorize(self, request: Request) -> str:
        """The identity of the request's API key (the default tenant's when the server has at most one key); 401
        without a valid key. Every key is compared, each in constant time."""
        if not self.keys:
            return DEFAULT_TENANT
        given = _given_key(request)
        matched = [identity for expected, identity in self.keys if hmac.compare_digest(given, expected)]
        if not matched:
            raise RequestError(401, "a valid API key is needed (Authorization: Bearer ...)", "authentication_error")
        return matched[0]

    def tenant(self, request: Request, read: ServerRequest) -> str | None:
        """Whose earlier requests' work ``read`` may start from: its API key's, narrowed by its ``user`` and
        ``cache_salt`` (None when nothing is reused between requests)."""
        if self.config.no_cross_request_reuse:
            return None
        return tenant_of(self.authorize(request), read.user, read.cache_salt)

    async def body(self, request: Request) -> bytes:
        """The request's body, read up to the limit (413 beyond)."""
        limit = self.config.limits.max_body_bytes
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise RequestError(413, f"the request body is larger than {limit} bytes")
        return bytes(data)

    async def read(self, request: Request, kind: Kind, translate: Translation | None = None) -> ServerRequest:
        """The request as a checked :class:`ServerRequest` (read off the event loop), with its tenant;
        ``translate`` makes another API's body (Anthropic's Messages) the chat request it means, first."""
        read = await self.off_loop(self._read, await self.body(request), kind, translate)
        return dataclasses.replace(read, tenant=self.tenant(request, read))

    async def off_loop(self, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)`` on the threads that read requests (:attr:`reader`)."""
        return await asyncio.get_running_loop().run_in_executor(self.reader, read, *args)

    def _read(self, data: bytes, kind: Kind, translate: Translation | None = None) -> ServerRequest:
        body = read_json(data, self.config.limits)
        return self.read_body(translate(body) if translate is not None else body, kind)

    def read_body(self, body: dict[str, Any], kind: Kind = "chat") -> ServerRequest:
        """A chat or completion request's JSON object, read by the one request reader."""
        limits = self.config.limits
        return read_request(kind, body, limits, model_name=self.config.name(), template_source=self.template)

    def stored_conversation(self, owner: str, ident: str | None) -> list[dict[str, Any]]:
        """The chat messages of ``owner``'s stored response ``ident`` (none for None); 400 if there is none."""
        if ident is None:
            return []
        found = self.responses.get(owner, ident)
        if found is None:
            raise RequestError(400, f"no stored response {ident!r}", param="previous_response_id")
        return found[1]

    def count_tokens(self, data: bytes) -> int:
        """The tokens of the prompt a Messages request would decode (``/v1/messages/count_tokens``)."""
        chat = messages.chat_body(read_json(data, self.config.limits), count_only=True)
        read = self.read_body({**chat, "max_tokens": 1})
        assert self.model is not None
        if not read.tools:
            return len(chat_template(self.model, self.config.chat_template).prompt_tokens(list(read.pairs)))
        assert read.chat is not None and read.chat.rendered is not None
        prompt = tool_prompt(self.model, read.chat.rendered, read.call, self.config.chat_template)
        return len(prompt.tokens())

    async def embed(self, request: Request) -> Response:
        """The reply to an embeddings request: read on the request readers, computed by the embedding workers
        (429 when their queue is full); a client that leaves cancels it."""
        texts, base64_floats = await self.off_loop(self._read_embeddings, await self.body(request))
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[object] = loop.create_future()

        def settle(item: object) -> None:
            if not answer.done():  # cancelled once its client left
                answer.set_result(item)

        def deliver(item: object) -> None:
            loop.call_soon_threadsafe(settle, item)

        job = EmbeddingJob(texts, base64_floats, deliver)
        assert self.model is not None
        self.embeddings.submit(self.model, self.config.name(), job)
        try:
            reply = await _unless_gone(answer, request)
        finally:
            job.cancelled.set()  # a no-op once it is answered; else its client went away
        if reply is _GONE:
            return Response(status_code=CLIENT_GONE)
        if isinstance(reply, RequestError):
            raise reply
        return JSONResponse(reply)

    def _read_embeddings(self, data: bytes) -> tuple[list[str], bool]:
        return read_embedding_request(read_json(data, self.config.limits), self.config.name())

    def model_entry(self) -> dict[str, Any]:
        """The one model, as ``/v1/models`` lists it."""
        return {"id": self.config.name(), "object": "model", "created": self.started, "owned_by": "specstate"}

    def health(self) -> tuple[dict[str, Any], int]:
        """``/health``'s body and status: 503 when nothing serves, "degraded" when a slot does not."""
        if self.driver is not None:
            total, serving = self.config.ray_workers, self.driver.serving()
        else:
            total, serving = len(self.slots), sum(slot.serving() for slot in self.slots)
        status = "ok" if serving == total else "degraded" if serving else "unavailable"
        return {"status": status, "slots": total, "slots_serving": serving}, 200 if serving else 503


Handler = Callable[["Server", Request], Awaitable[Response]]


def build_app(config: ServerConfig) -> tuple[Starlette, Server]:
    """The ASGI application and its state (the slots start with the application)."""
    server = Server(config)

    def endpoint(handler: Handler, name: str | None) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` bound to the server; a refusal or a failure as an OpenAI error body (never a bare 500),
        counted under ``name`` when it has one."""

        shape = messages.error_body if name in _ANTHROPIC else RequestError.body

        async def answer(request: Request) -> Response:
            try:
                response = await handler(server, request)
            except RequestError as error:
                response = _error_response(error, shape)
            except Exception as error:
                failure = RequestError.unforeseen(error)
                response = _error_response(failure, shape)
            if name is not None:
                server.metrics.request(name, response.status_code)
            return response

        return answer

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(server.start)
        try:
            yield
        finally:
            server.stop()

    routes = [Route(path, endpoint(handler, name), methods=[method]) for path, method, handler, name in _ROUTES]
    handlers = {404: _http_error, 405: _http_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers), server


async def _chat(server: Server, request: Request) -> Response:
    server.authorize(request)
    return await _answer(server, Job(await server.read(request, "chat"), _no_delivery), request)


async def _completion(server: Server, request: Request) -> Response:
    server.authorize(request)
    return await _answer(server, Job(await server.read(request, "completion"), _no_delivery), request)


async def _messages(server: Server, request: Request) -> Response:
    server.authorize(request)
    read = await server.read(request, "chat", messages.chat_body)
    if read.stream:  # message_delta carries the usage
        read = dataclasses.replace(read, include_usage=True)
    return await _answer(server, Job(read, _no_delivery), request, _Messages())


async def _responses(server: Server, request: Request) -> Response:
    owner = server.authorize(request)
    given = await server.off_loop(
        lambda data: responses.read_input(read_json(data, server.config.limits)), await server.body(request)
    )
    history = server.stored_conversation(owner, given.previous_response_id)
    read = await server.off_loop(server.read_body, responses.chat_body(given, history))
    read = dataclasses.replace(read, tenant=server.tenant(request, read), include_usage=read.stream)
    dialect = _Responses(server.responses, given, history, owner)
    return await _answer(server, Job(read, _no_delivery), request, dialect)


async def _stored_response(server: Server, request: Request) -> Response:
    found = server.responses.get(server.authorize(request), request.path_params["ident"])
    if found is None:
        raise RequestError(404, f"no stored response {request.path_params['ident']!r}", "not_found_error")
    return JSONResponse(found[0])


async def _delete_response(server: Server, request: Request) -> Response:
    ident = request.path_params["ident"]
    if not await server.off_loop(server.responses.delete, server.authorize(request), ident):
        raise RequestError(404, f"no stored response {ident!r}", "not_found_error")
    return JSONResponse({"id": ident, "object": "response", "deleted": True})


async def _count_tokens(server: Server, request: Request) -> Response:
    server.authorize(request)
    return JSONResponse({"input_tokens": await server.off_loop(server.count_tokens, await server.body(request))})


async def _embeddings(server: Server, request: Request) -> Response:
    server.authorize(request)
    return await server.embed(request)


async def _models(server: Server, request: Request) -> Response:
    server.authorize(request)
    return JSONResponse({"object": "list", "data": [server.model_entry()]})


async def _model(server: Server, request: Request) -> Response:
    server.authorize(request)
    name = request.path_params["model"]
    if name != server.config.name():
        raise RequestError(
            404, f"the model {name!r} does not exist; this server has {server.config.name()!r}", param="model"
        )
    return JSONResponse(server.model_entry())


async def _health(server: Server, request: Request) -> Response:
    body, status = server.health()
    return JSONResponse(body, status_code=status)


async def _metrics(server: Server, request: Request) -> Response:
    if not server.config.metrics_public:
        server.authorize(request)
    return PlainTextResponse(server.metrics.text(*server.gauges(), batch=server.engine_counters()))


#: Each path: its method, its handler, and the name its requests are counted under in /metrics (None: not).
_ROUTES: list[tuple[str, str, Handler, str | None]] = [
    ("/v1/chat/completions", "POST", _chat, "chat"),
    ("/v1/completions", "POST", _completion, "completions"),
    ("/v1/embeddings", "POST", _embeddings, "embeddings"),
    ("/v1/messages", "POST", _messages, "messages"),
    ("/v1/responses", "POST", _responses, "responses"),
    ("/v1/responses/{ident}", "GET", _stored_response, None),
    ("/v1/responses/{ident}", "DELETE", _delete_response, None),
    ("/v1/messages/count_tokens", "POST", _count_tokens, "count_tokens"),
    ("/v1/models", "GET", _models, None),
    ("/v1/models/{model:path}", "GET", _model, None),
    ("/health", "GET", _health, None),
    ("/metrics", "GET", _metrics, None),
]


#: The routes of Anthropic's API, whose errors have its shape.
_ANTHROPIC = {"messages", "count_tokens"}


def _no_delivery(item: object) -> None:
    raise AssertionError("a job delivers only once _answer has connected it")


async def _http_error(request: Request, error: Exception) -> Response:
    """A path the server does not have (404), or a method a path does not take (405), as an OpenAI error."""
    status = getattr(error, "status_code", 500)
    what = "no such path" if status == 404 else f"{request.method} is not allowed here"
    message = f"{what}: {request.url.path}"
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    headers = getattr(error, "headers", None)
    response = _error_response(RequestError(status, message, kind))
    if headers:
        response.headers.update(headers)
    return response


def _error_response(
    error: RequestError, shape: Callable[[RequestError], dict[str, Any]] = RequestError.body
) -> JSONResponse:
    """The error's body (OpenAI's unless ``shape`` says another API's), with ``Retry-After`` on a 429."""
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.status == 429 else None
    return JSONResponse(shape(error), status_code=error.status, headers=headers)


def _given_key(request: Request) -> bytes:
    """The request's ``Authorization`` header, or its ``x-api-key`` (Anthropic's clients') said as one."""
    header = request.headers.get("authorization")
    if header is None and "x-api-key" in request.headers:
        header = f"Bearer {request.headers['x-api-key']}"
    return (header or "").encode()


def _template_source(model: Model, config: ServerConfig) -> str:
    """The source of the chat template the server renders with. A template that does not parse, or whose setup
    exceeds a rendering bound (a model file is hostile input too), stops the server before it listens, naming
    the file and the reason."""
    try:
        return chat_template(model, config.chat_template).source
    except ChatTemplateError as error:
        whose = (
            "the chat template given" if config.chat_template is not None else f"{config.model_path}'s chat template"
        )
        raise ChatTemplateError(f"{whose} cannot be used: {error}; give another with --template") from None


async def _answer(server: Server, job: Job, request: Request, dialect: Dialect | None = None) -> Response:
    """Queue the job, wait for its first result (so a refusal is an error status), then answer (as OpenAI's chat
    completions answer, or as ``dialect`` says); a client that leaves before then cancels the job (a streamed
    one's later chunks notice it in :func:`_events`)."""
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
        events = (
            _events(job, first, results, server) if dialect is None else _said(dialect, job, first, results, server)
        )
        return StreamingResponse(events, media_type="text/event-stream")
    return JSONResponse(first if dialect is None else dialect.whole(first, job))  # type: ignore[arg-type]


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


class Dialect:
    """How another API says a chat's answer: whole (:meth:`whole`), or as its server-sent events (the
    :meth:`chunk` of each chat chunk, then the :meth:`end`, or an :meth:`error` in the middle)."""

    def whole(self, answer: dict[str, Any], job: Job) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def end(self, job: Job) -> list[str]:
        raise NotImplementedError

    def error(self, error: RequestError) -> str:
        raise NotImplementedError


class _Messages(Dialect):
    """Anthropic's Messages API (:mod:`specstate.serve.messages`)."""

    def __init__(self) -> None:
        self.events = messages.MessageEvents()

    def whole(self, answer: dict[str, Any], job: Job) -> dict[str, Any]:
        return messages.message(answer, _stop_sequence(job))

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        return self.events.chunk(chunk)

    def end(self, job: Job) -> list[str]:
        return self.events.end(_stop_sequence(job))

    def error(self, error: RequestError) -> str:
        return messages.error_event(error)


class _Responses(Dialect):
    """OpenAI's Responses API (:mod:`specstate.serve.responses`); a response asked to be stored is kept with its
    conversation, for its ``owner`` (the API key's identity)."""

    def __init__(
        self, store: responses.ResponseStore, given: responses.ResponsesInput, history: list[Any], owner: str
    ) -> None:
        self.store, self.given, self.history, self.owner = store, given, history, owner
        self.ident = responses.new_id()
        self.events = responses.ResponseEvents(given, self.ident)

    def whole(self, answer: dict[str, Any], job: Job) -> dict[str, Any]:
        made = responses.response(answer, self.given, self.ident)
        self._keep(made)
        return made

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        return self.events.chunk(chunk)

    def end(self, job: Job) -> list[str]:
        events = self.events.end()
        assert self.events.final is not None
        self._keep(self.events.final)
        return events

    def error(self, error: RequestError) -> str:
        return responses.error_event(error)

    def _keep(self, made: dict[str, Any]) -> None:
        if self.given.store:
            self.store.put(self.owner, made, responses.conversation(self.given, self.history, made))


async def _said(
    dialect: Dialect, job: Job, first: object, results: asyncio.Queue[object], server: Server
) -> AsyncIterator[str]:
    """The job's chunks as ``dialect``'s server-sent events; a client gone cancels the job."""
    item = first
    try:
        while item is not DONE:
            if isinstance(item, RequestError):
                yield dialect.error(item)
                return
            server.metrics.add("chunks")
            for event in dialect.chunk(item):  # type: ignore[arg-type]
                yield event
            item = await results.get()
        for event in dialect.end(job):
            yield event
    finally:
        job.cancelled.set()  # a no-op once the job is done; else the client went away


def _stop_sequence(job: Job) -> str | None:
    """The stop string that ended the job's reply, if one did."""
    return job.stop_sequence


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
