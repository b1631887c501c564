"""The benchmark report: a ``make bench`` run's tables and charts, and the benchmarks page, docs/benchmarks.md.

``write_report`` writes a run's ``latest.md`` and PNG charts (run.py calls it). ``page`` fills the text of
``benchmarks/benchmarks.md.template`` with the figures of ``benchmarks/results/*.json``: every measured figure on
the page comes from those files, so that text and figures cannot drift apart. ``make bench-report`` writes the page
from the results in the tree without measuring anything (``make bench`` and ``make bench-speculation`` do it after
their runs); tests/project/test_bench.py checks that the page in the tree is what they give.

``record_run`` adds the headline ratios of a finished ``make bench`` run (latest.json and the chain runs) to
``runs.json``, so that the page shows how they hold from run to run on a shared machine, not one run's luck.

Usage: python benchmarks/report.py [--results DIR] [--out PATH] [--check | --record-run]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from string import Template
from typing import Any

from bench_models import title
from busy import busy_fields
from grammar_drafts import grammar_fields
from perplexity_kl import kl_fields
from perplexity_kl import load_all as load_kl
from quality import load_all as load_quality
from quality import quality_fields
from real_models import RESULTS as REAL_MODELS
from real_models import load as load_real_models
from real_models import page_fields as real_models_fields
from serve_load import load_others as load_other_serve_runs
from serve_load import serve_fields
from speculation import ADAPTIVE, LLAMA_CPP_SIZES, NONE, PEERS, contenders_table, draft_text, exactness
from speculation import targets as speculation_targets
from speculation import targets_table as speculation_targets_table
from verify_cost import table as verify_cost_table

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
TEMPLATE = BENCHMARKS / "benchmarks.md.template"
PAGE = BENCHMARKS.parent / "docs" / "benchmarks.md"
#: The results files the page reads, by the name its fields use.
PAGE_RESULTS = (
    "latest",
    "speculation",
    "verify_cost",
    "openmp",
    "chain",
    "chain-json",
    "grammar_drafts",
    "runs",
    "busy",
    "serve",
)
#: How many `make bench` runs runs.json keeps, and how many the page shows side by side.
RUNS_KEPT, RUNS_SHOWN = 10, 3

Row = tuple[str, str, str, str]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _verdict(value: float | None, target: float, at_least: bool = True) -> str:
    if value is None:
        return "not measured"
    met = value >= target if at_least else value <= target
    return "met" if met else "**missed**"


# --- the table of targets of a `make bench` run -------------------------------------------------------------------


def _decode_rows(ratios: dict[str, Any]) -> list[Row]:
    """specstate's decode speed over each peer's, against its target (llama-bench's is a reference)."""
    rows = []
    for peer, label, target in (
        ("native_loop", "decode: specstate / native Rust loop", 0.97),
        ("llama_cpp_python", "decode: specstate / llama-cpp-python", 1.05),
        ("llama_bench", "decode: specstate / llama-bench tg128", None),
        ("llama_bench_native", "decode: specstate / llama-bench tg128, native build", None),
    ):
        entry = ratios.get(peer)
        shown = "n/a" if entry is None else f"{entry['median']:.2f} ({entry['low']:.2f}-{entry['high']:.2f})"
        if target is None:
            rows.append((label, shown, "(reference)", ""))
        else:
            rows.append((label, shown, f">= {target}", _verdict(None if entry is None else entry["median"], target)))
    return rows


def _checkpoint_rows(tokens: str, figures: dict[str, Any]) -> list[Row]:
    """A checkpoint's size against the state it holds and llama-cpp-python's, and its speed against theirs."""
    peer = figures.get("llama_cpp_python") or {}
    smaller = _ratio(peer.get("size"), figures["size"])
    need = 9.0 if tokens == "512" else 3.0
    faster = _ratio(peer.get("save_load_seconds"), figures["capture_seconds"] + figures["restore_seconds"])
    size_ratio = figures["size_ratio"]
    rows = [
        (
            f"checkpoint {tokens}: size / state in use",
            _fmt(size_ratio, ".4f"),
            "<= 1.05",
            _verdict(size_ratio, 1.05, False),
        ),
        (
            f"checkpoint {tokens}: llama-cpp-python size / ours",
            _fmt(smaller, ".1f"),
            f">= {need:g}",
            _verdict(smaller, need),
        ),
        (
            f"checkpoint {tokens}: their save+load / our capture+restore",
            _fmt(faster, ".1f"),
            ">= 3",
            _verdict(faster, 3.0),
        ),
    ]
    if tokens == "2048":
        prefill = _ratio(figures["prefill_seconds"], figures["restore_seconds"])
        rows.append(
            ("restore at 2048 vs prefill (times faster)", _fmt(prefill, ".0f"), ">= 200", _verdict(prefill, 200.0))
        )
    return rows


def _memory_rows(memory: dict[str, Any]) -> list[Row]:
    over = memory["over_model_and_kv"] / 2**20
    extra = memory["capture_extra_ratio"]
    return [
        ("peak RSS over model file + KV cache", _fmt(over, ".1f", " MiB"), "<= 64 MiB", _verdict(over, 64.0, False)),
        ("extra peak during capture / checkpoint size", _fmt(extra), "<= 1.1", _verdict(extra, 1.1, False)),
    ]


def targets(results: dict[str, Any]) -> list[Row]:
    """(measure, value, target, verdict) rows."""
    rows = _decode_rows(results["decode_ratios"])
    rows += speculation_targets(results["speculation"])
    for tokens, figures in results["checkpoints"].items():
        rows += _checkpoint_rows(tokens, figures)
    return rows + _memory_rows(results["memory"])


# --- a `make bench` run's latest.md and charts --------------------------------------------------------------------


def _checkpoint_table(checkpoints: dict[str, Any]) -> list[str]:
    lines = [
        "| checkpoint | size | capture | restore (load) | restore into new contexts | prefill | "
        "llama-cpp-python size | their save+load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tokens, f in checkpoints.items():
        peer = f.get("llama_cpp_python") or {}
        lines.append(
            f"| {tokens} tokens | {f['size'] / 1e6:.1f} MB | {f['capture_seconds'] * 1e3:.1f} ms | "
            f"{f['restore_seconds'] * 1e3:.1f} ms | {f.get('restore_new_seconds', 0) * 1e3:.1f} ms | "
            f"{f['prefill_seconds']:.2f} s | "
            f"{_fmt(peer.get('size') and peer['size'] / 1e6, '.1f', ' MB')} | "
            f"{_fmt(peer.get('save_load_seconds') and peer['save_load_seconds'] * 1e3, '.1f', ' ms')} |"
        )
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{title(results.get('model'))}{draft_text(results)}, {results['threads']} threads, {results['runs']} "
        "interleaved rounds "
        "(ratios: the median of per-round pairs, with their range), "
        f"{results['date']}, {results['machine']}; llama-cpp-python {results.get('llama_cpp_python_version', 'n/a')}",
        "",
        "| measure | value | target | verdict |",
        "| --- | ---: | ---: | --- |",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in targets(results)]
    lines += ["", "| decode, 128 tokens | tokens/s (median) |", "| --- | ---: |"]
    lines += [f"| {name} | {value:.1f} |" for name, value in results["decode"].items()]
    lines += ["", *contenders_table(results["speculation"])]
    if "verify_cost" in results:
        lines += ["", *verify_cost_table(results["verify_cost"])]
    lines += ["", *_checkpoint_table(results["checkpoints"])]
    memory = results["memory"]
    lines += [
        "",
        f"Memory: peak RSS {memory['generation_peak_rss'] / 2**20:.1f} MiB for a generation at "
        f"{memory['n_ctx']} tokens of context (model file {memory['model_file'] / 2**20:.1f} MiB, KV cache "
        f"{memory['kv_cache'] / 2**20:.1f} MiB); a checkpoint capture of {memory['checkpoint_size'] / 2**20:.1f} MiB "
        f"raised the peak by {memory['capture_extra'] / 2**20:.1f} MiB.",
        "",
        "| validator | calls/s |",
        "| --- | ---: |",
    ]
    lines += [f"| {name} | {rate / 1e6:.2f} M |" for name, rate in results["validators"].items()]
    return "\n".join(lines) + "\n"


def _bar_chart(path: Path, labels: list[str], values: list[float], color: str, xlabel: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.2))
    axis.barh(labels, values, color=color)
    axis.set_xlabel(xlabel)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _checkpoint_chart(checkpoints: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.2))
    tokens = list(checkpoints)
    ours = [checkpoints[t]["size"] / 1e6 for t in tokens]
    theirs = [((checkpoints[t].get("llama_cpp_python") or {}).get("size") or 0) / 1e6 for t in tokens]
    positions = range(len(tokens))
    axis.bar([p - 0.2 for p in positions], ours, width=0.4, label="specstate checkpoint")
    axis.bar([p + 0.2 for p in positions], theirs, width=0.4, label="llama-cpp-python save_state")
    axis.set_xticks(list(positions), [f"{t} tokens" for t in tokens])
    axis.set_ylabel("MB")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def charts(results: dict[str, Any], directory: Path) -> list[Path]:
    decode = results["decode"]
    speculation = [
        (f"{name}: {mode}", row["tokens_per_s"])
        for name, spec in results["speculation"].items()
        for mode, row in spec.items()
        if "tokens_per_s" in row
    ]
    return [
        _bar_chart(
            directory / "decode.png",
            list(decode),
            list(decode.values()),
            "#4c72b0",
            "tokens/s (plain greedy decode, 128 tokens)",
        ),
        _bar_chart(
            directory / "speculation.png",
            [label for label, _ in speculation],
            [value for _, value in speculation],
            "#55a868",
            "tokens/s (160 tokens, prefill excluded)",
        ),
        _checkpoint_chart(results["checkpoints"], directory / "checkpoints.png"),
    ]


