"""``make bench-serve``: specstate serve, llama.cpp's ``llama-server`` and llama-cpp-python's server under the same
concurrent chat load, side by side (issue 34).

For 1, 4 and 8 concurrent clients, each server is started with as many slots as clients and 2 threads in all:
specstate (``--slots C --threads 2``: one batched engine, modes ``none`` and ``ngram``; at 1 client also
``--separate-slots``, a slot with a model and context of its own as before batching), ``llama-server`` built from
llama.cpp's source (``--parallel C -t 2 -c 2048*C``: continuous batching over one context, ``llama_server()`` in
``llama_cpp_spec.py``) and llama-cpp-python's server (``--n_threads 2``, one request at a time, as it serves). Each is
given the same requests (a seeded mix of prompts, 24 to 96 tokens, half greedy, half sampled with a seed): first
each request alone, one after another (its reference reply, untimed), then all of them from C clients at once
(timed). Measured: aggregate completion tokens per second, time to first token p50 and p95, the server's peak RSS
(``VmHWM``), and the share of replies identical to the same request served alone by the same server. Interleaved
rounds: every server at every client count once per round, the order rotating; ratios are medians of per-round
pairs. Writes ``--json`` (``benchmarks/results/serve.json``) and the tables beside it (``serve.md``).

``--model`` serves another model (SmolLM2 by default); with ``--draft-model`` two more servers speculate with it:
specstate's ``draft`` mode (its slots separate, the adaptive draft policy) and ``llama-server -md``. Such a run
writes under ``benchmarks/results/models/`` unless ``--json`` says where (``bench_models.results_dir``).
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from bench_models import add_model_options, kv_bytes_per_token, resolve, results_dir, title
from llama_cpp_spec import llama_server
from peer_venv import peer_python
from specstate.smollm2 import smollm2_path

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "List ten fruits and one fact about each.",
    "Explain how a bicycle works.",
    "Copy this line three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that reverses a list, then explain it.",
    "Describe a walk through a city at night.",
]
#: The client counts measured; each server gets as many slots.
CLIENTS = (1, 4, 8)
#: Threads in all, for every server.
THREADS = 2
#: Context length of each slot.
SLOT_CTX = 2048
SPECSTATE = "specstate"
LLAMA_SERVER = "llama-server"
PEER = "llama-cpp-python"
#: The servers that batch their slots, whose peak RSS the goal bounds.
BATCHED = (f"{SPECSTATE} none", f"{SPECSTATE} ngram")
#: A server: its command line for a model, a port and a slot count.
Command = Callable[[Path, int, int], list[str]]


@dataclass(frozen=True)
class Request:
    """One chat request of the load."""

    prompt: str
    max_tokens: int
    temperature: float
    seed: int


@dataclass
class Reply:
    text: str = ""
    tokens: int = 0
    ttft: float = 0.0


@dataclass
class Run:
    """One concurrent run's measurements on one server."""

    replies: list[Reply] = field(default_factory=list)
    seconds: float = 0.0
    errors: int = 0


