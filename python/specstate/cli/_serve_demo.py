"""``specstate demo-serve`` (``make demo-serve``): a streamed chat parked for an urgent request, then resumed.

It starts ``specstate serve`` in this process on SmolLM2-135M-Instruct (``ngram``
mode, one slot), streams a reply through the ``openai`` client, and sends a
request of higher priority after the first chunks: the only slot parks the
stream (a checkpoint between two chunks), answers the urgent request, and
resumes the stream where it stopped. The streamed text is then compared with the
same reply generated uninterrupted: identical, with no gap and no duplicate.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console

from specstate import Generator, Model
from specstate.serve import ServerConfig, running
from specstate.smollm2 import SMOLLM2_FILE, smollm2_path

__all__ = ["run_serve_demo"]

TOKENS = 160
#: A text to copy: prompt lookup drafts the reply well.
NOTICE = (
    "The pool opens at seven on weekdays and at nine on weekends. Lanes one to three are kept for swimming "
    "lengths, lane four for lessons. Towels can be hired at the front desk. Lockers take a coin, which is "
    "returned. Children under eight must be with an adult in the water. The sauna closes half an hour before "
    "the pool. Lost property is kept at the desk for one month."
)
#: Chunks streamed before the urgent request arrives.
BEFORE_URGENT = 40


def run_serve_demo() -> bool:
    """Run the demo; returns whether the parked and resumed stream equals the uninterrupted reply."""
    out = Console(highlight=False)
    path = smollm2_path()
    config = ServerConfig(model_path=str(path), mode="ngram", slots=1, queue=4)
    question = f"Here is a notice:\n\n{NOTICE}\n\nCopy the notice word for word."
    with running(config) as (url, state):
        out.print(f"[bold]specstate serve[/bold] at {url}: {SMOLLM2_FILE}, mode ngram, one slot")
        streamed, urgent, seconds = _parked_stream(url, question)
        parked_ms = state.metrics.counts["parked_milliseconds"]
        out.print(f"[dim]...[/dim] an urgent request (priority 10) parked the stream after {BEFORE_URGENT} chunks")
        out.print(f"urgent reply, served in {seconds:.2f} s: {urgent!r}")
        out.print(f"preemptions: {state.metrics.counts['preemptions']}, the stream parked for {parked_ms} ms")
    out.print(streamed.rstrip() + "\n", markup=False)
    generator = Generator(Model(path), mode="ngram")
    same = streamed == generator.chat(question, max_tokens=TOKENS)
    colour = "green" if same else "red"
    out.print(f"[bold {colour}]streamed text identical to the uninterrupted reply: {same}[/]")
    return same


def _parked_stream(url: str, question: str) -> tuple[str, str, float]:
    """Stream a reply, send an urgent request after the first chunks; the whole stream, the urgent reply and
    how long it took."""
    import openai
    from openai.types.chat import ChatCompletionMessageParam

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    pieces: list[str] = []
    started = threading.Event()

    def read() -> None:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
        stream = client.chat.completions.create(
            model=SMOLLM2_FILE,
            messages=messages,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")
            if len(pieces) >= BEFORE_URGENT:
                started.set()
        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    started.wait()
    began = time.perf_counter()
    urgent = client.chat.completions.create(
        model=SMOLLM2_FILE,
        messages=[{"role": "user", "content": "What is the capital of France? One word."}],
        max_tokens=8,
        temperature=0,
        extra_body={"priority": 10},
    )
    seconds = time.perf_counter() - began
    reader.join()
    return "".join(pieces), urgent.choices[0].message.content or "", seconds
