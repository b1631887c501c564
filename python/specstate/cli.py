"""The ``specstate`` command: generate, resume, chat, inspect, bench, demo.

Text streams to standard output as it is committed; progress (tokens per
second, acceptance rate) and summaries go to standard error. Every failure
(bad input, an unreadable file, a refused checkpoint, an unexpected error)
gives one line on standard error and exit status 2, never a traceback unless
``SPECSTATE_DEBUG=1``. Numeric options are checked before anything is loaded,
and so is the destination of ``--save``: its directory, and that it is not a
directory, FIFO, device or socket (never replaced). A checkpoint to read must
be a regular file; the message says what the path is otherwise. ``SIGTERM`` is
handled as ``SIGINT`` is: cleanups run (a save in progress removes its
temporary file), then ``specstate: terminated`` and exit status 143.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, NamedTuple, NoReturn, get_args

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specstate import (
    CheckpointInfo,
    DraftPolicy,
    Generator,
    GeneratorSettings,
    Model,
    ModelFingerprint,
    _native,
    encode_prompt,
    errors,
    inspect_checkpoint,
    model_fingerprint,
)
from specstate._files import read_checkpoint, read_small_file, special_kind
from specstate.smollm2 import cache_dir

__all__ = ["main"]

MODES = ("none", "ngram", "draft", "mtp", "eagle3")
#: A new conversation's context length unless --n-ctx says otherwise (room for a few turns).
CHAT_N_CTX = 4096
err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """Bad command-line input, reported as one line."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line too (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')\n")


def _printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\u202e``), for a terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _one_line(text: str) -> str:
    return _printable(" ".join(text.split()))


def _add_draft_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft-policy",
        choices=get_args(DraftPolicy),
        help="fixed: draft up to --n-draft every round (the default); adaptive: choose each round's length "
        "from a measured cost curve and the recent acceptance (speculative modes)",
    )


#: The native generator's defaults (its signature, written once in Rust): what an option left out means.
NATIVE_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(_native.Generator).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
#: The sampler chain's options: (setting, type, what it does).
_SAMPLERS: tuple[tuple[str, type, str], ...] = (
    ("temperature", float, "softmax temperature; 0 is greedy"),
    ("top_k", int, "keep the k most likely tokens (0: all)"),
    ("top_p", float, "nucleus mass (1: all)"),
    ("min_p", float, "drop tokens less likely than min-p times the most likely one (0: none)"),
    ("typical_p", float, "locally typical sampling mass (1: off)"),
    ("repeat_penalty", float, "penalty for tokens among the last --repeat-last-n (1: none)"),
    ("repeat_last_n", int, "tokens the penalties look back over (0: none, -1: the whole context)"),
    ("presence_penalty", float, "subtracted from every token seen in that window (0: none)"),
    ("frequency_penalty", float, "subtracted per occurrence in that window (0: none)"),
    ("seed", int, "RNG seed"),
)


def _default(setting: str) -> str:
    return f" (default {NATIVE_DEFAULTS[setting]})"


def _add_settings(parser: argparse.ArgumentParser, n_ctx: int | None = None) -> None:
    """The settings of a new generation; an option left out takes the native default (``n_ctx``: this
    command's own), and with ``chat --resume`` one given must agree with the checkpoint."""
    parser.add_argument("--mode", choices=MODES, help="speculation mode" + _default("mode"))
    parser.add_argument("--draft-model", type=Path, help="draft GGUF model (draft and eagle3 modes)")
    parser.add_argument("--n-draft", type=int, help="most tokens drafted per round" + _default("n_draft"))
    _add_draft_policy(parser)
    parser.add_argument(
        "--n-ctx",
        type=int,
        help=f"context length (0: the model's trained length; default {n_ctx or NATIVE_DEFAULTS['n_ctx']})",
    )
    group = parser.add_argument_group("sampling (default: greedy)")
    for setting, kind, what in _SAMPLERS:
        if setting in NATIVE_DEFAULTS:
            group.add_argument("--" + setting.replace("_", "-"), type=kind, help=what + _default(setting))
    constrained = group.add_mutually_exclusive_group()
    constrained.add_argument(
        "--grammar", type=Path, metavar="FILE", dest="grammar_file", help="a GBNF grammar the reply follows"
    )
    constrained.add_argument(
        "--json-schema",
        type=Path,
        metavar="FILE",
        dest="json_schema_file",
        help="a JSON Schema the reply follows (as JSON text, by llama.cpp's converter to a grammar)",
    )


