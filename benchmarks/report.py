"""Markdown table and PNG charts of benchmark results (used by run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speculation import ADAPTIVE, contenders_table, ratio_text
from speculation import targets as speculation_targets
from verify_cost import table as verify_cost_table


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _verdict(value: float | None, target: float, at_least: bool = True) -> str:
    if value is None:
        return "not measured"
    met = value >= target if at_least else value <= target
    return "met" if met else "**missed**"


def targets(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, value, target, verdict) rows."""
    rows: list[tuple[str, str, str, str]] = []
    ratios = results["decode_ratios"]

    def decode_row(peer: str, label: str, target: float | None) -> None:
        entry = ratios.get(peer)
        value = None if entry is None else entry["median"]
        shown = "n/a" if entry is None else f"{entry['median']:.2f} ({entry['low']:.2f}-{entry['high']:.2f})"
        rows.append(
            (
                label,
                shown,
                "(reference)" if target is None else f">= {target}",
                _verdict(value, target) if target else "",
            )
        )

    decode_row("native_loop", "decode: specstate / native Rust loop", 0.97)
    decode_row("llama_cpp_python", "decode: specstate / llama-cpp-python", 1.05)
    decode_row("llama_bench", "decode: specstate / llama-bench tg128", None)
    for name in ("code", "quotes"):
        entry = results["speculation"][name][ADAPTIVE]["x_none"]
        rows.append((f"{name}: ngram adaptive / none", ratio_text(entry), ">= 2.0", _verdict(entry["median"], 2.0)))
    rows += speculation_targets(results["speculation"])
    for tokens, figures in results["checkpoints"].items():
        rows.append(
            (
                f"checkpoint {tokens}: size / state in use",
                _fmt(figures["size_ratio"], ".4f"),
                "<= 1.05",
                _verdict(figures["size_ratio"], 1.05, at_least=False),
            )
        )
        peer_ckpt = figures.get("llama_cpp_python") or {}
        smaller = _ratio(peer_ckpt.get("size"), figures["size"])
        need = 9.0 if tokens == "512" else 3.0
        rows.append(
            (
                f"checkpoint {tokens}: llama-cpp-python size / ours",
                _fmt(smaller, ".1f"),
                f">= {need:g}",
                _verdict(smaller, need),
            )
        )
        ours = figures["capture_seconds"] + figures["restore_seconds"]
        faster = _ratio(peer_ckpt.get("save_load_seconds"), ours)
        rows.append(
            (
                f"checkpoint {tokens}: their save+load / our capture+restore",
                _fmt(faster, ".1f"),
                ">= 3",
                _verdict(faster, 3.0),
            )
        )
        if tokens == "2048":
            prefill = _ratio(figures["prefill_seconds"], figures["restore_seconds"])
            rows.append(
                ("restore at 2048 vs prefill (times faster)", _fmt(prefill, ".0f"), ">= 200", _verdict(prefill, 200.0))
            )
    memory = results["memory"]
    over = memory["over_model_and_kv"] / 2**20
    rows.append(
        (
            "peak RSS over model file + KV cache",
            _fmt(over, ".1f", " MiB"),
            "<= 64 MiB",
            _verdict(over, 64.0, at_least=False),
        )
    )
    rows.append(
        (
            "extra peak during capture / checkpoint size",
            _fmt(memory["capture_extra_ratio"]),
            "<= 1.1",
            _verdict(memory["capture_extra_ratio"], 1.1, at_least=False),
        )
    )
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"SmolLM2-135M-Instruct Q4_1, {results['threads']} threads, {results['runs']} interleaved rounds "
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
    lines += [
        "",
        "| checkpoint | size | capture | restore (load) | restore into new contexts | prefill | "
        "llama-cpp-python size | their save+load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tokens, f in results["checkpoints"].items():
        peer = f.get("llama_cpp_python") or {}
        lines.append(
            f"| {tokens} tokens | {f['size'] / 1e6:.1f} MB | {f['capture_seconds'] * 1e3:.1f} ms | "
            f"{f['restore_seconds'] * 1e3:.1f} ms | {f.get('restore_new_seconds', 0) * 1e3:.1f} ms | "
            f"{f['prefill_seconds']:.2f} s | "
            f"{_fmt(peer.get('size') and peer['size'] / 1e6, '.1f', ' MB')} | "
            f"{_fmt(peer.get('save_load_seconds') and peer['save_load_seconds'] * 1e3, '.1f', ' ms')} |"
        )
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


def charts(results: dict[str, Any], directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    figure, axis = plt.subplots(figsize=(6, 3.2))
    names = list(results["decode"])
    axis.barh(names, [results["decode"][n] for n in names], color="#4c72b0")
    axis.set_xlabel("tokens/s (plain greedy decode, 128 tokens)")
    figure.tight_layout()
    paths.append(directory / "decode.png")
    figure.savefig(paths[-1], dpi=120)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 3.2))
    labels, values = [], []
    for name, spec in results["speculation"].items():
        for mode, row in spec.items():
            if "tokens_per_s" in row:
                labels.append(f"{name}: {mode}")
                values.append(row["tokens_per_s"])
    axis.barh(labels, values, color="#55a868")
    axis.set_xlabel("tokens/s (160 tokens, prefill excluded)")
    figure.tight_layout()
    paths.append(directory / "speculation.png")
    figure.savefig(paths[-1], dpi=120)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 3.2))
    tokens = list(results["checkpoints"])
    ours = [results["checkpoints"][t]["size"] / 1e6 for t in tokens]
    theirs = [((results["checkpoints"][t].get("llama_cpp_python") or {}).get("size") or 0) / 1e6 for t in tokens]
    positions = range(len(tokens))
    axis.bar([p - 0.2 for p in positions], ours, width=0.4, label="specstate checkpoint")
    axis.bar([p + 0.2 for p in positions], theirs, width=0.4, label="llama-cpp-python save_state")
    axis.set_xticks(list(positions), [f"{t} tokens" for t in tokens])
    axis.set_ylabel("MB")
    axis.legend()
    figure.tight_layout()
    paths.append(directory / "checkpoints.png")
    figure.savefig(paths[-1], dpi=120)
    plt.close(figure)
    return paths


def write_report(results: dict[str, Any], directory: Path) -> None:
    (directory / "latest.md").write_text(markdown(results))
    charts(results, directory)
