"""A smoke run of the benchmark measurements on the tiny models (the real
figures come from `make bench`; timings are never asserted here)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specstate import Model
from specstate.bench import (
    checkpoint_figures,
    decode_speed,
    interleave,
    median_of,
    pair_ratio,
    speculation_figures,
    validator_rates,
)


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


def test_interleaved_rounds_measure_every_contender_once_per_round() -> None:
    order: list[str] = []

    def contender(name: str, value: float) -> Callable[[], float]:
        def measure() -> float:
            order.append(name)
            return value

        return measure

    figures = interleave({"a": contender("a", 2.0), "b": contender("b", 1.0), "c": contender("c", 4.0)}, rounds=3)
    assert figures == {"a": [2.0] * 3, "b": [1.0] * 3, "c": [4.0] * 3}
    # The warm-up round, then each round starting one contender later.
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    ratio = pair_ratio([2.0, 3.0, 8.0], [1.0, 1.0, 2.0])
    assert (ratio.median, ratio.low, ratio.high) == (3.0, 2.0, 4.0)
    assert str(ratio) == "x3.00 (2.00-4.00)"


def test_verify_cost_times_every_batch_size_against_one_row(tiny_map: dict[str, Path]) -> None:
    from verify_cost import batch_costs, copy_bandwidth, figures, table, tensor_bytes

    model = Model(tiny_map["llama"])
    costs = batch_costs(model, rounds=2, threads=1, rows=(1, 2, 4), prompt_tokens=8)
    assert list(costs["seconds"]) == ["1", "2", "4"] and all(value > 0 for value in costs["seconds"].values())
    assert costs["x_one_row"]["1"] == {"median": 1.0, "low": 1.0, "high": 1.0}
    bandwidth = copy_bandwidth(2**20, repeats=1)
    assert bandwidth > 0 and 0 < tensor_bytes(tiny_map["llama"]) < tiny_map["llama"].stat().st_size
    models = figures({"tiny": tiny_map["llama"]}, 1, 1, bandwidth, rows=(1, 2), prompt_tokens=8)
    assert models["tiny"]["one_row_of_bound"] > 0
    results = {"prompt_tokens": 8, "threads": 1, "rounds": 1, "bandwidth_bytes_per_s": bandwidth, "models": models}
    lines = table(results)
    assert lines[2].startswith("| type | tensors | bound | 1 row | of the bound | 2 rows |")
    assert lines[4].startswith("| tiny |") and lines[4].count("|") == lines[3].count("|")
    # Upstream's costs, where measured, in a row below the model's own.
    ratio = {"median": 1.5, "low": 1.4, "high": 1.6}
    models["tiny"]["upstream"] = {"seconds": {"1": 0.002, "2": 0.003}, "x_one_row": {"1": ratio, "2": ratio}}
    lines = table(results)
    assert lines[5].startswith("| tiny, upstream | | | 2.00 ms |") and lines[5].endswith("| x1.50 (1.40-1.60) |")
    assert lines[5].count("|") == lines[3].count("|")
    # Another model: as shipped (named by its file type), no copy for f32 weights.
    from verify_cost import type_copies

    assert list(type_copies(tiny_map["llama"]).values()) == [tiny_map["llama"]]


def test_report_renders_every_target_row(tmp_path: Path, tiny_map: dict[str, Path]) -> None:
    from report import markdown, targets, write_report
    from speculation import ADAPTIVE, PROMPTS, prompt_figures

    model = Model(tiny_map["llama"])
    settings = argparse.Namespace(rounds=1, threads=1, tokens=12)
    speculation = {name: prompt_figures(model, prompt, settings, {}) for name, prompt in PROMPTS.items()}
    ratio = {"median": 1.7, "low": 1.6, "high": 1.8}
    assert speculation["quotes"][ADAPTIVE]["cost_curve_us"] is not None
    results = {
        "threads": 2,
        "runs": 5,
        "date": "today",
        "machine": "x86_64, 2 CPUs",
        "llama_cpp_python_version": "0.3.36",
        "decode": {"specstate": 100.0, "native_loop": 101.0, "llama_bench": 98.0, "llama_cpp_python": 88.0},
        "decode_ratios": {
            "native_loop": {"median": 0.99, "low": 0.95, "high": 1.02},
            "llama_bench": {"median": 1.02, "low": 0.9, "high": 1.1},
            "llama_cpp_python": {"median": 1.14, "low": 1.1, "high": 1.2},
        },
        "speculation": speculation,
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
        "verify_cost": {
            "prompt_tokens": 300,
            "threads": 2,
            "rounds": 20,
            "bandwidth_bytes_per_s": 25e9,
            "models": {
                "Q4_1": {
                    "weight_bytes": 96_600_000,
                    "bound_seconds": 0.0039,
                    "one_row_of_bound": 0.39,
                    "seconds": {"1": 0.01, "2": 0.017},
                    "x_one_row": {"1": {"median": 1.0, "low": 1.0, "high": 1.0}, "2": ratio},
                }
            },
        },
    }
    rows = targets(results)
    measures = [measure for measure, *_ in rows]
    assert "decode: specstate / native Rust loop" in measures
    assert "edit: ngram adaptive / none" in measures
    assert {verdict for *_, verdict in rows} <= {"met", "**missed**", "not measured", ""}
    # Without peers their rows are there, and say so.
    peer_rows = [row for row in rows if "fastest peer" in row[0]]
    assert len(peer_rows) == len(PROMPTS) and all(verdict == "not measured" for *_, verdict in peer_rows)
    text = markdown(results)
    assert "| decode: specstate / native Rust loop | 0.99 (0.95-1.02) | >= 0.97 | met |" in text
    assert "| quotes | ngram adaptive |" in text
    # On the tiny model too, every specstate mode's tokens equal plain greedy's.
    assert ("specstate runs: every token equal to none", "20 of 20", "all", "met") in rows
    assert "| 12/12 |" in text
    assert "| Q4_1 | 96.6 MB | 3.90 ms | 10.00 ms | 39% | x1.70 (1.60-1.80) |" in text
    write_report(results, tmp_path)
    assert (tmp_path / "latest.md").read_text() == text
    assert (tmp_path / "speculation.png").stat().st_size > 0
    check_run_history(results, tmp_path)
    # `make bench` writes its speculation figures as `make bench-speculation` does, for the page's section.
    from run import speculation_results
    from speculation import markdown as speculation_markdown

    assert "| quotes | ngram adaptive |" in speculation_markdown(speculation_results(results))


def test_speculation_takes_a_draft_model_and_a_choice_of_contenders(tiny_map: dict[str, Path]) -> None:
    from speculation import ADAPTIVE, DRAFT, DRAFT_ADAPTIVE, NONE, PROMPTS, markdown, prompt_figures, targets

    model = Model(tiny_map["llama"])  # its own draft: same vocabulary
    settings = argparse.Namespace(rounds=1, threads=1, tokens=12, contenders=[ADAPTIVE, DRAFT_ADAPTIVE])
    rows = prompt_figures(model, PROMPTS["edit"], settings, {}, draft_model=model)
    assert set(rows) == {NONE, ADAPTIVE, DRAFT_ADAPTIVE} and "best_fixed" not in rows[ADAPTIVE]
    assert all(row["tokens_equal_to_none"] == row["tokens_of_none"] == 12 for row in rows.values())
    results = {"date": "today", "model": "m.gguf", "draft_model": "d.gguf", "threads": 1, "tokens": 12, "rounds": 1}
    text = markdown({**results, "prompts": {"edit": rows}})
    assert text.startswith("m.gguf, draft model d.gguf, 1 threads") and "| edit | draft adaptive |" in text
    # Without `ngram` adaptive there is no adaptive target to check; exactness still is.
    settings.contenders = [DRAFT]
    rows = prompt_figures(model, PROMPTS["edit"], settings, {}, draft_model=model, drafts=(DRAFT,))
    assert set(rows) == {NONE, DRAFT}
    assert [measure for measure, *_ in targets({"edit": rows})] == ["specstate runs: every token equal to none"]
    assert "| edit | draft |" in markdown({**results, "prompts": {"edit": rows}})


def check_run_history(latest: dict[str, Any], directory: Path) -> None:
    """A finished run is recorded once in runs.json, and the page's table shows its medians."""
    from report import _runs_fields, record_run

    (directory / "latest.json").write_text(json.dumps(latest))
    ratio = {"median": 1.25, "low": 1.1, "high": 1.3}
    (directory / "chain.json").write_text(json.dumps({"specstate ngram / llama-cpp-python": ratio}))
    runs = record_run(directory)
    assert record_run(directory) == runs and len(runs) == 1
    table = _runs_fields(runs)["runs_table"]
    assert "| decode: specstate / llama-cpp-python | 1.14 | n/a |" in table
    assert "| sampling, code: `ngram` / llama-cpp-python | 1.25 | n/a |" in table
    assert "| sampling, code: `none` / llama-cpp-python | n/a | n/a |" in table
    assert "| specstate runs with every token equal to `none` | 20 of 20 | |" in table


