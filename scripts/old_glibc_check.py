"""What scripts/check-old-glibc.sh runs inside the old system, with that system's Python (3.9 on bullseye).

    python old_glibc_check.py MODEL WORKDIR

Imports the installed wheel, prints ``native_info()``, generates on the model, checkpoints half-way and resumes
(API and CLI), and checks that the resumed text equals the uninterrupted run's. Exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

PROMPT = "Quote the notice word for word: The library opens at nine and closes at five. The library opens at nine"
TOKENS = 32


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def check_api(model_path: str, workdir: Path) -> None:
    from specstate import Generator, Model

    model = Model(model_path)
    whole = Generator(model, mode="ngram")
    text = whole.generate(PROMPT, max_tokens=TOKENS)
    print(f"generated {len(whole.tokens)} tokens at {whole.tokens_per_second:.1f} tok/s: {text!r}")
    check(len(whole.tokens) == TOKENS, f"generate: {TOKENS} tokens")
    first = Generator(model, mode="ngram")
    first.generate(PROMPT, max_tokens=TOKENS // 2)
    checkpoint = workdir / "api.ckpt"
    first.save(checkpoint)
    resumed = Generator.restore(checkpoint, model)
    resumed.generate(max_tokens=TOKENS - TOKENS // 2)
    check(resumed.tokens == whole.tokens, "API: checkpoint half-way, restore, continue == uninterrupted run")


def cli(*args: str) -> str:
    specstate = str(Path(sys.executable).with_name("specstate"))
    done = subprocess.run([specstate, *args], check=True, stdout=subprocess.PIPE, text=True)
    return done.stdout


def check_cli(model_path: str, workdir: Path) -> None:
    checkpoint = str(workdir / "cli.ckpt")
    common = ["--model", model_path, "--mode", "ngram", "--quiet"]
    whole = cli("generate", PROMPT, *common, "--max-tokens", str(TOKENS))
    first = cli("generate", PROMPT, *common, "--max-tokens", str(TOKENS // 2), "--save", checkpoint)
    rest = cli("resume", checkpoint, "--model", model_path, "--quiet", "--max-tokens", str(TOKENS - TOKENS // 2))
    # Each command ends its text with one newline of its own.
    check(first[:-1] + rest[:-1] == whole[:-1], "CLI: generate --save, resume == uninterrupted generate")
    print(cli("inspect", checkpoint, "--model", model_path), end="")


def main() -> None:
    model_path, workdir = sys.argv[1], Path(sys.argv[2])
    libc, version = platform.libc_ver()
    print(f"system: {platform.machine()}, {libc} {version}, Python {platform.python_version()}, {os.cpu_count()} CPUs")
    import specstate

    print(f"specstate from {Path(specstate.__file__).parent}")
    info = specstate.native_info()
    print("native_info():", json.dumps(info, indent=1))
    baseline = "x86-64-v3" if platform.machine() == "x86_64" else "target default"  # src/native/info.rs
    check(info["cpu_baseline"] == baseline, f"native_info(): cpu_baseline {baseline}")
    check_api(model_path, workdir)
    check_cli(model_path, workdir)
    print("PASSED")


if __name__ == "__main__":
    main()