def _add_mmap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mmap",
        action="store_true",
        help="map the model files instead of reading them into memory (faster to load; a checkpoint is refused "
        "once a mapped file has been written)",
    )


def _add_max_n_batch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-n-batch",
        type=int,
        metavar="N",
        help="let a checkpoint allocate up to N rows per compute pass (default 512) and, on a recurrent or "
        "hybrid model, rollback snapshots beyond the model's size",
    )


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--save", type=Path, help="checkpoint file written at the end (and every N tokens)")
    parser.add_argument("--checkpoint-every", type=int, metavar="N", help="also save every N tokens")
    parser.add_argument(
        "--threads",
        type=int,
        help="threads (0: the CPUs available; default: all of them for a new generation, "
        "the checkpoint's own count, at most the CPUs available, for a resumed one: any count continues exactly)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specstate", description="Speculative decoding on llama.cpp with exact, checkpointable state."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="generate text, optionally checkpointing it")
    generate.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    generate.add_argument("--model", type=Path, required=True, help="target GGUF model")
    _add_settings(generate)
    generate.add_argument(
        "--literal",
        action="store_true",
        help="read special-token text in the prompt as plain text (default: parse it, as llama.cpp does)",
    )
    _add_output(generate)
    _add_mmap(generate)

    resume = commands.add_parser("resume", help="continue a saved generation exactly")
    resume.add_argument("checkpoint", type=Path)
    resume.add_argument(
        "--model",
        type=Path,
        help="target model (default: the file named in the checkpoint, "
        "next to the checkpoint or in the specstate cache)",
    )
    resume.add_argument("--draft-model", type=Path, help="draft model (draft and eagle3 modes)")
    _add_output(resume)
    _add_max_n_batch(resume)
    _add_mmap(resume)

    inspect = commands.add_parser("inspect", help="describe a checkpoint")
    inspect.add_argument("checkpoint", type=Path)
    inspect.add_argument("--model", type=Path, help="check the target model's fingerprint against this file")
    inspect.add_argument("--draft-model", type=Path, help="check the draft model's fingerprint against this file")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")

    _add_chat_parser(commands)
    _add_serve_parser(commands)

    bench = commands.add_parser("bench", help="run the quick benchmark suite and print the table")
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--runs", type=int, default=3)

    commands.add_parser("demo", help="speculate, checkpoint half-way, resume in a new process, compare")
    commands.add_parser(
        "demo-serve", help="a streamed chat parked for an urgent request and resumed exactly (needs the server extra)"
    )
    commands.add_parser(
        "demo-cluster", help="a generation moves between two Ray workers and survives a kill (needs the ray extra)"
    )
    return parser


def _add_chat_parser(commands: Any) -> None:
    chat = commands.add_parser("chat", help="chat with a model; the conversation saves and resumes exactly")
    chat.add_argument("--model", type=Path, help="target GGUF model (with --resume: default the checkpoint's)")
    _add_settings(chat, n_ctx=CHAT_N_CTX)
    chat.add_argument("--system", help="the system message of a new conversation")
    chat.add_argument("--template", help="chat template: a Jinja file, or 'chatml' (default: the model's own)")
    chat.add_argument(
        "--resume", type=Path, metavar="CHECKPOINT", help="continue a saved conversation (saved back to it by default)"
    )
    chat.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply (default 512)")
    chat.add_argument("--stop", action="append", default=[], help="end a reply before this string (repeatable)")
    chat.add_argument("--save", type=Path, help="checkpoint file written after every reply")
    chat.add_argument(
        "--threads",
        type=int,
        help="threads (0: the CPUs available; default: all, or the checkpoint's count, at most the CPUs)",
    )
    chat.add_argument("--quiet", action="store_true", help="no status line")
    _add_max_n_batch(chat)
    _add_mmap(chat)


