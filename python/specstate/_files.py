"""Checkpoint files: read from a path, written atomically; shared by the generator and the command line.

Reading (:func:`read_checkpoint`) checks the path's type before opening it and
again on the opened file, which is opened without blocking, so a FIFO or a
device can neither hang the caller nor feed it endlessly; it reads at most one
byte more than the largest checkpoint the format allows
(``_native.MAX_CHECKPOINT_BYTES``).

Writing (:func:`replace_atomically`) goes through a temporary file beside the
destination, named ``.NAME.specstate-PID@HOST-XXXXXXXX.tmp``, which is locked
(``flock``) from its creation until it is renamed over the destination. A save
that is interrupted by an exception (``KeyboardInterrupt``, or a ``SIGTERM``
handler that raises, as the command line's does) removes it; one that is
killed leaves it, and the next save of the same destination removes it once it
can prove it is such a leftover: named for that destination by this host, a
regular file owned by the same user, its writer's process gone and no lock
held on it (a lock dies with its process, wherever the process ran).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import socket
import stat
from pathlib import Path
from typing import BinaryIO, NoReturn

from specstate import _native
from specstate.errors import (
    CheckpointError,
    CheckpointTooLargeError,
    NotACheckpointError,
    NotARegularFileError,
    UnsupportedVersionError,
)

__all__ = [
    "check_destination",
    "file_kind",
    "mode_for",
    "read_checkpoint",
    "remove_stale_temporaries",
    "replace_atomically",
    "special_kind",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is (``"a FIFO"``, ``"a directory"``, ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is, symbolic links followed, if it exists and is not a regular file; else None."""
    try:
        return file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _refuse_unless_regular(path: str, mode: int, doing: str) -> None:
    """``IsADirectoryError`` or ``NotARegularFileError`` naming ``path`` unless ``mode`` is a regular file's."""
    kind = file_kind(mode)
    if kind is None:
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"cannot {doing} a directory", path)
    raise NotARegularFileError(path, kind)


