"""Exact verification (issue 21): a verified row gets the bits of the single-token decode, on any thread count.

specstate's llama.cpp patch (llama-cpp-sys-4/patches) runs batches of up to 17 rows through the single-row
kernels and gives flash attention a KV chunk shape that does not depend on the thread count. So:

* the logits of every row of a batch of 2..17 equal, byte for byte, those of decoding the same tokens one at
  a time, for Q4_1 (SmolLM2 as shipped), Q4_0 (repacked for AVX2), Q8_0 (tinyBLAS for prefill) and Q4_K weights,
  at 1 and 2 threads (3 and 4 outside the suite), after a prompt long enough (300 tokens) that the KV cache
  spans several chunks;
so speculative greedy output can equal plain greedy output token for token, and a checkpoint continue
exactly on another thread count (the generation-level tests are the next step of issue 21).
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from requantize import cached_copy
from specstate import Context, Model
from specstate.smollm2 import cache_dir

#: Thread counts compared. With 1 thread a single decode's flash attention is one pass, as a batch row's is; with 2,
#: stock llama.cpp splits a single query's KV cells in two. 3 and 4 threads were compared outside the suite
#: (benchmarks/divergence, docs/verification-numerics.md): on this project's 2-core machines ggml's spinning thread
#: pool makes an oversubscribed decode take seconds, too slow to run here.
THREADS = (1, 2)
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
    for n_threads in THREADS:
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
