"""``make bench-quality``: does specstate's exact decoding make a model worse than upstream llama.cpp's own batch-size
variation does?

One fixed text (the first ``--tokens`` tokens of docs/verification-numerics.md, tokenized by specstate with BOS as
the model asks; the same token ids go to every run) is decoded in one context five times, every row's logits kept:

- ``specstate exact``: what specstate computes by default, a ``specstate.Context`` with ``n_batch`` = ``n_ubatch`` =
  16 decoding the text in chunks of 16 rows (``EXACT_PROMPT_ROWS``), each row its single decode's bits;
- ``specstate n_batch 1``: the same context one token a decode, the single decodes the exact path must equal;
- ``specstate n_batch 512``: the same context at 512 rows a decode, where specstate's build takes llama.cpp's own
  big-batch kernels (what specstate decoded prompts with before exact decoding became the default);
- ``upstream n_batch 512``: unpatched llama.cpp through llama-cpp-python (the benchmark venv,
  ``benchmarks/quality_peer.py``), ``Llama`` with ``n_batch`` 512 and ``logits_all``, then ``eval``: upstream's
  usual big-batch path;
- ``upstream n_batch 1``: the same one token a decode, upstream's single-decode path.

Each run's raw float32 logits go to a temporary ``.npy`` file (tokens x vocabulary: 311 MB for Qwen's 151,936 at 512
tokens) and are compared a few rows at a time, in float64: each run's perplexity of the text (every row but the last
scoring the next token), and for each pair (test, reference) the KL divergence KL(reference || test) of every row
(mean, 99th percentile, max), the share of rows whose top-1 tokens agree and the rows whose logits are identical
bits. Upstream's own batch-size variation is the pair (upstream n_batch 1, upstream n_batch 512); the pair
(specstate n_batch 512, upstream n_batch 512) shows what the two builds' llama.cpp versions alone change (llama-cpp-
python 0.3.36 vendors an older llama.cpp than specstate's crate), at the same batch size. The exact path stays
within upstream's variation when its mean KL from upstream's big batches is no larger, and its perplexity no
further from theirs, than upstream's single decodes'.

Writes quality.json and quality.md into ``bench_models.results_dir`` (benchmarks/results for SmolLM2, else
benchmarks/results/models/<model>/); ``report.py`` puts every model's into docs/benchmarks.md.
Usage: python benchmarks/quality.py [--model M] [--tokens 512] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench_models import RESULTS, add_quality_options, record_quality_run, title
from peer_venv import peer_python
from specstate import Context, Model
from specstate._native import EXACT_PROMPT_ROWS

ROOT = Path(__file__).resolve().parent.parent
#: The text every run decodes (its first --tokens tokens).
TEXT = ROOT / "docs" / "verification-numerics.md"
SPECSTATE = "specstate exact"
SPECSTATE_ONE = "specstate n_batch 1"
SPECSTATE_BIG = "specstate n_batch 512"
UPSTREAM_BIG = "upstream n_batch 512"
UPSTREAM_ONE = "upstream n_batch 1"
#: specstate's runs and each one's rows a decode (n_batch = n_ubatch), then upstream's.
SPECSTATE_RUNS = {SPECSTATE: EXACT_PROMPT_ROWS, SPECSTATE_ONE: 1, SPECSTATE_BIG: 512}
UPSTREAM_RUNS = {UPSTREAM_BIG: 512, UPSTREAM_ONE: 1}
RUNS = (*SPECSTATE_RUNS, *UPSTREAM_RUNS)
#: The pairs compared, (test, reference): KL(reference || test) per row. The exact path against its own single
#: decodes (the same bits, if it is exact) and against upstream's two paths; upstream's own batch-size variation;
#: specstate build's own (its big batches take llama.cpp's kernels); the two builds at the same batch size (their
#: llama.cpp versions differ: llama-cpp-python 0.3.36 vendors an older one).
PAIRS = (
    (SPECSTATE, SPECSTATE_ONE),
    (SPECSTATE, UPSTREAM_BIG),
    (SPECSTATE, UPSTREAM_ONE),
    (UPSTREAM_ONE, UPSTREAM_BIG),
    (SPECSTATE, SPECSTATE_BIG),
    (SPECSTATE_BIG, UPSTREAM_BIG),
)
#: Rows of every run held in memory at once while comparing.
CHUNK_ROWS = 16

Array = npt.NDArray[Any]


def pair_name(test: str, reference: str) -> str:
    return f"{test} / {reference}"


# --- the figures, from logits (pure) ------------------------------------------------------------------------------


def log_softmax(logits: Array) -> npt.NDArray[np.float64]:
    """Each row's log-probabilities, in float64."""
    wide = np.asarray(logits, dtype=np.float64)
    shifted = wide - wide.max(axis=-1, keepdims=True)
    logprobs: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logprobs


