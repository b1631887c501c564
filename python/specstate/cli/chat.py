"""``specstate chat``: an interactive chat (the loop is :mod:`specstate.cli._chat_loop`) that saves and resumes
exactly."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specstate import Generator
from specstate.cli._args import (
    SETTING_OPTIONS,
    SETTING_RANGES,
    THREADS,
    Range,
    UsageError,
    add_max_n_batch,
    add_mmap,
    add_settings,
    chat_template,
    check_save_path,
    generator_settings,
)
from specstate.cli._models import load, restore_saved

#: A new conversation's context length unless --n-ctx says otherwise (room for a few turns).
CHAT_N_CTX = 4096
RANGES = (Range("max_tokens", 1), THREADS, *SETTING_RANGES)


def add_parser(commands: Any) -> None:
    chat = commands.add_parser("chat", help="chat with a model; the conversation saves and resumes exactly")
    chat.add_argument("--model", type=Path, help="target GGUF model (with --resume: default the checkpoint's)")
    add_settings(chat, n_ctx=CHAT_N_CTX)
    chat.add_argument("--system", help="the system message of a new conversation")
    chat.add_argument(
        "--template",
        help="chat template: a Jinja file, or a format's name, chatml, llama-3, ... (default: the model's)",
    )
    chat.add_argument(
        "--resume", type=Path, metavar="CHECKPOINT", help="continue a saved conversation (saved back to it by default)"
    )
    chat.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply (default 512)")
    chat.add_argument("--stop", action="append", default=[], help="end a reply before this string (repeatable)")
    chat.add_argument("--save", type=Path, help="checkpoint file written after every reply")
    chat.add_argument(
        "--threads",
        type=int,
        help="threads (0 or none: the default count; a checkpoint's own count, at most the default, on --resume)",
    )
    chat.add_argument("--quiet", action="store_true", help="no status line")
    add_max_n_batch(chat)
    add_mmap(chat)


def run(args: argparse.Namespace) -> None:
    from specstate.cli._chat_loop import run_chat

    save = args.save if args.save is not None else args.resume
    check_save_path(save, "--save" if args.save is not None else "--resume")
    template = chat_template(args.template)
    if args.resume is not None:
        generator = _restore_conversation(args)
    else:
        if args.model is None:
            raise UsageError("--model is needed to start a conversation")
        model = load(args.model, "model", args.mmap)
        draft = load(args.draft_model, "draft model", args.mmap) if args.draft_model else None
        settings = {"n_ctx": CHAT_N_CTX, **generator_settings(args)}
        generator = Generator(model, draft_model=draft, **settings)
    run_chat(generator, args, template, save)


def _restore_conversation(args: argparse.Namespace) -> Generator:
    generator = restore_saved(args.resume, args)
    if not generator.messages:
        raise UsageError(f"{args.resume} is not a conversation (it was saved by 'specstate generate')")
    _refuse_conflicts(generator_settings(args), generator)
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
            option = "--" + SETTING_OPTIONS.get(setting, setting).replace("_", "-")
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
