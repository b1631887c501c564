"""``specstate bench``: the quick benchmark suite (:mod:`specstate.bench`) and its table."""

from __future__ import annotations

import argparse
from typing import Any

from specstate.cli._args import THREADS, Range

RANGES = (THREADS._replace(low=1), Range("runs", 1))


def add_parser(commands: Any) -> None:
    bench = commands.add_parser("bench", help="run the quick benchmark suite and print the table")
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--runs", type=int, default=3)


def run(args: argparse.Namespace) -> None:
    from specstate.bench import quick_suite

    quick_suite(threads=args.threads, runs=args.runs)
