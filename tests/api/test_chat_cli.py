"""`specstate chat`: from standard input, resumed from its checkpoint, and on a terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from checkpoint_codec import rewrite_meta
from specstate import Generator, Model, inspect_checkpoint
from specstate_testkit import models
from test_chat import TINY_TEMPLATE

#: A reply's most tokens when the test interrupts it: its text (over 1.3 characters a token) outgrows what a
#: pseudo-terminal holds unread (about 20 KB on Linux) plus the test's first read (4 KB), so the reply is still
#: running when Ctrl-C comes however late a loaded machine lets the test type it (a 4000-token reply had been
#: written whole into the terminal's buffer before a starved test got to type Ctrl-C).
LONG_REPLY = 24_000
#: Room for two such replies and their prompts.
LONG_CONTEXT = 65_536


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama model with a hand-written chat template in its metadata (and room for two long replies)."""
    path = tmp_path_factory.mktemp("chat-cli") / "chat.gguf"
    return models.build_llama(path, chat_template=TINY_TEMPLATE, context_length=LONG_CONTEXT)


def chat(*args: str, lines: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "specstate", "chat", "--threads", "1", "--max-tokens", "12", *args]
    return subprocess.run(command, input=lines, capture_output=True, text=True, timeout=600, check=False)


def test_standard_input_one_reply_per_line_then_resume(chat_model: Path, tmp_path: Path) -> None:
    whole = chat("--model", str(chat_model), "--mode", "ngram", "--system", "Be brief.", lines="a\n\nb\nc\n")
    assert whole.returncode == 0, whole.stderr
    replies = whole.stdout.splitlines()
    assert len(replies) == 3 and all(replies)
    saved = tmp_path / "conv.ckpt"
    first = chat(
        "--model", str(chat_model), "--mode", "ngram", "--system", "Be brief.", "--save", str(saved), lines="a\nb\n"
    )
    assert first.returncode == 0 and first.stdout.splitlines() == replies[:2]
    resumed = chat("--resume", str(saved), lines="c\n")  # the model is neither next to it nor in the cache
    assert resumed.returncode == 2 and "was not found" in resumed.stderr
    resumed = chat("--resume", str(saved), "--model", str(chat_model), lines="c\n")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == replies[2:]
    # Saved back to the file it resumed: system, a, reply, b, reply, c before the current reply.
    assert inspect_checkpoint(saved.read_bytes())["n_messages"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--model is needed"),
        (("--max-tokens", "0"), "--max-tokens must be at least 1"),
        (("--template", "/no/such/file"), "neither a chat format's name"),
    ],
)
def test_bad_chat_options_give_one_line(chat_model: Path, args: tuple[str, ...], message: str) -> None:
    model = () if args == () else ("--model", str(chat_model))
    result = chat(*model, *args, lines="a\n")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_resume_refuses_a_generation_that_is_not_a_chat(chat_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "plain.ckpt"
    generator = Generator(Model(chat_model), n_threads=1)
    generator.generate("abc", max_tokens=3)
    generator.save(saved)
    result = chat("--resume", str(saved), "--model", str(chat_model), lines="a\n")
    assert result.returncode == 2 and "is not a conversation" in result.stderr


def test_resume_caps_a_recorded_thread_count_above_the_cpus(chat_model: Path, tmp_path: Path) -> None:
    generator = Generator(Model(chat_model), n_threads=1)
    generator.chat("a", max_tokens=4)
    saved = tmp_path / "many-threads.ckpt"
    saved.write_bytes(rewrite_meta(generator.checkpoint(), n_threads=len(os.sched_getaffinity(0)) + 1))
    command = [sys.executable, "-m", "specstate", "chat", "--resume", str(saved), "--model", str(chat_model)]
    replies = [
        subprocess.run(
            [*command, *threads, "--max-tokens", "4"], input="b\n", capture_output=True, text=True, timeout=600
        )
        for threads in ([], ["--threads", "1"])
    ]
    assert all(reply.returncode == 0 for reply in replies), replies
    assert replies[0].stdout == replies[1].stdout != ""  # the default thread count, or 1: the same reply


class Terminal:
    """A `specstate chat` process on a pseudo-terminal (its controlling terminal, so Ctrl-C is SIGINT)."""

    def __init__(self, args: list[str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            settings = termios.tcgetattr(0)
            settings[3] &= ~termios.ECHOCTL  # Ctrl-C echoed as itself, not as "^C" (which the model could write)
            termios.tcsetattr(0, termios.TCSANOW, settings)
            os.execv(sys.executable, [sys.executable, "-m", "specstate", "chat", *args])
        self.seen = ""

    def read_until(self, *texts: str, timeout: float = 120.0) -> str:
        """Everything the terminal shows until ``texts`` have appeared, in this order, after what was already
        read (one read may bring several: a status line and the next prompt)."""
        start, deadline = len(self.seen), time.monotonic() + timeout

        def shown() -> bool:
            at = start
            for text in texts:
                at = self.seen.find(text, at)
                if at < 0:
                    return False
                at += len(text)
            return True

        while not shown():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {texts!r}; the terminal shows {self.seen[start:]!r}"
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"the terminal closed before {texts!r}; it shows {self.seen[start:]!r}"
                self.seen += chunk.decode(errors="replace")
        return self.seen[start:]

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def drain(self) -> None:
        """Read what the terminal shows now, if anything (nothing once the child has closed it)."""
        if select.select([self.fd], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):
                self.seen += os.read(self.fd, 4096).decode(errors="replace")

    def exit_status(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self.drain()
        os.kill(self.pid, 9)
        raise AssertionError("specstate chat did not exit")


def test_interactive_ctrl_c_stops_a_reply_and_keeps_the_conversation(chat_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "conv.ckpt"
    args = ["--model", str(chat_model), "--mode", "ngram", "--threads", "1", "--n-ctx", str(LONG_CONTEXT)]
    terminal = Terminal([*args, "--max-tokens", str(LONG_REPLY), "--save", str(saved)])
    terminal.read_until("> ")
    terminal.type("Tell me a story.\n")
    # The echo, then the reply streaming (the tiny model's text cycles through printable ASCII).
    terminal.read_until("Tell me a story.\r\n", "<")
    terminal.type("\x03")
    stopped = terminal.read_until("> ")
    assert "interrupted" in stopped and "tok/s" in stopped
    terminal.type("Go on.\n")
    terminal.read_until("Go on.\r\n", "<")
    terminal.type("\x03")
    assert "interrupted" in terminal.read_until("> ")
    terminal.type("/quit\n")
    assert terminal.exit_status() == 0
    generator = Generator.restore(saved, Model(chat_model))
    roles = [message["role"] for message in generator.messages]
    assert roles == ["user", "assistant", "user", "assistant"]
    first_reply = generator.messages[1]["content"]
    shown = terminal.seen.replace("\r\n", "\n").replace("\x03", "")  # the echoed Ctrl-Cs
    assert len(first_reply) > 0 and first_reply in shown, repr(terminal.seen)
    assert generator.messages[3]["content"] in shown, repr(terminal.seen)


def test_a_resumed_conversation_refuses_options_that_contradict_it(chat_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "conv.ckpt"
    first = chat(
        "--model", str(chat_model), "--mode", "ngram", "--temperature", "0.5", "--save", str(saved), lines="a\n"
    )
    assert first.returncode == 0, first.stderr
    for option, value, setting in (
        ("--mode", "draft", "mode"),
        ("--n-ctx", "999", "n_ctx"),
        ("--min-p", "0.2", "min_p"),
    ):
        refused = chat("--resume", str(saved), "--model", str(chat_model), option, value, lines="b\n")
        assert refused.returncode == 2 and refused.stdout == ""
        assert f"{option} {value} contradicts the checkpoint's {setting}" in refused.stderr, refused.stderr
    agreeing = chat(
        "--resume", str(saved), "--model", str(chat_model), "--mode", "ngram", "--temperature", "0.5", lines="b\n"
    )
    assert agreeing.returncode == 0 and agreeing.stdout.strip(), agreeing.stderr


def test_interactive_commands_and_a_resumed_conversations_last_exchange(chat_model: Path, tmp_path: Path) -> None:
    args = ["--model", str(chat_model), "--threads", "1", "--max-tokens", "6"]
    terminal = Terminal(args)
    terminal.read_until("> ")
    terminal.type("/help\n")
    assert "/save FILE" in terminal.read_until("> ")
    terminal.type("/bogus\n")
    assert "unknown command /bogus" in terminal.read_until("> ")
    terminal.type("Hello there\n")
    terminal.read_until("tok/s", "> ")
    saved = tmp_path / "now.ckpt"
    terminal.type(f"/save {saved}\n")
    assert "saved to" in terminal.read_until("> ")
    terminal.type("/quit\n")
    assert terminal.exit_status() == 0
    reply = Generator.restore(saved, Model(chat_model)).messages[1]["content"]
    resumed = Terminal(["--resume", str(saved), "--model", str(chat_model), "--threads", "1"])
    greeting = resumed.read_until("> ")
    assert "2 messages resumed" in greeting and "Hello there" in greeting and reply.strip()[:3] in greeting
    resumed.type("/quit\n")
    assert resumed.exit_status() == 0


def test_chat_stop_strings_end_replies(chat_model: Path) -> None:
    whole = chat("--model", str(chat_model), lines="a\n").stdout.splitlines()[0]
    stop = whole[5:7]
    cut = chat("--model", str(chat_model), "--stop", stop, lines="a\n")
    assert cut.returncode == 0 and cut.stdout.splitlines()[0] == whole[: whole.index(stop)], cut.stderr