def test_the_benchmarks_page_is_what_the_results_give() -> None:
    """docs/benchmarks.md is generated: its text from benchmarks/benchmarks.md.template, every figure from
    benchmarks/results/*.json. A hand edit of the page, or results changed without `make bench-report`, fail here."""
    from report import PAGE, load_results, page

    assert PAGE.read_text() == page(load_results()), "docs/benchmarks.md is stale: run `make bench-report`"


def test_busy_tables_and_goals(tmp_path: Path, tiny_map: dict[str, Path]) -> None:
    """benchmarks/busy.py: a smoke run on the tiny model (no peers, one load, one round), and its goals and tables
    from a run's figures."""
    import subprocess
    import sys

    from busy import before_name, busy_fields, goals, table

    out = tmp_path / "busy.json"
    command = [sys.executable, "benchmarks/busy.py", "--skip-peers", "--loads", "0", "1", "--rounds", "1"]
    command += ["--tokens", "4", "--model", str(tiny_map["llama"]), "--json", str(out)]
    subprocess.run(command, check=True, cwd=Path(__file__).resolve().parents[2], capture_output=True)
    smoke = json.loads(out.read_text())
    assert set(smoke["figures"]) == {"0", "1"} and all(
        v[0] > 0 for row in smoke["figures"].values() for v in row.values()
    )
    assert len(goals(smoke)) == 6  # no peer: the four of one busy process, the two idle ones

    names = ["specstate none, 1 thread", "specstate none, 2 threads", "specstate none, default threads"]
    names += [before_name("none"), "llama-cpp-python none, its default threads"]
    speeds = {"0": [60.0, 80.0, 80.0, 80.0, 60.0], "1": [60.0, 62.0, 61.0, 21.0, 60.0]}
    results = {
        "date": "today",
        "tokens": 64,
        "rounds": 2,
        "machine": {"cpus": 2, "default_threads": 2, "llama_cpp_python_default_threads": 1},
        "figures": {load: {n: [v, v] for n, v in zip(names, values)} for load, values in speeds.items()},
    }
    rows = {measure: entry["median"] for measure, entry, _ in goals(results)}
    assert rows["1 busy process, none: default / best of 1 and 2 threads"] == 61 / 62
    assert rows["1 busy process, none: 2 threads / 1 thread"] == 62 / 60
    assert rows["idle, none: default / before (2 fixed threads)"] == 1.0
    assert rows["1 busy: specstate none, default / llama-cpp-python at its default"] == 61 / 60
    fields = busy_fields(results)
    assert fields["busy_verdict"] == "5 of 5 goals met"
    assert "| 1 busy process, none: 2 threads / 1 thread | x1.03 (1.03-1.03) | >= 1 | met |" in fields["busy_targets"]
    assert table(results)[3] == "| specstate none, 2 threads | 80.0 | x1.00 (1.00-1.00) | 62.0 | x1.02 (1.02-1.02) |"


