"""``specstate inspect``: a checkpoint described, its models' fingerprints checked against files given."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specstate import CheckpointInfo, ModelFingerprint, inspect_checkpoint, model_fingerprint
from specstate.cli._args import printable
from specstate.cli._models import load, read_checkpoint


def add_parser(commands: Any) -> None:
    inspect = commands.add_parser("inspect", help="describe a checkpoint")
    inspect.add_argument("checkpoint", type=Path)
    inspect.add_argument("--model", type=Path, help="check the target model's fingerprint against this file")
    inspect.add_argument("--draft-model", type=Path, help="check the draft model's fingerprint against this file")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> None:
    info = inspect_checkpoint(read_checkpoint(args.checkpoint))
    given = {"target": args.model, "draft": args.draft_model}
    matches: dict[str, bool] = {}
    for role, entry in _model_entries(info):
        if given[role] is not None:
            # Only fingerprinted, never run: mapped rather than read into memory.
            sha, size = model_fingerprint(load(given[role], f"{role} model", use_mmap=True))
            matches[role] = entry is not None and entry["sha256"] == sha and entry["size"] == size
    if args.json:  # JSON escapes control characters itself
        print(json.dumps({**info, "checksum_ok": True, "models_match": matches}, indent=2))
        return
    for line in _describe(args.checkpoint, info, matches):
        print(printable(line))  # every string from the file is escaped for the terminal


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
