"""``specstate serve --ray-workers N``: the slot backend, scaled out over Ray workers.

Each worker (:class:`~specstate.serve.ray_worker.ServeWorker`, a Ray actor) runs what the server runs without
Ray: ``slots`` slots, their generations batched on one engine where the mode batches, a scheduler with
priorities and parking, a conversation cache and the tenants' lookup corpora. A request is read once, by the
server's request reader, and the worker's slot runs the :class:`~specstate.serve.request.ServerRequest` as it is,
with :class:`specstate.Llama`'s own calls and result builder: stop strings, log-probabilities, ``echo``, tools,
``response_format`` and grammars, several prompts, the adaptive draft policy (in ``draft`` mode the cost curve timed by
the first worker and pinned in every other), tenants, and both agent APIs, as the slot backend serves them.

One driver thread places requests and streams their results back: the highest priority first, each on the worker
that holds its conversation when that worker has a free slot, else on the least loaded one with a free slot (a
request of higher priority than a chat running there goes to that worker, whose scheduler parks the chat). Every
finished chat turn's checkpoint comes back to the driver and is kept in the server's conversation cache, so a
follow-up turn whose worker is busy or died is given its conversation's checkpoint and continues it exactly on
another worker. A worker that dies costs its requests nothing they can see where that can be done exactly: a
request its client has seen nothing of yet runs again on another worker; a sampled chat's stream goes on there
from the latest snapshot its worker reported (every :data:`SNAPSHOT_CHUNKS` chunks: its checkpoint between two
chunks), and a greedy or seeded stream runs again, its client sent only what comes after the text it has. A
stream with log-probabilities that its client has begun, and a sampled one without a seed and with no snapshot
yet (a chat with tools, or one within its first snapshot's chunks), end with a 500. A client that disconnects
has its generation stopped before its next token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import queue
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specstate import Model
from specstate.llama import ParkedChat
from specstate.llama.results import joined_chat
from specstate.serve.cache import ConversationCache, conversation_key, conversation_keys
from specstate.serve.config import ServerConfig
from specstate.serve.jobs import DONE, Job, Metrics, Snapshot, joined_prompts
from specstate.serve.ray_worker import Conversation, Finished, Report, ServeWorker, worker_config
from specstate.serve.request import RequestError

__all__ = ["RayDriver"]

#: Seconds a worker waits for its slots' next results before it reports none (it reports as soon as it has some).
POLL_SECONDS = 0.5

#: Seconds the driver waits for a worker's report before it looks at its queue again.
WAIT_SECONDS = 0.02

#: Conversations whose worker the driver remembers (the least recently finished forgotten beyond them: a follow-up
#: turn of a forgotten one goes to any worker, with its checkpoint when the cache has it).
HELD_CONVERSATIONS = 4096

#: Chunks of a sampled stream between two snapshots of it that the driver keeps (what it resumes from if its worker
#: dies).
SNAPSHOT_CHUNKS = 16

#: Calls a worker runs at once: its results are asked for while requests are handed to it.
WORKER_CONCURRENCY = 4


@dataclass
class _Worker:
    """A worker actor, as the driver sees it."""

    actor: Any
    pid: int
    alive: bool = True
    #: Its outstanding :meth:`ServeWorker.poll` call.
    poll: Any = None
    #: The requests it runs, by id.
    running: dict[str, _Running] = field(default_factory=dict)
    #: Its batched engine's counters, as its latest report gave them (None: none yet, or separate slots).
    engine: dict[str, int] | None = None


@dataclass
class _Running:
    """A request placed on a worker, and what its client has been sent."""

    job: Job
    worker: int
    #: The chunks of a whole answer so far.
    collected: list[Any] = field(default_factory=list)
    usage: Any = None
    #: The ``id`` and ``created`` of the first chunk sent (every later chunk says the same).
    labels: tuple[str, int] | None = None
    #: Characters of each choice's text the client has, and whether it has the role chunk.
    sent: Counter[int] = field(default_factory=Counter)
    role_sent: bool = False
    #: Characters of each choice's text this run of the request has produced (a rerun's text up to ``sent`` is
    #: what the client has already).
    produced: Counter[int] = field(default_factory=Counter)
    #: A sampled stream's latest snapshot, and the characters of each choice's text produced before it.
    snapshot: tuple[ParkedChat, Counter[int]] | None = None

    def snapshots(self) -> int:
        """Chunks between the snapshots the request's worker reports: a sampled chat's stream (without a seed, its
        rerun would not be the reply its client has begun; with one, it would be, after all its tokens again), with
        no tools and no log-probabilities; 0: none."""
        request = self.job.request
        call = request.call
        sampled = call.sampling.temperature > 0 and call.top_logprobs is None
        return SNAPSHOT_CHUNKS if self.job.stream and request.chat is not None and not request.tools and sampled else 0

    def rerun(self) -> ParkedChat | None:
        """Go on on another worker: from the latest snapshot, if there is one (returned), else from the start."""
        self.collected, self.usage = [], None
        if self.snapshot is None:
            self.produced = Counter()
            return None
        parked, produced = self.snapshot
        self.produced = Counter(produced)
        return parked

    def news(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """``chunk`` as its client is to get it (labelled as the first one; only the text it does not have yet),
        or None when it has all of it."""
        if self.labels is None:
            self.labels = chunk["id"], chunk["created"]
        chunk = {**chunk, "id": self.labels[0], "created": self.labels[1]}
        if not chunk["choices"]:
            return chunk
        choice = chunk["choices"][0]
        index, delta = choice["index"], choice.get("delta")
        if delta is not None and "role" in delta:
            if self.role_sent:
                return None
            self.role_sent = True
        text = (delta or {}).get("content") if delta is not None else choice.get("text")
        if not text:
            return chunk
        start = self.produced[index]
        self.produced[index] += len(text)
        fresh = text[max(0, self.sent[index] - start) :]
        if not fresh:
            return None
        self.sent[index] += len(fresh)
        if fresh == text:
            return chunk
        changed = {**choice, "delta": {**delta, "content": fresh}} if delta is not None else {**choice, "text": fresh}
        return {**chunk, "choices": [changed]}

    def reproducible(self) -> bool:
        """Whether going on elsewhere gives what its client was sent: nothing was sent, or the request has a
        snapshot, or its generation is greedy or seeded and reports no log-probabilities."""
        call = self.job.request.call
        if not self.job.stream or (not self.sent and not self.role_sent) or self.snapshot is not None:
            return True
        return call.sampling.seed is not None and call.top_logprobs is None


class RayDriver(threading.Thread):
    """The thread that runs the server's requests on Ray workers (see the module's docstring); ``cache``: the
    server's conversation cache, which keeps every worker's finished conversations."""

    def __init__(
        self, config: ServerConfig, metrics: Metrics, cache: ConversationCache, workers: int, address: str | None
    ) -> None:
        super().__init__(daemon=True, name="specstate-ray")
        self.config, self.metrics, self.cache, self.address = config, metrics, cache, address
        self.count = workers
        self._incoming: queue.Queue[Job] = queue.Queue()
        self._waiting: list[Job] = []
        self._submitted = 0
        self._lock = threading.Lock()
        self.workers: list[_Worker] = []
        #: The worker that finished each conversation's last turn, by conversation key.
        self._holders: OrderedDict[str, int] = OrderedDict()
        self.loaded = threading.Event()
        self.error: BaseException | None = None
        self.closed = False
        self.model: Model | None = None
        self._started_ray = False

    # --- the server's side ---------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job`` (:class:`RequestError` 429 when every slot of every worker is taken and the queue is full)."""
        with self._lock:
            free = self.count * self.config.slots - self.busy()
            if len(self._waiting) + self._incoming.qsize() >= self.config.queue + max(free, 0):
                raise RequestError(429, "the server is busy: every slot is taken and the queue is full", "rate_limit")
            self._submitted += 1
            job.order = self._submitted
            self._incoming.put(job)

    def depth(self) -> int:
        """Requests waiting for a worker's slot."""
        return len(self._waiting) + self._incoming.qsize()

    def busy(self) -> int:
        """Requests placed on workers."""
        return sum(len(worker.running) for worker in self.workers)

    def serving(self) -> int:
        """Workers alive (as far as the driver knows)."""
        return sum(worker.alive for worker in self.workers) if self.is_alive() else 0

    def corpus_documents(self) -> dict[str, int] | None:
        """The documents of each tenant's lookup corpus, summed over the live workers (None: requests keep none)."""
        import ray

        described: list[dict[str, Any]] = ray.get([w.actor.describe.remote() for w in self.workers if w.alive])
        if any(worker["corpora"] is None for worker in described):
            return None
        return _summed(worker["corpora"] for worker in described)

    def engine_counters(self) -> dict[str, int] | None:
        """The workers' batched engines' counters, summed (a dead worker's as its last report gave them; None: no
        worker has reported any)."""
        reported = [worker.engine for worker in self.workers if worker.engine is not None]
        return _summed(reported) if reported else None

    def worker_pid(self, worker: int) -> int:
        """The process id of a worker."""
        return self.workers[worker].pid

    def holder_of(self, pairs: Sequence[tuple[str, str]], tenant: str) -> int | None:
        """The worker that finished the conversation ``pairs`` of ``tenant`` (None: none the driver remembers)."""
        return self._holders.get(conversation_key(pairs, tenant))

    # --- the driver's loop -----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._open()
        except BaseException as error:
            self.error = error
            self._close()
            return
        finally:
            self.loaded.set()
        try:
            while not self.closed:
                self._step()
        finally:
            self._close()

    def _open(self) -> None:
        importlib.import_module("specstate.cluster")  # first: without Ray, its error says how to install it
        import ray

        from specstate.cluster.pool import _quiet_raylet

        self.model = Model(self.config.model_path, use_mmap=True)  # the chat template, tokens and embeddings
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            _quiet_raylet(True)
        actor = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")(ServeWorker).options(
            max_concurrency=WORKER_CONCURRENCY
        )
        nodes = [node for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
        config = worker_config(self.config, -(-self.count // max(len(nodes), 1)))  # the workers of one node
        first: Any = actor.remote(config, None)
        described: dict[str, Any] = ray.get(first.describe.remote())
        others: list[Any] = [actor.remote(config, described["cost_curve"]) for _ in range(self.count - 1)]
        # the first worker measures the cost curve, the others, started together, pin it
        descriptions: list[dict[str, Any]] = [described, *ray.get([other.describe.remote() for other in others])]
        for handle, each in zip([first, *others], descriptions):
            self.workers.append(_Worker(handle, each["pid"]))

    def _close(self) -> None:
        """Stop the workers (their requests hear why), and the local Ray instance if the driver started it."""
        import ray

        from specstate.cluster.pool import _quiet_raylet

        for worker in self.workers:
            if worker.alive:
                ray.kill(worker.actor, no_restart=True)
            for running in worker.running.values():
                with contextlib.suppress(RuntimeError):  # its event loop is closed already
                    running.job.deliver(RequestError(503, "the server is stopping", "server_error"))
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            _quiet_raylet(False)

    def _step(self) -> None:
        while True:
            try:
                self._waiting.append(self._incoming.get_nowait())
            except queue.Empty:
                break
        self._cancel()
        self._place()
        self._poll()

    def _cancel(self) -> None:
        """Drop the waiting requests whose clients left, and stop the running ones."""
        for job in [job for job in self._waiting if job.cancelled.is_set()]:
            self._waiting.remove(job)
            self.metrics.add("cancelled_requests")
        for worker in self.workers:
            for ident, running in list(worker.running.items()):
                if running.job.cancelled.is_set():
                    del worker.running[ident]
                    if worker.alive:
                        worker.actor.cancel.remote(ident)  # the worker's slot counts it

    def _place(self) -> None:
        """Hand the waiting requests to workers, the highest priority first, while a worker can take one."""
        for job in sorted(self._waiting, key=lambda j: (-j.priority, j.order)):
            if not any(worker.alive for worker in self.workers):
                self._waiting.remove(job)
                job.deliver(RequestError(503, "no Ray worker is alive", "server_error"))
                continue
            try:
                held = self._holder(job)
                chosen = self._choose(job, held)
                if chosen is None:
                    return
                self._waiting.remove(job)
                conversation = None if chosen == held else self._conversation(job)
                self._send(job, chosen, conversation, _Running(job, chosen))
            except Exception as error:  # the driver outlives any request: its client hears what failed
                if job in self._waiting:
                    self._waiting.remove(job)
                job.deliver(RequestError.unforeseen(error))

    def _send(
        self,
        job: Job,
        worker: int,
        conversation: Conversation | None,
        running: _Running,
        resume: ParkedChat | None = None,
    ) -> None:
        ident = f"r{uuid.uuid4().hex}"
        request = dataclasses.replace(job.request, stream=True, include_usage=True)  # the driver joins whole ones
        self.workers[worker].actor.submit.remote(ident, request, conversation, resume, running.snapshots())
        running.worker = worker
        self.workers[worker].running[ident] = running  # what it delivers is polled for by this thread, after this

    def _choose(self, job: Job, held: int | None) -> int | None:
        """The worker for ``job``: the one that holds its conversation if it has a free slot, else the least loaded
        with a free slot, else one running a chat of lower priority (parked there to make room); None: none now."""
        alive = [index for index, worker in enumerate(self.workers) if worker.alive]
        load = {index: len(self.workers[index].running) for index in alive}
        free = [index for index in alive if load[index] < self.config.slots]
        if held in free:
            return held
        if free:
            return min(free, key=lambda index: (load[index], index))
        for index in sorted(alive, key=lambda index: (load[index], index)):
            running = self.workers[index].running.values()
            lower = sum(r.job.preemptible() and r.job.priority < job.priority for r in running)
            if load[index] < self.config.slots + lower:
                return index
        return None

    def _holder(self, job: Job) -> int | None:
        """The live worker that finished the last turn of the longest conversation ``job`` continues, if any."""
        request = job.request
        if request.chat is None or request.tools or request.tenant is None:
            return None
        pairs = request.pairs
        ends = [key for n, key in conversation_keys(pairs[:-1], request.tenant) if pairs[n - 1][0] == "assistant"]
        for key in reversed(ends):
            worker = self._holders.get(key)
            if worker is not None:
                return worker if self.workers[worker].alive else None
        return None

    def _conversation(self, job: Job) -> Conversation | None:
        """The checkpoint of the longest cached conversation ``job`` continues, for a worker that does not hold it."""
        request = job.request
        if request.chat is None or request.tools or request.tenant is None:
            return None
        found = self.cache.longest(request.pairs, request.tenant)
        return None if found is None else (tuple(request.pairs[: found[0]]), found[1], request.tenant)

    def _poll(self) -> None:
        """Ask each live worker for its results, and take those of the first to answer (or none in a while)."""
        import ray

        for worker in self.workers:
            if worker.alive and worker.poll is None:
                worker.poll = worker.actor.poll.remote(POLL_SECONDS)
        polls = {worker.poll: worker for worker in self.workers if worker.alive}
        if not polls:  # every worker died: requests are refused (503) until the server stops
            time.sleep(WAIT_SECONDS)
            return
        ready, _ = ray.wait(list(polls), num_returns=1, timeout=WAIT_SECONDS)
        for reference in ready:
            worker = polls[reference]
            worker.poll = None
            try:
                report: Report = ray.get(reference)
            except Exception:  # its process died (or its poll failed): its requests go elsewhere
                if worker.alive:
                    ray.kill(worker.actor, no_restart=True)
                self._lost(worker)
                continue
            self._take(self.workers.index(worker), worker, report)

    def _take(self, index: int, worker: _Worker, report: Report) -> None:
        self.metrics.merge(report.counts)
        worker.engine = report.engine or worker.engine
        for pairs, checkpoint, tenant in report.conversations:
            self.cache.put(pairs, checkpoint, tenant)
            key = conversation_key(pairs, tenant)
            self._holders[key] = index
            self._holders.move_to_end(key)
            while len(self._holders) > HELD_CONVERSATIONS:
                self._holders.popitem(last=False)
        for ident, item in report.items:
            running = worker.running.get(ident)
            if running is None:
                continue
            try:
                self._deliver(worker, ident, running, item)
            except Exception as error:  # the driver outlives any request: its client hears what failed
                worker.running.pop(ident, None)
                running.job.deliver(RequestError.unforeseen(error))

    def _deliver(self, worker: _Worker, ident: str, running: _Running, item: object) -> None:
        """Give the client what the worker's slot delivered."""
        job = running.job
        if isinstance(item, RequestError):
            del worker.running[ident]
            job.deliver(item)
        elif isinstance(item, Finished):
            del worker.running[ident]
            job.stop_sequence = item.stop_sequence
            if not job.stream:
                job.deliver(_whole(running))
            job.deliver(DONE)
        elif isinstance(item, Snapshot):
            running.snapshot = item.parked, Counter(running.produced)
        elif not isinstance(item, dict):
            raise TypeError(f"a worker delivered {type(item).__name__}")
        elif not item["choices"] and "usage" in item:
            running.usage = item["usage"]
            if job.stream and job.request.include_usage:
                job.deliver({**item, **_labelled(running)})
        elif (chunk := running.news(item)) is not None:
            job.deliver(chunk) if job.stream else running.collected.append(chunk)

    def _lost(self, worker: _Worker) -> None:
        """A worker died: each of its requests runs again elsewhere where that is exact (else it ends with a 500)."""
        worker.alive = False
        self.metrics.add("ray_workers_lost")
        for running in worker.running.values():
            if running.reproducible():
                resume = running.rerun()
                self.metrics.add("ray_requests_rerun" if resume is None else "ray_requests_resumed")
                self._requeue(running, resume)
            else:
                message = "the Ray worker running this request died and its reply cannot be reproduced exactly"
                running.job.deliver(RequestError(500, message, "server_error"))
        worker.running.clear()

    def _requeue(self, running: _Running, resume: ParkedChat | None) -> None:
        """Run the request again on the least loaded live worker, with its conversation's checkpoint (or from its
        snapshot ``resume``)."""
        alive = [index for index, worker in enumerate(self.workers) if worker.alive]
        if not alive:
            running.job.deliver(RequestError(503, "no Ray worker is alive", "server_error"))
            return
        chosen = min(alive, key=lambda index: (len(self.workers[index].running), index))
        try:
            conversation = None if resume is not None else self._conversation(running.job)
            self._send(running.job, chosen, conversation, running, resume)
        except Exception as error:  # as in _place
            running.job.deliver(RequestError.unforeseen(error))


def _summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The workers' counts added up, by name."""
    summed: Counter[str] = Counter()
    for each in counts:
        summed.update(each)
    return dict(summed)


def _labelled(running: _Running) -> dict[str, Any]:
    """The ``id`` and ``created`` every chunk of the request says (the first one's)."""
    return {} if running.labels is None else {"id": running.labels[0], "created": running.labels[1]}


def _whole(running: _Running) -> Any:
    """The whole answer the request's chunks make (a chat's, or a completion's of each prompt)."""
    request = running.job.request
    if request.chat is not None:
        return joined_chat(running.collected, running.usage)
    return joined_prompts(running.collected, running.usage, len(request.prompts))