def test_serve_goals_and_tables_from_a_runs_figures() -> None:
    """benchmarks/serve_load.py (make bench-serve): its goals and the tables from a run's figures."""
    from serve_load import ALONE, LLAMA_SERVER, PEER, SERVERS, goals, requests, tables

    def figures(speed: float, identical: float = 1.0, rss: float = 300.0) -> dict[str, float]:
        return {"tokens_per_second": speed, "ttft_p50_ms": 50.0, "ttft_p95_ms": 90.0, "peak_rss_mib": rss,
                "identical": identical, "errors": 0}  # fmt: skip

    speeds = {"specstate none": 100.0, "specstate ngram": 120.0, f"{LLAMA_SERVER} none": 110.0, f"{PEER} none": 40.0}
    by_clients = {str(c): {name: figures(speed * c**0.5) for name, speed in speeds.items()} for c in (1, 4, 8)}
    by_clients["8"][f"{LLAMA_SERVER} none"] = figures(400.0, identical=0.75)
    by_clients["1"][ALONE] = figures(102.0)  # measured at one client only
    results = {"date": "today", "clients": [1, 4, 8], "rounds": [by_clients, by_clients]}
    rows = {measure: (value, met) for measure, value, _, met in goals(results)}
    assert rows[f"4 clients: specstate ngram / {LLAMA_SERVER} throughput"] == (120 / 110, True)
    assert rows[f"4 clients: specstate ngram / {PEER} throughput"] == (3.0, True)
    assert rows[f"8 clients: specstate ngram / {LLAMA_SERVER} throughput"] == (120 * 8**0.5 / 400, False)
    assert rows["specstate replies identical to solo, lowest share"] == (1.0, True)
    assert rows["1 client: specstate none, batched engine / a slot of its own"] == (100 / 102, True)
    assert rows["peak RSS, 4 slots, every specstate mode (MiB)"] == (300.0, True)
    heavier = {**by_clients, "4": {**by_clients["4"], "specstate ngram": figures(120.0 * 2, rss=900.0)}}
    rows = {measure: (value, met) for measure, value, _, met in goals({**results, "rounds": [by_clients, heavier]})}
    assert rows["peak RSS, 4 slots, every specstate mode (MiB)"] == (900.0, False)  # the ngram server counts too
    text = tables(results)
    assert f"| {LLAMA_SERVER} none | 8 | 400.0 | 50 | 90 | 300 | 75% |" in text
    assert text.count("| specstate ngram |") == 3 and len(SERVERS) == 5
    # A draft model adds two servers; the tables show any server a run measured.
    from serve_load import draft_servers, rss_bound

    servers = draft_servers(Path("d.gguf"))
    assert list(servers) == ["specstate draft", f"{LLAMA_SERVER} draft"] and draft_servers(None) == {}
    command = servers["specstate draft"](Path("m.gguf"), 8000, 4)
    assert command[command.index("--mode") + 1] == "draft" and command[command.index("--draft-model") + 1] == "d.gguf"
    drafted = {c: {**by_server, "specstate draft": figures(90.0)} for c, by_server in by_clients.items()}
    assert tables({**results, "rounds": [drafted]}).count("| specstate draft |") == 3
    assert rss_bound({"model_bytes": 2**30, "kv_bytes_per_token": 2**10}) == 1024 + 8 + 200
    load = requests(16)
    assert len(load) == 16 and {r.temperature for r in load} == {0.0, 0.8} and len({r.seed for r in load}) == 16
    assert all(24 <= r.max_tokens <= 96 for r in load) and requests(16) == load  # seeded