def _add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the server extra)")
    serve.add_argument("--model", type=Path, required=True, help="target GGUF model")
    serve.add_argument("--mode", choices=MODES, default="none", help="speculation mode (default none)")
    serve.add_argument("--draft-model", type=Path, help="draft GGUF model (draft and eagle3 modes)")
    serve.add_argument("--n-draft", type=int, default=8, help="most tokens drafted per round (default 8)")
    serve.add_argument(
        "--n-ctx",
        type=int,
        default=4096,
        help="context length of each slot (0: the model's trained length; default 4096)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--slots", type=int, default=1, help="generations run at once (default 1)")
    serve.add_argument("--queue", type=int, default=16, help="requests that may wait for a slot (default 16)")
    serve.add_argument("--max-tokens", type=int, default=4096, help="most tokens a request may ask for")
    serve.add_argument("--threads", type=int, default=0, help="threads per slot (0: the CPUs shared out)")
    serve.add_argument("--template", help="chat template: a Jinja file, or 'chatml' (default: the model's own)")
    serve.add_argument("--model-name", help="the model name clients use (default: the file's name)")
    serve.add_argument("--cache-dir", type=Path, help="keep conversation checkpoints here across restarts")
    serve.add_argument(
        "--cache-mib", type=int, default=1024, help="MiB of conversation checkpoints kept in memory (default 1024)"
    )
    serve.add_argument(
        "--parked-mib", type=int, default=1024, help="MiB of parked replies' checkpoints kept in memory (default 1024)"
    )
    serve.add_argument("--spill-dir", type=Path, help="parked replies' checkpoints beyond --parked-mib go here")
    serve.add_argument(
        "--ray-workers", type=int, default=0, metavar="N", help="serve from N Ray workers (needs the ray extra)"
    )
    serve.add_argument("--ray-address", help="the Ray cluster to join (default: a local instance)")
    serve.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' (default: $SPECSTATE_API_KEY, else no key)"
    )


def _load(path: Path, what: str, use_mmap: bool = False) -> Model:
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist")
    return Model(path, use_mmap=use_mmap)


def _prompt_tokens(model: Model, prompt: str, literal: bool) -> list[int]:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text:
        raise UsageError("the prompt is empty")
    return encode_prompt(model, text, literal=literal)


U32_MAX, U64_MAX = 2**32 - 1, 2**64 - 1


class _Range(NamedTuple):
    """Where a numeric option's value must lie: ``low`` (excluded if ``low_open``) to ``high``."""

    option: str  # the attribute; the option is --option-with-dashes
    low: float
    high: float = math.inf
    low_open: bool = False
    when: Callable[[argparse.Namespace], bool] | None = None  # only checked when this holds
    note: str = ""

    def requirement(self) -> str:
        if self.high == math.inf and self.low == 0:
            return "must be positive" if self.low_open else "must not be negative"
        low = f"greater than {self.low}" if self.low_open else f"at least {self.low}"
        return f"must be {low}" if self.high == math.inf else f"must be {low} and at most {self.high}"

    def problem(self, value: float) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        too_low = value <= self.low if self.low_open else value < self.low
        return self.requirement() + self.note if too_low or value > self.high else None