def requests(count: int, seed: int = 0) -> list[Request]:
    """``count`` requests: prompts in turn, lengths at random, every other one sampled with a seed."""
    rng = random.Random(seed)
    return [
        Request(PROMPTS[i % len(PROMPTS)], rng.randint(24, 96), 0.0 if i % 2 == 0 else 0.8, 1000 + i)
        for i in range(count)
    ]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def _server(command: list[str], port: int) -> Iterator[tuple[openai.OpenAI, subprocess.Popen[str]]]:
    """A server process on ``port`` until the block ends; yields a client and the process."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:4]} exited: {process.stderr.read() if process.stderr else ''}")
            try:
                client.models.list()
                break
            except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield client, process
    finally:
        process.terminate()
        process.wait(timeout=60)


# --- the servers --------------------------------------------------------------------------------------------------


def specstate_command(mode: str, *options: str) -> Command:
    def command(model: Path, port: int, slots: int) -> list[str]:
        return [
            *(sys.executable, "-m", "specstate", "serve", "--model", str(model), "--port", str(port)),
            *("--slots", str(slots), "--threads", str(THREADS), "--n-ctx", str(SLOT_CTX), "--mode", mode),
            *options,
        ]

    return command


def llama_server_command(model: Path, port: int, slots: int) -> list[str]:
    return [
        *(str(llama_server()), "-m", str(model), "--port", str(port), "--parallel", str(slots)),
        *("-t", str(THREADS), "-tb", str(THREADS), "-c", str(SLOT_CTX * slots), "--no-webui"),
    ]


def peer_command(model: Path, port: int, slots: int) -> list[str]:
    # By default its server stops the request in progress when another arrives (each client would get a cut
    # reply); here they wait their turn.
    return [
        *(str(peer_python()), "-m", "llama_cpp.server", "--model", str(model), "--port", str(port)),
        *("--n_threads", str(THREADS), "--n_ctx", str(SLOT_CTX), "--verbose", "False"),
        *("--interrupt_requests", "False"),
    ]


#: A slot with a model and context of its own, as before batching: the lone request's speed batching must keep.
ALONE = f"{SPECSTATE} none, separate slots"

SERVERS: dict[str, Command] = {
    f"{SPECSTATE} none": specstate_command("none"),
    ALONE: specstate_command("none", "--separate-slots"),
    f"{SPECSTATE} ngram": specstate_command("ngram"),
    f"{LLAMA_SERVER} none": llama_server_command,
    f"{PEER} none": peer_command,
}


def draft_servers(draft: Path | None) -> dict[str, Command]:
    """The servers that speculate with the draft model `draft` (none without one): specstate's ``draft`` mode and
    llama-server's draft-model speculation."""
    if draft is None:
        return {}

    def llama_server_draft(model: Path, port: int, slots: int) -> list[str]:
        return [*llama_server_command(model, port, slots), "-md", str(draft)]

    return {
        f"{SPECSTATE} draft": specstate_command("draft", "--draft-model", str(draft)),
        f"{LLAMA_SERVER} draft": llama_server_draft,
    }


# --- the load -----------------------------------------------------------------------------------------------------


def ask(client: openai.OpenAI, model: str, request: Request) -> Reply:
    """One streamed chat request; its text, completion tokens and time to the first token."""
    reply, started = Reply(), time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": request.prompt}],
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        seed=request.seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = 0
    for chunk in stream:
        if chunk.usage is not None:
            reply.tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            if not reply.text:
                reply.ttft = time.perf_counter() - started
            reply.text += chunk.choices[0].delta.content
            pieces += 1
    reply.tokens = reply.tokens or pieces
    return reply


def concurrent(client: openai.OpenAI, model: str, load: list[Request], clients: int) -> Run:
    """The requests from ``clients`` threads at once (client i sends requests i, i + clients, ...)."""
    run = Run(replies=[Reply() for _ in load])
    lock = threading.Lock()

    def client_thread(first: int) -> None:
        for index in range(first, len(load), clients):
            try:
                run.replies[index] = ask(client, model, load[index])
            except openai.OpenAIError:
                with lock:
                    run.errors += 1

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.seconds = time.perf_counter() - started
    return run


def measure(
    name: str, command: Command, model: Path, clients: int, load: list[Request], solo: dict[str, list[str]]
) -> dict[str, Any]:
    """One server at one client count: the lone replies (once per server and count), then the concurrent run."""
    port = _free_port()
    key = f"{name} @{clients}"
    with _server(command(model, port, clients), port) as (client, process):
        if key not in solo:
            solo[key] = [ask(client, model.name, request).text for request in load]
        run = concurrent(client, model.name, load, clients)
        rss = _peak_rss_mib(process.pid)
    tokens = sum(reply.tokens for reply in run.replies)
    ttfts = [reply.ttft * 1000 for reply in run.replies if reply.text]
    identical = sum(reply.text == alone for reply, alone in zip(run.replies, solo[key]))
    figures = {
        "tokens_per_second": tokens / run.seconds,
        "ttft_p50_ms": _quantile(ttfts, 0.5),
        "ttft_p95_ms": _quantile(ttfts, 0.95),
        "peak_rss_mib": rss,
        "identical": identical / len(load),
        "errors": run.errors,
    }
    print(f"  {name:22s} {clients} clients  " + "  ".join(f"{k} {v:.2f}" for k, v in figures.items()), flush=True)
    return figures


# --- goals and tables ---------------------------------------------------------------------------------------------


