#!/usr/bin/env python3
"""Function calling as a llama-cpp-python (or OpenAI) script writes it, running on specstate.

Usage::

    python examples/tools.py                        # SmolLM2-135M-Instruct with a Hermes-style tools template
    python examples/tools.py --model model.gguf     # a model whose own template takes tools (Qwen 2.5, ...)

The model is asked about the weather; ``tool_choice="required"`` makes its reply a call of ``get_weather``
(a grammar built from the function's JSON schema keeps the arguments parseable), the script runs the
function, sends the result back as a ``tool`` message, and the model answers in words. SmolLM2's own
template has no tools, so the example gives it ``hermes_tools.jinja`` (Qwen 2.5's format) beside this file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specstate import Llama  # was: from llama_cpp import Llama
from specstate.smollm2 import smollm2_path

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}


def get_weather(city: str) -> str:
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF chat model whose template takes tools (default: SmolLM2)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    template = None if args.model else (Path(__file__).parent / "hermes_tools.jinja").read_text()
    llm = Llama(model_path=args.model or str(smollm2_path()), chat_template=template, n_threads=args.threads)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = llm.create_chat_completion(
        messages=messages, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=64, temperature=0
    )
    message = reply["choices"][0]["message"]
    call = message["tool_calls"][0]
    print("finish_reason:", reply["choices"][0]["finish_reason"])
    print("call:", call["function"]["name"], json.dumps(json.loads(call["function"]["arguments"])))
    result = get_weather(**json.loads(call["function"]["arguments"]))
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": result}]
    answer = llm.create_chat_completion(messages=messages, tools=[WEATHER_TOOL], max_tokens=48, temperature=0)
    print("answer:", answer["choices"][0]["message"]["content"])


if __name__ == "__main__":
    main()
