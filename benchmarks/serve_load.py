"""``make bench-serve``: specstate serve against llama-cpp-python's own server, under the same load, interleaved.

Both servers run on loopback with SmolLM2-135M-Instruct Q4_1 and the same
threads in all (specstate: ``--slots 2 --threads 1``; llama-cpp-python:
``--n_threads 2``, one request at a time, as its server runs). Each round runs
the same load against each server, in alternating order: ``--clients`` threads,
each sending ``--requests`` streamed chat completions (32 to 128 tokens, a seeded
mix of prompts, greedy), through the ``openai`` client. Measured: tokens per
second over the round, time to first token (p50, p99), time per token after
the first (p50), errors. Then the follow-up turn of a conversation of about
2,000 tokens, after another client's request went between its turns: time to
the first token of the second turn, on each server.

Printed: the figures per server and the ratios (specstate against
llama-cpp-python) as medians over rounds; ``--json`` writes them. The peer
runs from the benchmark venv (``SPECSTATE_BENCH_VENV``, default
``~/.cache/specstate-bench-venv``, with ``llama-cpp-python[server]``); without
it only specstate's figures are printed.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from peer_venv import PEER_VENV
from specstate.smollm2 import smollm2_path

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "List ten fruits and one fact about each.",
    "Explain how a bicycle works.",
    "Copy this line three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that reverses a list, then explain it.",
    "Describe a walk through a city at night.",
]
#: About 2,000 tokens of conversation before the follow-up turn.
LONG_CONTEXT = "Here are my notes from the meeting. " + " ".join(
    f"Item {i}: the team reviewed the budget line {i}, agreed on the schedule and noted the open questions."
    for i in range(90)
)


@dataclass
class Load:
    """One load run's measurements on one server."""

    seconds: float = 0.0
    tokens: int = 0
    errors: int = 0
    first_token: list[float] = field(default_factory=list)
    per_token: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            "tokens_per_second": self.tokens / self.seconds if self.seconds else 0.0,
            "ttft_p50_ms": 1000 * _quantile(self.first_token, 0.5),
            "ttft_p99_ms": 1000 * _quantile(self.first_token, 0.99),
            "per_token_p50_ms": 1000 * _quantile(self.per_token, 0.5),
            "errors": float(self.errors),
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _server(command: list[str], port: int) -> Iterator[openai.OpenAI]:
    """A server process on ``port``, until the block ends; yields a client."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[2:4]} exited: {process.stderr.read() if process.stderr else ''}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield client
    finally:
        process.terminate()
        process.wait(timeout=60)


def specstate_command(model: Path, port: int, threads: int) -> list[str]:
    slots = max(1, threads)
    return [
        sys.executable,
        "-m",
        "specstate",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--slots",
        str(slots),
        "--threads",
        "1",
        "--n-ctx",
        "4096",
        "--mode",
        "ngram",
    ]


def peer_command(model: Path, port: int, threads: int) -> list[str] | None:
    python = PEER_VENV / "bin" / "python"
    if (
        not python.exists()
        or subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True).returncode
    ):
        return None
    return [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_ctx",
        "4096",
        "--verbose",
        "False",
        # By default its server stops the request in progress when another arrives (each client would get a
        # cut reply); here they wait their turn, as specstate's queue makes them.
        "--interrupt_requests",
        "False",
    ]


def _requests(clients: int, per_client: int, seed: int) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    return [[(rng.choice(PROMPTS), rng.randint(32, 128)) for _ in range(per_client)] for _ in range(clients)]


def _one(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, load: Load, lock: threading.Lock) -> None:
    started = time.perf_counter()
    times: list[float] = []
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
    except openai.APIError:
        with lock:
            load.errors += 1
        return
    with lock:
        load.tokens += len(times)
        load.errors += not times  # a reply without text counts as failed
        if times:
            load.first_token.append(times[0] - started)
            load.per_token.extend(b - a for a, b in zip(times, times[1:]))


def run_load(client: openai.OpenAI, model: str, plan: list[list[tuple[str, int]]]) -> Load:
    """Every client's requests, one after another per client, clients at once."""
    load, lock = Load(), threading.Lock()

    def client_thread(requests: list[tuple[str, int]]) -> None:
        for prompt, max_tokens in requests:
            _one(client, model, prompt, max_tokens, load, lock)

    threads = [threading.Thread(target=client_thread, args=(requests,)) for requests in plan]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.seconds = time.perf_counter() - started
    return load


def follow_up_ttft(client: openai.OpenAI, model: str) -> float:
    """Seconds to the first token of a conversation's second turn, another request having gone between."""
    history: list[Any] = [{"role": "user", "content": LONG_CONTEXT + "\n\nSummarise the notes in one line."}]
    first = client.chat.completions.create(model=model, messages=history, max_tokens=16, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
    history += [{"role": "user", "content": "Which item was the last one?"}]
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    started = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=history, max_tokens=8, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            return time.perf_counter() - started
    return time.perf_counter() - started


def measure(server: str, command: list[str], port: int, plan: list[list[tuple[str, int]]]) -> dict[str, float]:
    model = smollm2_path().name
    with _server(command, port) as client:
        figures = run_load(client, model, plan).summary()
        figures["follow_up_ttft_ms"] = 1000 * follow_up_ttft(client, model)
    print(f"  {server:16s} " + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    return figures


def _ratios(rounds: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """specstate against llama-cpp-python, medians over rounds (throughput: higher is better; times: theirs/ours)."""
    if not all("llama-cpp-python" in r for r in rounds):
        return {}
    ours = [r["specstate"] for r in rounds]
    theirs = [r["llama-cpp-python"] for r in rounds]
    return {
        "throughput": statistics.median(a["tokens_per_second"] / b["tokens_per_second"] for a, b in zip(ours, theirs)),
        "ttft_p50": statistics.median(b["ttft_p50_ms"] / a["ttft_p50_ms"] for a, b in zip(ours, theirs)),
        "follow_up_ttft": statistics.median(
            b["follow_up_ttft_ms"] / a["follow_up_ttft_ms"] for a, b in zip(ours, theirs)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=6, help="requests per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    model = smollm2_path()
    plan = _requests(args.clients, args.requests, seed=0)
    servers = {"specstate": specstate_command, "llama-cpp-python": peer_command}
    rounds: list[dict[str, dict[str, float]]] = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", flush=True)
        order = list(servers) if index % 2 == 0 else list(reversed(servers))
        figures: dict[str, dict[str, float]] = {}
        for name in order:
            port = _free_port()
            command = servers[name](model, port, args.threads)
            if command is not None:
                figures[name] = measure(name, command, port, plan)
        rounds.append(figures)
    ratios = _ratios(rounds)
    print(
        "specstate / llama-cpp-python (median over rounds): "
        + ("  ".join(f"{k} x{v:.2f}" for k, v in ratios.items()) or "peer not installed")
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"clients": args.clients, "rounds": rounds, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
