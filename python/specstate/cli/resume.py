"""``specstate resume``: a saved generation continued exactly."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specstate.cli._args import OUTPUT_RANGES, UsageError, add_max_n_batch, add_mmap, add_output, check_output_options
from specstate.cli._models import restore_saved
from specstate.cli.generate import run_generation

RANGES = OUTPUT_RANGES


def add_parser(commands: Any) -> None:
    resume = commands.add_parser("resume", help="continue a saved generation exactly")
    resume.add_argument("checkpoint", type=Path)
    resume.add_argument(
        "--model",
        type=Path,
        help="target model (default: the file named in the checkpoint, "
        "next to the checkpoint or in the specstate cache)",
    )
    resume.add_argument("--draft-model", type=Path, help="draft model (draft and eagle3 modes)")
    add_output(resume)
    add_max_n_batch(resume)
    add_mmap(resume)


def run(args: argparse.Namespace) -> None:
    check_output_options(args)
    generator = restore_saved(args.checkpoint, args)
    if generator.finished:
        raise UsageError("the saved generation has already finished")
    run_generation(generator, None, args)
