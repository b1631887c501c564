"""Upstream llama.cpp's logits for benchmarks/quality.py; runs inside the benchmark's own venv (llama-cpp-python).

python quality_peer.py REQUEST.json -> writes the logits and prints one JSON object.
REQUEST: {"model", "tokens": [ids], "text", "n_batch", "threads", "out"}: the tokens decoded in one context by
``Llama.eval`` with every row's logits (``logits_all``), ``n_batch`` rows a decode (``n_ubatch`` follows it), their
raw float32 logits saved with ``np.save`` to "out" (tokens x vocabulary). Printed: the seconds of the decode,
llama-cpp-python's version, and whether its own tokenization of "text" (BOS as the model asks) begins with the
tokens it was given.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    tokens: list[int] = request["tokens"]
    threads = request["threads"]
    llm = Llama(
        request["model"],
        n_ctx=len(tokens),
        n_batch=request["n_batch"],
        logits_all=True,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    start = time.perf_counter()
    llm.eval(tokens)
    seconds = time.perf_counter() - start
    np.save(request["out"], llm.scores[: len(tokens)])
    own = llm.tokenize(request["text"].encode(), add_bos=True, special=False)
    print(
        json.dumps({"seconds": seconds, "version": llama_cpp.__version__, "same_tokens": own[: len(tokens)] == tokens})
    )


if __name__ == "__main__":
    main()
