"""``make bench-chain``: generation with llama-cpp-python's full default chat chain, specstate against it.

Both sample 160 tokens on the code prompt of ``make bench`` (SmolLM2-135M-Instruct
Q4_1) with llama-cpp-python's chat defaults -- temperature 0.2, top-p 0.95,
top-k 40, min-p 0.05, the same seed -- at the same thread count, in interleaved
rounds (every contender once per round, the order rotating): specstate in mode
``none`` and ``ngram``, llama-cpp-python's ``create_completion`` (in the
benchmark venv, ``SPECSTATE_BENCH_VENV``). Printed: tokens per second after the
first token (prefill excluded) and the ratios to llama-cpp-python, medians over
rounds with their ranges; ``--json`` writes them. ``--workload json`` asks for a
JSON answer instead and constrains both with the same grammar (llama.cpp's
conversion of JSON_SCHEMA), each generation ending where the grammar ends.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peer_venv import PEER_VENV
from specstate import Model, json_schema_to_grammar
from specstate.bench import CODE_PROMPT, interleave, pair_ratio, timed_generation
from specstate.smollm2 import smollm2_path

PEER = Path(__file__).resolve().parent / "peer_llama_cpp_python.py"
#: llama-cpp-python's chat defaults (as benchmarks/peer_llama_cpp_python.py's CHAIN).
CHAIN: dict[str, Any] = dict(temperature=0.2, top_p=0.95, top_k=40, min_p=0.05, typical_p=1.0, repeat_penalty=1.0)
SEED = 1234
#: The JSON workload: a chat prompt asking for records, and the schema their answer follows.
JSON_PROMPT = (
    "<|im_start|>user\nList five famous scientists as JSON: name, field, year of birth.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
JSON_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "field": {"type": "string"}, "born": {"type": "integer"}},
        "required": ["name", "field", "born"],
    },
    "minItems": 5,
    "maxItems": 5,
}


class Peer:
    """llama-cpp-python in its own venv, answering one measurement per request line."""

    def __init__(self, model: Path, threads: int, prompt: str, grammar: str | None) -> None:
        self.prompt, self.grammar = prompt, grammar
        python = PEER_VENV / "bin" / "python"
        command = [str(python), str(PEER), "--serve", str(model), str(threads)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def measure(self, tokens: int) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {"llm": "chain", "prompt": self.prompt, "tokens": tokens, "seed": SEED, "grammar": self.grammar}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return float(json.loads(self.process.stdout.readline())["tokens_per_s"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workload", choices=("code", "json"), default="code")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    path = smollm2_path()
    model = Model(path)
    grammar = json_schema_to_grammar(json.dumps(JSON_SCHEMA)) if args.workload == "json" else None
    prompt = JSON_PROMPT if grammar is not None else CODE_PROMPT

    def ours(mode: str) -> Any:
        settings: Any = dict(mode=mode, n_threads=args.threads, seed=SEED, grammar=grammar, **CHAIN)
        return lambda: timed_generation(model, prompt, args.tokens, **settings)[0]

    contenders = {"specstate none": ours("none"), "specstate ngram": ours("ngram")}
    peer = Peer(path, args.threads, prompt, grammar) if (PEER_VENV / "bin" / "python").exists() else None
    if peer is not None:
        contenders["llama-cpp-python"] = lambda: peer.measure(args.tokens)
    try:
        figures = interleave(contenders, args.rounds)
    finally:
        if peer is not None:
            peer.close()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "workload": args.workload,
        "tokens": args.tokens,
        "threads": args.threads,
        "chain": CHAIN,
        "figures": figures,
    }
    for name, values in figures.items():
        print(f"{name:20s} {sorted(values)[len(values) // 2]:7.1f} tok/s")
    if peer is not None:
        for name in ("specstate none", "specstate ngram"):
            ratio = pair_ratio(figures[name], figures["llama-cpp-python"])
            result[f"{name} / llama-cpp-python"] = {"median": ratio.median, "low": ratio.low, "high": ratio.high}
            print(f"{name} / llama-cpp-python: x{ratio.median:.2f} ({ratio.low:.2f}-{ratio.high:.2f})")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