#: Every thread count's range, as the native core checks it (0: the CPUs available).
_THREADS = _Range("threads", 0, _native.MAX_THREADS)
_OUTPUT_RANGES = (_Range("max_tokens", 0), _Range("checkpoint_every", 0, low_open=True), _THREADS)
#: The settings of a new generation (``generate`` and ``chat``).
#: --n-ctx: 0 (the model's trained length) or a length the native core then checks against the model.
_N_CTX = _Range("n_ctx", 2, U32_MAX, when=lambda args: args.n_ctx != 0, note=" (or 0: the model's trained length)")
_SETTING_RANGES = (
    _N_CTX,
    _Range("n_draft", 1, U32_MAX, when=lambda args: args.mode not in (None, "none"), note=" when speculating"),
    _Range("n_draft", 0, U32_MAX),
    _Range("seed", 0, U64_MAX),
    _Range("top_k", 0, U32_MAX),
    _Range("temperature", 0),
    _Range("top_p", 0, 1, low_open=True),
)
RANGES: dict[str, tuple[_Range, ...]] = {
    "generate": (*_OUTPUT_RANGES, *_SETTING_RANGES),
    "resume": _OUTPUT_RANGES,
    "chat": (_Range("max_tokens", 1), _THREADS, *_SETTING_RANGES),
    "bench": (_THREADS._replace(low=1), _Range("runs", 1)),
    "serve": (
        _N_CTX,
        _Range("n_draft", 1, U32_MAX),
        _Range("port", 0, 65535),
        _Range("slots", 1, 64),
        _Range("queue", 0, 1 << 16),
        _Range("max_tokens", 1, U32_MAX),
        _THREADS,
        _Range("cache_mib", 0, 1 << 20),
        _Range("parked_mib", 0, 1 << 20),
        _Range("ray_workers", 0, 1024),
    ),
}


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse, naming the option, any numeric option of the command outside its range."""
    for bound in RANGES.get(args.command, ()):
        value = getattr(args, bound.option)
        if value is None or (bound.when is not None and not bound.when(args)):
            continue
        problem = bound.problem(value)
        if problem is not None:
            raise UsageError(f"--{bound.option.replace('_', '-')} {problem} (got {value})")


def _check_save_path(path: Path | None, option: str = "--save") -> None:
    """Refuse a checkpoint destination that cannot be written, before any generation.

    ``option`` names it in the message: ``--save``, or ``--resume`` for a conversation saved back.
    """
    if path is None:
        return
    directory = Path(os.path.realpath(path)).parent
    if not directory.is_dir():
        raise UsageError(
            f"{option}: the directory {directory} does not exist"
            if not directory.exists()
            else f"{option}: {directory} is not a directory"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: the directory {directory} is not writable")
    kind = special_kind(path)
    if kind is not None:
        raise UsageError(f"{option}: {path} is {kind}, not a regular file")


def _check_output_options(args: argparse.Namespace) -> None:
    if args.checkpoint_every is not None and args.save is None:
        raise UsageError("--checkpoint-every needs --save")
    _check_save_path(args.save)


def run_generation(generator: Generator, prompt: list[int] | None, args: argparse.Namespace) -> None:
    """Stream text to stdout with a progress bar on stderr; checkpoint as asked."""
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


#: The options named otherwise than the generator setting they give.
_SETTING_OPTIONS = {"n_threads": "threads"}


def _generator_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The generator settings given as options named after them (``--threads``: ``n_threads``).

    ``--draft-model`` is a path, loaded apart.
    """
    options = {setting: _SETTING_OPTIONS.get(setting, setting) for setting in GeneratorSettings.__optional_keys__}
    settings = {
        setting: getattr(args, option)
        for setting, option in options.items()
        if setting not in ("draft_model", "grammar") and getattr(args, option, None) is not None
    }
    grammar = _grammar_option(args)
    if grammar is not None:
        settings["grammar"] = grammar
    return settings


def _grammar_option(args: argparse.Namespace) -> str | None:
    """The grammar of ``--grammar FILE`` or ``--json-schema FILE`` (None when neither is given)."""
    for option, path in (("--grammar", "grammar_file"), ("--json-schema", "json_schema_file")):
        file = getattr(args, path, None)
        if file is None:
            continue
        try:
            what = "a grammar" if option == "--grammar" else "a schema"
            text = read_small_file(file, _native.MAX_GRAMMAR_BYTES, what)
            source = text.decode("utf-8")
            return source if option == "--grammar" else _native.json_schema_to_grammar(source)
        except (OSError, ValueError) as error:
            raise UsageError(f"{option} {file}: {error}") from error
    return None


def cmd_generate(args: argparse.Namespace) -> None:
    _check_output_options(args)
    model = _load(args.model, "model", args.mmap)
    draft = _load(args.draft_model, "draft model", args.mmap) if args.draft_model else None
    generator = Generator(model, draft_model=draft, **_generator_settings(args))
    run_generation(generator, _prompt_tokens(model, args.prompt, args.literal), args)


def _base_name(file_name: str) -> str | None:
    """The last component of a name recorded in a checkpoint, ``/`` or ``\\`` separated; None if there is none."""
    name = PureWindowsPath(PurePosixPath(file_name).name).name
    return None if name in ("", ".", "..") else name


