"""``specstate serve --ray``: the server's generations on a :class:`specstate.cluster.Pool` of Ray workers.

One driver thread owns the pool (a pool is driven from one thread): it submits
each request as a generation, pumps the pool, and hands each generation's new
text to its request as OpenAI chunks. The pool places generations by load (and the
driver migrates one when generations end unevenly) and,
with ``checkpoint_every``, recovers a killed worker's generations from their
last checkpoints: their streams go on exactly, the regenerated tokens compared
with those already sent (``specstate.cluster``). A client that disconnects has
its generation preempted (stopped, its worker freed).

A request here is a prompt: a chat's messages are rendered with the model's chat
template and the reply generated after them. Requests are read by the same step
as the slot server's (:func:`specstate.serve.request.read_request`: the same
checks, limits and llama-cpp-python defaults), so a request means the same
generation on either backend; ``max_tokens``, the sampler chain's parameters and
the grammar (``response_format`` included) are honoured, and what the pool does
not do is refused with 400 (stop strings, log-probabilities, ``echo``, several
prompts in one completion request; the slot
server, without ``--ray``, has them, and priorities and conversations continued
from checkpoints).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specstate import Model
from specstate.chat import chat_template
from specstate.llama.results import (
    chat_chunk,
    chat_result,
    completion_chunk,
    completion_result,
    reply_tokens,
    usage_chunk,
    usage_counts,
)
from specstate.llama.types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionDelta,
    ChatCompletionMessage,
    Completion,
    CompletionChunk,
    CompletionUsage,
    FinishReason,
)
from specstate.serve.config import ServerConfig
from specstate.serve.jobs import DONE, Job, Metrics
from specstate.serve.request import RequestError, ServerRequest

__all__ = ["PoolDriver"]
#: Tokens a worker checkpoints after, so that a killed worker's generations recover.
CHECKPOINT_EVERY = 16


@dataclass
class _Active:
    job: Job
    handle: Any
    id: str
    created: int
    chat: bool
    prompt_tokens: int
    started: bool = False
    text: list[str] = field(default_factory=list)


class PoolDriver(threading.Thread):
    """The thread that owns the pool and runs every request on it."""

    def __init__(self, config: ServerConfig, metrics: Metrics, workers: int, address: str | None) -> None:
        super().__init__(daemon=True, name="specstate-pool")
        self.config, self.metrics, self.workers, self.address = config, metrics, workers, address
        self._incoming: queue.Queue[Job] = queue.Queue()
        self._active: list[_Active] = []
        self.loaded = threading.Event()
        self.error: BaseException | None = None
        self.closed = False
        self.pool: Any = None

    def submit(self, job: Job) -> None:
        unsupported = _unsupported(job.request)
        if unsupported is not None:
            raise RequestError(400, f"{unsupported} is not available with --ray-workers", param=unsupported)
        if self._incoming.qsize() + len(self._active) >= self.config.queue + self.workers * self.config.slots:
            raise RequestError(429, "the server is busy: every worker is taken and the queue is full", "rate_limit")
        self._incoming.put(job)

    def depth(self) -> int:
        return self._incoming.qsize()

    def busy(self) -> int:
        return len(self._active)

    def run(self) -> None:
        from specstate.cluster import Pool

        try:
            self.model = Model(self.config.model_path, use_mmap=True)  # for the chat template and the tokenizer
            models = {"target": self.config.model_path}
            if self.config.draft_model_path is not None:
                models["draft"] = self.config.draft_model_path
            # n_threads 0: each worker's default, the workers on one node sharing it (Pool, docs/threads.md).
            self.pool = Pool(models, workers=self.workers, n_threads=self.config.n_threads, address=self.address)
        except BaseException as error:
            self.error = error
            return
        finally:
            self.loaded.set()
        with self.pool:
            while not self.closed:
                self._step()

    def _step(self) -> None:
        try:
            while True:
                self._start(self._incoming.get_nowait())
        except queue.Empty:
            pass
        if not self._active:
            time.sleep(0.01)
            return
        try:
            self.pool.pump(timeout=0.05)
        except Exception as error:  # a worker refused a generation (bad sampling, say): its client hears why
            status, kind = (
                (400, "invalid_request_error") if isinstance(error, (TypeError, ValueError)) else (500, "server_error")
            )
            for active in [a for a in self._active if self.pool.done(a.handle)]:
                self._active.remove(active)
                active.job.deliver(RequestError(status, f"{type(error).__name__}: {error}", kind))
        for active in list(self._active):
            try:
                self._hand_out(active)
            except Exception as error:  # the driver outlives any request: its client hears what failed
                self._active.remove(active)
                active.job.deliver(RequestError(500, f"{type(error).__name__}: {error}", "server_error"))
        self._rebalance()

    def _rebalance(self) -> None:
        """Move the newest generation of the busiest worker to the least busy one when they differ by two or
        more (generations end unevenly); the move is exact (a checkpoint, restored there)."""
        load: dict[int, list[_Active]] = {worker: [] for worker in self.pool.workers()}
        for active in self._active:
            worker = self.pool.worker_of(active.handle)
            if worker in load and not self.pool.done(active.handle):
                load[worker].append(active)
        if len(load) < 2:
            return
        busiest = max(load, key=lambda w: len(load[w]))
        idlest = min(load, key=lambda w: len(load[w]))
        if len(load[busiest]) - len(load[idlest]) < 2:
            return
        try:
            self.pool.migrate(load[busiest][-1].handle, idlest)
        except Exception:  # the target died or refused: the generation goes on where it was (the pool's rule)
            return
        self.metrics.add("migrations")

    def _start(self, job: Job) -> None:
        chat = job.kind == "chat"
        try:
            prompt = self._prompt(job.request)
            settings = job.request.call.converted().sampling.settings()  # a response_format's schema, bounded
            handle = self.pool.submit(
                prompt,
                max_tokens=job.request.max_tokens,
                target="target",
                draft="draft" if self.config.draft_model_path is not None else None,
                checkpoint_every=CHECKPOINT_EVERY,
                mode=self.config.mode,
                n_draft=self.config.n_draft,
                n_ctx=self.config.n_ctx,
                **settings,
            )
        except (TypeError, ValueError) as error:
            job.deliver(RequestError(400, str(error)))
            return
        except Exception as error:  # the driver outlives any request: its client hears what failed
            job.deliver(RequestError(500, f"{type(error).__name__}: {error}", "server_error"))
            return
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4()}"
        self._active.append(_Active(job, handle, ident, int(time.time()), chat, len(prompt)))

    def _prompt(self, request: ServerRequest) -> list[int]:
        if request.kind == "chat":
            return chat_template(self.model, self.config.chat_template).prompt_tokens(list(request.pairs))
        prompt = request.options["prompt"]
        return self.model.tokenize(prompt, add_special=True, parse_special=True) if isinstance(prompt, str) else prompt

    def _hand_out(self, active: _Active) -> None:
        """Send the generation's new text; finish it when it is over; preempt it when its client left."""
        if active.job.cancelled.is_set():
            self.pool.preempt(active.handle)
            self._active.remove(active)
            self.metrics.add("cancelled_requests")
            return
        text = self.pool.take_text(active.handle)
        done = self.pool.done(active.handle)
        if active.job.stream:
            if text or not active.started:
                active.job.deliver(self._chunk(active, text, None))
                active.started = True
            if done:
                last = self._chunk(active, "", self._finish(active))
                active.job.deliver(last)
                if active.job.request.include_usage:
                    active.job.deliver(usage_chunk(last, self._usage(active)))
        else:
            active.text.append(text)
            if done:
                active.job.deliver(self._whole(active, "".join(active.text)))
        if done:
            active.job.deliver(DONE)
            self._active.remove(active)

    def _finish(self, active: _Active) -> FinishReason:
        tokens = self.pool.tokens(active.handle)
        return "stop" if tokens and self.model.is_eog(tokens[-1]) else "length"

    def _labels(self, active: _Active) -> tuple[str, int, str]:
        return active.id, active.created, self.config.name()

    def _chunk(self, active: _Active, text: str, finish: FinishReason | None) -> CompletionChunk | ChatCompletionChunk:
        if not active.chat:
            return completion_chunk(self._labels(active), text, finish)
        delta: ChatCompletionDelta = {"content": text} if active.started else {"role": "assistant", "content": text}
        return chat_chunk(self._labels(active), delta, finish)

    def _usage(self, active: _Active) -> CompletionUsage:
        return usage_counts(active.prompt_tokens, reply_tokens(self.model, self.pool.tokens(active.handle)))

    def _whole(self, active: _Active, text: str) -> Completion | ChatCompletion:
        labels, finish, usage = self._labels(active), self._finish(active), self._usage(active)
        if not active.chat:
            return completion_result(
                labels, {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}, usage
            )
        message: ChatCompletionMessage = {"role": "assistant", "content": text}
        return chat_result(labels, {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}, usage)


def _unsupported(request: ServerRequest) -> str | None:
    """The first field of ``request`` that the pool cannot honour (None if it can do the whole request)."""
    call = request.call
    if request.kind == "completion" and len(request.prompts) > 1:
        return "prompt"
    if call.stops:
        return "stop"
    if call.top_logprobs is not None:
        return "logprobs"
    if call.echo:
        return "echo"
    return None
