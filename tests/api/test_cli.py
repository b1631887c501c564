"""The `specstate` command line, run as users run it: in a subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_codec import meta, rewrite_meta
from save_support import stop_while_saving, temporaries
from specstate import cli, errors
from specstate_testkit.generator_support import tiny_generator


def specstate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specstate", *args], capture_output=True, text=True, timeout=600, env=env
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failure writes on stderr (asserting exit status 2, no traceback, nothing on stdout)."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and result.stdout == "", result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_generate_save_resume_matches_an_uninterrupted_run(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_map["qwen35"])
    common = ["--mode", "mtp", "--n-ctx", "256", "--threads", "1", "--temperature", "1.5", "--seed", "5"]
    full = specstate("generate", "--model", model, *common, "--max-tokens", "60", "--quiet", "hello cli")
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "half.ckpt"
    half = specstate(
        "generate",
        "--model",
        model,
        *common,
        "--max-tokens",
        "25",
        "--save",
        str(ckpt),
        "--checkpoint-every",
        "10",
        "hello cli",
    )
    assert half.returncode == 0, half.stderr
    assert "acceptance" in half.stderr and ckpt.is_file()
    rest = specstate("resume", str(ckpt), "--model", model, "--max-tokens", "35", "--threads", "1", "--quiet")
    assert rest.returncode == 0, rest.stderr
    assert half.stdout[:-1] + rest.stdout == full.stdout


def test_resume_finds_the_model_next_to_the_checkpoint(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    local = tmp_path / "qwen35.gguf"
    local.write_bytes(tiny_map["qwen35"].read_bytes())
    ckpt = tmp_path / "run.ckpt"
    made = specstate(
        "generate",
        "--model",
        str(local),
        "--mode",
        "ngram",
        "--n-ctx",
        "256",
        "--max-tokens",
        "5",
        "--save",
        str(ckpt),
        "--quiet",
        "x",
    )
    assert made.returncode == 0, made.stderr
    again = specstate("resume", str(ckpt), "--max-tokens", "5", "--quiet")
    assert again.returncode == 0, again.stderr


def test_resume_caps_a_recorded_thread_count_above_the_cpus(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    generator = tiny_generator("ngram", tiny_map)
    generator.generate("threads", max_tokens=4)
    ckpt = tmp_path / "many-threads.ckpt"
    ckpt.write_bytes(rewrite_meta(generator.checkpoint(), n_threads=len(os.sched_getaffinity(0)) + 1))
    options = ["--model", str(tiny_map["qwen35"]), "--max-tokens", "3", "--quiet"]
    capped = specstate("resume", str(ckpt), *options)  # at most the default thread count: any count continues exactly
    given = specstate("resume", str(ckpt), *options, "--threads", "1")
    assert capped.returncode == 0 and given.returncode == 0, capped.stderr + given.stderr
    assert capped.stdout == given.stdout == generator.generate(max_tokens=3) + "\n"


def test_resume_refuses_a_checkpoint_larger_than_a_restore_allocates_unless_allowed(
    tiny_map: dict[str, Path], tmp_path: Path
) -> None:
    generator = tiny_generator("ngram", tiny_map)
    generator.generate("rows", max_tokens=4)
    ckpt = tmp_path / "many-rows.ckpt"
    ckpt.write_bytes(rewrite_meta(generator.checkpoint(), n_batch=600, n_ctx=600))
    options = ["--model", str(tiny_map["qwen35"]), "--max-tokens", "3", "--threads", "1", "--quiet"]
    line = one_error_line(specstate("resume", str(ckpt), *options))
    assert "n_batch of 600" in line and "--max-n-batch" in line, line
    allowed = specstate("resume", str(ckpt), *options, "--max-n-batch", "600")
    assert allowed.returncode == 0, allowed.stderr


def test_mmap_loads_mapped_models(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    options = ["--model", str(tiny_map["qwen35"]), "--threads", "1", "--quiet", "--max-tokens"]
    ckpt = tmp_path / "mapped.ckpt"
    mapped = specstate("generate", "--n-ctx", "256", *options, "6", "--mmap", "--save", str(ckpt), "mapped")
    read = specstate("generate", "--n-ctx", "256", *options, "6", "mapped")
    assert mapped.returncode == 0 and read.returncode == 0, mapped.stderr + read.stderr
    assert mapped.stdout == read.stdout
    resumed = specstate("resume", str(ckpt), *options, "3", "--mmap")
    assert resumed.returncode == 0, resumed.stderr


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


def test_the_adaptive_draft_policy_from_the_command_line(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "adaptive.ckpt"
    options = ["--model", str(tiny_map["qwen35"]), "--mode", "ngram", "--n-ctx", "256", "--quiet"]
    made = specstate("generate", *options, "--draft-policy", "adaptive", "--max-tokens", "9", "--save", str(ckpt), "x")
    assert made.returncode == 0, made.stderr
    human = specstate("inspect", str(ckpt))
    assert "draft_policy=adaptive" in human.stdout and "cost curve" in human.stdout, human.stdout
    resumed = specstate("resume", str(ckpt), "--model", str(tiny_map["qwen35"]), "--max-tokens", "5", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    plain = specstate("generate", *options[:2], "--draft-policy", "adaptive", "x")
    assert plain.returncode != 0 and "needs a speculative mode" in plain.stderr
    unknown = specstate("generate", *options, "--draft-policy", "sometimes", "x")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


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
def test_bad_input_gives_one_clear_line(
    tiny_map: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a model, not a checkpoint")
    generator = tiny_generator("ngram", tiny_map)
    generator.generate("x", max_tokens=3)
    data = generator.checkpoint()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    other = tmp_path / "other.ckpt"
    other.write_bytes(data)
    values = {
        "{tiny}": str(tiny_map["llama"]),
        "{garbage}": str(garbage),
        "{truncated}": str(truncated),
        "{other-model}": str(other),
    }
    line = one_error_line(specstate(*[values.get(a, a) for a in args]))
    assert line.startswith("specstate: error:") and message in line, line


TINY = ["generate", "--model", "{tiny}"]


@pytest.mark.parametrize(
    "args,option",
    [
        ([*TINY, "--n-ctx", "-1", "hi"], "--n-ctx"),
        ([*TINY, "--n-ctx", "1", "hi"], "--n-ctx"),
        ([*TINY, "--n-ctx", str(2**32), "hi"], "--n-ctx"),
        ([*TINY, "--n-ctx", "many", "hi"], "--n-ctx"),
        ([*TINY, "--seed", "-1", "hi"], "--seed"),
        ([*TINY, "--seed", str(2**64), "hi"], "--seed"),
        ([*TINY, "--threads", "-1", "hi"], "--threads"),
        ([*TINY, "--threads", str(2**31), "hi"], "--threads"),
        ([*TINY, "--max-tokens", "-5", "hi"], "--max-tokens"),
        ([*TINY, "--checkpoint-every", "0", "--save", "{tmp}/x.ckpt", "hi"], "--checkpoint-every"),
        ([*TINY, "--top-k", "-1", "hi"], "--top-k"),
        ([*TINY, "--top-k", str(2**32), "hi"], "--top-k"),
        ([*TINY, "--temperature", "-0.5", "hi"], "--temperature"),
        ([*TINY, "--temperature", "nan", "hi"], "--temperature"),
        ([*TINY, "--temperature", "inf", "hi"], "--temperature"),
        ([*TINY, "--top-p", "0", "hi"], "--top-p"),
        ([*TINY, "--top-p", "1.5", "hi"], "--top-p"),
        ([*TINY, "--top-p", "nan", "hi"], "--top-p"),
        ([*TINY, "--mode", "ngram", "--n-draft", "0", "hi"], "--n-draft"),
        ([*TINY, "--n-draft", "-1", "hi"], "--n-draft"),
        (["resume", "/no/such.ckpt", "--threads", "-1"], "--threads"),
        (["resume", "/no/such.ckpt", "--max-tokens", str(-(2**70))], "--max-tokens"),
        (["bench", "--threads", "0"], "--threads"),
        (["bench", "--runs", "0"], "--runs"),
    ],
)
def test_bad_numbers_give_one_line_naming_the_option(
    tiny_map: dict[str, Path], tmp_path: Path, args: list[str], option: str
) -> None:
    values = {"{tiny}": str(tiny_map["llama"]), "{tmp}/x.ckpt": str(tmp_path / "x.ckpt")}
    line = one_error_line(specstate(*[values.get(a, a) for a in args]))
    assert line.startswith("specstate") and option in line, line


def test_main_reports_every_failure_as_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert {getattr(errors, name) for name in errors.__all__} <= set(cli.EXPECTED_ERRORS)
    failures = [OverflowError("can't convert negative int to unsigned"), MemoryError(), RuntimeError("boom\x1b[2J")]
    lines = []
    for failure in failures:

        def fail(args: object, failure: BaseException = failure) -> None:
            raise failure

        monkeypatch.setitem(cli.COMMANDS, "demo", fail)
        assert cli.main(["demo"]) == 2
        lines.append(capsys.readouterr().err)
    assert lines == [
        "specstate: error: can't convert negative int to unsigned\n",
        "specstate: error: MemoryError\n",
        "specstate: internal error: RuntimeError: boom\\x1b[2J\n",
    ]
    monkeypatch.setenv("SPECSTATE_DEBUG", "1")
    assert cli.main(["demo"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    "save,message",
    [
        ("missing/run.ckpt", "does not exist"),
        ("file/run.ckpt", "is not a directory"),
        (".", "is a directory"),
    ],
)
def test_a_bad_save_path_fails_before_generating(
    tiny_map: dict[str, Path], tmp_path: Path, save: str, message: str
) -> None:
    (tmp_path / "file").write_bytes(b"")
    result = specstate(
        "generate",
        "--model",
        str(tiny_map["llama"]),
        "--max-tokens",
        "20",
        "--n-ctx",
        "256",
        "--threads",
        "1",
        "--save",
        str(tmp_path / save),
        "hi",
    )
    line = one_error_line(result)
    assert "--save" in line and message in line, line
    assert sorted(os.listdir(tmp_path)) == ["file"]


def crafted_run(tiny_map: dict[str, Path], tmp_path: Path, file_name: str) -> tuple[Path, Path, Path]:
    """A checkpoint in tmp/run naming its model `file_name` ("{outside}": tmp/outside/qwen35.gguf's absolute path).

    Returns the checkpoint, where a neighbour model would be and the outside model's path (neither made).
    """
    (tmp_path / "run").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "cache").mkdir()
    outside = tmp_path / "outside" / "qwen35.gguf"
    generator = tiny_generator("ngram", tiny_map)
    generator.generate("x", max_tokens=4)
    data = generator.checkpoint()
    target = {**meta(data)["target_model"], "file": file_name.replace("{outside}", str(outside))}
    checkpoint = tmp_path / "run" / "run.ckpt"
    checkpoint.write_bytes(rewrite_meta(data, target_model=target))
    return checkpoint, tmp_path / "run" / "qwen35.gguf", outside


NAMES = ["../outside/qwen35.gguf", "{outside}", "..\\outside\\qwen35.gguf"]


@pytest.mark.parametrize("file_name", NAMES)
def test_resume_looks_for_the_model_by_base_name_only(
    tiny_map: dict[str, Path], tmp_path: Path, file_name: str
) -> None:
    checkpoint, neighbour, outside = crafted_run(tiny_map, tmp_path, file_name)
    env = {**os.environ, "SPECSTATE_CACHE": str(tmp_path / "cache")}
    outside.write_bytes(b"not a model: loading it would fail")
    shutil.copyfile(tiny_map["qwen35"], neighbour)
    used = specstate("resume", str(checkpoint), "--max-tokens", "3", "--quiet", env=env)
    assert used.returncode == 0, used.stderr
    neighbour.unlink()
    shutil.copyfile(tiny_map["qwen35"], outside)  # a good model, but not where resume may look
    line = one_error_line(specstate("resume", str(checkpoint), "--max-tokens", "3", "--quiet", env=env))
    assert "was not found" in line, line


@pytest.mark.parametrize(
    "name,expected",
    [
        ("qwen35.gguf", "qwen35.gguf"),
        ("../a/qwen35.gguf", "qwen35.gguf"),
        ("/abs/qwen35.gguf", "qwen35.gguf"),
        ("..\\a\\qwen35.gguf", "qwen35.gguf"),
        ("C:\\models\\qwen35.gguf", "qwen35.gguf"),
        ("", None),
        (".", None),
        ("..", None),
        ("a/..", None),
        ("a\\..", None),
        ("/", None),
    ],
)
def test_base_name(name: str, expected: str | None) -> None:
    assert cli._base_name(name) == expected


def test_inspect_escapes_control_characters(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    hostile = "evil\x1b[31m\u202e.gguf"
    generator = tiny_generator("none", tiny_map)
    generator.generate("x", max_tokens=2)
    data = generator.checkpoint()
    checkpoint = tmp_path / "hostile.ckpt"
    checkpoint.write_bytes(rewrite_meta(data, target_model={**meta(data)["target_model"], "file": hostile}))
    human = specstate("inspect", str(checkpoint))
    assert human.returncode == 0, human.stderr
    assert "\x1b" not in human.stdout and "\u202e" not in human.stdout
    assert "evil\\x1b[31m\\u202e.gguf" in human.stdout
    machine = specstate("inspect", str(checkpoint), "--json")
    assert "\x1b" not in machine.stdout and json.loads(machine.stdout)["target_model"]["file"] == hostile


def test_printable() -> None:
    assert cli._printable("a\tb\x1b[0m\u202e\U000e0041 é…") == "a\\tb\\x1b[0m\\u202e\\U000e0041 é…"


def specstate_within(seconds: float, *args: str) -> subprocess.CompletedProcess[str]:
    """``specstate`` with nothing on standard input, failing the test if it runs longer (a hang)."""
    command = [sys.executable, "-m", "specstate", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=seconds, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    "command,name,kind",
    [
        (["resume", "{path}", "--model", "{tiny}"], "fifo", "a FIFO"),
        (["inspect", "{path}"], "/dev/zero", "a character device"),
        (["inspect", "{path}"], "directory", "a directory"),
        (["inspect", "{path}"], "socket", "a socket"),
        (["chat", "--resume", "{path}", "--model", "{tiny}"], "fifo", "a FIFO"),
    ],
)
def test_a_checkpoint_that_is_not_a_regular_file_is_named_for_what_it_is(
    tiny_map: dict[str, Path], tmp_path: Path, command: list[str], name: str, kind: str
) -> None:
    path = tmp_path / name
    if name == "fifo":
        os.mkfifo(path)
    elif name == "directory":
        path.mkdir()
    server = socket.socket(socket.AF_UNIX)
    if name == "socket":
        server.bind(str(path))
    values = {"{path}": str(path), "{tiny}": str(tiny_map["qwen35"])}
    with server:
        line = one_error_line(specstate_within(60, *[values.get(a, a) for a in command]))
    assert f"{path} is {kind}" in line and "does not exist" not in line, line


@pytest.mark.parametrize("name", ["/dev/null", "/dev/full", "fifo", "link to /dev/null"])
def test_a_save_destination_that_is_not_a_regular_file_fails_before_generating(
    tiny_map: dict[str, Path], tmp_path: Path, name: str
) -> None:
    path = tmp_path / name.replace("/", "_") if not name.startswith("/") else Path(name)
    if name == "fifo":
        os.mkfifo(path)
    elif name.startswith("link"):
        path.symlink_to("/dev/null")
    before = os.stat(path)
    options = ["--model", str(tiny_map["llama"]), "--max-tokens", "4", "--n-ctx", "256", "--threads", "1"]
    for command in (["generate", *options, "--save", str(path), "hi"], ["chat", *options, "--save", str(path)]):
        line = one_error_line(specstate_within(60, *command))
        kind = "a FIFO" if name == "fifo" else "a character device"
        assert line == f"specstate: error: --save: {path} is {kind}, not a regular file", line
        after = os.stat(path)
        assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)


def test_sigterm_during_a_save_removes_the_temporary(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    """The command saves after every token; it is stopped while a temporary exists, then sent SIGTERM."""
    target = tmp_path / "run.ckpt"
    target.write_bytes(b"old")
    command = [sys.executable, "-m", "specstate", "generate", "--model", str(tiny_map["qwen35"]), "--n-ctx", "4096"]
    command += ["--threads", "1", "--max-tokens", "4000", "--save", str(target), "--checkpoint-every", "1"]
    process = subprocess.Popen(
        [*command, "--quiet", "hi"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        caught = stop_while_saving(process, tmp_path, "run.ckpt")
        assert caught, f"the command was never caught saving: {process.communicate(timeout=60)}"
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGCONT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "specstate: terminated", stderr
    assert temporaries(tmp_path, "run.ckpt") == []
    if target.read_bytes() != b"old":  # the save interrupted was not the first: the last one that completed
        described = specstate("inspect", str(target))
        assert described.returncode == 0, described.stderr


def test_generate_follows_a_grammar_or_a_json_schema_and_resumes(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_map["qwen35"])
    grammar = tmp_path / "words.gbnf"
    grammar.write_text('root ::= [a-e] [a-e ]* ("." [a-e ]+)*\n')
    common = ["--model", model, "--mode", "ngram", "--threads", "1", "--temperature", "1.0", "--seed", "3"]
    full = specstate("generate", *common, "--grammar", str(grammar), "--max-tokens", "40", "--quiet", "abc")
    assert full.returncode == 0, full.stderr
    assert re.fullmatch(r"[a-e][a-e .]*\n", full.stdout), full.stdout
    ckpt = tmp_path / "grammar.ckpt"
    half = specstate("generate", *common, "--grammar", str(grammar), "--max-tokens", "15", "--save", str(ckpt), "abc")
    assert half.returncode == 0, half.stderr
    rest = specstate("resume", str(ckpt), "--model", model, "--max-tokens", "25", "--threads", "1", "--quiet")
    assert rest.returncode == 0, rest.stderr
    assert half.stdout[:-1] + rest.stdout == full.stdout
    schema = tmp_path / "number.json"
    schema.write_text(json.dumps({"type": "integer", "minimum": 0}))
    number = specstate("generate", *common, "--json-schema", str(schema), "--max-tokens", "20", "--quiet", "n=")
    assert number.returncode == 0, number.stderr
    assert re.fullmatch(r"\d+\n", number.stdout), number.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--grammar", "{dir}/missing.gbnf"], "No such file"),
        (["--grammar", "{fifo}"], "is a FIFO"),
        (["--grammar", "{bad}"], "grammar does not parse"),
        (["--json-schema", "{bad}"], "--json-schema"),
        (["--grammar", "{bad}", "--json-schema", "{bad}"], "not allowed with argument"),
    ],
)
def test_bad_grammar_options_give_one_line(
    tiny_map: dict[str, Path], tmp_path: Path, options: list[str], message: str
) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "bad").write_text("root ::= nothing")
    values = {"{dir}": str(tmp_path), "{fifo}": str(tmp_path / "fifo"), "{bad}": str(tmp_path / "bad")}
    given = [values.get(option, option).replace("{dir}", str(tmp_path)) for option in options]
    result = specstate_within(60, "generate", "--model", str(tiny_map["qwen35"]), *given, "abc")
    if "does not parse" in message:  # llama.cpp's parser prints where on standard error first
        assert "Undefined rule identifier 'nothing'" in result.stderr
        result.stderr = result.stderr.splitlines()[-1]
    assert message in one_error_line(result)
