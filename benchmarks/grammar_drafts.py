"""``make bench-grammar``: drafts from the grammar, on against off, side by side.

A reply under a JSON schema of eight fixed keys (llama.cpp's conversion of SCHEMA to a grammar) and a free-text
reply (no grammar), greedy, on SmolLM2-135M-Instruct Q4_1 at 2 threads: each generated with grammar drafts on and
off in interleaved rounds (every contender once per round, the order rotating), in modes ``none`` and ``ngram``.
Printed: tokens per second after the first token (prefill excluded), the ratio on/off as the median of the
per-round ratios with their range, whether on and off gave the same tokens (they must), and the rounds each took
(in ``none``, rounds off / rounds on bounds the ratio: off decodes one row a round). ``--json`` writes the figures.

Usage: python benchmarks/grammar_drafts.py [--rounds 5] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specstate import Generator, Model, json_schema_to_grammar
from specstate._typing import Mode
from specstate.bench import STORY_PROMPT, interleave, pair_ratio
from specstate.smollm2 import smollm2_path

#: The JSON workload: a chat prompt asking for an event record, and the schema of eight fixed keys it follows.
SCHEMA_PROMPT = (
    "<|im_start|>user\nCreate a calendar event for a team meeting about the product launch next Monday as JSON: "
    "title, date, start time, end time, location, organizer, number of attendees, and whether it is online."
    "<|im_end|>\n<|im_start|>assistant\n"
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "date": {"type": "string"},
        "start_time": {"type": "string"},
        "end_time": {"type": "string"},
        "location": {"type": "string"},
        "organizer": {"type": "string"},
        "attendees": {"type": "integer"},
        "online": {"type": "boolean"},
    },
    "required": ["title", "date", "start_time", "end_time", "location", "organizer", "attendees", "online"],
    "additionalProperties": False,
}
#: Most tokens of one reply (the schema's reply ends where the grammar ends, well before).
MAX_TOKENS = 160
MODES: tuple[Mode, ...] = ("none", "ngram")


def timed(
    model: Model, prompt: list[int], threads: int, mode: Mode, grammar: str | None, on: bool
) -> Callable[[], float]:
    """A contender: one greedy generation, its tokens per second after the first token (kept in ``replies``)."""

    def once() -> float:
        generator = Generator(model, mode=mode, n_ctx=1024, n_threads=threads, grammar=grammar, grammar_drafts=on)
        generator.generate(prompt, max_tokens=1)
        started = time.perf_counter()
        generator.generate(max_tokens=MAX_TOKENS - 1)
        elapsed = time.perf_counter() - started
        replies[(mode, grammar is not None, on)] = Reply(
            generator.tokens, generator.drafted, generator.accepted, generator.rounds
        )
        return (len(generator.tokens) - 1) / elapsed

    return once


@dataclass
class Reply:
    """A contender's last reply: its tokens, the draft tokens verified and accepted, and the rounds it took."""

    tokens: list[int]
    drafted: int
    accepted: int
    rounds: int


#: The last reply of each contender.
replies: dict[tuple[Mode, bool, bool], Reply] = {}


