"""Text prompts mean what they say: special-token text is parsed, as llama.cpp's tools parse it.

A new user's example: a chat-formatted string given to
``Generator.generate`` on SmolLM2-Instruct reaches the model as its special
tokens (not as punctuation and letters), so it gets the reply the token ids
would get, ending its turn. ``literal=True`` (``--literal`` on the command
line) keeps the plain-text reading.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specstate import Generator, Model, encode_prompt

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def special_id(model: Model, text: str) -> int:
    (token,) = model.tokenize(text, add_special=False, parse_special=True)
    return token


def test_special_token_text_becomes_the_special_token(smollm2: Model) -> None:
    tokens = encode_prompt(smollm2, CHAT)
    start, end = special_id(smollm2, "<|im_start|>"), special_id(smollm2, "<|im_end|>")
    assert tokens.count(start) == 2 and tokens.count(end) == 1
    assert tokens == smollm2.tokenize(CHAT, add_special=True, parse_special=True)
    literal = encode_prompt(smollm2, CHAT, literal=True)
    assert start not in literal and end not in literal
    assert len(literal) > len(tokens) + 10  # each marker spelt out in several tokens


def test_a_chat_text_prompt_gets_the_reply_its_tokens_get(smollm2: Model) -> None:
    from_text = Generator(smollm2, n_ctx=512, n_threads=1)
    reply = from_text.generate(CHAT, max_tokens=64)
    from_tokens = Generator(smollm2, n_ctx=512, n_threads=1)
    from_tokens.generate(smollm2.tokenize(CHAT, add_special=True, parse_special=True), max_tokens=64)
    assert from_text.prompt_tokens == from_tokens.prompt_tokens
    assert from_text.tokens == from_tokens.tokens
    assert from_text.finished and from_text.stopped_by == "eos", reply  # a reply that ends its turn
    assert "Paris" in reply
    literal = Generator(smollm2, n_ctx=512, n_threads=1)
    literal.generate(CHAT, max_tokens=64, literal=True)
    assert literal.prompt_tokens == encode_prompt(smollm2, CHAT, literal=True) != from_text.prompt_tokens


def test_the_command_line_reads_prompts_the_same_way(smollm2_file: Path, tmp_path: Path) -> None:
    def prompt_of(*options: str) -> int:
        checkpoint = tmp_path / f"run{len(options)}.ckpt"
        subprocess.run(
            [sys.executable, "-m", "specstate", "generate", "--model", str(smollm2_file), "--max-tokens", "1",
             "--quiet", "--save", str(checkpoint), *options, CHAT],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        info = subprocess.run(
            [sys.executable, "-m", "specstate", "inspect", "--json", str(checkpoint)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        n_prompt: int = json.loads(info.stdout)["n_prompt"]
        return n_prompt

    model = Model(smollm2_file)
    assert prompt_of() == len(encode_prompt(model, CHAT))
    assert prompt_of("--literal") == len(encode_prompt(model, CHAT, literal=True))