def _find_model(checkpoint: Path, named: Path | None, entry: ModelFingerprint | None, role: str) -> Path | None:
    """The model given, else the checkpoint's by base name next to it or in the cache (never elsewhere)."""
    if named is not None:
        return named
    if entry is None:
        return None
    file_name = entry["file"]
    name = _base_name(file_name)
    for directory in (checkpoint.parent, cache_dir()):
        if name is not None and (directory / name).is_file():
            return directory / name
    raise UsageError(
        f"the checkpoint's {role} model {file_name!r} was not found next to it or in {cache_dir()}; "
        f"pass --{'model' if role == 'target' else 'draft-model'}"
    )


def _restore_saved(checkpoint: Path, args: argparse.Namespace) -> Generator:
    """The generation saved in ``checkpoint``, on the models given or found next to it or in the cache."""
    data = _read_checkpoint(checkpoint)
    info = inspect_checkpoint(data)
    target_path = _find_model(checkpoint, args.model, info["target_model"], "target")
    draft_path = _find_model(checkpoint, args.draft_model, info["draft_model"], "draft")
    assert target_path is not None
    model = _load(target_path, "model", args.mmap)
    draft = _load(draft_path, "draft model", args.mmap) if draft_path else None
    return Generator.restore(data, model, draft_model=draft, n_threads=args.threads, max_n_batch=args.max_n_batch)


def cmd_resume(args: argparse.Namespace) -> None:
    _check_output_options(args)
    generator = _restore_saved(args.checkpoint, args)
    if generator.finished:
        raise UsageError("the saved generation has already finished")
    run_generation(generator, None, args)


def _chat_template(option: str | None) -> str | None:
    """``--template``: ``chatml``, or the text of a Jinja file."""
    if option is None or option == "chatml":
        return option
    path = Path(option)
    if not path.is_file():
        raise UsageError(f"--template: {option} is neither 'chatml' nor a file")
    return path.read_text(encoding="utf-8")


def _restore_conversation(args: argparse.Namespace) -> Generator:
    generator = _restore_saved(args.resume, args)
    if not generator.messages:
        raise UsageError(f"{args.resume} is not a conversation (it was saved by 'specstate generate')")
    _refuse_conflicts(_generator_settings(args), generator)
    return generator


def _refuse_conflicts(given: dict[str, Any], generator: Generator) -> None:
    """Refuse a setting given on the command line that the resumed conversation's checkpoint contradicts
    (it continues with its own: a silently dropped option would mislead)."""
    config: dict[str, Any] = dict(generator.config)
    for setting, value in given.items():
        if setting == "n_ctx" and value == 0:
            value = generator.model.n_ctx_train  # the length 0 stands for, as the checkpoint records it
        if setting in config and config[setting] != value and not _same_real(config[setting], value):
            if setting == "grammar":
                raise UsageError(
                    "the grammar given contradicts the checkpoint's: a resumed conversation continues with its "
                    "own (leave --grammar and --json-schema out)"
                )
            option = "--" + _SETTING_OPTIONS.get(setting, setting).replace("_", "-")
            raise UsageError(
                f"{option} {value} contradicts the checkpoint's {setting} {config[setting]}: "
                "a resumed conversation continues with its own settings (leave the option out)"
            )


def _same_real(recorded: object, given: object) -> bool:
    """Whether a float setting given equals the one recorded (stored in single precision)."""
    return (
        isinstance(recorded, float)
        and isinstance(given, (int, float))
        and abs(recorded - given) <= 1e-6 * max(1.0, abs(given))
    )


def cmd_chat(args: argparse.Namespace) -> None:
    from specstate.chat_cli import run_chat

    save = args.save if args.save is not None else args.resume
    _check_save_path(save, "--save" if args.save is not None else "--resume")
    template = _chat_template(args.template)
    if args.resume is not None:
        generator = _restore_conversation(args)
    else:
        if args.model is None:
            raise UsageError("--model is needed to start a conversation")
        model = _load(args.model, "model", args.mmap)
        draft = _load(args.draft_model, "draft model", args.mmap) if args.draft_model else None
        settings = {"n_ctx": CHAT_N_CTX, **_generator_settings(args)}
        generator = Generator(model, draft_model=draft, **settings)
    run_chat(generator, args, template, save)


