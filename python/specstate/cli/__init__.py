"""The ``specstate`` command: generate, resume, chat, inspect, serve, bench, demo.

One module per command (:mod:`.generate`, :mod:`.resume`, :mod:`.chat`, :mod:`.inspect`, :mod:`.serve`,
:mod:`.bench`, :mod:`.demo`), each with its parser, the ranges of its numeric options and what it runs, on a
shared argument layer (:mod:`._args`) and the files layer (:mod:`._models`); this module parses, dispatches
and reports.

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
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from specstate import errors
from specstate.cli import _args, _models, bench, chat, demo, generate, resume, serve
from specstate.cli import inspect as inspect_command
from specstate.cli._args import (
    NATIVE_DEFAULTS,
    Parser,
    Range,
    UsageError,
    check_numbers,
    check_sampling_options,
    one_line,
)

__all__ = ["COMMANDS", "EXPECTED_ERRORS", "NATIVE_DEFAULTS", "RANGES", "UsageError", "build_parser", "main"]

# Helpers the tests reach through this module: the settings the options give, and text and file names.
_generator_settings = _args.generator_settings
_printable = _args.printable
_base_name = _models.base_name


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specstate", description="Speculative decoding on llama.cpp with exact, checkpointable state.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (generate, resume, inspect_command, chat, serve, bench):
        command.add_parser(commands)
    demo.add_parsers(commands)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "generate": generate.run,
    "resume": resume.run,
    "chat": chat.run,
    "inspect": inspect_command.run,
    "bench": bench.run,
    "demo": demo.run,
    "demo-cluster": demo.run_cluster,
    "demo-serve": demo.run_serve,
    "serve": serve.run,
}
#: The ranges of each command's numeric options, checked before it runs.
RANGES: dict[str, tuple[Range, ...]] = {
    "generate": generate.RANGES,
    "resume": resume.RANGES,
    "chat": chat.RANGES,
    "bench": bench.RANGES,
    "serve": serve.RANGES,
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
    message = one_line(str(error))
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
        check_numbers(args, RANGES.get(args.command, ()))
        check_sampling_options(args)
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
