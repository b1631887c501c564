"""Exact verification: a verified row gets the bits of the single-token decode, on any thread count.

specstate's llama.cpp patch (llama-cpp-sys-4/patches) runs batches of up to 17 rows through the single-row
kernels and gives flash attention a KV chunk shape that does not depend on the thread count. So:

* the logits of every row of a batch of 2..17 equal, byte for byte, those of decoding the same tokens one at
  a time, for Q4_1 (SmolLM2 as shipped), Q4_0 (repacked for AVX2), Q8_0 (tinyBLAS for prefill), Q5_0, Q4_K, Q5_K
  (with Q5_1) and Q6_K weights,
  at 1 and 2 threads (3 and 4 outside the suite), after a prompt long enough (300 tokens) that the KV cache
  spans several chunks;
so speculative greedy output can equal plain greedy output token for token, and a checkpoint continue
exactly on another thread count.
"""

from __future__ import annotations

import os
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from specstate import Context, Generator, Model
from specstate.smollm2 import cache_dir
from specstate_testkit.requantize import cached_copy

#: Thread counts compared. With 1 thread a single decode's flash attention is one pass, as a batch row's is; with 2,
#: stock llama.cpp splits a single query's KV cells in two. 3 and 4 threads were compared outside the suite
#: (benchmarks/divergence, docs/verification-numerics.md): on this project's 2-core machines ggml's spinning thread
#: pool makes an oversubscribed decode take seconds, too slow to run here.
THREADS = (1, 2)
#: Verification batches: the drafts specstate verifies are at most 16 tokens, plus the last committed one.
ROWS = 17
#: Batch sizes checked: both sides of the repacked kernels' groups of 4, and the largest.
BATCHES = (2, 3, 4, 5, 8, 9, 16, 17)
QUANTS = {
    "Q4_1": None,
    "Q4_0": T.Q4_0,
    "Q8_0": T.Q8_0,
    "Q5_0": T.Q5_0,
    "Q4_K": T.Q4_K,
    "Q5_K": T.Q5_K,
    "Q6_K": T.Q6_K,
}
VERIFIED = " and the minutes were approved without a single vote by all of the members who were present there"
LONG_TEXT = "The committee met on Tuesday to review the budget, the schedule and the open questions. " * 25


@pytest.fixture(scope="module")
def quantized(smollm2_file: Path) -> dict[str, Model]:
    """SmolLM2 as shipped (Q4_1) and copies requantized to Q4_0, Q8_0, Q5_0, Q4_K, Q5_K and Q6_K (built once,
    cached)."""
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


