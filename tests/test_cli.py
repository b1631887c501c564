"""The `specstate` command line, run as users run it: in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from generator_support import tiny_generator


def specstate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specstate", *args], capture_output=True, text=True, timeout=600)


def test_generate_save_resume_matches_an_uninterrupted_run(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_map["qwen35"])
    common = ["--mode", "mtp", "--n-ctx", "256", "--threads", "1", "--temperature", "1.5", "--seed", "5"]
    full = specstate("generate", "--model", model, *common, "--max-tokens", "60", "--quiet", "hello cli")
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "half.ckpt"
    half = specstate("generate", "--model", model, *common, "--max-tokens", "25", "--save", str(ckpt),
                     "--checkpoint-every", "10", "hello cli")
    assert half.returncode == 0, half.stderr
    assert "acceptance" in half.stderr and ckpt.is_file()
    rest = specstate("resume", str(ckpt), "--model", model, "--max-tokens", "35", "--threads", "1", "--quiet")
    assert rest.returncode == 0, rest.stderr
    assert half.stdout[:-1] + rest.stdout == full.stdout


def test_resume_finds_the_model_next_to_the_checkpoint(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    local = tmp_path / "qwen35.gguf"
    local.write_bytes(tiny_map["qwen35"].read_bytes())
    ckpt = tmp_path / "run.ckpt"
    made = specstate("generate", "--model", str(local), "--mode", "ngram", "--n-ctx", "256", "--max-tokens", "5",
                     "--save", str(ckpt), "--quiet", "x")
    assert made.returncode == 0, made.stderr
    again = specstate("resume", str(ckpt), "--max-tokens", "5", "--quiet")
    assert again.returncode == 0, again.stderr


def test_inspect_describes_and_checks_models(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    generator = tiny_generator("eagle3", tiny_map)
    generator.generate("inspect me", max_tokens=12)
    ckpt = tmp_path / "g.ckpt"
    generator.save(ckpt)
    human = specstate("inspect", str(ckpt), "--model", str(tiny_map["qwen35"]), "--draft-model", str(tiny_map["llama"]))
    assert human.returncode == 0, human.stderr
    assert "mode=eagle3" in human.stdout and "ok" in human.stdout
    assert "target model   qwen35.gguf" in human.stdout and "matches" in human.stdout
    assert "DOES NOT MATCH" in human.stdout  # the llama file is not the EAGLE-3 draft
    machine = json.loads(specstate("inspect", str(ckpt), "--json").stdout)
    assert machine["config"]["mode"] == "eagle3" and machine["n_delivered"] == 12 <= machine["n_generated"]
    assert [name for name, _ in machine["sections"]][-1] == "speculative_state"


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "--model", "/no/such.gguf", "hi"], "does not exist"),
        (["generate", "--model", "{tiny}", "--mode", "draft", "hi"], "needs a draft model"),
        (["generate", "--model", "{tiny}", "--checkpoint-every", "5", "hi"], "needs --save"),
        (["generate", "--model", "{tiny}", "--max-tokens", "-1", "hi"], "must not be negative"),
        (["generate", "--model", "{garbage}", "hi"], "cannot load model"),
        (["resume", "{garbage}", "--model", "{tiny}"], "not a specstate checkpoint"),
        (["resume", "/no/such.ckpt"], "does not exist"),
        (["inspect", "{garbage}"], "not a specstate checkpoint"),
        (["inspect", "{truncated}"], "truncated"),
        (["resume", "{other-model}", "--model", "{tiny}"], "model"),
    ],
)
def test_bad_input_gives_one_clear_line(tiny_map: dict[str, Path], tmp_path: Path, args: list[str], message: str) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a model, not a checkpoint")
    generator = tiny_generator("ngram", tiny_map)
    generator.generate("x", max_tokens=3)
    data = generator.checkpoint()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    other = tmp_path / "other.ckpt"
    other.write_bytes(data)
    values = {"{tiny}": str(tiny_map["llama"]), "{garbage}": str(garbage), "{truncated}": str(truncated),
              "{other-model}": str(other)}
    result = specstate(*[values.get(a, a) for a in args])
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specstate: error:") and message in lines[0], result.stderr
