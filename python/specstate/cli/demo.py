"""``specstate demo``, ``demo-serve`` and ``demo-cluster``: the demonstrations (the last two need extras)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from specstate.cli._args import UsageError


def add_parsers(commands: Any) -> None:
    commands.add_parser("demo", help="speculate, checkpoint half-way, resume in a new process, compare")
    commands.add_parser(
        "demo-serve", help="a streamed chat parked for an urgent request and resumed exactly (needs the server extra)"
    )
    commands.add_parser(
        "demo-cluster", help="a generation moves between two Ray workers and survives a kill (needs the ray extra)"
    )


def run(args: argparse.Namespace) -> None:
    from specstate.cli._demo import run_demo

    run_demo()


def run_serve(args: argparse.Namespace) -> None:
    _run_optional(args.command, "specstate.cli._serve_demo", "run_serve_demo", "the server extra (specstate[server])")


def run_cluster(args: argparse.Namespace) -> None:
    _run_optional(args.command, "specstate.cli._cluster_demo", "run_cluster_demo", "Ray: pip install 'specstate[ray]'")


def _run_optional(command: str, module: str, function: str, needs: str) -> None:
    """Run a demo that needs an extra (named in the error if it is missing); it returns whether the texts matched."""
    try:
        demo = getattr(importlib.import_module(module), function)
    except ImportError as error:
        raise UsageError(f"{command} needs {needs} ({error})") from error
    if not demo():
        raise UsageError("the resumed text differed from the uninterrupted run")