def ratio(rounds: list[dict[str, Any]], clients: int, ours: str, theirs: str) -> dict[str, float] | None:
    """Throughput of ``ours`` over ``theirs`` at ``clients``: median, low and high of the per-round ratios."""
    pairs = [
        r[str(clients)][ours]["tokens_per_second"] / r[str(clients)][theirs]["tokens_per_second"]
        for r in rounds
        if ours in r.get(str(clients), {}) and theirs in r.get(str(clients), {})
    ]
    if not pairs:
        return None
    return {"median": statistics.median(pairs), "low": min(pairs), "high": max(pairs)}


def goals(results: dict[str, Any]) -> list[tuple[str, float | None, str, bool | None]]:
    """The goals: (measure, value, target, met). On SmolLM2: throughput against llama-server and
    llama-cpp-python's server, the batched engine against a slot of its own, replies identical to solo, peak RSS
    within ``rss_bound``; on another model: throughput against llama-server, replies identical to solo, and peak
    RSS against llama-server's."""
    rounds, best = results["rounds"], f"{SPECSTATE} ngram"
    other_model = title(results.get("model")) != title(None)
    peers = [(4, LLAMA_SERVER, 1.0), (8, LLAMA_SERVER, 1.0)]
    if not other_model:
        peers.insert(1, (4, PEER, 2.5))
    rows: list[tuple[str, float | None, str, bool | None]] = []
    for clients, peer, target in peers:
        entry = ratio(rounds, clients, best, f"{peer} none")
        value = None if entry is None else entry["median"]
        met = None if value is None else value >= target
        rows.append((f"{clients} clients: specstate ngram / {peer} throughput", value, f">= {target:g}", met))
    if not other_model:
        entry = ratio(rounds, 1, f"{SPECSTATE} none", ALONE)
        value = None if entry is None else entry["median"]
        met = None if value is None else value >= 0.97
        rows.append(("1 client: specstate none, batched engine / a slot of its own", value, ">= 0.97", met))
    shares = [
        figures["identical"]
        for r in rounds
        for by_server in r.values()
        for name, figures in by_server.items()
        if name.startswith(SPECSTATE)
    ]
    share = min(shares) if shares else None
    rows.append(
        ("specstate replies identical to solo, lowest share", share, "1.0", None if share is None else share == 1)
    )
    if other_model:
        return [*rows, rss_against_llama_server(rounds)]
    bound = rss_bound(results)
    rss = [f["peak_rss_mib"] for r in rounds for name, f in r.get("4", {}).items() if name in BATCHED]
    peak = max(rss) if rss else None
    met = None if peak is None else peak <= bound
    rows.append(("peak RSS, 4 slots, every specstate mode (MiB)", peak, f"<= {bound:.0f}", met))
    return rows


def rss_against_llama_server(rounds: list[dict[str, Any]]) -> tuple[str, float | None, str, bool | None]:
    """The memory bound on another model than SmolLM2: at 8 clients, the batched specstate servers' largest peak RSS
    at most llama-server's + 25%."""
    ours = [f["peak_rss_mib"] for r in rounds for name, f in r.get("8", {}).items() if name in BATCHED]
    theirs = [
        r["8"][f"{LLAMA_SERVER} none"]["peak_rss_mib"] for r in rounds if f"{LLAMA_SERVER} none" in r.get("8", {})
    ]
    value = max(ours) / max(theirs) if ours and theirs else None
    return ("peak RSS, 8 clients, specstate / llama-server", value, "<= 1.25", None if value is None else value <= 1.25)


def rss_bound(results: dict[str, Any]) -> float:
    """Issue 34's bound on a batched server's peak RSS at 4 slots, MiB: the model file, 4 slots' f16 KV cache and
    200 MiB. From the run's model facts; results written before runs recorded them are SmolLM2's."""
    model_bytes = results.get("model_bytes") or smollm2_path().stat().st_size
    kv_bytes = results.get("kv_bytes_per_token") or kv_bytes_per_token(smollm2_path())
    return float(model_bytes + 4 * kv_bytes * SLOT_CTX) / 2**20 + 200


