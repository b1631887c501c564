"""``specstate generate``: a new generation streamed to standard output, optionally checkpointed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specstate import Generator, Model, encode_prompt
from specstate.cli._args import (
    OUTPUT_RANGES,
    SETTING_RANGES,
    UsageError,
    add_mmap,
    add_output,
    add_settings,
    check_output_options,
    err,
    generator_settings,
)
from specstate.cli._models import load

RANGES = (*OUTPUT_RANGES, *SETTING_RANGES)


def add_parser(commands: Any) -> None:
    generate = commands.add_parser("generate", help="generate text, optionally checkpointing it")
    generate.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    generate.add_argument("--model", type=Path, required=True, help="target GGUF model")
    add_settings(generate)
    generate.add_argument(
        "--literal",
        action="store_true",
        help="read special-token text in the prompt as plain text (default: parse it, as llama.cpp does)",
    )
    add_output(generate)
    add_mmap(generate)


def run(args: argparse.Namespace) -> None:
    check_output_options(args)
    model = load(args.model, "model", args.mmap)
    draft = load(args.draft_model, "draft model", args.mmap) if args.draft_model else None
    generator = Generator(model, draft_model=draft, **generator_settings(args))
    run_generation(generator, _prompt_tokens(model, args.prompt, args.literal), args)


def _prompt_tokens(model: Model, prompt: str, literal: bool) -> list[int]:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text:
        raise UsageError("the prompt is empty")
    return encode_prompt(model, text, literal=literal)


def run_generation(generator: Generator, prompt: list[int] | None, args: argparse.Namespace) -> None:
    """Stream text to stdout with a progress bar on stderr; checkpoint as asked (``generate`` and ``resume``)."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[speed]:>6.1f} tok/s  acceptance {task.fields[rate]:>4.0%}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=args.quiet,
    )
    budget, done, next_save = args.max_tokens, 0, args.checkpoint_every
    started = time.perf_counter()
    with progress:
        task = progress.add_task(generator.mode, total=budget, speed=0.0, rate=0.0)
        while done < budget:
            chunk = budget - done if next_save is None else min(budget - done, next_save - done)
            before = len(generator.tokens)
            for piece in generator.stream(prompt, max_tokens=chunk, stop=args.stop):
                sys.stdout.write(piece)
                sys.stdout.flush()
                elapsed = time.perf_counter() - started
                made = len(generator.tokens) - before + done
                progress.update(
                    task, completed=made, speed=made / elapsed if elapsed else 0.0, rate=generator.acceptance_rate
                )
            prompt = None
            done += len(generator.tokens) - before
            if next_save is not None and done >= next_save:
                generator.save(args.save)
                next_save += args.checkpoint_every
            if generator.stopped_by != "max_tokens":
                break
    sys.stdout.write("\n")
    elapsed = time.perf_counter() - started
    if args.save is not None:
        generator.save(args.save)
    if not args.quiet:
        saved = f"; saved {args.save}" if args.save else ""
        err.print(
            f"[dim]{done} tokens in {elapsed:.2f} s ({done / elapsed if elapsed else 0:.1f} tok/s), "
            f"mode {generator.mode}, acceptance {generator.accepted}/{generator.drafted} "
            f"({generator.acceptance_rate:.0%}), stopped by {generator.stopped_by}{saved}[/dim]"
        )