def _read_checkpoint(path: Path) -> bytes:
    """The checkpoint file's bytes (:func:`specstate._files.read_checkpoint`: never blocks, bounded).

    A path that is missing, or is not a regular file, is one line saying which.
    """
    try:
        return read_checkpoint(path)
    except FileNotFoundError as error:
        raise UsageError(f"checkpoint {path} does not exist") from error
    except (IsADirectoryError, errors.NotARegularFileError) as error:
        raise UsageError(f"checkpoint {path} is {special_kind(path) or 'not a regular file'}") from error


def _verdict(match: bool | None) -> str:
    return "not checked" if match is None else "matches" if match else "DOES NOT MATCH"


def _model_entries(info: CheckpointInfo) -> tuple[tuple[str, ModelFingerprint | None], ...]:
    """The checkpoint's model fingerprints by role: ``target``, ``draft``."""
    return ("target", info["target_model"]), ("draft", info["draft_model"])


def _describe(path: Path, info: CheckpointInfo, matches: dict[str, bool]) -> list[str]:
    """The human-readable description of a checkpoint, line by line (not yet escaped)."""
    lines = [
        f"checkpoint     {path} ({info['size']:,} bytes, format {info['format_version']}, "
        f"CRC-32 {info['checksum']}: ok)",
        f"written by     specstate {info['specstate_version']}, llama-cpp-sys-4 {info['llama_cpp_sys_version']}, "
        f"llama.cpp {info['llama_cpp_build']} ({info['llama_cpp_commit']})",
    ]
    for role, entry in _model_entries(info):
        if entry is not None:
            lines.append(
                f"{role + ' model':<14} {entry['file']} ({entry['size']:,} bytes, "
                f"sha256 {entry['sha256'][:16]}…): {_verdict(matches.get(role))}"
            )
    threads = "" if info["n_threads"] is None else f", decoded with {info['n_threads']} threads"
    lines.append("mode           " + ", ".join(f"{k}={v}" for k, v in info["config"].items()) + threads)
    lines.append(
        f"tokens         {info['n_prompt']} prompt + {info['n_delivered']} generated and handed out "
        f"({info['n_generated']} committed, {info['n_past']} in the target's memory)"
        f"{', finished' if info['finished'] else ''}"
    )
    if info["n_messages"] is not None:
        lines.append(f"conversation   {info['n_messages']} messages, then the reply")
    lines.append(
        f"speculation    {info['rounds']} rounds, {info['accepted']}/{info['drafted']} drafted tokens accepted"
    )
    if info["cost_curve"] is not None:
        costs = info["cost_curve"]
        lines.append(f"cost curve     {costs[0]:,} us for 1 row to {costs[-1]:,} us for {len(costs)} rows (adaptive)")
    lines.extend(f"  {name:<18} {size:>12,} bytes" for name, size in info["sections"])
    return lines


def cmd_inspect(args: argparse.Namespace) -> None:
    info = inspect_checkpoint(_read_checkpoint(args.checkpoint))
    given = {"target": args.model, "draft": args.draft_model}
    matches: dict[str, bool] = {}
    for role, entry in _model_entries(info):
        if given[role] is not None:
            # Only fingerprinted, never run: mapped rather than read into memory.
            sha, size = model_fingerprint(_load(given[role], f"{role} model", use_mmap=True))
            matches[role] = entry is not None and entry["sha256"] == sha and entry["size"] == size
    if args.json:  # JSON escapes control characters itself
        print(json.dumps({**info, "checksum_ok": True, "models_match": matches}, indent=2))
        return
    for line in _describe(args.checkpoint, info, matches):
        print(_printable(line))  # every string from the file is escaped for the terminal


def cmd_bench(args: argparse.Namespace) -> None:
    from specstate.bench import quick_suite

    quick_suite(threads=args.threads, runs=args.runs)


def cmd_demo(args: argparse.Namespace) -> None:
    from specstate.demo import run_demo

    run_demo()


def cmd_demo_serve(args: argparse.Namespace) -> None:
    _run_optional_demo(args.command, "specstate.serve_demo", "run_serve_demo", "the server extra (specstate[server])")