def write_report(results: dict[str, Any], directory: Path) -> None:
    (directory / "latest.md").write_text(markdown(results))
    charts(results, directory)


# --- the benchmarks page: the template's fields, each from the results --------------------------------------------


def _x(entry: dict[str, float] | None) -> str:
    """A ratio's median, as the tables print it."""
    return "n/a" if entry is None else f"x{entry['median']:.2f}"


def _listing(items: Iterable[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    words = list(items)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _fixed(prompt: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """A prompt's fixed-length ngram rows, by draft length."""
    return {int(name.split("=")[1]): row for name, row in prompt.items() if name.startswith("ngram k=")}


def _exactness_note(prompts: dict[str, Any]) -> str:
    """Whether every specstate row of the speculation run equals `none` in full, and where not, by how much."""
    parted = []
    for name, prompt in prompts.items():
        total = prompt[NONE]["tokens_equal_to_none"]
        equal = [row["tokens_equal_to_none"] for c, row in prompt.items() if c not in PEERS]
        if min(equal) != total:
            parted.append(f"{min(equal)} of {total} on the {name} prompt")
    if not parted:
        return "In the run below every specstate row equals `none` in full."
    return (
        f"The run below predates that patch: its specstate rows equal `none` for as few as {_listing(parted)}, where "
        "a verified row's logits then parted from the single decode's "
        "([docs/verification-numerics.md](verification-numerics.md))."
    )


def _row_costs(curve_us: list[int]) -> tuple[str, str]:
    """(the cost of each further row, on average and its steps' range; the cost of one row) of a measured cost
    curve, in ms. Steps are uneven: the exact kernels take columns in groups of 8, 4, 2 and 1."""
    steps = [max(0, later - earlier) for earlier, later in zip(curve_us, curve_us[1:])]
    average = (curve_us[-1] - curve_us[0]) / (len(curve_us) - 1)
    spread = f"steps of {min(steps) / 1e3:.1f} to {max(steps) / 1e3:.1f} ms"
    return f"{average / 1e3:.1f} ms on average ({spread})", f"{curve_us[0] / 1e3:.1f} ms"


#: The template's name for each peer configuration of speculation.PEERS, in order.
PEER_FIELDS = ("lookup", "llama_cpp", "llama_cpp_native")


def _speculation_fields(spec: dict[str, Any]) -> dict[str, Any]:
    prompts = spec["prompts"]
    story, code, quotes = prompts["story"], prompts["code"], prompts["quotes"]
    story_fixed = [row["x_none"]["median"] for row in _fixed(story).values()]
    longest = max(_fixed(code))
    best = quotes[ADAPTIVE]["best_fixed"]
    row_costs, plain_cost = _row_costs(quotes[ADAPTIVE]["cost_curve_us"])
    return {
        "spec_tokens": spec["tokens"],
        "spec_rounds": spec["rounds"],
        "spec_threads": spec["threads"],
        "spec_date": spec["date"],
        "quotes_answer": quotes[NONE]["tokens_equal_to_none"],
        "fixed_lengths": ", ".join(str(k) for k in _fixed(story)),
        "llama_cpp_sizes": f"{LLAMA_CPP_SIZES[0]}-token n-grams, drafts up to {LLAMA_CPP_SIZES[1]}",
        "exactness_note": _exactness_note(prompts),
        "spec_targets": "\n".join(speculation_targets_table(prompts)),
        "spec_contenders": "\n".join(contenders_table(prompts)),
        "story_fixed": f"x{max(story_fixed):.2f} to x{min(story_fixed):.2f}",
        "story_adaptive": _x(story[ADAPTIVE]["x_none"]),
        "longest": longest,
        "code_longest": _x(_fixed(code)[longest]["x_none"]),
        "quotes_best_acceptance": f"{_fixed(quotes)[best]['acceptance']:.0%}",
        "row_costs": row_costs,
        "plain_cost": plain_cost,
        "quotes_vs_bound": _x(quotes[ADAPTIVE].get("x_bound")),
        **{key: value for name, rows in prompts.items() for key, value in _prompt_fields(name, rows[ADAPTIVE]).items()},
    }


def _prompt_fields(name: str, adaptive: dict[str, Any]) -> dict[str, Any]:
    """The adaptive policy's ratios on prompt `name` as template fields: ``{name}_x_none``, ``{name}_vs_best`` (and
    ``{name}_best``, the best fixed length), ``{name}_vs_fastest`` (and ``{name}_fastest``, that peer), and
    ``{name}_vs_{peer}`` for each peer configuration."""
    return {
        f"{name}_x_none": _x(adaptive["x_none"]),
        f"{name}_acceptance": "n/a" if adaptive.get("acceptance") is None else f"{adaptive['acceptance']:.0%}",
        f"{name}_vs_best": _x(adaptive["x_best_fixed"]),
        f"{name}_best": adaptive["best_fixed"],
        f"{name}_vs_fastest": _x(adaptive.get("x_fastest_peer")),
        f"{name}_fastest": adaptive.get("fastest_peer", "no peer measured"),
        **{f"{name}_vs_{field}": _x(adaptive.get(f"x_{peer}")) for field, peer in zip(PEER_FIELDS, PEERS)},
    }


def _latest_fields(latest: dict[str, Any], spec: dict[str, Any], verify: dict[str, Any]) -> dict[str, Any]:
    speculation = latest["speculation"]
    q4_1 = next(iter(verify["models"].values()))["x_one_row"]
    return {
        "machine": latest["machine"],
        "peer_version": latest.get("llama_cpp_python_version", "n/a"),
        "speed_note": _speed_note(latest, spec),
        "latest_table": markdown(latest).rstrip("\n"),
        "code_vs_none": _x(speculation["code"][ADAPTIVE]["x_none"]),
        "quotes_vs_none": _x(speculation["quotes"][ADAPTIVE]["x_none"]),
        "edit_vs_none": _x(speculation.get("edit", {}).get(ADAPTIVE, {}).get("x_none")),
        "prompt_names": ", ".join(speculation),
        "q4_1_8_rows": _x(q4_1.get("8")),
        "q4_1_16_rows": _x(q4_1.get("16")),
        "draft_acceptance": _listing(f"{prompt['draft']['acceptance']:.0%}" for prompt in speculation.values()),
        "draft_vs_none": _listing(_x(prompt["draft"]["x_none"]) for prompt in speculation.values()),
    }


def _speed_note(latest: dict[str, Any], spec: dict[str, Any]) -> str:
    """Whether the speculation section above is this run's (`make bench` writes both) or an earlier run's."""
    if spec["date"] == latest["date"]:
        return f"This run ({latest['date']}) also gave the speculation section above."
    plain, earlier = latest["decode"]["specstate"], spec["prompts"]["story"][NONE]["tokens_per_s"]
    pace = "slower" if plain < earlier else "faster"
    return (
        f"The machine was {pace} during this run ({latest['date']}) than during the speculation run above "
        f"(`make bench-speculation`, {spec['date']}): {plain:.0f} tokens/s for plain decoding against {earlier:.0f}, "
        "which interleaving makes harmless for the ratios."
    )


def _disturbed(models: dict[str, Any]) -> str:
    """Which types' ratios a stall of the shared machine reached: a batch of more rows cannot be faster than one."""
    lows = {
        name: min(r["low"] for rows, r in model["x_one_row"].items() if rows != "1") for name, model in models.items()
    }
    hit = [name for name, low in lows.items() if low < 1.0]
    if not hit:
        return "No range falls below 1: no stall of the shared machine reached a one-row decode."
    calm = [f"{models[name]['one_row_of_bound']:.0%}" for name in models if name not in hit]
    share = f" The other types' one row runs at {_listing(calm)} of the bound." if calm else ""
    return (
        f"Other work shared the machine during this run: the {_listing(hit)} rows caught it (ranges down to "
        f"{min(lows.values()):.2f}, where a batch of more rows cannot be faster than one row).{share}"
    )


def _verify_fields(verify: dict[str, Any]) -> dict[str, Any]:
    models = verify["models"]
    first, *copies = models
    rows = list(models[first]["seconds"])
    last = [model["x_one_row"][rows[-1]]["median"] for model in models.values()]
    return {
        "verify_rows": _listing(rows),
        "verify_prompt": verify["prompt_tokens"],
        "verify_first": first,
        "verify_copies": _listing(copies),
        "verify_repeats": verify.get("repeats", 1),
        "verify_copy": f"{verify['bandwidth_copy_bytes'] / 2**30:g} GiB",
        "verify_threads": verify["threads"],
        "verify_rounds": verify["rounds"],
        "verify_date": verify["date"],
        "bandwidth": f"{verify['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s",
        "verify_table": "\n".join(verify_cost_table(verify)[2:]),
        "verify_disturbed": _disturbed(models),
        "verify_last_rows": rows[-1],
        "verify_last_range": f"x{min(last):.2f} to x{max(last):.2f}",
    }


def _openmp_fields(openmp: dict[str, Any]) -> dict[str, Any]:
    labels = {
        "decode": "decode",
        "prefill": "prefill",
        "ngram_code": "`ngram`, code",
        "ngram_quotes": "`ngram`, quotes",
    }
    figures = openmp["figures"]
    lines = ["| figure (tokens/s) | default | OpenMP | ratio |", "| --- | ---: | ---: | ---: |"]
    for name, row in figures.items():
        lines.append(
            f"| {labels.get(name, name)} | {row['default']:.1f} | {row['openmp']:.1f} | "
            f"x{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) |"
        )
    decode = figures["decode"]["ratio_median"]
    ngram = [figures[name]["ratio_median"] for name in ("ngram_code", "ngram_quotes")]
    summary = f"OpenMP changes plain decoding by x{decode:.2f} and `ngram` speculation by "
    summary += _listing(f"x{ratio:.2f}" for ratio in ngram) + " (code, quotes)"
    if decode > 1.0 >= max(ngram):
        summary += ": it speeds up plain decoding but not speculation, which is what specstate is for"
    crossing = all(row["ratio_min"] < 1.0 < row["ratio_max"] for row in figures.values())
    return {
        "openmp_pairs": openmp["pairs"],
        "openmp_threads": openmp["threads"],
        "openmp_table": "\n".join(lines),
        "openmp_summary": summary + "." + (" Every range crosses 1.0 on this shared machine." if crossing else ""),
    }


def _chain_ratio(result: dict[str, Any], name: str) -> str:
    ratio = result.get(f"{name} / llama-cpp-python")
    return "n/a" if ratio is None else f"x{ratio['median']:.2f} ({ratio['low']:.2f}-{ratio['high']:.2f})"


def _chain_fields(code: dict[str, Any], constrained: dict[str, Any]) -> dict[str, Any]:
    """`make bench`'s sampling with llama-cpp-python's chat chain (chain_bench.py): the table and the target."""
    contenders = ("specstate none", "specstate ngram", "llama-cpp-python")
    lines = [
        "| workload (tokens/s) | "
        + " | ".join(contenders)
        + " | "
        + " | ".join(f"`{mode}` / llama-cpp-python" for mode in ("none", "ngram"))
        + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, result in (("code prompt", code), ("JSON under a JSON-schema grammar", constrained)):
        medians = [sorted(result["figures"][name])[len(result["figures"][name]) // 2] for name in contenders]
        ratios = [_chain_ratio(result, f"specstate {mode}") for mode in ("none", "ngram")]
        lines.append(f"| {label} | " + " | ".join(f"{m:.1f}" for m in medians) + " | " + " | ".join(ratios) + " |")
    none, ngram = (code[f"specstate {mode} / llama-cpp-python"]["median"] for mode in ("none", "ngram"))
    verdict = "met" if none >= 1.10 and ngram > none else "**missed**"
    return {
        "chain_table": "\n".join(lines),
        "chain_threads": code["threads"],
        "chain_rounds": len(code["figures"]["specstate none"]),
        "chain_date": code.get("date", "an earlier run"),
        "chain_verdict": f"Target (issue 22): `none` at least x1.10 of llama-cpp-python on the code prompt and `ngram` "
        f"more: {verdict} (x{none:.2f} and x{ngram:.2f}).",
    }


def _median(entry: dict[str, float] | None) -> float | None:
    return None if entry is None else entry["median"]


def run_summary(latest: dict[str, Any], chain: dict[str, Any]) -> dict[str, Any]:
    """A `make bench` run's headline ratios (medians; None where not measured): what runs.json keeps of it."""
    speculation = latest["speculation"]
    q4_1 = next(iter(latest["verify_cost"]["models"].values()))["x_one_row"]
    figures = {
        "decode: specstate / llama-cpp-python": _median(latest["decode_ratios"].get("llama_cpp_python")),
        "decode: specstate / llama-bench": _median(latest["decode_ratios"].get("llama_bench")),
        "decode: specstate / llama-bench, native build": _median(latest["decode_ratios"].get("llama_bench_native")),
        **{
            f"`ngram` adaptive / {against}, {name}": _median(prompt[ADAPTIVE].get(f"x_{against}"))
            for name, prompt in speculation.items()
            for against in (NONE, *PEERS)
        },
        "verify 8 rows / 1 row, Q4_1": _median(q4_1.get("8")),
        "verify 16 rows / 1 row, Q4_1": _median(q4_1.get("16")),
        "sampling, code: `none` / llama-cpp-python": _median(chain.get("specstate none / llama-cpp-python")),
        "sampling, code: `ngram` / llama-cpp-python": _median(chain.get("specstate ngram / llama-cpp-python")),
    }
    return {"date": latest["date"], "equal_to_none": exactness(speculation)[1], "figures": figures}


def record_run(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Add the run in `directory` (latest.json, chain.json) to its runs.json, once; keep the last RUNS_KEPT."""
    path = directory / "runs.json"
    runs: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    latest, chain = (json.loads((directory / f"{name}.json").read_text()) for name in ("latest", "chain"))
    summary = run_summary(latest, chain)
    if all(run["date"] != summary["date"] for run in runs):
        runs = [*runs, summary][-RUNS_KEPT:]
        path.write_text(json.dumps(runs, indent=2) + "\n")
    return runs


def _runs_fields(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The last RUNS_SHOWN `make bench` runs side by side, and the spread of each ratio across them."""
    shown = runs[-RUNS_SHOWN:]
    if not shown:
        return {"runs_count": 0, "runs_table": "No run recorded yet: `make bench` records one."}
    lines = [
        "| median ratio | " + " | ".join(run["date"] for run in shown) + " | spread |",
        "| --- |" + " ---: |" * (len(shown) + 1),
    ]
    for label in shown[-1]["figures"]:
        values = [run["figures"].get(label) for run in shown]
        known = [v for v in values if v is not None]
        spread = f"{max(known) / min(known):.2f}" if len(known) > 1 else "n/a"
        lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in values) + f" | {spread} |")
    equal = " | ".join(run["equal_to_none"] for run in shown)
    lines.append(f"| specstate runs with every token equal to `none` | {equal} | |")
    return {"runs_count": len(shown), "runs_table": "\n".join(lines)}


def load_results(directory: Path = RESULTS) -> dict[str, Any]:
    """The results files the page reads, by name, every model's quality.json and perplexity_kl.json
    (``quality``, ``perplexity_kl``: lists), the other models' serve.json (``serve_others``: a list), and the
    real-model section's (``real_models``: the pair's latest run, None before the first, and its recorded runs)."""
    results = {name: json.loads((directory / f"{name}.json").read_text()) for name in PAGE_RESULTS}
    results["quality"] = load_quality(directory)
    results["perplexity_kl"] = load_kl(directory)
    results["serve_others"] = load_other_serve_runs(directory)
    results["real_models"] = load_real_models(directory / REAL_MODELS.relative_to(RESULTS))
    return results


def page(results: dict[str, Any], template: Path = TEMPLATE) -> str:
    """docs/benchmarks.md: the template's text with every field filled from `results` (see ``load_results``)."""
    real_latest, real_runs = results["real_models"]
    fields = {
        **_speculation_fields(results["speculation"]),
        **_latest_fields(results["latest"], results["speculation"], results["verify_cost"]),
        **_verify_fields(results["verify_cost"]),
        **_openmp_fields(results["openmp"]),
        **_chain_fields(results["chain"], results["chain-json"]),
        **grammar_fields(results["grammar_drafts"]),
        **_runs_fields(results["runs"]),
        **busy_fields(results["busy"]),
        **serve_fields(results["serve"], results["serve_others"]),
        **quality_fields(results["quality"]),
        **kl_fields(results["perplexity_kl"]),
        **real_models_fields(real_latest, real_runs, RUNS_SHOWN),
    }
    return Template(template.read_text()).substitute({name: str(value) for name, value in fields.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results directory")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write (docs/benchmarks.md)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="write nothing; fail when the page differs")
    action.add_argument("--record-run", action="store_true", help="add the run in --results to runs.json first")
    args = parser.parse_args()
    if args.record_run:
        record_run(args.results)
    text = page(load_results(args.results))
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is not what {args.results} gives: run `make bench-report`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
