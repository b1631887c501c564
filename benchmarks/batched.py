"""``make bench-batched``: the batched engine against the same requests served one by one, interleaved.

For 1, 4 and 8 concurrent requests (a seeded mix of six prompts, 64 tokens each; greedy and sampled at
temperature 0.8; modes ``none`` and ``ngram``), each round runs the same requests two ways, in alternating order:

- ``batched``: one :class:`specstate.BatchEngine` of that many sequences, every request joined and prefilled, then
  stepped until all are done (one decode per step for all of them);
- ``shared``: one thread per request, each with a :class:`specstate.Generator` attached to one
  :class:`specstate.SharedEngine` (what ``specstate serve --slots N`` does);
- ``one by one``: one :class:`specstate.Generator` per request, run to its end before the next starts (what a single
  server slot does).

Both on SmolLM2-135M-Instruct Q4_1 with the same threads (``--threads``, default 2). Printed per configuration: the
aggregate tokens per second of each way (median over rounds; the engines are made before the clock starts, the
generators after), the ratios to one by one, and the share of batched and shared replies that equal, token for
token, the same request served alone. ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specstate import BatchEngine, Generator, Model, SharedEngine, encode_prompt
from specstate.smollm2 import smollm2_path

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "List ten fruits and one fact about each.",
    "Explain how a bicycle works.",
    "Copy this line three times: the quick brown fox jumps over the lazy dog.",
    'def reverse(items):\n    """Reverse a list."""\n    return items[::-1]\n\n\ndef reverse_words(text):\n',
    "Describe a walk through a city at night.",
]
N_CTX = 1024


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    mode: str
    temperature: float
    seed: int
    budget: int

    def generator(self, model: Model, threads: int, engine: SharedEngine | None = None) -> Generator:
        return Generator(
            model,
            mode=self.mode,
            n_ctx=N_CTX,
            n_threads=threads,
            temperature=self.temperature,
            seed=self.seed,
            engine=engine,
        )


def requests(model: Model, n: int, mode: str, temperature: float, budget: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(encode_prompt(model, rng.choice(PROMPTS)), mode, temperature, rng.randrange(1 << 30), budget)
        for _ in range(n)
    ]


def alone(model: Model, request: Request, threads: int, engine: SharedEngine | None = None) -> list[int]:
    """The reply of ``request`` served alone (or on ``engine``): its rounds bounded by the remaining budget."""
    native = request.generator(model, threads, engine)._native
    native.prefill(request.prompt)
    reply: list[int] = []
    while len(reply) < request.budget and (tokens := native.take(1 << 30, max_commit=request.budget - len(reply))):
        reply += tokens
    return reply


def one_by_one(model: Model, batch: list[Request], threads: int) -> tuple[list[list[int]], float]:
    started = time.perf_counter()
    replies = [alone(model, request, threads) for request in batch]
    return replies, time.perf_counter() - started


def shared(model: Model, batch: list[Request], threads: int) -> tuple[list[list[int]], float]:
    engine = SharedEngine(model, n_seq=len(batch), n_ctx=N_CTX, n_threads=threads)
    replies: list[list[int]] = [[] for _ in batch]

    def serve(index: int) -> None:
        replies[index] = alone(model, batch[index], threads, engine)

    workers = [threading.Thread(target=serve, args=(index,)) for index in range(len(batch))]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return replies, time.perf_counter() - started


def batched(model: Model, batch: list[Request], threads: int) -> tuple[list[list[int]], float]:
    engine = BatchEngine(model, n_seq=len(batch), n_ctx=N_CTX, n_threads=threads)
    started = time.perf_counter()
    seqs = [engine.join(request.generator(model, threads)) for request in batch]
    for seq, request in zip(seqs, batch):
        engine.prefill(seq, request.prompt)
    replies: list[list[int]] = [[] for _ in batch]
    live = set(range(len(batch)))
    while live:
        for index in list(live):
            replies[index] += engine.take(seqs[index])
            remaining = batch[index].budget - len(replies[index])
            if remaining <= 0 or engine.done(seqs[index]):
                live.discard(index)
                engine.remove(seqs[index])
            else:
                engine.set_budget(seqs[index], remaining)
        if live:
            engine.step()
    return replies, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = Model(smollm2_path())
    rows = []
    header = f"{'clients':>7} {'mode':>6} {'temp':>4} {'one by one':>10} {'batched':>8} {'shared':>8}"
    print(header, f"{'ratios':>11} {'identical':>9}")
    for n in args.clients:
        for mode in ("none", "ngram"):
            for temperature in (0.0, 0.8):
                rows.append(measure(model, args, n, mode, temperature))
                row = rows[-1]
                print(
                    f"{n:>7} {mode:>6} {temperature:>4} {row['one_by_one_tps']:>10.1f} {row['batched_tps']:>8.1f}"
                    f" {row['shared_tps']:>8.1f} x{row['batched_ratio']:.2f} x{row['shared_ratio']:.2f}"
                    f" {row['identical']:>4}/{row['replies']:<4}"
                )
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "tokens": args.tokens, "rows": rows}, indent=1))


def measure(model: Model, args: argparse.Namespace, n: int, mode: str, temperature: float) -> dict[str, object]:
    rates: dict[str, list[float]] = {"batched": [], "shared": [], "one_by_one": []}
    identical = replies = 0
    for round_ in range(args.rounds):
        batch = requests(model, n, mode, temperature, args.tokens, seed=round_)
        ways = [("batched", batched), ("shared", shared), ("one_by_one", one_by_one)]
        results = {}
        for name, run in ways if round_ % 2 == 0 else ways[::-1]:
            results[name] = run(model, batch, args.threads)
            tokens = sum(len(reply) for reply in results[name][0])
            rates[name].append(tokens / results[name][1])
        solo = results["one_by_one"][0]
        for way in ("batched", "shared"):
            identical += sum(a == b for a, b in zip(solo, results[way][0]))
            replies += len(batch)
    tps = {way: statistics.median(rates[way]) for way in rates}
    return {
        "clients": n,
        "mode": mode,
        "temperature": temperature,
        **{f"{way}_tps": value for way, value in tps.items()},
        "batched_ratio": tps["batched"] / tps["one_by_one"],
        "shared_ratio": tps["shared"] / tps["one_by_one"],
        "identical": identical,
        "replies": replies,
    }


if __name__ == "__main__":
    main()
