"""`Generator.save`: permission bits, symbolic links, missing directories, special files, leftovers."""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import specstate._files
from save_support import stop_while_saving, temporaries
from specstate import Generator, Model
from specstate.errors import NotARegularFileError
from specstate_testkit.generator_support import tiny_generator


@pytest.fixture()
def generator(tiny_map: dict[str, Path]) -> Generator:
    made = tiny_generator("ngram", tiny_map)
    made.generate("save me", max_tokens=6)
    return made


@pytest.fixture()
def umask_027() -> Iterator[int]:
    """Runs the test under umask 027, then puts the previous umask back."""
    previous = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(previous)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def leftovers(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_an_existing_file_keeps_its_mode(generator: Generator, tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    path.write_bytes(b"old")
    path.chmod(0o640)
    generator.save(path)
    assert mode_of(path) == 0o640
    assert path.read_bytes() == generator.checkpoint() and not leftovers(tmp_path)


@pytest.mark.parametrize("proc_status", ["/proc/self/status", "/no/such/status"], ids=["proc", "umask-call"])
def test_a_new_file_gets_the_umask_mode(
    generator: Generator, tmp_path: Path, umask_027: int, proc_status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(specstate._files, "_PROC_STATUS", proc_status)
    path = tmp_path / "new.ckpt"
    generator.save(path)
    assert mode_of(path) == 0o666 & ~umask_027 == 0o640
    assert os.umask(umask_027) == umask_027  # the umask itself is unchanged


def test_a_symlink_is_written_through(generator: Generator, tiny_map: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "links").mkdir()
    real = tmp_path / "store" / "real.ckpt"
    real.write_bytes(b"old")
    real.chmod(0o600)
    link = tmp_path / "links" / "latest.ckpt"
    link.symlink_to(Path("..") / "store" / "real.ckpt")
    generator.save(link)
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "store", "real.ckpt")
    assert real.read_bytes() == generator.checkpoint() and mode_of(real) == 0o600
    assert not leftovers(tmp_path / "store") and not leftovers(tmp_path / "links")
    restored = Generator.restore(link, Model(tiny_map["qwen35"]))
    assert restored.tokens == generator.tokens


def test_a_dangling_symlink_creates_its_target(generator: Generator, tmp_path: Path) -> None:
    link = tmp_path / "latest.ckpt"
    link.symlink_to(tmp_path / "first.ckpt")
    generator.save(link)
    assert link.is_symlink() and (tmp_path / "first.ckpt").read_bytes() == generator.checkpoint()


@pytest.mark.parametrize("where", ["missing/run.ckpt", "file/run.ckpt", "."])
def test_a_bad_destination_is_refused_before_the_checkpoint_is_taken(
    generator: Generator, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_bytes(b"not a directory")
    monkeypatch.setattr(generator, "checkpoint", lambda: pytest.fail("the checkpoint was taken"))
    with pytest.raises(OSError) as caught:
        generator.save(tmp_path / where)
    expected = {
        "missing/run.ckpt": (FileNotFoundError, tmp_path / "missing"),
        "file/run.ckpt": (NotADirectoryError, tmp_path / "file"),
        ".": (IsADirectoryError, tmp_path),
    }
    kind, named = expected[where]
    assert type(caught.value) is kind and caught.value.filename == os.path.realpath(named)
    assert sorted(os.listdir(tmp_path)) == ["file"]


SPECIAL = ["/dev/null", "/dev/full", "fifo", "socket", "link to /dev/null"]


def special_file(kind: str, directory: Path, held: list[socket.socket]) -> Path:
    """The destination ``kind`` names: a device, or a FIFO, a socket or a link made in ``directory``."""
    if kind.startswith("/dev/"):
        return Path(kind)
    path = directory / kind.replace(" ", "-").replace("/", "_")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        held.append(server)
    else:
        path.symlink_to("/dev/null")
    return path


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_destination_that_is_not_a_regular_file_is_never_replaced(
    generator: Generator, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[socket.socket] = []
    path = special_file(kind, tmp_path, held)
    real = os.path.realpath(path)
    before = os.stat(real)
    listing = sorted(os.listdir(tmp_path))
    monkeypatch.setattr(generator, "checkpoint", lambda: pytest.fail("the checkpoint was taken"))
    with pytest.raises(NotARegularFileError) as caught:
        generator.save(path)
    after = os.stat(real)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    expected = {"fifo": "a FIFO", "socket": "a socket"}.get(kind, "a character device")
    assert (caught.value.path, caught.value.kind) == (real, expected)
    assert str(caught.value) == f"{real} is {expected}, not a regular file"
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), copy.path, copy.kind, str(copy)) == (NotARegularFileError, real, expected, str(caught.value))
    assert sorted(os.listdir(tmp_path)) == listing
    for server in held:
        server.close()


WRITER = """
import json, sys
from pathlib import Path
from specstate_testkit.generator_support import tiny_generator
generator = tiny_generator("ngram", {k: Path(v) for k, v in json.loads(sys.argv[1]).items()})
generator.generate("save me", max_tokens=6)
while True:
    generator.save(sys.argv[2])
"""

HOLDER = """
import fcntl, sys
with open(sys.argv[1], "a") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
"""


def killed_while_saving(tiny_map: dict[str, Path], path: Path) -> tuple[int, list[str]]:
    """A process saving to ``path`` in a loop, killed (``SIGKILL``) while a temporary exists: its pid, what it left."""
    paths = json.dumps({name: str(p) for name, p in tiny_map.items()})
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), paths, str(path)],
        cwd=Path(__file__).resolve().parent.parent / "support",
        text=True,
    )
    try:
        left = stop_while_saving(writer, path.parent, path.name)
    finally:
        writer.kill()
        writer.wait()
    assert left, "the writer was never caught saving"
    return writer.pid, left


