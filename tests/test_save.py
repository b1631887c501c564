"""`Generator.save`: permission bits, symbolic links and missing directories."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import specstate.generator
from generator_support import tiny_generator
from specstate import Generator, Model


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
    monkeypatch.setattr(specstate.generator, "_PROC_STATUS", proc_status)
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