#: The ways of summing the exact multi-column kernels' integer products (patch 0005): AVX2's maddubs + madd, and
#: VNNI's dpbusd, VEX or EVEX encoded, where the CPU has them (a way it lacks falls back to AVX2).
EXACT_SUMS = ("avx2", "avxvnni", "avx512vnni")
SUPPORT = Path(__file__).resolve().parent.parent / "support"


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    flags = [line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")] if cpuinfo.exists() else []
    return set(flags[0].split(":", 1)[1].split()) if flags else set()


@pytest.mark.parametrize("quant", ["Q4_1", "Q8_0"])
def test_every_way_of_summing_gives_the_same_bits(quantized: dict[str, Model], quant: str) -> None:
    """VNNI's dpbusd gives the integer sums of maddubs + madd (no 16-bit sum can saturate on these operands), so
    a decode and every verified row have the same bits whichever the CPU runs: each way, in its own process, keeps
    batch rows equal to single decodes, and all give the same logits. With VNNI sums on a CPU with AVX512-VNNI the
    products of several columns run in 512-bit tiles (patch 0008), with AVX2 sums in 256-bit ones: both paths."""
    flags = _cpu_flags()
    zmm_tiles = {"avx512_vnni", "avx512bw", "avx512vl"} <= flags
    available = {
        "avx2",
        *(("avxvnni",) if "avx_vnni" in flags else ()),
        *(("avx512vnni",) if "avx512_vnni" in flags else ()),
    }
    digests = {}
    for sums in EXACT_SUMS:
        for n_threads in THREADS:
            result = subprocess.run(
                [sys.executable, str(SUPPORT / "exact_sums_worker.py"), str(quantized[quant].path), str(n_threads)],
                env={**os.environ, "GGML_CPU_EXACT_SUMS": sums},
                capture_output=True,
                text=True,
                check=True,
            )
            ran, tiles, _, _, digests[sums, n_threads] = result.stdout.split()[-5:]
            assert ran == (sums if sums in available else "avx2")  # a way the CPU lacks is not taken
            assert tiles == ("avx512" if ran != "avx2" and zmm_tiles else "avx2")
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("quant", ["Q4_1", "Q8_0"])
def test_attention_sharing_each_cell_gives_the_same_bits(quantized: dict[str, Model], quant: str) -> None:
    """Patch 0006: the queries that read one K/V head (a token's heads, a verified batch's rows) take each cell's
    conversion once for all of them, each query keeping its own operations in its own order. Each way, in its own
    process and after a prompt spanning two chunks of cells, keeps batch rows equal to single decodes, and both give
    the logits of each query walking the cells alone."""
    digests = {}
    for attention in ("shared", "rows"):
        for n_threads in THREADS:
            env = {key: value for key, value in os.environ.items() if key != "GGML_CPU_EXACT_ATTN"}
            result = subprocess.run(
                [sys.executable, str(SUPPORT / "exact_sums_worker.py"), str(quantized[quant].path), str(n_threads)],
                env={**env, **({"GGML_CPU_EXACT_ATTN": "rows"} if attention == "rows" else {})},
                capture_output=True,
                text=True,
                check=True,
            )
            _, _, ran, prompt_tokens, digests[attention, n_threads] = result.stdout.split()[-5:]
            assert ran == attention
            assert int(prompt_tokens) > 256  # a single decode's heads span two chunks
    assert len(set(digests.values())) == 1, digests


#: The multi-column kernels with a switch each copy runs: the switch back to the single-column kernel and where the
#: worker's output gives its way and chunk count (from the end), for each; and the ways of summing the model's
#: tensors run with (Q5_0's ``avx512vnni`` takes its AVX-512 tiles, ``avx2`` its multi-column kernel; a CPU without
#: AVX512-VNNI falls back to AVX2, so the Q5_K copy's one way runs the best kernel each CPU has; Q4_K's and Q6_K's
#: ``avx512vnni`` run their products in AVX-512 registers, patches 0017 and 0018, ``avx2`` in AVX2). The Q4_K copy's
#: 576-wide tensors are Q5_0 (its kernels are checked there, in the same processes), the Q5_K copy's Q5_1.
COLUMN_KERNELS: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    "Q4_K": ({"GGML_CPU_EXACT_Q4_K": -7, "GGML_CPU_EXACT_Q5_0": -11}, ("avx2", "avx512vnni")),
    "Q6_K": ({"GGML_CPU_EXACT_Q6_K": -9}, ("avx2", "avx512vnni")),
    "Q4_0": ({"GGML_CPU_EXACT_Q4_0": -13}, ("avx2",)),
    "Q5_K": ({"GGML_CPU_EXACT_Q5_K": -17, "GGML_CPU_EXACT_Q5_1": -15}, ("avx512vnni",)),
}


@pytest.mark.parametrize("quant", COLUMN_KERNELS)
def test_columns_at_once_give_the_same_bits(quantized: dict[str, Model], quant: str) -> None:
    """Patches 0011 (Q4_K, repacked), 0012 (Q6_K), 0013 (Q5_0), 0014 (Q4_0, repacked) and 0015 (Q5_1, Q5_K): a
    verification's products take every column of a weight row at once (each weight block loaded and unpacked once
    for all of them), each column with the bits of the single-column kernel a decode runs (the repacked gemv,
    ``vec_dot``). Each way, in its own process, keeps batch rows equal to single decodes (the multi-column one at 1
    and 2 threads, the reference at 1), the multi-column kernel really runs (its chunk counter), and both give the
    logits of the single-column kernel once per column (``GGML_CPU_EXACT_Q4_K=rows``, ``..._Q6_K=rows``,
    ``..._Q5_0=rows`` and so on); the other exact kernels' ways of summing change no bit either (a way the CPU lacks
    falls back to AVX2). The SmolLM2 copies' K-quant matrices are their 1,536-wide ``ffn_down`` (the 576-wide rest
    falls back to Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K); the Q4_0 copy is Q4_0 throughout."""
    switches, ways_of_summing = COLUMN_KERNELS[quant]
    worker = [sys.executable, str(SUPPORT / "exact_sums_worker.py"), str(quantized[quant].path)]
    digests = {}
    for way in ("cols", "rows"):
        # the reference once: the multi-column way at every thread count must give its bits
        for n_threads in THREADS if way == "cols" else THREADS[:1]:
            for sums in ways_of_summing if way == "cols" else ("avx2",):
                env = {key: value for key, value in os.environ.items() if key not in switches}
                env["GGML_CPU_EXACT_SUMS"] = sums
                if way == "rows":
                    env.update(dict.fromkeys(switches, "rows"))
                result = subprocess.run([*worker, str(n_threads)], env=env, capture_output=True, text=True, check=True)
                output = result.stdout.split()
                digests[way, n_threads, sums] = output[-1]
                for switch, field in switches.items():
                    ran, chunks = output[field], output[field + 1]
                    assert ran == way, switch
                    assert (int(chunks) > 0) == (way == "cols"), f"{switch}: the multi-column kernel ran {chunks}"
    assert len(set(digests.values())) == 1, digests


