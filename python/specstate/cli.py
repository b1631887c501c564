"""The ``specstate`` command: generate, resume, inspect, bench, demo.

Text streams to standard output as it is committed; progress (tokens per
second, acceptance rate) and summaries go to standard error. Bad input gives
one clear line on standard error and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specstate import Generator, Model, inspect_checkpoint, model_fingerprint
from specstate.errors import CheckpointError, ContextError, GenerationError, ModelLoadError, SessionError
from specstate.generator import Mode
from specstate.smollm2 import cache_dir

__all__ = ["main"]

MODES = ("none", "ngram", "draft", "mtp", "eagle3")
err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """Bad command-line input, reported as one line."""


def _add_sampling(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (default: greedy)")
    group.add_argument("--temperature", type=float, default=0.0, help="softmax temperature; 0 is greedy")
    group.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    group.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1: all)")
    group.add_argument("--seed", type=int, default=0, help="RNG seed")


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--save", type=Path, help="checkpoint file written at the end (and every N tokens)")
    parser.add_argument("--checkpoint-every", type=int, metavar="N", help="also save every N tokens")
    parser.add_argument("--threads", type=int, default=0, help="threads (0: the CPUs available)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specstate", description="Speculative decoding on llama.cpp with exact, checkpointable state."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text, optionally checkpointing it")
    generate.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    generate.add_argument("--model", type=Path, required=True, help="target GGUF model")
    generate.add_argument("--mode", choices=MODES, default="none", help="speculation mode (default none)")
    generate.add_argument("--draft-model", type=Path, help="draft GGUF model (draft and eagle3 modes)")
    generate.add_argument("--n-draft", type=int, default=8, help="most tokens drafted per round (default 8)")
    generate.add_argument("--n-ctx", type=int, default=2048, help="context length (default 2048)")
    generate.add_argument("--raw", action="store_true", help="parse special tokens in the prompt, add no BOS")
    _add_sampling(generate)
    _add_output(generate)

    resume = commands.add_parser("resume", help="continue a saved generation exactly")
    resume.add_argument("checkpoint", type=Path)
    resume.add_argument("--model", type=Path, help="target model (default: the file named in the checkpoint, "
                        "next to the checkpoint or in the specstate cache)")
    resume.add_argument("--draft-model", type=Path, help="draft model (draft and eagle3 modes)")
    _add_output(resume)

    inspect = commands.add_parser("inspect", help="describe a checkpoint")
    inspect.add_argument("checkpoint", type=Path)
    inspect.add_argument("--model", type=Path, help="check the target model's fingerprint against this file")
    inspect.add_argument("--draft-model", type=Path, help="check the draft model's fingerprint against this file")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")

    bench = commands.add_parser("bench", help="run the quick benchmark suite and print the table")
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--runs", type=int, default=3)

    commands.add_parser("demo", help="speculate, checkpoint half-way, resume in a new process, compare")
    return parser


def _load(path: Path, what: str) -> Model:
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist")
    return Model(path)


def _prompt_tokens(model: Model, prompt: str, raw: bool) -> list[int]:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text:
        raise UsageError("the prompt is empty")
    return model.tokenize(text, add_special=not raw, parse_special=raw)


def _check_output_options(args: argparse.Namespace) -> None:
    if args.max_tokens < 0:
        raise UsageError("--max-tokens must not be negative")
    if args.checkpoint_every is not None:
        if args.checkpoint_every <= 0:
            raise UsageError("--checkpoint-every must be positive")
        if args.save is None:
            raise UsageError("--checkpoint-every needs --save")


def run_generation(generator: Generator, prompt: list[int] | None, args: argparse.Namespace) -> None:
    """Stream text to stdout with a progress bar on stderr; checkpoint as asked."""
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[speed]:>6.1f} tok/s  acceptance {task.fields[rate]:>4.0%}"),
        TimeElapsedColumn(), console=err, transient=True, disable=args.quiet,
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
                progress.update(task, completed=made, speed=made / elapsed if elapsed else 0.0,
                                rate=generator.acceptance_rate)
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
        err.print(f"[dim]{done} tokens in {elapsed:.2f} s ({done / elapsed if elapsed else 0:.1f} tok/s), "
                  f"mode {generator.mode}, acceptance {generator.accepted}/{generator.drafted} "
                  f"({generator.acceptance_rate:.0%}), stopped by {generator.stopped_by}{saved}[/dim]")


def cmd_generate(args: argparse.Namespace) -> None:
    _check_output_options(args)
    model = _load(args.model, "model")
    draft = _load(args.draft_model, "draft model") if args.draft_model else None
    generator = Generator(model, mode=cast(Mode, args.mode), draft_model=draft, n_draft=args.n_draft,
                          n_ctx=args.n_ctx, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, n_threads=args.threads)
    run_generation(generator, _prompt_tokens(model, args.prompt, args.raw), args)


def _find_model(checkpoint: Path, named: Path | None, entry: object, role: str) -> Path | None:
    if named is not None:
        return named
    if not isinstance(entry, dict):
        return None
    file_name = str(entry.get("file", ""))
    for candidate in (checkpoint.parent / file_name, cache_dir() / file_name):
        if file_name and candidate.is_file():
            return candidate
    raise UsageError(f"the checkpoint's {role} model {file_name!r} was not found next to it or in {cache_dir()}; "
                     f"pass --{'model' if role == 'target' else 'draft-model'}")


def cmd_resume(args: argparse.Namespace) -> None:
    _check_output_options(args)
    data = _read_checkpoint(args.checkpoint)
    info = inspect_checkpoint(data)
    target_path = _find_model(args.checkpoint, args.model, info["target_model"], "target")
    draft_path = _find_model(args.checkpoint, args.draft_model, info["draft_model"], "draft")
    assert target_path is not None
    model = _load(target_path, "model")
    draft = _load(draft_path, "draft model") if draft_path else None
    generator = Generator.restore(data, model, draft_model=draft, n_threads=args.threads)
    if generator.finished:
        raise UsageError("the saved generation has already finished")
    run_generation(generator, None, args)


def _read_checkpoint(path: Path) -> bytes:
    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist")
    return path.read_bytes()


def cmd_inspect(args: argparse.Namespace) -> None:
    info = inspect_checkpoint(_read_checkpoint(args.checkpoint))
    matches: dict[str, bool] = {}
    for role, given in (("target", args.model), ("draft", args.draft_model)):
        entry = info[f"{role}_model"]
        if given is not None:
            sha, size = model_fingerprint(_load(given, f"{role} model"))
            matches[role] = isinstance(entry, dict) and entry["sha256"] == sha and entry["size"] == size
    info["checksum_ok"] = True
    info["models_match"] = matches
    if args.json:
        print(json.dumps(info, indent=2))
        return
    config = cast(dict[str, object], info["config"])
    print(f"checkpoint     {args.checkpoint} ({info['size']:,} bytes, format {info['format_version']}, "
          f"CRC-32 {info['checksum']}: ok)")
    print(f"written by     specstate {info['specstate_version']}, llama-cpp-sys-4 {info['llama_cpp_sys_version']}, "
          f"llama.cpp {info['llama_cpp_build']} ({info['llama_cpp_commit']})")
    for role in ("target", "draft"):
        entry = info[f"{role}_model"]
        if isinstance(entry, dict):
            verdict = {True: "matches", False: "DOES NOT MATCH"}.get(matches.get(role, None), "not checked")  # type: ignore[arg-type]
            print(f"{role + ' model':<14} {entry['file']} ({entry['size']:,} bytes, sha256 {entry['sha256'][:16]}…): "
                  f"{verdict}")
    print("mode           " + ", ".join(f"{k}={v}" for k, v in config.items()))
    print(f"tokens         {info['n_prompt']} prompt + {info['n_delivered']} generated and handed out "
          f"({info['n_generated']} committed, {info['n_past']} in the target's memory)"
          f"{', finished' if info['finished'] else ''}")
    print(f"speculation    {info['rounds']} rounds, {info['accepted']}/{info['drafted']} drafted tokens accepted")
    for name, size in cast(list[tuple[str, int]], info["sections"]):
        print(f"  {name:<18} {size:>12,} bytes")


def cmd_bench(args: argparse.Namespace) -> None:
    from specstate.bench import quick_suite

    quick_suite(threads=args.threads, runs=args.runs)


def cmd_demo(args: argparse.Namespace) -> None:
    from specstate.demo import run_demo

    run_demo()


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "generate": cmd_generate, "resume": cmd_resume, "inspect": cmd_inspect, "bench": cmd_bench, "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except KeyboardInterrupt:
        sys.stderr.write("specstate: interrupted\n")
        return 130
    except (UsageError, CheckpointError, ModelLoadError, ContextError, SessionError, GenerationError,
            ValueError, OSError) as error:
        message = " ".join(str(error).split())  # one line, whatever the error's text
        sys.stderr.write(f"specstate: error: {message}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