def lock(path: Path) -> subprocess.Popen[str]:
    """A live process holding ``path`` locked as a save holds its temporary, until its standard input closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def test_the_next_save_removes_only_the_temporaries_a_killed_save_provably_left(
    generator: Generator, tiny_map: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "run.ckpt"
    dead, left = killed_while_saving(tiny_map, path)
    assert len(left) == 1 and left[0].startswith(f".run.ckpt.specstate-{dead}@")
    host = specstate._files._host()
    lookalike = f".run.ckpt.specstate-{dead}@{host}-{{}}.tmp"  # the name a save of run.ckpt gives, with the dead pid
    kept = {
        "locked by a live process": lookalike.format("0000000a"),
        "a live writer": f".run.ckpt.specstate-{os.getppid()}@{host}-0000000b.tmp",
        "another host": f".run.ckpt.specstate-{dead}@{host}x-0000000c.tmp",
        "another destination": f".walk.ckpt.specstate-{dead}@{host}-0000000d.tmp",
        "another naming": ".run.ckpt.0000000e.tmp",
        "a symbolic link": lookalike.format("0000000f"),
        "a directory": lookalike.format("00000010"),
    }
    for why, name in kept.items():
        if why == "a symbolic link":
            (tmp_path / name).symlink_to(tmp_path / left[0])
        elif why == "a directory":
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_bytes(b"not ours to remove")
    if os.geteuid() == 0:  # only root can give a file to another user
        kept["another user's"] = lookalike.format("00000011")
        (tmp_path / kept["another user's"]).write_bytes(b"")
        os.chown(tmp_path / kept["another user's"], 65534, 65534)
    holder = lock(tmp_path / kept["locked by a live process"])
    try:
        generator.save(path)
    finally:
        holder.communicate("")
    assert sorted(temporaries(tmp_path, "run.ckpt")) == sorted(n for n in kept.values() if n.startswith(".run."))
    assert path.read_bytes() == generator.checkpoint()