def kl_rows(reference: Array, test: Array) -> npt.NDArray[np.float64]:
    """KL(reference || test) of each row, from the two runs' log-probabilities (nats)."""
    return np.asarray((np.exp(reference) * (reference - test)).sum(axis=-1), dtype=np.float64)


def next_token_nll(logprobs: Array, next_tokens: Array) -> npt.NDArray[np.float64]:
    """The negative log-probability of each row's next token (rows whose next token is negative: none scored)."""
    scored = next_tokens >= 0
    rows = logprobs[scored]
    return np.asarray(-rows[np.arange(len(rows)), next_tokens[scored]], dtype=np.float64)


def perplexity(nll: Array) -> float:
    return float(np.exp(np.mean(nll)))


def chunk_figures(logits: Mapping[str, Array], next_tokens: Array) -> dict[str, Array]:
    """Per-row figures of a chunk of rows of every run: ``nll RUN``, ``top1 RUN``, and for each pair ``kl PAIR`` and
    ``identical PAIR`` (the rows' logits equal bit for bit)."""
    figures = {}
    logprobs = {run: log_softmax(rows) for run, rows in logits.items()}
    for run, rows in logits.items():
        figures[f"nll {run}"] = next_token_nll(logprobs[run], next_tokens)
        figures[f"top1 {run}"] = np.argmax(rows, axis=-1)
    for test, reference in PAIRS:
        if test in logits and reference in logits:
            name = pair_name(test, reference)
            figures[f"kl {name}"] = kl_rows(logprobs[reference], logprobs[test])
            figures[f"identical {name}"] = np.all(logits[reference] == logits[test], axis=-1)
    return figures


def summary(rows: Mapping[str, Array]) -> dict[str, Any]:
    """Each run's perplexity, each pair's KL (mean, 99th percentile, max), top-1 agreement and identical rows, from
    the per-row figures of every row (``chunk_figures``, concatenated)."""
    runs = {key.removeprefix("nll "): {"perplexity": perplexity(nll)} for key, nll in rows.items() if key[:4] == "nll "}
    pairs = {}
    for test, reference in PAIRS:
        name = pair_name(test, reference)
        if f"kl {name}" not in rows:
            continue
        kl = rows[f"kl {name}"]
        pairs[name] = {
            "test": test,
            "reference": reference,
            "kl_mean": float(np.mean(kl)),
            "kl_p99": float(np.percentile(kl, 99)),
            "kl_max": float(np.max(kl)),
            "top1_agreement": float(np.mean(rows[f"top1 {test}"] == rows[f"top1 {reference}"])),
            "identical_rows": int(np.sum(rows[f"identical {name}"])),
        }
    return {"runs": runs, "pairs": pairs}


def compare(paths: Mapping[str, Path], tokens: list[int], chunk_rows: int = CHUNK_ROWS) -> dict[str, Any]:
    """``summary`` of the runs whose logits are the ``.npy`` files `paths`, read `chunk_rows` rows at a time."""
    arrays = {run: np.load(path, mmap_mode="r") for run, path in paths.items()}
    next_tokens = np.array([*tokens[1:], -1])
    parts: dict[str, list[Array]] = {}
    for start in range(0, len(tokens), chunk_rows):
        window = slice(start, start + chunk_rows)
        chunk = chunk_figures({run: np.asarray(a[window]) for run, a in arrays.items()}, next_tokens[window])
        for key, values in chunk.items():
            parts.setdefault(key, []).append(values)
    return summary({key: np.concatenate(values) for key, values in parts.items()})


#: How the verdict names each criterion of ``within``.
CRITERIA = {"kl_mean": "mean KL", "perplexity": "perplexity"}