def cmd_demo_cluster(args: argparse.Namespace) -> None:
    _run_optional_demo(args.command, "specstate.cluster_demo", "run_cluster_demo", "Ray: pip install 'specstate[ray]'")


def _run_optional_demo(command: str, module: str, function: str, needs: str) -> None:
    """Run a demo that needs an extra (named in the error if it is missing); it returns whether the texts matched."""
    import importlib

    try:
        demo = getattr(importlib.import_module(module), function)
    except ImportError as error:
        raise UsageError(f"{command} needs {needs} ({error})") from error
    if not demo():
        raise UsageError("the resumed text differed from the uninterrupted run")


def cmd_serve(args: argparse.Namespace) -> None:
    try:
        from specstate.server import API_KEY_VARIABLE, ServerConfig, serve
    except ImportError as error:
        raise UsageError(f"specstate serve needs the server extra: pip install 'specstate[server]' ({error})") from None
    config = ServerConfig(
        model_path=str(args.model),
        mode=args.mode,
        draft_model_path=None if args.draft_model is None else str(args.draft_model),
        n_draft=args.n_draft,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        slots=args.slots,
        queue=args.queue,
        max_tokens=args.max_tokens,
        api_key=args.api_key or os.environ.get(API_KEY_VARIABLE) or None,
        chat_template=_chat_template(args.template),
        model_name=args.model_name,
        cache_bytes=args.cache_mib << 20,
        cache_dir=None if args.cache_dir is None else str(args.cache_dir),
        parked_bytes=args.parked_mib << 20,
        spill_dir=None if args.spill_dir is None else str(args.spill_dir),
        ray_workers=args.ray_workers,
        ray_address=args.ray_address,
    )
    sys.stderr.write(f"specstate serve: http://{args.host}:{args.port}/v1 ({config.name()}, mode {args.mode})\n")
    serve(config, args.host, args.port)


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "generate": cmd_generate,
    "resume": cmd_resume,
    "chat": cmd_chat,
    "inspect": cmd_inspect,
    "bench": cmd_bench,
    "demo": cmd_demo,
    "demo-cluster": cmd_demo_cluster,
    "demo-serve": cmd_demo_serve,
    "serve": cmd_serve,
}


#: Every failure reported as one line: usage errors, every class of specstate.errors, and the
#: standard ones bad input or the system can cause.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    UsageError,
    *(getattr(errors, name) for name in errors.__all__),
    ValueError,
    ArithmeticError,
    OSError,
    MemoryError,
)


def _report(error: BaseException, *, internal: bool) -> int:
    """Write ``error`` as one line (after its traceback with ``SPECSTATE_DEBUG=1``); the exit status, 2."""
    if os.environ.get("SPECSTATE_DEBUG") == "1":
        traceback.print_exception(type(error), error, error.__traceback__)
    message = _one_line(str(error))
    if internal:
        line = f"internal error: {type(error).__name__}: {message}"
    else:
        line = f"error: {message or type(error).__name__}"
    sys.stderr.write(f"specstate: {line}\n")
    return 2


class Terminated(BaseException):
    """``SIGTERM`` received: raised in the main thread so that cleanups run, as for ``KeyboardInterrupt``."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise Terminated


def _raise_on_sigterm() -> Any:
    """Make ``SIGTERM`` raise :class:`Terminated` (the main thread only handles signals); the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Any failure is one line on standard error and exit status 2; with
    ``SPECSTATE_DEBUG=1`` the traceback is printed before it. ``SIGINT``
    (exit status 130) and ``SIGTERM`` (143) stop the command after its
    cleanups: a save in progress removes its temporary file.
    """
    args = build_parser().parse_args(argv)
    previous = _raise_on_sigterm()
    try:
        _check_numbers(args)
        COMMANDS[args.command](args)
    except KeyboardInterrupt:
        sys.stderr.write("specstate: interrupted\n")
        return 130
    except Terminated:
        sys.stderr.write("specstate: terminated\n")
        return 128 + signal.SIGTERM
    except EXPECTED_ERRORS as error:
        return _report(error, internal=False)
    except Exception as error:
        return _report(error, internal=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
