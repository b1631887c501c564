"""``specstate chat``: a conversation on the terminal, saved after every reply.

On a terminal it is interactive: a ``> `` prompt, the reply streamed as it is
committed, and a status line on standard error after each reply (tokens,
speed, drafted and accepted tokens). Ctrl-C stops the current reply cleanly and
keeps the conversation (the reply so far is part of it); Ctrl-C at the prompt,
Ctrl-D or ``/quit`` leaves. Otherwise it reads the user's messages from
standard input, one per line, and writes each reply on one line of standard
output. With ``--save`` the conversation is checkpointed after every reply;
``--resume`` continues a saved one (and saves back to it unless ``--save``
names another file).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from specstate import Generator
from specstate.chat import Messages

__all__ = ["run_chat"]

err = Console(stderr=True, highlight=False)
QUIT = "/quit"


def _lines(interactive: bool) -> Iterator[str]:
    """The user's messages: prompted on a terminal, else one per line of standard input (blank lines skipped)."""
    if not interactive:
        for raw in sys.stdin:
            line = raw.rstrip("\r\n")
            if line.strip():
                yield line
        return
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            sys.stderr.write("\n")
            return
        if line.strip() == QUIT:
            return
        if line.strip():
            yield line


def _reply(generator: Generator, messages: Messages, args: argparse.Namespace, template: str | None) -> None:
    """Stream one reply to standard output; Ctrl-C ends it early, keeping what was said."""
    started = time.perf_counter()
    stream = generator.stream_chat(messages, max_tokens=args.max_tokens, template=template)
    stopped = None
    try:
        for piece in stream:
            sys.stdout.write(piece.replace("\n", " ") if not args.interactive else piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stopped = "interrupted"
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.quiet:
        return
    elapsed = time.perf_counter() - started
    made = len(generator.tokens)
    err.print(
        f"[dim]{made} tokens, {made / elapsed if elapsed else 0:.1f} tok/s, mode {generator.mode}, "
        f"accepted {generator.accepted}/{generator.drafted} drafted ({generator.acceptance_rate:.0%}), "
        f"{stopped or generator.stopped_by}[/dim]"
    )


def run_chat(generator: Generator, args: argparse.Namespace, template: str | None, save: Path | None) -> None:
    """The conversation loop: one reply per user message, saved after each when ``save`` is set."""
    args.interactive = sys.stdin.isatty()
    held = generator.messages
    if args.interactive and not args.quiet:
        where = f"{len(held)} messages resumed, " if held else ""
        err.print(
            f"[dim]specstate chat: {where}mode {generator.mode}; Ctrl-C stops a reply, {QUIT} or Ctrl-D leaves[/dim]"
        )
    for line in _lines(args.interactive):
        messages: Messages = line
        if not generator.messages:
            system = [{"role": "system", "content": args.system}] if args.system else []
            messages = [*system, {"role": "user", "content": line}]
        _reply(generator, messages, args, template)
        if save is not None:
            generator.save(save)