def test_quality_figures_from_small_logits(tmp_path: Path) -> None:
    """benchmarks/quality.py's figures on small arrays: a uniform row's perplexity is the vocabulary's size, KL is
    its closed form (0 between identical rows), top-1 agreement and identical rows are counted, figures read a few
    rows at a time equal those of the whole, and the tables and the page's fields come from them."""
    import numpy as np

    from quality import (
        PAIRS,
        SPECSTATE,
        SPECSTATE_BIG,
        SPECSTATE_ONE,
        UPSTREAM_BIG,
        UPSTREAM_ONE,
        compare,
        kl_rows,
        log_softmax,
        pair_name,
        quality_fields,
        tables,
        within,
    )

    half, skewed = np.log([[0.5, 0.5]]), np.log([[0.9, 0.1]])
    assert np.allclose(kl_rows(log_softmax(half), log_softmax(skewed)), 0.5 * np.log(25 / 9))
    assert kl_rows(log_softmax(skewed), log_softmax(skewed + 3.0)) == [0.0]  # a shift changes no probability
    tokens = [0, 1, 2, 3, 0]
    uniform = np.zeros((5, 4), dtype=np.float32)
    sharp = np.eye(4, dtype=np.float32)[[1, 2, 3, 0, 0]] * 20  # each row certain of its next token
    off = sharp.copy()
    off[0] = np.eye(4)[3] * 20  # row 0 certain of another token
    runs = (SPECSTATE, SPECSTATE_ONE, SPECSTATE_BIG, UPSTREAM_BIG, UPSTREAM_ONE)
    logits = dict(zip(runs, (sharp, sharp, uniform, sharp, off)))
    paths = {run: tmp_path / f"{index}.npy" for index, run in enumerate(logits)}
    for run, path in paths.items():
        np.save(path, logits[run])
    figures = compare(paths, tokens, chunk_rows=2)
    assert compare(paths, tokens, chunk_rows=5) == figures
    assert np.isclose(figures["runs"][SPECSTATE_BIG]["perplexity"], 4.0)
    assert figures["runs"][SPECSTATE]["perplexity"] < 1.0001 < figures["runs"][UPSTREAM_ONE]["perplexity"]
    exact = figures["pairs"][pair_name(SPECSTATE, UPSTREAM_BIG)]
    assert (exact["kl_mean"], exact["kl_max"], exact["top1_agreement"], exact["identical_rows"]) == (0, 0, 1, 5)
    own = figures["pairs"][pair_name(UPSTREAM_ONE, UPSTREAM_BIG)]
    assert own["top1_agreement"] == 0.8 and own["identical_rows"] == 4 and own["kl_max"] > 19
    assert own["kl_p99"] < own["kl_max"] and np.isclose(own["kl_mean"], own["kl_max"] / 5)
    assert set(figures["pairs"]) == {pair_name(*pair) for pair in PAIRS}
    assert within(figures) == {"kl_mean": True, "perplexity": True}
    result = {"model": "m.gguf", "tokens": 5, "text": "t.md", "threads": 2, "date": "today", **figures}
    result["llama_cpp_python_version"] = "0.3.36"
    lines = tables([result]).splitlines()
    assert lines[2].startswith("| m.gguf | 1.000 | 1.000 | 4.000 | 1.000 |")
    assert lines[2].count("|") == lines[1].count("|")
    assert lines[2].endswith("| 5/5 | 0.00e+00, 1.39e+00, 4.00e+00 | yes | yes |")  # mean KLs from upstream 512
    zeros = "0.00e+00 | 0.00e+00 | 0.00e+00"
    assert f"| m.gguf | {pair_name(SPECSTATE, UPSTREAM_BIG)} | {zeros} | 100.00% | 5/5 |" in lines
    verdict = quality_fields([result])["quality_verdict"]
    assert verdict.startswith("The exact path stays within upstream's own batch-size variation on 1 of 1 models;")
    assert "is at most that of specstate n_batch 512 (" in verdict and verdict.endswith("single decode on 1 of 1")
    assert quality_fields([])["quality_setup"] == "not measured yet"


