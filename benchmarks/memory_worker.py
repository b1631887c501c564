"""Peak memory of a generation and of a checkpoint capture (for benchmarks/run.py).

Usage: python memory_worker.py MODEL N_CTX N_TOKENS THREADS -> prints one JSON object.
Peak RSS is read from /proc/self/status (VmHWM); writing 5 to
/proc/self/clear_refs resets it, so the capture's own peak is measured apart.
"""

from __future__ import annotations

import json
import sys

from specstate import Generator, Model


def rss(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def main() -> None:
    path, n_ctx, n_tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    baseline = rss("VmRSS")
    model = Model(path)
    generator = Generator(model, mode="ngram", n_ctx=n_ctx, n_threads=threads)
    text = "Write a long story about the sea. " * (n_ctx // 8)
    prompt = model.tokenize(text)[: n_ctx - n_tokens - 8]
    generator.generate(prompt, max_tokens=n_tokens)
    generation_peak = rss("VmHWM")
    generator.checkpoint()  # fingerprint the model file once, outside the measured capture
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = rss("VmRSS")
    data = generator.checkpoint()
    capture_peak = rss("VmHWM")
    print(
        json.dumps(
            {
                "python_baseline_rss": baseline,
                "generation_peak_rss": generation_peak,
                "context_tokens": len(prompt) + n_tokens,
                "n_ctx": n_ctx,
                "capture_rss_before": before,
                "capture_peak_rss": capture_peak,
                "checkpoint_size": len(data),
            }
        )
    )


if __name__ == "__main__":
    main()
