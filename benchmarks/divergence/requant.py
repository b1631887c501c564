"""Requantize SmolLM2-135M-Instruct (Q4_1 GGUF) into a copy of another weight type: the command line over
``specstate_testkit.requantize`` (one requantizer for the exactness tests and this study).

Usage: requant.py SRC DST TYPE  (TYPE: a ``gguf.GGMLQuantizationType`` name, such as Q4_0, Q8_0 or Q4_K)
"""

from __future__ import annotations

import sys
from pathlib import Path

from gguf import GGMLQuantizationType as T

from specstate_testkit.requantize import requantize


def main() -> None:
    src, dst, kind = sys.argv[1], sys.argv[2], T[sys.argv[3]]
    requantize(Path(src), Path(dst), kind)


if __name__ == "__main__":
    main()
