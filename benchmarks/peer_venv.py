"""The benchmarks' peer environment: a virtual environment with llama-cpp-python built from its sdist with
specstate's CPU flags, shared by every benchmark that measures it (``make bench``, ``bench-chain``,
``bench-serve``); a leaf module, so that the benchmarks import it without importing each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llama_cpp_spec import KERNEL_FLAGS

#: Where the peer environment lives (``SPECSTATE_BENCH_VENV`` to move it).
PEER_VENV = Path(os.environ.get("SPECSTATE_BENCH_VENV", Path.home() / ".cache" / "specstate-bench-venv"))
#: The llama-cpp-python measured against.
LLAMA_CPP_PYTHON = "llama-cpp-python[server]==0.3.36"


def peer_python() -> Path:
    """The bench venv's python, with llama-cpp-python and its server built from its sdist (once)."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import llama_cpp, llama_cpp.server.app"], capture_output=True)
    if probe.returncode != 0:
        print(f"[bench] building {LLAMA_CPP_PYTHON} from its sdist (several minutes on 2 cores)", file=sys.stderr)
        env = dict(os.environ, CMAKE_ARGS=" ".join(KERNEL_FLAGS))
        packages = [LLAMA_CPP_PYTHON, "numpy", "matplotlib"]
        command = [str(python), "-m", "pip", "install", "-q", "--no-binary", "llama-cpp-python", *packages]
        subprocess.run(command, check=True, env=env)
    return python
