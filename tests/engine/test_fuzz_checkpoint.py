"""The structured checkpoint fuzzer (checkpoint_fuzz.py) in CI size, and the fuzzer's own crash handling.

Every case restores a mutated real checkpoint in a worker subprocess and must
end in a typed ``CheckpointError`` or in a restore that continues as the
original does. ``SPECSTATE_FUZZ_CASES`` overrides the number of cases (``make
fuzz`` runs 100,000).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpoint_fuzz import INJECT_ENV, FuzzConfig, format_summary, fuzz

#: At least 2,000; with a fifth of the cases over SmolLM2 (about 170 ms each, the
#: tiny models' about 15 ms) this takes about a minute and a half on 2 cores.
CI_CASES = int(os.environ.get("SPECSTATE_FUZZ_CASES", "3000"))
SMOLLM2_SHARE = 0.2


def test_mutated_checkpoints_are_refused_with_typed_errors_or_continue_exactly(
    tiny_map: dict[str, Path], smollm2_file: Path, tmp_path: Path
) -> None:
    config = FuzzConfig(cases=CI_CASES, seed=0, workers=2, timeout=120.0, smollm2_share=SMOLLM2_SHARE)
    summary = fuzz(config, tiny=tiny_map, smollm2=smollm2_file, bases_dir=tmp_path / "bases", log=print)
    report = format_summary(summary)
    print(report)
    assert not summary["refused_bases"], report
    assert summary["format_versions"], report
    assert sum(summary["outcomes"].values()) == CI_CASES, report
    assert (summary["crashes"], summary["hangs"], summary["untyped"], summary["unexpected_accepts"]) == (0, 0, 0, 0), (
        report
    )
    assert summary["failed"] == 0, report
    # The hybrid target's memory-driving fields were forged, and the restores refused what they may not allocate.
    assert summary["by_class"].get("memory") and summary["outcomes"].get("typed:AllocationLimitError"), report
    assert summary["peak_vm_mb"] < summary["memory_limit_mb"], report


def test_the_fuzzer_reports_crashes_hangs_and_dead_workers_and_carries_on(
    tiny_map: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INJECT_ENV, "crash@2,hang@5,exit@7")
    # A tiny case takes milliseconds: 3 s is a hang.
    config = FuzzConfig(cases=10, seed=0, workers=2, timeout=3.0, smollm2_share=0.0, chunk=5)
    summary = fuzz(config, tiny=tiny_map, bases_dir=tmp_path / "bases", log=print)
    print(format_summary(summary))
    failing = {case["index"]: case for case in summary["failing_cases"]}
    assert failing[2]["outcome"] == "crash" and failing[2]["detail"] == "SIGABRT"
    assert failing[5]["outcome"] == "hang"
    assert failing[7]["outcome"] == "crash" and failing[7]["detail"] == "exit status 3"
    assert sum(summary["outcomes"].values()) == 10  # every other case still ran
    assert summary["crashes"] == 2 and summary["hangs"] == 1
