"""A smoke run of the benchmark measurements on the tiny models (the real
figures come from `make bench`; timings are never asserted here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specstate import Model
from specstate.bench import checkpoint_figures, decode_speed, median_of, speculation_figures, validator_rates

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_measurements_run_and_report(tiny_map: dict[str, Path]) -> None:
    model = Model(tiny_map["llama"])
    assert decode_speed(model, n_tokens=8, threads=1, runs=1) > 0
    figures = speculation_figures(model, "ngram", "abc abc abc", n_tokens=16, threads=1, runs=1)
    assert figures.tokens_per_second > 0 and len(figures.tokens) == 16
    checkpoint = checkpoint_figures(model, 64, threads=1, runs=1)
    assert checkpoint.size >= checkpoint.state_in_use > 0
    assert checkpoint.size / checkpoint.state_in_use <= 1.05 + 2048 / checkpoint.state_in_use
    rates = validator_rates(seconds=0.01)
    assert set(rates) == {"validate_config", "validate_context_capacities", "validate_state_size", "ContextCapacity"}
    assert median_of(3, lambda: 2.0, warmup=0) == 2.0


def test_report_renders_every_target_row(tmp_path: Path) -> None:
    from report import markdown, targets, write_report

    results = {
        "threads": 2,
        "runs": 5,
        "date": "today",
        "machine": "x86_64, 2 CPUs",
        "llama_cpp_python_version": "0.3.36",
        "decode": {"specstate": 100.0, "native_loop": 101.0, "llama_bench": 98.0, "llama_cpp_python": 88.0},
        "speculation": {
            "code": {
                "none": {"tokens_per_s": 100.0, "acceptance": 0.0},
                "ngram": {"tokens_per_s": 210.0, "acceptance": 0.6, "agreement_with_none": 160},
                "llama_cpp_python_prompt_lookup": {"tokens_per_s": 70.0, "agreement_with_plain": 40},
            }
        },
        "checkpoints": {
            "512": {
                "size": 11_800_000,
                "state_in_use": 11_790_000,
                "size_ratio": 1.0008,
                "capture_seconds": 0.01,
                "restore_seconds": 0.01,
                "prefill_seconds": 2.0,
                "llama_cpp_python": {"size": 112_000_000, "save_load_seconds": 0.11},
            },
            "2048": {
                "size": 47_000_000,
                "state_in_use": 46_990_000,
                "size_ratio": 1.0002,
                "capture_seconds": 0.02,
                "restore_seconds": 0.03,
                "prefill_seconds": 9.0,
                "llama_cpp_python": {"size": 148_000_000, "save_load_seconds": 0.21},
            },
        },
        "memory": {
            "generation_peak_rss": 200 * 2**20,
            "model_file": 98_362_432,
            "kv_cache": 47_185_920,
            "n_ctx": 2048,
            "over_model_and_kv": 40 * 2**20,
            "checkpoint_size": 47_000_000,
            "capture_extra": 47_500_000,
            "capture_extra_ratio": 1.01,
        },
        "validators": {"validate_config": 6e6},
    }
    rows = targets(results)
    assert [verdict for *_, verdict in rows if verdict].count("**missed**") == 0
    assert "| code: ngram / none | 2.10 | >= 2.0 | met |" in markdown(results)
    write_report(results, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"latest.md", "decode.png", "speculation.png", "checkpoints.png"}
    json.dumps(results)
