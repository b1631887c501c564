"""llama-cpp-python's figures for benchmarks/run.py; runs inside the benchmark's own venv.

Checkpoints: python peer_llama_cpp_python.py REQUEST.json -> prints one JSON object.
REQUEST: {"model", "threads", "runs", "checkpoint_tokens": [..], "checkpoint_text"}

Speeds: python peer_llama_cpp_python.py --serve MODEL THREADS (0: its default) -> one measurement per request line,
so that a benchmark can interleave them with its own: each line of stdin is {"llm": "plain" | "prompt_lookup",
"prompt": text, "tokens": n}, answered by one line {"tokens_per_s", "tokens"} (prefill excluded). With
"llm": "chain" and a "seed", the completion samples with llama-cpp-python's chat defaults (CHAIN), constrained
by the request's "grammar" (GBNF text) when it has one.

Batch costs: python peer_llama_cpp_python.py --batches MODEL THREADS -> the first line of stdin is {"prompt": [ids],
"batch": [ids]} (answered {"ready": true} once the prompt is decoded), each next one {"rows": n, "repeats": r},
answered {"seconds"}: the best of r decodes of the batch's first n tokens after the prompt, every row's logits, the
KV cache cut back to the prompt before each (what benchmarks/verify_cost.py times on specstate).

Prefill: python peer_llama_cpp_python.py --prefill MODEL THREADS -> the first line of stdin is {"prompt": [ids]}
(answered {"ready": true}), each next one {"repeats": r}, answered {"seconds"}: the best of r decodes of the whole
prompt into an emptied KV cache, at llama-cpp-python's default ``n_batch`` (512), the last row's logits only (what
benchmarks/real_models.py times against specstate's exact prefill).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import Llama, LlamaGrammar, LlamaState
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

#: llama-cpp-python's chat defaults (create_chat_completion's signature), its full sampler chain.
CHAIN: dict[str, Any] = dict(temperature=0.2, top_p=0.95, top_k=40, min_p=0.05, typical_p=1.0, repeat_penalty=1.0)


def chain_stream(llm: Llama, prompt: str, n: int, seed: int, grammar: str | None = None) -> tuple[list[str], float]:
    """A completion of ``n`` tokens sampled with CHAIN (and ``grammar``); seconds after the first piece (prefill
    excluded)."""
    pieces: list[str] = []
    started = 0.0
    constrained = None if grammar is None else LlamaGrammar.from_string(grammar, verbose=False)
    for chunk in llm.create_completion(prompt, max_tokens=n, seed=seed, stream=True, grammar=constrained, **CHAIN):
        if not pieces:
            started = time.perf_counter()
        pieces.append(chunk["choices"][0]["text"])  # type: ignore[index]
    return pieces, time.perf_counter() - started


def median(runs: int, measure: Any) -> float:
    measure()
    return statistics.median(measure() for _ in range(runs))


def greedy_stream(llm: Llama, tokens: list[int], n: int) -> tuple[list[int], float]:
    """Greedy generation of n tokens; seconds after the first token (prefill excluded)."""
    out: list[int] = []
    started = 0.0
    for token in llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if not out:
            started = time.perf_counter()
        out.append(token)
        if len(out) == n or llm.token_eos() == token:
            break
    return out, time.perf_counter() - started


def serve(model: str, threads: int) -> None:
    """Answer measurement requests from stdin, one JSON line each, until stdin closes. ``threads`` 0: llama-cpp-python's
    own default thread counts."""
    common: dict[str, Any] = dict(n_ctx=1024, verbose=False)
    if threads:
        common.update(n_threads=threads, n_threads_batch=threads)
    llms = {
        "plain": Llama(model, **common),
        "prompt_lookup": Llama(
            model, logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **common
        ),
    }
    for line in sys.stdin:
        request = json.loads(line)
        if request["llm"] == "chain":
            pieces, seconds = chain_stream(
                llms["plain"], request["prompt"], request["tokens"], request["seed"], request.get("grammar")
            )
            print(json.dumps({"tokens_per_s": (len(pieces) - 1) / seconds, "tokens": len(pieces)}), flush=True)
            continue
        llm = llms[request["llm"]]
        out, seconds = greedy_stream(
            llm, llm.tokenize(request["prompt"].encode(), add_bos=False, special=True), request["tokens"]
        )
        print(json.dumps({"tokens_per_s": (len(out) - 1) / seconds, "tokens": out}), flush=True)


def batches(model: str, threads: int) -> None:
    """Answer batch timings from stdin, one JSON line each, until stdin closes (the module's docstring)."""
    setup = json.loads(sys.stdin.readline())
    prompt, batch = setup["prompt"], setup["batch"]
    llm = Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads, logits_all=True, verbose=False)
    llm.eval(prompt)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        best = float("inf")
        for _ in range(request["repeats"]):
            llm.n_tokens = len(prompt)  # eval() first drops the KV cache's cells from n_tokens on
            started = time.perf_counter()
            llm.eval(batch[: request["rows"]])
            int(np.argmax(llm.scores[llm.n_tokens - 1]))
            best = min(best, time.perf_counter() - started)
        print(json.dumps({"seconds": best}), flush=True)


def prefill(model: str, threads: int) -> None:
    """Answer prefill timings from stdin, one JSON line each, until stdin closes (the module's docstring)."""
    prompt = json.loads(sys.stdin.readline())["prompt"]
    # llama-cpp-python's default n_batch (512): its big batches take ggml's inexact batched kernels.
    llm = Llama(model, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        best = float("inf")
        for _ in range(json.loads(line)["repeats"]):
            llm.n_tokens = 0  # eval() first drops the KV cache's cells from n_tokens on: all of them
            started = time.perf_counter()
            llm.eval(prompt)
            best = min(best, time.perf_counter() - started)
        print(json.dumps({"seconds": best}), flush=True)


def main() -> None:
    modes = {"--serve": serve, "--batches": batches, "--prefill": prefill}
    if sys.argv[1] in modes:
        modes[sys.argv[1]](sys.argv[2], int(sys.argv[3]))
        return
    request = json.loads(Path(sys.argv[1]).read_text())
    model, threads, runs = request["model"], request["threads"], request["runs"]
    result: dict[str, Any] = {}
    import llama_cpp

    result["version"] = llama_cpp.__version__

    result["checkpoints"] = {}
    for n_tokens in request["checkpoint_tokens"]:
        llm = Llama(model, n_ctx=n_tokens + 64, n_threads=threads, n_threads_batch=threads, verbose=False)
        tokens = llm.tokenize(request["checkpoint_text"].encode(), add_bos=True)[:n_tokens]
        llm.eval(tokens)
        state: LlamaState = llm.save_state()
        size = len(state.llama_state) + state.scores.nbytes + np.asarray(state.input_ids).nbytes

        def save_load(llm: Llama = llm) -> float:
            started = time.perf_counter()
            saved = llm.save_state()
            llm.load_state(saved)
            return time.perf_counter() - started

        def save(llm: Llama = llm) -> float:
            started = time.perf_counter()
            llm.save_state()
            return time.perf_counter() - started

        result["checkpoints"][str(n_tokens)] = {
            "size": size,
            "llama_state_bytes": len(state.llama_state),
            "scores_bytes": state.scores.nbytes,
            "save_load_seconds": median(runs, save_load),
            "save_seconds": median(runs, save),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
