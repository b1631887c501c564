"""Measurements shared by ``specstate bench`` and ``benchmarks/run.py``.

Every figure is a median over several runs after a warm-up, and every
comparison is measured side by side in one run: these machines are shared and
noisy, so only ratios measured together mean anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specstate import (
    ContextCapacity,
    Generator,
    GeneratorSettings,
    Model,
    _defaults,
    validate_config,
    validate_context_capacities,
    validate_state_size,
)
from specstate.generator import Mode

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CODE_PROMPT",
    "EDIT_PROMPT",
    "QUOTE_PROMPT",
    "STORY_PROMPT",
    "CheckpointFigures",
    "PairRatio",
    "SpeculationFigures",
    "checkpoint_figures",
    "decode_speed",
    "interleave",
    "median_of",
    "pair_ratio",
    "quick_suite",
    "speculation_figures",
    "timed_generation",
    "validator_rates",
]

#: Plain decoding: an open-ended request whose answer runs well past 128 tokens.
STORY_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWrite a long story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the sea, the weather and the keeper's daily routine in detail.<|im_end|>\n<|im_start|>assistant\n"
)
_CODE = '''import math


def area(radius):
    """Return the area of a circle."""
    return math.pi * radius * radius


def circumference(radius):
    """Return the circumference of a circle."""
    return 2 * math.pi * radius


def describe(radius):
    """Describe a circle in words."""
    a = area(radius)
    c = circumference(radius)
    return f"A circle of radius {radius} has area {a:.2f} and circumference {c:.2f}."


if __name__ == "__main__":
    for r in (1, 2, 3):
        print(describe(r))
'''

#: Speculation that pays (1): rewrite a given source file with small edits.
CODE_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHere is a Python file:\n```python\n" + _CODE + "```\n"
    "Rewrite the whole file, adding type hints to every function. Output only the code.<|im_end|>\n"
    "<|im_start|>assistant\n```python\n"
)
#: Speculation that pays (2): answer with quotes from a given document. "Whole sentences in quotation marks": asked
#: only for "every sentence", instruction-tuned coders answer with the days alone.
QUOTE_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nRead this notice:\n\n"
    "The library will be closed on Monday for maintenance. During the closure, books can be returned "
    "through the drop box next to the main entrance. The reading room will reopen on Tuesday at nine "
    "in the morning. Members who need help can write to the front desk, which answers every message "
    "within one working day. Late fees are waived for the days the library is closed.\n\n"
    "Quote, word for word and in quotation marks, every whole sentence of the notice that mentions a day of the "
    "week.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

#: Speculation that pays (3), the agentic kind: edit a given file, the answer mostly the file copied with small changes.
EDIT_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHere is the file circle.py:\n```python\n" + _CODE + "```\n"
    "Rename the function describe to summary everywhere. Output the whole edited file.<|im_end|>\n"
    "<|im_start|>assistant\n```python\n"
)


def median_of(runs: int, measure: Callable[[], float], warmup: int = 1) -> float:
    """The median of `runs` calls of `measure` after `warmup` discarded calls."""
    for _ in range(warmup):
        measure()
    return statistics.median(measure() for _ in range(runs))


def interleave(contenders: dict[str, Callable[[], float]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Measure every contender once per round, in turn, for `rounds` rounds after `warmup` discarded ones.

    Each round measures all contenders back to back (the order rotating by one each round), so any two of
    them are compared within the same stretch of time: their per-round ratios (:func:`pair_ratio`) are
    interleaved pairs, untouched by the drifts of a shared machine between distant measurements.
    """
    names = list(contenders)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            value = contenders[name]()
            if index >= warmup:
                figures[name].append(value)
    return figures