def within(results: Mapping[str, Any]) -> dict[str, bool]:
    """Whether specstate's exact path stays within upstream's own batch-size variation, measured from upstream's big
    batches: its mean KL from them no larger than upstream's single decodes', and its perplexity no further from
    theirs than upstream's single decodes' is."""
    pairs, runs = results["pairs"], results["runs"]
    own = pairs[pair_name(UPSTREAM_ONE, UPSTREAM_BIG)]["kl_mean"]
    big = runs[UPSTREAM_BIG]["perplexity"]
    return {
        "kl_mean": pairs[pair_name(SPECSTATE, UPSTREAM_BIG)]["kl_mean"] <= own,
        "perplexity": abs(runs[SPECSTATE]["perplexity"] - big) <= abs(runs[UPSTREAM_ONE]["perplexity"] - big),
    }


# --- the runs -----------------------------------------------------------------------------------------------------


def text_tokens(model: Model, n: int, text: Path = TEXT) -> list[int]:
    """The first `n` tokens of `text`, as specstate tokenizes it (BOS as the model asks)."""
    tokens = model.tokenize(text.read_text())
    if len(tokens) < n:
        raise ValueError(f"{text} has {len(tokens)} tokens, fewer than {n}")
    return tokens[:n]


def specstate_logits(model: Model, tokens: list[int], rows: int, threads: int, out: Path) -> float:
    """The tokens decoded by specstate in chunks of `rows` (n_batch = n_ubatch), every row's logits to the ``.npy``
    file `out`; the seconds of the decodes."""
    context = Context(model, n_ctx=len(tokens), n_batch=rows, n_ubatch=rows, n_threads=threads)
    logits = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(len(tokens), model.n_vocab))
    seconds = 0.0
    for start in range(0, len(tokens), rows):
        chunk = tokens[start : start + rows]
        began = time.perf_counter()
        context.decode(chunk, start, all_logits=True)
        seconds += time.perf_counter() - began
        for row in range(len(chunk)):
            logits[start + row] = context.logits(row)
    logits.flush()
    del logits
    return seconds


def upstream_logits(model: Path, tokens: list[int], n_batch: int, threads: int, out: Path) -> dict[str, Any]:
    """llama-cpp-python's logits of the tokens at `n_batch` rows a decode into `out` (benchmarks/quality_peer.py in
    the benchmark venv): its seconds, version and whether it tokenizes the text the same."""
    request = {"model": str(model), "tokens": tokens, "text": TEXT.read_text(), "n_batch": n_batch}
    request |= {"threads": threads, "out": str(out)}
    path = out.with_suffix(".json")
    path.write_text(json.dumps(request))
    command = [str(peer_python()), str(ROOT / "benchmarks" / "quality_peer.py"), str(path)]
    stdout = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    figures: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return figures


def measure(path: Path, tokens_wanted: int, threads: int) -> dict[str, Any]:
    """Every run on the model at `path`, compared (their logits in a temporary directory, removed after)."""
    model = Model(path)
    tokens = text_tokens(model, tokens_wanted)
    facts = {"tokens": len(tokens), "bos": bool(tokens[0] == model.bos)}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="specstate-quality-") as scratch:
        paths = {run: Path(scratch) / f"{index}.npy" for index, run in enumerate(RUNS)}
        for run, rows in SPECSTATE_RUNS.items():
            seconds[run] = specstate_logits(model, tokens, rows, threads, paths[run])
        del model
        peer: dict[str, Any] = {}
        for run, n_batch in UPSTREAM_RUNS.items():
            peer = upstream_logits(path, tokens, n_batch, threads, paths[run])
            seconds[run] = peer["seconds"]
        results = compare(paths, tokens)
    for run, figures in results["runs"].items():
        figures["seconds"] = seconds[run]
    peer_facts = {"same_tokens": peer["same_tokens"], "llama_cpp_python_version": peer["version"]}
    return {**facts, **peer_facts, **results}


# --- tables -------------------------------------------------------------------------------------------------------