def tables(results: dict[str, Any]) -> str:
    lines = ["| goal | value | target | verdict |", "| --- | ---: | ---: | --- |"]
    for measure, value, target, met in goals(results):
        verdict = "not measured" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {measure} | {'-' if value is None else f'{value:.2f}'} | {target} | {verdict} |")
    lines += ["", "| server | clients | tokens/s | TTFT p50 ms | TTFT p95 ms | peak RSS MiB | identical to solo |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rounds = results["rounds"]
    names = list(dict.fromkeys(name for r in rounds for by_server in r.values() for name in by_server))
    for clients in results["clients"]:
        for name in [*SERVERS, *(name for name in names if name not in SERVERS)]:
            runs = [r[str(clients)][name] for r in rounds if name in r.get(str(clients), {})]
            if not runs:
                continue

            def median(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return float(statistics.median(run[key] for run in runs))

            lines.append(
                f"| {name} | {clients} | {median('tokens_per_second'):.1f} | {median('ttft_p50_ms'):.0f} | "
                f"{median('ttft_p95_ms'):.0f} | {max(run['peak_rss_mib'] for run in runs):.0f} | "
                f"{min(run['identical'] for run in runs):.0%} |"
            )
    return "\n".join(lines) + "\n"


def _setup(run: dict[str, Any]) -> str:
    """Another model's run: the model, the client counts, the rounds and the date."""
    clients = ", ".join(map(str, run["clients"]))
    return f"{title(run['model'])}, {clients} clients, {len(run['rounds'])} interleaved rounds, {run['date']}"


def _verdict(results: dict[str, Any]) -> str:
    verdicts = [met for _, _, _, met in goals(results) if met is not None]
    return f"{verdicts.count(True)} of {len(verdicts)} goals met"


def serve_fields(results: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, str]:
    """The fields of docs/benchmarks.md's section (``report.py`` fills the template with them): SmolLM2's run
    (``results``) and the other models' (``others``, :func:`load_others`)."""
    sections = [f"On {_setup(run)}; {_verdict(run)}:\n\n{tables(run).rstrip()}" for run in others]
    return {
        "serve_setup": f"{len(results['rounds'])} interleaved rounds, {results['date']}",
        "serve_tables": tables(results).rstrip("\n"),
        "serve_verdict": _verdict(results),
        "serve_others": "\n\n".join(sections) or "No other model measured yet.",
    }


def load_others(results: Path) -> list[dict[str, Any]]:
    """The other models' runs under ``results`` (``models/*/serve.json``)."""
    return [json.loads(path.read_text()) for path in sorted(results.glob("models/*/serve.json"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--requests", type=int, default=16, help="requests of each run")
    parser.add_argument("--rounds", type=int, default=2)
    add_model_options(parser, draft="adds specstate draft and llama-server draft")
    parser.add_argument("--servers", nargs="+", help="of the servers above and those the draft model adds")
    parser.add_argument("--json", type=Path, help="default: serve.json in bench_models.results_dir")
    args = parser.parse_args(argv)
    model, load = resolve(args.model), requests(args.requests)
    draft = resolve(args.draft_model) if args.draft_model else None
    servers = {**SERVERS, **draft_servers(draft)}
    names = args.servers or list(servers)
    if not set(names) <= set(servers):
        parser.error(f"unknown servers: {sorted(set(names) - set(servers))}; known: {list(servers)}")
    solo: dict[str, list[str]] = {}
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", flush=True)
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        rounds.append(
            {
                str(c): {n: measure(n, servers[n], model, c, load, solo) for n in order if n != ALONE or c == 1}
                for c in args.clients
            }
        )
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **model_facts(model, draft),
        "clients": args.clients,
        "rounds": rounds,
    }
    text = tables(results)
    print(text)
    out = args.json or results_dir(args.model, args.draft_model) / "serve.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    draft_note = f", draft model {draft.name}" if draft else ""
    out.with_suffix(".md").write_text(
        f"{title(model.name)}{draft_note}, {THREADS} threads, {results['date']}\n\n{text}"
    )
    return 0


def model_facts(model: Path, draft: Path | None) -> dict[str, Any]:
    """What a run's results record of its models: the files' names, and what the RSS goal's bound needs."""
    return {
        "model": model.name,
        "model_bytes": model.stat().st_size,
        "kv_bytes_per_token": kv_bytes_per_token(model),
        "draft_model": draft and draft.name,
    }


if __name__ == "__main__":
    sys.exit(main())