#: Twenty prompts of different kinds: code, lists, prose, questions, repetition (prompt lookup drafts from these).
PROMPTS = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n# The same again:\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Once upon a time, in a small village by the sea, there lived",
    "List the planets of the solar system in order from the sun:\n1.",
    "Q: What is the capital of France?\nA:",
    "import numpy as np\n\ndef softmax(x):\n",
    "To be, or not to be, that is the question:",
    "The recipe for a simple bread needs flour, water, salt and",
    "Monday, Tuesday, Wednesday, Thursday,",
    "In machine learning, gradient descent is",
    "<html>\n<head>\n<title>My page</title>\n</head>\n<body>\n",
    "SELECT name, age FROM users WHERE",
    "The history of the Roman Empire begins",
    "Write a haiku about autumn leaves:\n",
    "1, 1, 2, 3, 5, 8, 13,",
    "Dear Sir or Madam,\n\nI am writing to",
    "The mitochondria is the powerhouse of the cell. The mitochondria",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "Photosynthesis is the process by which plants",
    "Hello! How are you today? I am",
)
GENERATED = 96


@pytest.fixture(scope="module")
def draft_model(smollm2_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Model:
    from specstate_testkit.smollm2_draft import build_smollm2_draft

    return Model(build_smollm2_draft(smollm2_file, tmp_path_factory.mktemp("draft") / "smollm2-draft.gguf"))


@pytest.fixture(scope="module")
def plain_greedy_texts(smollm2: Model) -> list[list[int]]:
    """Plain greedy tokens (mode ``none``) for every prompt, at 2 threads."""
    out = []
    for prompt in PROMPTS:
        generator = Generator(smollm2, n_ctx=512, n_threads=2)
        generator.generate(prompt, max_tokens=GENERATED)
        out.append(generator.tokens)
    return out


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_greedy_equals_plain_greedy_on_smollm2(
    smollm2: Model, draft_model: Model, plain_greedy_texts: list[list[int]], mode: str
) -> None:
    """On the real model at 2 threads, speculation never changes the text: token for token, every prompt (every
    other one with the draft model, whose rounds cost several times prompt lookup's)."""
    accepted = drafted = 0
    step = 2 if mode == "draft" else 1
    for prompt, plain in zip(PROMPTS[::step], plain_greedy_texts[::step], strict=True):
        generator = Generator(
            smollm2,
            mode=mode,  # type: ignore[arg-type]
            draft_model=draft_model if mode == "draft" else None,
            n_ctx=512,
            n_threads=2,
        )
        generator.generate(prompt, max_tokens=GENERATED)
        assert generator.tokens == plain, f"{mode} parted from plain greedy on {prompt!r}"
        accepted, drafted = accepted + generator.accepted, drafted + generator.drafted
    prompts = len(PROMPTS[::step])
    print(f"{mode}: {prompts} prompts x {GENERATED} tokens equal to plain greedy; accepted {accepted}/{drafted}")
    assert accepted > 0


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_a_checkpoint_taken_at_2_threads_continues_exactly_at_1_and_3(smollm2: Model, mode: str) -> None:
    """Thread count changes speed, not numerics: a checkpoint resumes token for token on another count (3 threads
    oversubscribe this project's 2-core machines, where ggml's spinning thread pool takes seconds a token: that
    leg is short)."""
    generator = Generator(smollm2, mode=mode, n_ctx=512, n_threads=2)  # type: ignore[arg-type]
    generator.generate(PROMPTS[0], max_tokens=40)
    checkpoint = generator.checkpoint()
    generator.generate(max_tokens=GENERATED - 40)
    for n_threads, more in ((1, GENERATED - 40), (3, 6)):
        resumed = Generator.restore(checkpoint, smollm2, n_threads=n_threads)
        assert resumed._native.n_threads == n_threads
        resumed.generate(max_tokens=more)
        assert resumed.tokens == generator.tokens[: 40 + more], f"{mode} resumed at {n_threads} threads parted"