def measure(rounds: int, threads: int) -> dict[str, Any]:
    model = Model(smollm2_path())
    grammar = json_schema_to_grammar(json.dumps(SCHEMA))
    prompts = {
        "schema": (model.tokenize(SCHEMA_PROMPT, add_special=False, parse_special=True), grammar),
        "free": (model.tokenize(STORY_PROMPT, add_special=False, parse_special=True), None),
    }
    contenders = {
        f"{workload} {mode} {'on' if on else 'off'}": timed(model, tokens, threads, mode, text, on)
        for workload, (tokens, text) in prompts.items()
        for mode in MODES
        for on in (True, False)
    }
    figures = interleave(contenders, rounds)
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    results: dict[str, Any] = {"date": date, "threads": threads, "rounds": rounds, "workloads": {}}
    for workload, (_, text) in prompts.items():
        for mode in MODES:
            on, off = figures[f"{workload} {mode} on"], figures[f"{workload} {mode} off"]
            ratio = pair_ratio(on, off)
            reply_on, reply_off = (replies[(mode, text is not None, drafts)] for drafts in (True, False))
            results["workloads"][f"{workload} {mode}"] = {
                "on_tokens_per_second": statistics.median(on),
                "off_tokens_per_second": statistics.median(off),
                "ratio": {"median": ratio.median, "low": ratio.low, "high": ratio.high},
                "identical": reply_on.tokens == reply_off.tokens,
                "tokens": len(reply_on.tokens),
                "drafted": reply_on.drafted,
                "accepted": reply_on.accepted,
                "rounds_on": reply_on.rounds,
                "rounds_off": reply_off.rounds,
                "text": model.detokenize(reply_on.tokens),
            }
    return results


#: The goals: the schema's reply at least this much faster with grammar drafts, the free text within this of off.
SCHEMA_GOAL, FREE_TOLERANCE = 1.5, 0.02


def grammar_fields(results: dict[str, Any]) -> dict[str, Any]:
    """The benchmarks page's section (docs/benchmarks.md): the table of a run and its verdicts."""
    lines = [
        "| reply, mode | on (tokens/s) | off (tokens/s) | on / off | same tokens | tokens | drafted | accepted "
        "| rounds on / off |",
        "| --- | ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: |",
    ]
    for name, entry in results["workloads"].items():
        ratio = entry["ratio"]
        lines.append(
            f"| {name} | {entry['on_tokens_per_second']:.1f} | {entry['off_tokens_per_second']:.1f} "
            f"| x{ratio['median']:.2f} ({ratio['low']:.2f}-{ratio['high']:.2f}) | "
            f"{'yes' if entry['identical'] else '**no**'} | {entry['tokens']} | {entry['drafted']} "
            f"| {entry['accepted']} | {entry['rounds_on']} / {entry['rounds_off']} |"
        )
    verdicts = []
    for mode in MODES:
        schema, free = (
            results["workloads"][f"{workload} {mode}"]["ratio"]["median"] for workload in ("schema", "free")
        )
        met = schema >= SCHEMA_GOAL and abs(free - 1) <= FREE_TOLERANCE
        verdicts.append(f"`{mode}` {'met' if met else '**missed**'} (x{schema:.2f} and x{free:.2f})")
    plain = results["workloads"]["schema none"]
    ceiling = plain["rounds_off"] / plain["rounds_on"]
    return {
        "grammar_table": "\n".join(lines),
        "grammar_threads": results["threads"],
        "grammar_rounds": results["rounds"],
        "grammar_date": results.get("date", "an earlier run"),
        "grammar_verdict": f"Target: the schema's reply at least x{SCHEMA_GOAL} with grammar drafts, the free text "
        f"within {FREE_TOLERANCE:.0%} of off: " + ", ".join(verdicts) + ".",
        "grammar_ceiling": f"x{ceiling:.2f}",
        "grammar_goal": SCHEMA_GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = measure(args.rounds, args.threads)
    for name, entry in results["workloads"].items():
        ratio = entry["ratio"]
        print(
            f"{name:12} on {entry['on_tokens_per_second']:7.1f} tok/s  off {entry['off_tokens_per_second']:7.1f} tok/s"
            f"  on/off x{ratio['median']:.2f} ({ratio['low']:.2f}-{ratio['high']:.2f})"
            f"  identical: {entry['identical']}  {entry['tokens']} tokens, drafted {entry['drafted']},"
            f" accepted {entry['accepted']}, rounds {entry['rounds_on']} / {entry['rounds_off']}"
        )
    print(f"schema reply: {results['workloads']['schema none']['text']!r}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if not all(entry["identical"] for entry in results["workloads"].values()):
        sys.exit("grammar drafts changed a reply")


if __name__ == "__main__":
    main()
