"""The argument layer every command shares: the parser and its one-line errors, the options of a generation
and of its output, the numeric ranges checked before anything is loaded, save destinations, and the generator
settings the options give."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, get_args

from rich.console import Console

from specstate import DraftPolicy, GeneratorSettings, _native
from specstate._files import read_small_file, special_kind
from specstate._typing import U32_MAX, Mode

MODES = get_args(Mode)
#: Progress, summaries and status lines.
err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """Bad command-line input, reported as one line."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line too (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\u202e``), for a terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line(text: str) -> str:
    return printable(" ".join(text.split()))


# --- the options --------------------------------------------------------------------------------------------


#: The native generator's defaults (written once, in Rust): what an option left out means.
NATIVE_DEFAULTS: dict[str, Any] = dict(_native.GENERATOR_DEFAULTS)
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


def add_draft_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft-policy",
        choices=get_args(DraftPolicy),
        help="adaptive: choose each round's length from a cost curve and the recent acceptance; fixed: draft up to "
        "--n-draft every round (speculative modes)" + _default("draft_policy"),
    )


def add_settings(parser: argparse.ArgumentParser, n_ctx: int | None = None) -> None:
    """The settings of a new generation; an option left out takes the native default (``n_ctx``: this
    command's own), and with ``chat --resume`` one given must agree with the checkpoint."""
    parser.add_argument("--mode", choices=MODES, help="speculation mode" + _default("mode"))
    parser.add_argument("--draft-model", type=Path, help="draft GGUF model (draft and eagle3 modes)")
    parser.add_argument("--n-draft", type=int, help="most tokens drafted per round" + _default("n_draft"))
    add_draft_policy(parser)
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
    group.add_argument(
        "--no-grammar-drafts",
        dest="grammar_drafts",
        action="store_false",
        default=None,
        help="do not draft the tokens the grammar forces (the reply is the same; only its speed changes)",
    )


def add_mmap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mmap",
        action="store_true",
        help="map the model files instead of reading them into memory (faster to load; a checkpoint is refused "
        "once a mapped file has been written)",
    )


def add_max_n_batch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-n-batch",
        type=int,
        metavar="N",
        help="let a checkpoint allocate up to N rows per compute pass (default 512) and, on a recurrent or "
        "hybrid model, rollback snapshots beyond the model's size",
    )


def add_output(parser: argparse.ArgumentParser) -> None:
    """The options of a generation's output: ``generate`` and ``resume``."""
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--save", type=Path, help="checkpoint file written at the end (and every N tokens)")
    parser.add_argument("--checkpoint-every", type=int, metavar="N", help="also save every N tokens")
    parser.add_argument(
        "--threads",
        type=int,
        help="threads (0: the default count, docs/threads.md; default: that for a new generation, "
        "the checkpoint's own count, at most the default, for a resumed one: any count continues exactly)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")


# --- numeric ranges -----------------------------------------------------------------------------------------


class Range(NamedTuple):
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


#: Every thread count's range, as the native core checks it (0: the default thread count).
THREADS = Range("threads", 0, _native.MAX_THREADS)
#: --n-ctx: 0 (the model's trained length) or a length the native core then checks against the model.
N_CTX = Range("n_ctx", 2, U32_MAX, when=lambda args: args.n_ctx != 0, note=" (or 0: the model's trained length)")
#: The options of add_output.
OUTPUT_RANGES = (Range("max_tokens", 0), Range("checkpoint_every", 0, low_open=True), THREADS)
#: The settings of a new generation (``generate`` and ``chat``).
SETTING_RANGES = (
    N_CTX,
    Range("n_draft", 1, U32_MAX, when=lambda args: args.mode not in (None, "none"), note=" when speculating"),
    Range("n_draft", 0, U32_MAX),
)


def check_sampling_options(args: argparse.Namespace) -> None:
    """Refuse, naming the option, a sampler option the core refuses: its ranges are checked once, in the core
    (``_native.check_sampling``), with the message a ``Generator`` gives."""
    for setting, _, _ in _SAMPLERS:
        value = getattr(args, setting, None)
        if value is None:
            continue
        try:
            _native.check_sampling(**{setting: value})
        except (TypeError, ValueError) as error:
            raise UsageError(f"--{setting.replace('_', '-')}: {error}") from None


def check_numbers(args: argparse.Namespace, ranges: Sequence[Range]) -> None:
    """Refuse, naming the option, any numeric option outside its range."""
    for bound in ranges:
        value = getattr(args, bound.option)
        if value is None or (bound.when is not None and not bound.when(args)):
            continue
        problem = bound.problem(value)
        if problem is not None:
            raise UsageError(f"--{bound.option.replace('_', '-')} {problem} (got {value})")


# --- files the options name ---------------------------------------------------------------------------------


def check_save_path(path: Path | None, option: str = "--save") -> None:
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


def check_output_options(args: argparse.Namespace) -> None:
    if args.checkpoint_every is not None and args.save is None:
        raise UsageError("--checkpoint-every needs --save")
    check_save_path(args.save)


def chat_template(option: str | None) -> str | None:
    """``--template``: a chat format's name (``chatml``, ``llama-3``, ``gemma``, ...: llama.cpp's built-in
    templates), or the text of a Jinja file."""
    from specstate.chat import builtin_name

    if option is None or builtin_name(option) is not None:
        return option
    path = Path(option)
    if not path.is_file():
        raise UsageError(f"--template: {option} is neither a chat format's name (chatml, llama-3, ...) nor a file")
    return path.read_text(encoding="utf-8")


# --- the settings the options give --------------------------------------------------------------------------

#: The options named otherwise than the generator setting they give.
SETTING_OPTIONS = {"n_threads": "threads"}


def generator_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The generator settings given as options named after them (``--threads``: ``n_threads``).

    ``--draft-model`` is a path, loaded apart.
    """
    options = {setting: SETTING_OPTIONS.get(setting, setting) for setting in GeneratorSettings.__optional_keys__}
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
