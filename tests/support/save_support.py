"""Catching a real save in the act: a process stopped while its temporary file exists.

Nothing is mocked: the process saves real checkpoints in a loop; the test
polls the directory, and when a temporary of the destination appears it stops
the process (``SIGSTOP``) and looks again. A temporary still there then is one
the stopped process has created and not yet renamed (a rename is atomic), so a
signal sent now reaches the save before it ends, deterministically.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def temporaries(directory: Path, name: str) -> list[str]:
    """The hidden temporaries of saves of ``directory / name``."""
    return sorted(n for n in os.listdir(directory) if n.startswith(f".{name}.") and n.endswith(".tmp"))


def stop_while_saving(process: subprocess.Popen[str], directory: Path, name: str, timeout: float = 120) -> list[str]:
    """Stop ``process`` while a save of ``directory / name`` has its temporary; the temporaries then.

    Returns an empty list if ``process`` ended first. The process is left
    stopped (``SIGCONT`` resumes it).
    """
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if not temporaries(directory, name):
            time.sleep(0.0002)
            continue
        os.kill(process.pid, signal.SIGSTOP)
        _wait_stopped(process.pid)
        caught = temporaries(directory, name)
        if caught:
            return caught
        os.kill(process.pid, signal.SIGCONT)
    return []


def _wait_stopped(pid: int) -> None:
    """Wait until ``pid`` is really stopped (``SIGSTOP`` is delivered asynchronously)."""
    for _ in range(10_000):
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t", "Z"):
                return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")
