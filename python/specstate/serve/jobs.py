"""What a request becomes inside the server: a :class:`Job`, the results it delivers, the counters."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Generator as PyGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specstate import SharedEngine
from specstate.llama import (
    CompletionStream,
    ParkedChat,
    joined_completion,
)
from specstate.llama.types import CompletionUsage
from specstate.serve.request import ServerRequest


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
    #: The last chunk made (what labels a stream's usage chunk).
    last: Any = None
    #: The stop string that ended a chat's reply, once it is done (None: none did).
    stop_sequence: str | None = None
    #: Chunks of a streamed chat between two :class:`Snapshot` s it delivers (0: none).
    snapshot_every: int = 0

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


@dataclass(frozen=True)
class Snapshot:
    """A streamed chat's reply between two chunks (:meth:`ChatStream.snapshot`), delivered among its chunks when
    the job asks (:attr:`Job.snapshot_every`): what the Ray driver resumes the reply from, exactly, on another
    worker if the one running it dies."""

    parked: ParkedChat


class Completions(Iterator[Any]):
    """The chunks of a completion request's prompts, one prompt after another (a chunk's choice ``index`` is its
    prompt's, every chunk labelled with the first one's ``id`` and ``created``), as OpenAI answers several prompts;
    ``start`` makes a prompt's stream when its turn comes. :meth:`usage` sums the prompts', :meth:`whole` joins
    the chunks into one ``text_completion`` with a choice per prompt."""

    def __init__(self, start: Callable[[str | list[int]], CompletionStream], prompts: list[str | list[int]]) -> None:
        self._start, self._prompts = start, prompts
        self._usages: list[CompletionUsage] = []
        self._chunks = self._each()

    def _each(self) -> PyGenerator[dict[str, Any], None, None]:
        labels: tuple[str, int] | None = None
        for index, prompt in enumerate(self._prompts):
            stream = self._start(prompt)
            try:
                for chunk in stream:
                    labels = labels or (chunk["id"], chunk["created"])
                    yield {
                        **chunk,
                        "id": labels[0],
                        "created": labels[1],
                        "choices": [{**chunk["choices"][0], "index": index}],
                    }
            finally:
                stream.close()
            self._usages.append(stream.usage())  # now: the next prompt's generation may take its sequence

    def __next__(self) -> Any:
        return next(self._chunks)

    def close(self) -> None:
        """Stop after the chunk made last."""
        self._chunks.close()

    def usage(self) -> CompletionUsage:
        """The finished prompts' tokens, summed."""
        prompt = sum(usage["prompt_tokens"] for usage in self._usages)
        reply = sum(usage["completion_tokens"] for usage in self._usages)
        return {"prompt_tokens": prompt, "completion_tokens": reply, "total_tokens": prompt + reply}

    def whole(self, chunks: list[Any]) -> dict[str, Any]:
        """The ``text_completion`` that the chunks of every prompt make."""
        return joined_prompts(chunks, self.usage(), len(self._prompts))


def joined_prompts(chunks: list[Any], usage: CompletionUsage, prompts: int) -> dict[str, Any]:
    """The ``text_completion`` that the chunks of a request's ``prompts`` make (:class:`Completions`' chunks), a
    choice per prompt."""
    choices = []
    for index in range(prompts):
        own = [chunk for chunk in chunks if chunk["choices"][0]["index"] == index]
        choices.append({**joined_completion(own, usage)["choices"][0], "index": index})
    return {**joined_completion(chunks, usage), "choices": choices}


def engine_counters(engine: SharedEngine | None) -> dict[str, int] | None:
    """A batched engine's counters so far, by their ``/metrics`` names: its decodes, their rows and sequences, and
    the prompt tokens it reused (None without an engine)."""
    if engine is None:
        return None
    decodes, rows, sequences = engine.stats
    return {"decodes": decodes, "rows": rows, "sequences": sequences, "prompt_tokens_reused": engine.reused_tokens}


class Metrics:
    """Counters for ``/metrics``, updated from the slot threads and the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.counts: Counter[str] = Counter()

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            self.counts[name] += value

    def merge(self, counts: Mapping[str, int]) -> None:
        """Add ``counts`` (another process's counters' increase) to these."""
        with self._lock:
            self.counts.update(counts)

    def snapshot(self) -> Counter[str]:
        """The counters as they are now."""
        with self._lock:
            return self.counts.copy()

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def text(self, queued: int, busy: int, parked_bytes: int, batch: Mapping[str, int] | None = None) -> str:
        """The Prometheus text; ``batch``: the batched engine's counters so far, by name (its decodes, their rows
        and sequences, the prompt tokens it reused)."""
        lines = ["# TYPE specstate_requests_total counter"]
        with self._lock:
            for (endpoint, status), count in sorted(self.requests.items()):
                lines.append(f'specstate_requests_total{{endpoint="{endpoint}",status="{status}"}} {count}')
            for name, value in sorted(self.counts.items()):
                lines += [f"# TYPE specstate_{name}_total counter", f"specstate_{name}_total {value}"]
        lines += ["# TYPE specstate_queue_depth gauge", f"specstate_queue_depth {queued}"]
        lines += ["# TYPE specstate_slots_busy gauge", f"specstate_slots_busy {busy}"]
        lines += ["# TYPE specstate_parked_bytes gauge", f"specstate_parked_bytes {parked_bytes}"]
        for name, value in (batch or {}).items():
            lines += [f"# TYPE specstate_batch_{name}_total counter", f"specstate_batch_{name}_total {value}"]
        return "\n".join(lines) + "\n"