def _sorted(results: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """SmolLM2's first, then the others by file size."""
    return sorted(results, key=lambda r: (title(r["model"]) != title(None), r.get("model_bytes", 0)))


#: The runs whose mean KL from upstream's big batches the first table sets side by side: the exact path, specstate's
#: own big batches (the builds' version difference alone) and upstream's single decodes (upstream's own variation).
FROM_UPSTREAM_BIG = (SPECSTATE, SPECSTATE_BIG, UPSTREAM_ONE)


def _summary_row(result: Mapping[str, Any]) -> str:
    """A model's row of the first table."""
    perplexities = " | ".join(f"{result['runs'][run]['perplexity']:.3f}" for run in RUNS)
    single = f"{result['pairs'][pair_name(SPECSTATE, SPECSTATE_ONE)]['identical_rows']}/{result['tokens']}"
    kl = ", ".join(f"{result['pairs'][pair_name(run, UPSTREAM_BIG)]['kl_mean']:.2e}" for run in FROM_UPSTREAM_BIG)
    verdicts = " | ".join("yes" if held else "**no**" for held in within(result).values())
    return f"| {result['model']} | {perplexities} | {single} | {kl} | {verdicts} |"


def tables(results: Iterable[Mapping[str, Any]]) -> str:
    """Two Markdown tables of one or more models' results: each run's perplexity of the text, the exact path's rows
    equal to its single decodes, the mean KLs of FROM_UPSTREAM_BIG and the verdict; then each pair's figures."""
    shown = _sorted(results)
    lines = [
        f"| model | {' | '.join(RUNS)} | exact rows = single decodes | mean KL from {UPSTREAM_BIG}: exact, "
        "specstate 512, upstream 1 | exact within upstream's variation: mean KL | perplexity |",
        "| --- |" + " ---: |" * (len(RUNS) + 4),
        *(_summary_row(result) for result in shown),
        "",
        "| model | test / reference | mean KL | p99 KL | max KL | top-1 agreement | identical rows |",
        "| --- | --- |" + " ---: |" * 5,
    ]
    for result in shown:
        for name, pair in result["pairs"].items():
            kl = " | ".join(f"{pair[key]:.2e}" for key in ("kl_mean", "kl_p99", "kl_max"))
            agree, identical = f"{pair['top1_agreement']:.2%}", f"{pair['identical_rows']}/{result['tokens']}"
            lines.append(f"| {result['model']} | {name} | {kl} | {agree} | {identical} |")
    return "\n".join(lines)


def load_all(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every model's quality.json under `directory` (SmolLM2's in it, the others' in models/*/)."""
    files = [directory / "quality.json", *sorted(directory.glob("models/*/quality.json"))]
    return [json.loads(path.read_text()) for path in files if path.exists()]


def _verdict(shown: list[Mapping[str, Any]]) -> str:
    """The section's verdict: on how many models the exact path is within upstream's variation (those that are not
    named), no further from upstream's big batches than specstate's own big batches, and its single decodes' bits."""

    def kl_from_big(result: Mapping[str, Any], run: str) -> float:
        return float(result["pairs"][pair_name(run, UPSTREAM_BIG)]["kl_mean"])

    failed = {r["model"]: [CRITERIA[k] for k, held in within(r).items() if not held] for r in shown}
    missed = [f"{model}: {' and '.join(names)}" for model, names in failed.items() if names]
    versions = sum(kl_from_big(r, SPECSTATE) <= kl_from_big(r, SPECSTATE_BIG) for r in shown)
    exact = sum(r["pairs"][pair_name(SPECSTATE, SPECSTATE_ONE)]["identical_rows"] == r["tokens"] for r in shown)
    n = len(shown)
    text = f"The exact path stays within upstream's own batch-size variation on {n - len(missed)} of {n} models"
    text += f" (not on {', '.join(missed)})" if missed else ""
    text += f"; its mean KL from {UPSTREAM_BIG} is at most that of {SPECSTATE_BIG} (the same build's big batches: "
    text += f"the two llama.cpp versions apart) on {versions} of {n}; every row equals its single decode on {exact}"
    return text + f" of {n}"


def quality_fields(results: list[dict[str, Any]]) -> dict[str, str]:
    """The fields of docs/benchmarks.md's section (``report.py`` fills the template with them)."""
    if not results:
        return {"quality_setup": "not measured yet", "quality_tables": "", "quality_verdict": "`make bench-quality`"}
    shown = _sorted(results)
    first, dates = shown[0], sorted(r["date"] for r in shown)
    setup = f"{first['tokens']} tokens of `{first['text']}`, {first['threads']} threads, "
    setup += f"llama-cpp-python {first['llama_cpp_python_version']}, {dates[0]} to {dates[-1]}"
    return {"quality_setup": setup, "quality_tables": tables(shown), "quality_verdict": _verdict(shown)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quality_options(parser, "quality.json")
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the text (default %(default)s)")
    args = parser.parse_args()
    record = functools.partial(measure, tokens_wanted=args.tokens, threads=args.threads)
    results, out = record_quality_run(args, TEXT, ROOT, "quality.json", record)
    out.with_suffix(".md").write_text(f"{results['model']}, {args.threads} threads\n\n{tables([results])}\n")
    print(tables([results]))


if __name__ == "__main__":
    main()
