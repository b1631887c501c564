"""Exact verification (issue 21): a verified row gets the bits of the single-token decode, on any thread count.

specstate's llama.cpp patch (llama-cpp-sys-4/patches) runs batches of up to 17 rows through the single-row
kernels and gives flash attention a KV chunk shape that does not depend on the thread count. So:

* the logits of every row of a batch of 2..17 equal, byte for byte, those of decoding the same tokens one at
  a time, for Q4_1 (SmolLM2 as shipped), Q4_0 (repacked for AVX2), Q8_0 (tinyBLAS for prefill) and Q4_K weights,
  at 1 to 4 threads, after a prompt long enough (300 tokens) that the KV cache spans several chunks;
* speculative greedy output equals plain greedy output token for token in every mode;
* a checkpoint continues exactly on another thread count.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from generator_support import MODES, tiny_generator
from requantize import cached_copy
from specstate import Context, Generator, Model
from specstate.smollm2 import cache_dir

#: Thread counts compared (with 1 thread, a single decode's flash attention is what a batch row computes; more
#: threads split a single query's KV cells). Above the 2 cores of this project's machines, ggml's spinning thread
#: pool makes oversubscribed runs slow, so 3 and 4 threads are checked once, on the shipped weights.
THREADS = {"Q4_1": (1, 2, 3, 4), "Q4_0": (1, 2), "Q8_0": (1, 2), "Q4_K": (1, 2)}
#: Verification batches: the drafts specstate verifies are at most 16 tokens, plus the last committed one.
ROWS = 17
#: Batch sizes checked: both sides of the repacked kernels' groups of 4, and the largest.
BATCHES = (2, 3, 4, 5, 8, 9, 16, 17)
QUANTS = {"Q4_1": None, "Q4_0": T.Q4_0, "Q8_0": T.Q8_0, "Q4_K": T.Q4_K}
VERIFIED = " and the minutes were approved without a single vote by all of the members who were present there"
LONG_TEXT = "The committee met on Tuesday to review the budget, the schedule and the open questions. " * 25


@pytest.fixture(scope="module")
def quantized(smollm2_file: Path) -> dict[str, Model]:
    """SmolLM2 as shipped (Q4_1) and copies requantized to Q4_0, Q8_0 and Q4_K (built once, cached)."""
    directory = cache_dir() / "requantized"
    return {
        name: Model(smollm2_file if kind is None else cached_copy(smollm2_file, kind, directory))
        for name, kind in QUANTS.items()
    }


def _bits(context: Context, row: int) -> bytes:
    return array("f", context.logits(row)).tobytes()


def _singles(context: Context, tokens: list[int], start: int) -> list[bytes]:
    """The logits of decoding ``tokens`` one at a time from ``start``."""
    rows = []
    for offset, token in enumerate(tokens):
        context.decode([token], start + offset)
        rows.append(_bits(context, -1))
    return rows


@pytest.mark.parametrize("quant", QUANTS)
def test_verified_rows_equal_single_decodes_bit_for_bit(quantized: dict[str, Model], quant: str) -> None:
    model = quantized[quant]
    prompt = model.tokenize(LONG_TEXT)[:300]
    tokens = model.tokenize(
        " and the minutes were approved without a single vote by all of the members who were present there on that day"
    )[:ROWS]
    assert len(tokens) == ROWS
    reference: list[bytes] | None = None
    for n_threads in THREADS[quant]:
        context = Context(model, n_ctx=512, n_threads=n_threads)
        context.decode(prompt, 0)
        state = context.seq_state()
        singles = _singles(context, tokens, len(prompt))
        reference = reference or singles
        assert singles == reference, f"{quant}: single decodes at {n_threads} threads differ from 1 thread"
        for n in BATCHES:
            context.set_seq_state(0, state)
            context.decode(tokens[:n], len(prompt), all_logits=True)
            rows = [_bits(context, row) for row in range(n)]
            differing = [row for row in range(n) if rows[row] != reference[row]]
            assert not differing, f"{quant}, {n_threads} threads, batch of {n}: rows {differing} differ"


PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the planets of the solar system in order.",
    "Copy this sentence exactly: the quick brown fox jumps over the lazy dog.",
    "What is the capital of France, and why is it famous?",
    "Explain what a hash map is in two sentences.",
    "Write a haiku about autumn leaves.",
    "Give three tips for writing clear documentation.",
    "Translate 'good morning, how are you?' into Spanish and French.",
    "Write a JSON object describing a book with a title, an author and a year.",
    "Summarize the plot of Romeo and Juliet.",
    "Count from one to twenty in words.",
    "Write a SQL query that selects all users older than thirty.",
    "What are the primary colors?",
    "Describe the water cycle.",
    "Write a short story about a robot who learns to paint.",
    "Repeat the word 'echo' ten times, separated by commas.",
    "Explain recursion to a child.",
    "Write a bash command that counts the lines of every .py file in a directory.",
    "Name five fruits that are red.",
    "Rewrite this list in alphabetical order: pear, apple, fig, banana, cherry.",
]


#: Prompts per mode: all 20 with prompt lookup; 5 with SmolLM2 drafting for itself (twice the compute).
PROMPTS_PER_MODE = {"ngram": len(PROMPTS), "draft": 5}


@pytest.fixture(scope="module")
def smollm2_self_draft(smollm2_file: Path) -> Model:
    return Model(smollm2_file)


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_greedy_equals_plain_greedy_on_smollm2(
    smollm2: Model, smollm2_self_draft: Model, mode: str
) -> None:
    """Chat prompts, 160 tokens each, 2 threads: speculation commits plain greedy's tokens."""
    from specstate.chat import chat_template

    template = chat_template(smollm2)
    for text in PROMPTS[: PROMPTS_PER_MODE[mode]]:
        prompt = template.prompt_tokens([("user", text)])
        plain = Generator(smollm2, n_ctx=512, n_threads=2)
        plain.generate(prompt, max_tokens=160)
        draft = smollm2_self_draft if mode == "draft" else None
        speculative = Generator(smollm2, mode=mode, draft_model=draft, n_ctx=512, n_threads=2)  # type: ignore[arg-type]
        speculative.generate(prompt, max_tokens=160)
        assert speculative.tokens == plain.tokens, f"{mode} parted from plain greedy on {text!r}"


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_equals_plain_greedy_on_tiny_models(tiny_map: dict[str, Path], mode: str) -> None:
    plain = tiny_generator("none", tiny_map, n_threads=2)
    plain.generate("the tiny models speculate", max_tokens=120)
    speculative = tiny_generator(mode, tiny_map, n_threads=2)
    speculative.generate("the tiny models speculate", max_tokens=120)
    assert speculative.tokens == plain.tokens


@pytest.mark.parametrize("n_threads", [1, 3])
def test_a_checkpoint_taken_at_two_threads_resumes_exactly_on_another_count(smollm2: Model, n_threads: int) -> None:
    prompt = smollm2.tokenize(LONG_TEXT)[:200]
    uninterrupted = Generator(smollm2, mode="ngram", n_ctx=512, n_threads=2)
    uninterrupted.generate(prompt, max_tokens=120)
    first = Generator(smollm2, mode="ngram", n_ctx=512, n_threads=2)
    first.generate(prompt, max_tokens=50)
    resumed = Generator.restore(first.checkpoint(), smollm2, n_threads=n_threads)
    resumed.generate(max_tokens=120 - len(resumed.tokens))
    assert resumed.tokens == uninterrupted.tokens
