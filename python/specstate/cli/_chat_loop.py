"""``specstate chat``: a conversation on the terminal, saved after every reply.

On a terminal it is interactive: a ``> `` prompt, the reply streamed as it is
committed, and a status line on standard error after each reply (tokens,
speed, drafted and accepted tokens); ``/save FILE`` checkpoints the
conversation now, ``/help`` lists the commands, and a resumed conversation
shows its last exchange first. Ctrl-C stops the current reply cleanly and
keeps the conversation (the reply so far is part of it); Ctrl-C at the prompt,
Ctrl-D or ``/quit`` leaves. Otherwise it reads the user's messages from
standard input, one per line, and writes each reply on one line of standard
output. With ``--save`` the conversation is checkpointed after every reply;
``--resume`` continues a saved one (and saves back to it unless ``--save``
names another file).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specstate import Generator
from specstate.chat import Messages

__all__ = ["run_chat"]

err = Console(stderr=True, highlight=False)
QUIT = "/quit"
#: The commands typed at the prompt, and what they do.
COMMANDS = {
    "/save FILE": "save the conversation to FILE now (a checkpoint that --resume continues)",
    "/help": "this list",
    QUIT: "leave (so do Ctrl-D, and Ctrl-C at the prompt)",
}


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


class _CtrlC:
    """While a reply streams, Ctrl-C only raises a flag, read between pieces: a ``KeyboardInterrupt`` could land
    between a token joining the reply and its text reaching the screen. On a terminal it also sets NOFLSH, since a
    terminal otherwise discards the output not yet shown when it sends SIGINT."""

    def __init__(self) -> None:
        self.pressed = False

    def _press(self, signum: int, frame: object) -> None:
        self.pressed = True

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self._press)
        terminal = sys.stdin.fileno() if sys.stdin.isatty() else None
        saved = termios.tcgetattr(terminal) if terminal is not None else None
        if terminal is not None and saved is not None:
            changed = list(saved)
            changed[3] |= termios.NOFLSH
            termios.tcsetattr(terminal, termios.TCSANOW, changed)
        try:
            yield
        finally:
            if terminal is not None and saved is not None:
                termios.tcsetattr(terminal, termios.TCSANOW, saved)
            signal.signal(signal.SIGINT, previous)


def _reply(generator: Generator, messages: Messages, args: argparse.Namespace, template: str | None) -> None:
    """Stream one reply to standard output; Ctrl-C ends it early, keeping what was said."""
    started = time.perf_counter()
    stream = generator.stream_chat(messages, max_tokens=args.max_tokens, template=template, stop=args.stop)
    ctrl_c = _CtrlC()

    def show(text: str) -> None:
        sys.stdout.write(text if args.interactive else text.replace("\n", " "))
        sys.stdout.flush()

    shown = ""
    with ctrl_c.watching(), contextlib.closing(stream):
        for piece in stream:
            show(piece)
            shown += piece
            if ctrl_c.pressed:
                break
    if ctrl_c.pressed:  # the text a closed stream held back (a token's incomplete character) is in the reply too
        reply = generator.messages[-1]["content"]
        show(reply[len(shown) :] if reply.startswith(shown) else "")
    stopped = "interrupted" if ctrl_c.pressed else None
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


def _greet(generator: Generator) -> None:
    """The first lines of an interactive chat: what runs, and a resumed conversation's last exchange."""
    held = generator.messages
    where = f"{len(held)} messages resumed, " if held else ""
    err.print(
        f"[dim]specstate chat: {where}mode {generator.mode}; Ctrl-C stops a reply, /help lists the commands[/dim]"
    )
    for message in held[-2:]:  # the last exchange
        err.print(f"[dim]{message['role']}:[/dim] " + escape(message["content"]))


def _command(generator: Generator, line: str) -> None:
    """``/save FILE`` or ``/help``; anything else is named unknown (the conversation is unchanged)."""
    name, _, argument = line.strip().partition(" ")
    if name == "/save" and argument.strip():
        try:
            generator.save(argument.strip())
        except (OSError, ValueError, RuntimeError) as error:  # a bad path, a mapped model file changed, ...
            err.print(f"[red]/save: {escape(str(error))}[/red]")
            return
        err.print(f"[dim]saved to {escape(argument.strip())}[/dim]")
        return
    if name != "/help":
        err.print(f"[red]unknown command {escape(line.strip())!s}[/red]")
    for usage, what in COMMANDS.items():
        err.print(f"[dim]{usage:12s} {what}[/dim]")


def run_chat(generator: Generator, args: argparse.Namespace, template: str | None, save: Path | None) -> None:
    """The conversation loop: one reply per user message, saved after each when ``save`` is set."""
    args.interactive = sys.stdin.isatty()
    if args.interactive and not args.quiet:
        _greet(generator)
    for line in _lines(args.interactive):
        if line.startswith("/") and args.interactive:
            _command(generator, line)
            continue
        messages: Messages = line
        if not generator.messages:
            system = [{"role": "system", "content": args.system}] if args.system else []
            messages = [*system, {"role": "user", "content": line}]
        _reply(generator, messages, args, template)
        if save is not None:
            generator.save(save)