@dataclass
class PairRatio:
    """The median of per-round ratios ``a / b`` of interleaved measurements, with their range."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"x{self.median:.2f} ({self.low:.2f}-{self.high:.2f})"


def pair_ratio(a: list[float], b: list[float]) -> PairRatio:
    """The ratio of two contenders measured by :func:`interleave`, round by round."""
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    if not ratios:
        raise ValueError("no round measured both contenders")
    return PairRatio(statistics.median(ratios), min(ratios), max(ratios))


def _tokens(model: Model, prompt: str) -> list[int]:
    return model.tokenize(prompt, add_special=False, parse_special=True)


def decode_speed(model: Model, n_tokens: int = 128, threads: int = 2, runs: int = 5) -> float:
    """Tokens per second of plain greedy decoding (``none`` mode), prefill excluded."""

    def once() -> float:
        generator = Generator(model, n_ctx=1024, n_threads=threads)
        generator.generate(_tokens(model, STORY_PROMPT), max_tokens=1)
        started = time.perf_counter()
        generator.generate(max_tokens=n_tokens - 1)
        return (len(generator.tokens) - 1) / (time.perf_counter() - started)

    return median_of(runs, once)


def timed_generation(
    model: Model, prompt: str, n_tokens: int = 160, **settings: Unpack[GeneratorSettings]
) -> tuple[float, Generator]:
    """One generation of `n_tokens` on `prompt` (``n_ctx`` 1024 unless given): its tokens per second after
    the first token (prefill excluded), and the generator."""
    settings.setdefault("n_ctx", 1024)
    generator = Generator(model, **settings)
    generator.generate(_tokens(model, prompt), max_tokens=1)
    started = time.perf_counter()
    generator.generate(max_tokens=n_tokens - 1)
    elapsed = time.perf_counter() - started
    return (len(generator.tokens) - 1) / elapsed, generator


@dataclass
class SpeculationFigures:
    """One mode on one prompt."""

    mode: str
    tokens_per_second: float
    acceptance_rate: float
    tokens: list[int]


def speculation_figures(
    model: Model,
    mode: Mode,
    prompt: str,
    n_tokens: int = 160,
    threads: int = 2,
    runs: int = 5,
    draft_model: Model | None = None,
    n_draft: int = _defaults.N_DRAFT,
) -> SpeculationFigures:
    """Generation speed (prefill excluded) and acceptance of `mode` on `prompt`."""
    last: list[Generator] = []

    def once() -> float:
        speed, generator = timed_generation(
            model, prompt, n_tokens, mode=mode, draft_model=draft_model, n_threads=threads, n_draft=n_draft
        )
        last[:] = [generator]
        return speed

    speed = median_of(runs, once)
    return SpeculationFigures(mode, speed, last[0].acceptance_rate, last[0].tokens)


@dataclass
class CheckpointFigures:
    """Checkpoint size and timings at one context length."""

    context_tokens: int
    size: int
    state_in_use: int
    capture_seconds: float
    restore_seconds: float
    restore_new_seconds: float
    prefill_seconds: float


def checkpoint_figures(model: Model, context_tokens: int, threads: int = 2, runs: int = 5) -> CheckpointFigures:
    """Checkpoint size, capture and restore time with `context_tokens` in the context, and prefill time."""
    from specstate import inspect_checkpoint

    text = (CODE_PROMPT + " ") * (context_tokens // 100 + 1)
    prompt = model.tokenize(text)[: context_tokens - 1]
    generator = Generator(model, mode="ngram", n_ctx=context_tokens + 64, n_threads=threads)
    started = time.perf_counter()
    generator.generate(prompt, max_tokens=1)
    prefill = time.perf_counter() - started
    data = generator.checkpoint()  # the first one also fingerprints the model file

    def capture() -> float:
        started = time.perf_counter()
        generator.checkpoint()
        return time.perf_counter() - started

    other = Generator(model, mode="ngram", n_ctx=context_tokens + 64, n_threads=threads)
    other.generate(prompt[: context_tokens // 2], max_tokens=1)

    def restore() -> float:  # into an existing generator, as llama-cpp-python's load_state
        started = time.perf_counter()
        other.load(data)
        return time.perf_counter() - started

    def restore_new() -> float:  # into new contexts
        started = time.perf_counter()
        Generator.restore(data, model, n_threads=threads)
        return time.perf_counter() - started

    sections = dict(inspect_checkpoint(data)["sections"])
    in_use = sections["target_state"] + sections["tokens"]
    return CheckpointFigures(
        context_tokens,
        len(data),
        in_use,
        median_of(runs, capture),
        median_of(runs, restore),
        median_of(runs, restore_new),
        prefill,
    )


def validator_rates(seconds: float = 0.3) -> dict[str, float]:
    """Calls per second of each seed validator from Python."""
    capacity = ContextCapacity(512, 512, 0, False)
    calls: dict[str, Callable[[], None]] = {
        "validate_config": lambda: validate_config(1, 8, 0, 0.0),
        "validate_context_capacities": lambda: validate_context_capacities(capacity, capacity, 8),
        "validate_state_size": lambda: validate_state_size(1 << 20),
        "ContextCapacity": lambda: ContextCapacity(512, 512, 0, False) and None,
    }
    rates = {}
    for name, call in calls.items():
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            for _ in range(1000):
                call()
            count += 1000
        rates[name] = count / elapsed
    return rates


def quick_suite(threads: int = 2, runs: int = 3) -> None:
    """The quick benchmark table of ``specstate bench`` (SmolLM2, no peers)."""
    from rich.console import Console
    from rich.table import Table

    from specstate.smollm2 import smollm2_path

    console = Console()
    model = Model(smollm2_path())
    table = Table(
        title=f"specstate quick benchmark: SmolLM2-135M-Instruct Q4_1, {threads} threads, median of {runs} runs"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("plain greedy decode, 128 tokens", f"{decode_speed(model, threads=threads, runs=runs):.1f} tok/s")
    for name, prompt in (("code rewrite", CODE_PROMPT), ("document quotes", QUOTE_PROMPT)):
        none = speculation_figures(model, "none", prompt, threads=threads, runs=runs)
        ngram = speculation_figures(model, "ngram", prompt, threads=threads, runs=runs)
        agree = sum(1 for a, b in zip(none.tokens, ngram.tokens) if a == b)
        table.add_row(f"{name}: none", f"{none.tokens_per_second:.1f} tok/s")
        table.add_row(
            f"{name}: ngram",
            f"{ngram.tokens_per_second:.1f} tok/s "
            f"(x{ngram.tokens_per_second / none.tokens_per_second:.2f}, "
            f"acceptance {ngram.acceptance_rate:.0%}, {agree}/{len(none.tokens)} equal)",
        )
    for tokens in (512, 2048):
        figures = checkpoint_figures(model, tokens, threads=threads, runs=runs)
        table.add_row(
            f"checkpoint at {tokens} tokens",
            f"{figures.size / 1e6:.1f} MB (x{figures.size / figures.state_in_use:.4f} of the state), "
            f"capture {figures.capture_seconds * 1e3:.0f} ms, restore {figures.restore_seconds * 1e3:.0f} ms "
            f"({figures.restore_new_seconds * 1e3:.0f} ms into new contexts), "
            f"prefill {figures.prefill_seconds:.2f} s",
        )
    for name, rate in validator_rates().items():
        table.add_row(name, f"{rate / 1e6:.2f} M calls/s")
    console.print(table)