#: The lines of llama-perplexity's output that benchmarks/perplexity_kl.py reads (a KL run's, as printed).
def write_log_probs(path: Path, context: int, tokens: Any, log_probs: Any) -> None:
    """A file as llama-perplexity's ``--kl-divergence-base`` writes it: `log_probs` (rows x vocabulary) quantized
    its way, for the text `tokens` (chunks x `context`)."""
    import numpy as np

    chunks, vocab = tokens.shape[0], log_probs.shape[1]
    width = 2 * ((vocab + 1) // 2) + 4
    rows = np.zeros((len(log_probs), width), dtype=np.uint16)
    for row, values in zip(rows, log_probs, strict=True):
        top, bottom = values.max(), max(values.min(), values.max() - 16)
        scale = np.float32((top - bottom) / 65535)
        row[:4] = np.array([scale, bottom], dtype=np.float32).view(np.uint16)
        row[4 : 4 + vocab] = np.where(values > bottom, np.rint((values - bottom) / scale), 0)
    header = np.array([context, vocab, chunks], dtype=np.int32).tobytes()
    path.write_bytes(b"_logits_" + header + tokens.astype(np.int32).tobytes() + rows.tobytes())


def test_perplexity_kl_reads_llama_perplexity_files_and_compares_runs(tmp_path: Path) -> None:
    """benchmarks/perplexity_kl.py: llama-perplexity's log-probability files read back within their rounding (a
    wrong header or size refused), and each run's figures against the reference row by row: perplexity's paired
    error, KL (none for the reference's own rows), top tokens, and the exact path's paired differences."""
    import numpy as np

    from perplexity_kl import EXACT, REFERENCE, UPSTREAM_SMALL, compare, read_log_probs

    context, chunks, vocab = 8, 3, 7
    scored = context - 1 - context // 2
    random = np.random.default_rng(5)
    tokens = random.integers(0, vocab, size=(chunks, context))

    def log_softmax(logits: Any) -> Any:
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

    base = log_softmax(random.normal(size=(chunks * scored, vocab)) * 3)
    shifted = {name: log_softmax(base + random.normal(size=base.shape) * 0.1) for name in UPSTREAM_SMALL}
    runs = {name: tmp_path / f"{index}.kld" for index, name in enumerate([REFERENCE, EXACT, *UPSTREAM_SMALL])}
    for name, path in runs.items():
        write_log_probs(path, context, tokens, {REFERENCE: base, EXACT: base, **shifted}[name])
    reference = read_log_probs(runs[REFERENCE])
    assert np.array_equal(reference.next_tokens, tokens[:, context // 2 + 1 : context].reshape(-1))
    assert np.allclose(reference.block(0, len(base)), base, atol=16 / 65535)
    figures = compare(reference, {name: read_log_probs(path) for name, path in runs.items() if name != REFERENCE})
    assert figures[EXACT]["kl_mean"] == 0.0 and figures[EXACT]["same_top"] == 100.0
    assert figures[EXACT]["paired_ln_ratio_se"] == 0.0
    ub1 = figures[UPSTREAM_SMALL[0]]
    rows = np.arange(len(base))
    expected_kl = (np.exp(base) * (base - shifted[UPSTREAM_SMALL[0]])).sum(axis=1)
    assert ub1["kl_mean"] == pytest.approx(expected_kl.mean(), rel=1e-2)
    assert ub1["kl_max"] == pytest.approx(expected_kl.max(), rel=1e-2)
    nll = -shifted[UPSTREAM_SMALL[0]][rows, reference.next_tokens] + base[rows, reference.next_tokens]
    paired = figures[EXACT]["paired"][UPSTREAM_SMALL[0]]
    assert paired["kl_mean"] == pytest.approx(-ub1["kl_mean"])
    assert paired["nll_mean"] == pytest.approx(-nll.mean(), abs=1e-3)
    assert paired["nll_mean_se"] == pytest.approx(nll.std(ddof=1) / np.sqrt(len(nll)), rel=1e-2)
    assert ub1["same_top"] == 100.0 * np.mean(np.argmax(shifted[UPSTREAM_SMALL[0]], 1) == np.argmax(base, 1))

    bad = tmp_path / "bad.kld"
    bad.write_bytes(runs[REFERENCE].read_bytes()[:-2])
    with pytest.raises(ValueError, match="its size is not that of 3 chunks of 8 rows of 7 tokens"):
        read_log_probs(bad)
    bad.write_bytes(b"_logitz_" + runs[REFERENCE].read_bytes()[8:])
    with pytest.raises(ValueError, match="not a llama-perplexity log-probability file"):
        read_log_probs(bad)
    other_text = tmp_path / "other.kld"
    write_log_probs(other_text, context, (tokens + 1) % vocab, base)
    with pytest.raises(ValueError, match="different texts"):
        compare(reference, {EXACT: read_log_probs(other_text)})


def test_perplexity_kl_verdicts_and_tables() -> None:
    """benchmarks/perplexity_kl.py: llama-perplexity's estimate read (a missing one refused), the exact path within
    upstream's variation by each criterion against the larger of upstream's two small-batch runs, up to two standard
    errors of the paired difference, and the tables and the page's fields from them."""
    from perplexity_kl import (
        EXACT,
        FINAL,
        REFERENCE,
        SAME_BUILD,
        UPSTREAM_SMALL,
        kl_fields,
        parse,
        tables,
        verdict,
        within,
    )

    assert parse("Final estimate: PPL = 46.0268 +/- 3.34395", {"perplexity": FINAL}) == {
        "perplexity": 46.0268,
        "perplexity_se": 3.34395,
    }
    with pytest.raises(ValueError, match="printed no perplexity"):
        parse("Final: PPL = 46.0268", {"perplexity": FINAL})

    def run(kl: float, ln_ratio: float, same_top: float = 95.0) -> dict[str, Any]:
        figures = {"perplexity": 46.0, "kl_mean": kl, "kl_mean_se": 1e-4, "kl_p99": 0.01, "kl_max": 0.05}
        return figures | {"same_top": same_top, "ln_ratio": ln_ratio, "paired_ln_ratio_se": 0.0034}

    def exact(kl: float, ln_ratio: float, kl_se: float, nll_se: float) -> dict[str, Any]:
        paired = {"kl_mean": kl - 0.0040, "kl_mean_se": kl_se, "nll_mean": ln_ratio - 0.003, "nll_mean_se": nll_se}
        return run(kl, ln_ratio) | {"paired": {name: paired for name in UPSTREAM_SMALL}}

    runs = {REFERENCE: {"perplexity": 46.0, "ln_ratio": 0.0}, UPSTREAM_SMALL[0]: run(0.0039, -0.002)}
    runs |= {UPSTREAM_SMALL[1]: run(0.0040, 0.003), SAME_BUILD: run(0.0, 0.0, 100.0)}
    result = {"model": "m.gguf", "date": "today", "chunks": 8, "threads": 2, "runs": runs}
    runs[EXACT] = exact(0.0040, -0.003, kl_se=1e-5, nll_se=1e-4)
    assert within(result) == within(result, resolution=0.0) == {"kl_mean": True, "perplexity": True}
    runs[EXACT] = exact(0.0041, 0.0031, kl_se=6e-5, nll_se=1e-4)
    assert within(result) == {"kl_mean": True, "perplexity": True}
    assert within(result, resolution=0.0) == {"kl_mean": False, "perplexity": False}
    assert verdict([result]).endswith(
        "on 1 of 1 models; by the point estimates alone on 0 of 1, past them elsewhere by at most 2 standard "
        "errors of the paired difference; the patched build's big batches agree with the reference on every top "
        "token on 1 of 1"
    )
    runs[EXACT] = exact(0.0041, 0.0031, kl_se=4e-5, nll_se=4e-5)
    assert within(result) == {"kl_mean": False, "perplexity": False}
    lines = tables([result]).splitlines()
    assert lines[2] == "| m.gguf | unpatched ub 512 | 46.000 | (reference) | | | |  |"
    row = f"| m.gguf | {EXACT} | 46.000 | +0.0031 ± 0.0034 | 4.10e-03 ± 1.0e-04 | 1.00e-02 | 5.00e-02 | 95.00% |"
    assert row in lines
    assert f"| m.gguf | {UPSTREAM_SMALL[0]} | +1.00e-04 ± 4.0e-05 | +0.0001 ± 0.0000 |" in lines
    assert all(line.count("|") == lines[1].count("|") for line in lines[: lines.index("")])
    assert verdict([result]).endswith(
        "on 0 of 1 models (not on m.gguf: mean KL and perplexity); by the point estimates alone on 0 of 1; the "
        "patched build's big batches agree with the reference on every top token on 1 of 1"
    )
    assert kl_fields([result])["kl_setup"] == "8 chunks of 512 tokens, 2 threads, today to today"
    assert kl_fields([])["kl_setup"] == "not measured yet"


def test_real_model_goals_runs_and_tables(tmp_path: Path) -> None:
    """benchmarks/real_models.py (make bench-models): issue 51's goals from a run's figures, the run recorded once,
    and the page's tables; without a run the section says so."""
    from real_models import NGRAM_FIXED, goals, page_fields, record_run
    from speculation import ADAPTIVE, DRAFT_ADAPTIVE, LLAMA_CPP, LLAMA_CPP_DRAFT, NONE

    def ratio(median: float) -> dict[str, float]:
        return {"median": median, "low": median - 0.1, "high": median + 0.1}

    def row(speed: float, x_none: float, **against: float) -> dict[str, Any]:
        figures: dict[str, Any] = {"tokens_per_s": speed, "runs": [speed], "x_none": ratio(x_none), "acceptance": 0.5}
        figures.update({f"x_{name}": ratio(value) for name, value in against.items()})
        return {**figures, "tokens_equal_to_none": 24, "tokens_of_none": 24}

    costs = {"1": 0.03, "2": 0.033, "8": 0.09, "16": 0.15}
    shipped: dict[str, Any] = {
        "seconds": costs,
        "x_one_row": {n: ratio(s / 0.03) for n, s in costs.items()},
        "weight_bytes": 1e9,
    }
    shipped["upstream"] = {"seconds": {n: s * 1.1 for n, s in costs.items()}, "x_one_row": shipped["x_one_row"]}
    shipped |= {"bound_seconds": 0.02, "one_row_of_bound": 0.67}
    q6_k = {**shipped, "upstream": {**shipped["upstream"], "seconds": {n: s / 2 for n, s in costs.items()}}}
    edit = {
        NONE: row(30.0, 1.0),
        NGRAM_FIXED: row(33.0, 1.1),
        ADAPTIVE: row(45.0, 1.5, **{LLAMA_CPP: 1.2}),
        DRAFT_ADAPTIVE: row(36.0, 1.19, **{LLAMA_CPP_DRAFT: 1.05}),
        LLAMA_CPP: {**row(38.0, 1.27), "tokens_equal_to_none": 3},
        LLAMA_CPP_DRAFT: row(34.0, 1.13),
    }
    verify = {"prompt_tokens": 300, "threads": 2, "rounds": 1, "bandwidth_bytes_per_s": 2e10}
    results = {
        "date": "today", "machine": "x86_64, 2 CPUs", "model": "t.gguf", "draft_model": "d.gguf", "threads": 2,
        "rounds": 1, "tokens": 24, "verify_cost": {**verify, "models": {"Q4_K_M": shipped, "Q6_K": q6_k}},
        "prefill": {"prompt_tokens": 571, "tokens_per_s": {"exact": 70.0, "upstream": 75.0},
                    "exact_over_upstream": ratio(0.93)},
        "speculation": {"edit": edit},
        "cache_equality": {"smollm2": {"file": "a.gguf", "equal": True}, "b": {"file": "b.gguf", "equal": False}},
    }  # fmt: skip
    verdicts = {goal["goal"]: (goal["value"], goal["met"]) for goal in goals(results)}
    assert verdicts["verify 2 rows / 1 row, Q4_K_M: <= 1.15"] == ("x1.10", True)
    assert verdicts["verify 16 rows / 1 row, Q4_K_M: <= 4.5"] == ("x5.00", False)
    assert verdicts["every type and batch at most upstream's cost"] == ("worst x2.00 of upstream (Q6_K, 1 row)", False)
    assert verdicts["prefill: exact / upstream speed: >= 0.9"] == ("x0.93", True)
    assert verdicts[f"`{ADAPTIVE}` / `none` on edit: >= 1.3"] == ("x1.50", True)
    assert verdicts[f"`{DRAFT_ADAPTIVE}` / `none` on edit: >= 1.2"] == ("x1.19", False)
    assert verdicts[f"`{DRAFT_ADAPTIVE}` / {LLAMA_CPP_DRAFT} on every prompt: >= 1.0"] == ("lowest x1.05 (edit)", True)
    # llama.cpp's own rows are not specstate's: their tokens may part from `none`.
    assert verdicts["specstate runs with every token equal to `none`"] == ("4 of 4", True)
    assert verdicts["cache-continued conversation equal to fresh, every model"] == ("1 of 2", False)
    results["goals"] = goals(results)
    runs = record_run(results, tmp_path, kept=10)
    assert record_run(results, tmp_path, kept=10) == runs and len(runs) == 1
    fields = page_fields(results, runs, shown=3)
    assert "| prefill: exact / upstream speed: >= 0.9 | met: x0.93 |" in fields["real_runs"]
    assert "| `draft adaptive` / `none` on edit: >= 1.2 | **missed**: x1.19 |" in fields["real_runs"]
    assert (
        "| edit | ngram adaptive | 45.0 | 50% | x1.50 (1.40-1.60) | x1.20 (1.10-1.30) |  | 24/24 |"
        in (fields["real_tables"])
    )
    assert "| Q6_K, upstream |" in fields["real_tables"] and "| b.gguf | **not equal** |" in fields["real_tables"]
    assert "No run recorded yet" in page_fields(None, [], shown=3)["real_runs"]
