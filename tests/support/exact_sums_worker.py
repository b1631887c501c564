"""The logits of a prompt's verified rows, in batches of 2 to 17 and one at a time, under the integer sums that
``GGML_CPU_EXACT_SUMS`` picks and the attention that ``GGML_CPU_EXACT_ATTN`` picks (used by test_exact.py).

Usage: [GGML_CPU_EXACT_SUMS=avx2|avxvnni|avx512vnni] [GGML_CPU_EXACT_ATTN=rows] [GGML_CPU_EXACT_Q4_K=rows] \
    [GGML_CPU_EXACT_Q6_K=rows] [GGML_CPU_EXACT_Q5_0=rows] [GGML_CPU_EXACT_Q4_0=rows] [GGML_CPU_EXACT_Q5_1=rows] \
    [GGML_CPU_EXACT_Q5_K=rows] python exact_sums_worker.py MODEL N_THREADS
Checks that every batch row equals its single decode; prints how Q5_K, Q5_1, Q4_0, Q5_0, Q6_K and Q4_K products ran
(``cols`` or ``rows``) and how many chunks each multi-column kernel computed, the way of summing, the tiles' registers
and the way of attending that ran, and the SHA-256 of all the rows' logits. The prompt (about 330 tokens) spans two
of attention's chunks of 256 cells, so a single decode spreads its heads' chunks over the threads while a batch's rows
walk theirs whole.
"""

from __future__ import annotations

import hashlib
import sys
from array import array

from specstate import Context, Model, native_info

PROMPT = "The committee met on Tuesday to review the budget, the schedule and the open questions. " * 18
VERIFIED = " and the minutes were approved without a single vote by all of the members who were present there"
BATCHES = (2, 4, 5, 8, 9, 16, 17)


def main() -> None:
    model, n_threads = Model(sys.argv[1]), int(sys.argv[2])
    prompt, tokens = model.tokenize(PROMPT), model.tokenize(VERIFIED)[: max(BATCHES)]
    context = Context(model, n_ctx=512, n_threads=n_threads)
    context.decode(prompt, 0)
    state = context.seq_state()
    singles = []
    for offset, token in enumerate(tokens):
        context.decode([token], len(prompt) + offset)
        singles.append(array("f", context.logits(-1)).tobytes())
    digest = hashlib.sha256(b"".join(singles))
    for n in BATCHES:
        context.set_seq_state(0, state)
        context.decode(tokens[:n], len(prompt), all_logits=True)
        rows = [array("f", context.logits(row)).tobytes() for row in range(n)]
        assert rows == singles[:n], f"batch of {n}: rows differ from single decodes"
        digest.update(b"".join(rows))
    info = native_info()
    print(
        info["exact_q5_k"],
        info["exact_q5_k_cols_chunks"],
        info["exact_q5_1"],
        info["exact_q5_1_cols_chunks"],
        info["exact_q4_0"],
        info["exact_q4_0_cols_chunks"],
        info["exact_q5_0"],
        info["exact_q5_0_cols_chunks"],
        info["exact_q6_k"],
        info["exact_q6_k_cols_chunks"],
        info["exact_q4_k"],
        info["exact_q4_k_cols_chunks"],
        info["exact_sums"],
        info["exact_tiles"],
        info["exact_attention"],
        len(prompt),
        digest.hexdigest(),
    )


if __name__ == "__main__":
    main()