# --- reading -----------------------------------------------------------------------------------------

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_checkpoint(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the checkpoint file at ``path`` (symbolic links followed).

    A missing file is ``FileNotFoundError``, a directory ``IsADirectoryError``,
    any other file that is not a regular one (a FIFO, a device, a socket)
    ``NotARegularFileError``, each naming the path: the type is checked before
    the file is opened and again on the file opened (without blocking), so
    nothing put at the path in between is read. At most
    ``_native.MAX_CHECKPOINT_BYTES + 1`` bytes are read; a longer file is
    ``CheckpointTooLargeError`` (a file whose size says so is not read at all).
    """
    name = os.fspath(path)
    _refuse_unless_regular(name, os.stat(name).st_mode, "read a checkpoint from")
    with open(os.open(name, _READ_FLAGS), "rb") as file:
        info = os.fstat(file.fileno())
        _refuse_unless_regular(name, info.st_mode, "read a checkpoint from")
        maximum = _native.MAX_CHECKPOINT_BYTES
        if info.st_size > maximum:
            _too_large(name, info.st_size)
        data = _read_at_most(file, info.st_size, maximum + 1)
    if len(data) > maximum:
        _too_large(name, len(data))
    return data


def read_small_file(path: str | os.PathLike[str], maximum: int, what: str) -> bytes:
    """The bytes of the regular file at ``path`` (a grammar, a schema, a template): checked as
    :func:`read_checkpoint` checks (never blocks on a FIFO or device); longer than ``maximum`` bytes is
    ``ValueError`` naming ``what``."""
    name = os.fspath(path)
    _refuse_unless_regular(name, os.stat(name).st_mode, f"read {what} from")
    with open(os.open(name, _READ_FLAGS), "rb") as file:
        _refuse_unless_regular(name, os.fstat(file.fileno()).st_mode, f"read {what} from")
        data = file.read(maximum + 1)
    if len(data) > maximum:
        raise ValueError(f"{name}: {what} is longer than {maximum} bytes")
    return data


#: A file longer than this is read only if it starts as a checkpoint does.
_HEAD = 1 << 16


def _read_at_most(file: BinaryIO, expected: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``file``: one read of the ``expected`` size (plus one byte to see the end),
    then, only if the file has grown, chunks up to ``limit``, so memory follows what is really there.

    A long file that does not start as a checkpoint (its magic and version)
    is refused from its first bytes, so a model given as a checkpoint is not
    read whole to be refused.
    """
    first = min(expected + 1, limit)
    if first > _HEAD:
        _refuse_foreign(file.read(_HEAD))
        file.seek(0)
    data = file.read(first)
    if len(data) <= expected or len(data) >= limit:
        return data
    chunks, total = [data], len(data)
    while total < limit:
        chunk = file.read(min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _refuse_foreign(head: bytes) -> None:
    """Raise what decoding the whole file would raise first if ``head`` is not a checkpoint's beginning.

    Only the errors its first bytes decide (the magic, the version); every
    other one is left to the decoding of the whole file.
    """
    try:
        _native.inspect_checkpoint(head)
    except (NotACheckpointError, UnsupportedVersionError):
        raise
    except CheckpointError:
        pass


def _too_large(path: str, size: int) -> NoReturn:
    maximum = _native.MAX_CHECKPOINT_BYTES
    raise CheckpointTooLargeError(
        f"{path} is at least {size} bytes, more than the {maximum} bytes a checkpoint can hold",
        path=path,
        size=size,
        maximum=maximum,
    )


# --- writing -----------------------------------------------------------------------------------------

_PROC_STATUS = "/proc/self/status"


def _umask() -> int:
    """The process umask, read without changing it where ``/proc`` tells it (Linux)."""
    try:
        with open(_PROC_STATUS, encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0)  # elsewhere the only way to read it is to set it (briefly)
    os.umask(old)
    return old


def mode_for(target: Path) -> int:
    """The permission bits a save gives ``target``: its own if it exists, else ``0o666 & ~umask``."""
    try:
        return stat.S_IMODE(target.stat().st_mode) & 0o777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def check_destination(target: Path) -> None:
    """Refuse, before any work, a destination (symbolic links resolved) that cannot be replaced by a file.

    A missing directory is ``FileNotFoundError``, a directory path that is not
    one ``NotADirectoryError``, a destination that is a directory
    ``IsADirectoryError``, one that is a FIFO, a device or a socket
    ``NotARegularFileError``: each names the path.
    """
    directory = target.parent
    if not directory.exists():
        raise FileNotFoundError(errno.ENOENT, "cannot save a checkpoint: no such directory", str(directory))
    if not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "cannot save a checkpoint: not a directory", str(directory))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    _refuse_unless_regular(str(target), mode, "save a checkpoint over")


def _host() -> str:
    """This machine's name as temporaries carry it: at most 32 characters of ``[A-Za-z0-9.-]``."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:32] or "host"


def _temporary_name(target: Path) -> str:
    """A new name for a temporary of ``target``: ``.NAME.specstate-PID@HOST-XXXXXXXX.tmp`` (8 hex digits)."""
    return f".{target.name}.specstate-{os.getpid()}@{_host()}-{secrets.token_hex(4)}.tmp"


def _temporary_pattern(target: Path) -> re.Pattern[str]:
    """The names of the temporaries of saves of ``target`` on this host; group 1 is the writer's pid."""
    return re.compile(rf"\.{re.escape(target.name)}\.specstate-(\d+)@{re.escape(_host())}-[0-9a-f]{{8}}\.tmp")


def replace_atomically(target: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a locked temporary file next to ``target`` with ``mode``, fsync, rename, fsync the directory.

    Stale temporaries of earlier saves of ``target`` are removed first
    (:func:`remove_stale_temporaries`). On any exception, ``KeyboardInterrupt``
    and a raising signal handler's included, the temporary is removed and
    ``target`` is left as it was. Right before the rename the destination is
    checked again, so a FIFO or device put there meanwhile is not replaced.
    """
    remove_stale_temporaries(target)
    temporary: str | None = None
    try:
        temporary, out = _locked_temporary(target)
        with out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            check_destination(target)
            os.replace(temporary, target)  # while the temporary is still locked
    except BaseException:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _locked_temporary(target: Path) -> tuple[str, BinaryIO]:
    """A new temporary file for ``target``, open for writing and locked (``flock``), and its path."""
    while True:
        temporary = str(target.parent / _temporary_name(target))
        try:
            out = open(temporary, "xb", opener=_private)  # noqa: SIM115 -- returned open, or closed below
        except FileExistsError:
            continue
        except OSError:
            raise  # nothing was created
        except BaseException:  # a signal handler's exception, raised right after the file was created
            Path(temporary).unlink(missing_ok=True)
            raise
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX)
            if os.fstat(out.fileno()).st_nlink > 0:
                return temporary, out
        except BaseException:
            out.close()
            Path(temporary).unlink(missing_ok=True)
            raise
        # Another save took it for a leftover between its creation and the lock, and removed it.
        out.close()


def _private(path: str, flags: int) -> int:
    """Open a new temporary: never through a symbolic link, readable and writable by its owner only."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def remove_stale_temporaries(target: Path) -> list[str]:
    """Remove the temporaries that interrupted saves of ``target`` left beside it; returns their paths.

    Only a file that is provably such a leftover is removed: its name is the
    pattern a save of ``target`` on this host gives its temporary, it is a
    regular file (not a symbolic link) owned by this user, no process with the
    pid in its name is alive, and no process holds the lock a save keeps on its
    temporary until the rename. Anything else is left alone, silently.
    """
    pattern = _temporary_pattern(target)
    removed: list[str] = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is not None and not _process_alive(int(match.group(1))) and _remove_if_unlocked(entry.path):
            removed.append(entry.path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's, or not a pid this system can have: keep the file
    return True


def _remove_if_unlocked(path: str) -> bool:
    """Unlink ``path`` if it is a regular file of this user that no one holds locked; whether it was."""
    try:
        seen = os.lstat(path)
        if not stat.S_ISREG(seen.st_mode) or seen.st_uid != os.geteuid():
            return False
        handle = _open_no_follow(path)
    except OSError:
        return False
    try:
        opened = os.fstat(handle)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            return False
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
            return False
        os.unlink(path)  # while holding the lock: a writer that locks it after sees it unlinked
        return True
    except OSError:  # BlockingIOError: a save is writing it
        return False
    finally:
        os.close(handle)


def _open_no_follow(path: str) -> int:
    """A descriptor for the regular file ``path`` (never through a symbolic link), for locking it."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        return os.open(path, os.O_RDONLY | flags)
    except PermissionError:
        return os.open(path, os.O_WRONLY | flags)  # a write-only mode: no O_TRUNC, nothing changes
