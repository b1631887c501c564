"""Part of ``make bench-quality``: specstate's patched llama.cpp against the same llama.cpp unpatched, with llama.cpp's
own ``llama-perplexity`` and the KL divergence of its ``--kl-divergence``.

Both binaries are built here from the llama.cpp source inside the pinned llama-cpp-sys-4 crate, with the same
x86-64-v3 kernel flags as every peer: ``unpatched`` as it ships (the llama-bench build of ``llama_cpp_spec.py``),
``patched`` from a copy of it configured with specstate's toolchain file (``llama-cpp-sys-4/specstate.cmake``, which
applies ``llama-cpp-sys-4/patches``), so the two differ by specstate's patches alone. Each run decodes the same text
(``--chunks`` chunks of ``-c`` 512 tokens of ``docs/verification-numerics.md``, llama.cpp's own tokenization) with
``-b`` 512 and a micro-batch (``-ub``) of its own:

- ``unpatched ub 512``: the reference, upstream's usual big-batch path, which every other run is compared with;
- ``unpatched ub 1`` and ``unpatched ub 16``: upstream's own batch-size variation, at the two batch sizes specstate's
  exact path replaces (one-token decodes; verification and prompt chunks of up to 16 rows);
- ``patched ub 16``: the exact path, as specstate decodes a prompt (chunks of 16 rows, each row its single decode's
  bits);
- ``patched ub 512``: the patched build's big batches, which keep llama.cpp's kernels: the same bits as the
  reference, which shows that the two builds are the same llama.cpp.

Each run writes the log-probabilities of the rows it scores (``--kl-divergence-base``; llama-perplexity's own format,
read by ``read_log_probs``), and the figures come from them as llama-perplexity's ``--kl-divergence`` computes its own,
row by row against the reference: for each run its perplexity (llama-perplexity's estimate), ``ln(PPL / PPL(ref))``
with its standard error (paired, row by row), the mean KL divergence with its standard error, its 99th percentile and
maximum, and the share of rows whose top token agrees; and for the exact path, its difference from each of upstream's
small-batch runs row by row (mean KL, mean negative log-likelihood), each with its standard error.

The exact path is within upstream's variation when its mean KL is no larger than that of the larger of upstream's
two small-batch runs, and its perplexity no further from the reference's (as ``|ln(PPL / PPL(ref))|``) than theirs,
each up to ``RESOLUTION`` standard errors of the paired difference from that run: the differences this text cannot
tell from the noise of the runs' own rounding (the tables show the point estimates; the verdict also counts the
models within by them alone).

Writes perplexity_kl.json into ``bench_models.results_dir``; ``report.py`` puts every model's into docs/benchmarks.md.
Usage: python benchmarks/perplexity_kl.py [--model M] [--chunks 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench_models import RESULTS, add_quality_options, record_quality_run, title
from llama_cpp_spec import BENCH_CACHE, ROOT, build_dir, llama_cpp_source, llama_cpp_tool

#: The text every run decodes.
TEXT = ROOT / "docs" / "verification-numerics.md"
#: Tokens a chunk (``-c``): positions past 256 take the exact attention's second chunk of cells.
CONTEXT = 512
#: specstate's toolchain file, which applies its patches to the llama.cpp tree it configures.
TOOLCHAIN = ROOT / "llama-cpp-sys-4" / "specstate.cmake"
#: The copy of the crate's llama.cpp that the patched binary is built from, and its build.
PATCHED_SOURCE = BENCH_CACHE / "patched" / "llama.cpp"
PATCHED_BUILD = BENCH_CACHE / "patched" / "build"
REFERENCE = "unpatched ub 512"
EXACT = "patched ub 16"
#: Upstream's own batch-size variation: the batch sizes the exact path replaces.
UPSTREAM_SMALL = ("unpatched ub 1", "unpatched ub 16")
SAME_BUILD = "patched ub 512"
#: Every run after the reference: its build and micro-batch.
RUNS = {name: (name.split()[0], int(name.split()[-1])) for name in (*UPSTREAM_SMALL, EXACT, SAME_BUILD)}


def unpatched_perplexity() -> Path:
    """``llama-perplexity`` of the crate's llama.cpp as it ships (the unpatched llama-bench build's tree)."""
    return llama_cpp_tool("llama-perplexity", llama_cpp_source(), build_dir("llama-bench", "x86-64-v3"))


def patched_perplexity() -> Path:
    """``llama-perplexity`` of a copy of the crate's llama.cpp with specstate's patches: configured every time, so
    that the toolchain file applies the current patch set (again from the originals if the patches changed), and
    rebuilt where they changed it."""
    if not (PATCHED_SOURCE / "CMakeLists.txt").exists():
        shutil.rmtree(PATCHED_SOURCE, ignore_errors=True)
        shutil.copytree(llama_cpp_source(), PATCHED_SOURCE)
    toolchain = (f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}",)
    return llama_cpp_tool("llama-perplexity", PATCHED_SOURCE, PATCHED_BUILD, options=toolchain, refresh=True)


# --- one run ------------------------------------------------------------------------------------------------------

#: llama-perplexity's estimate of a run's perplexity (from its own float logits) and the estimate's standard error.
FINAL = r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)"


def parse(output: str, patterns: Mapping[str, str]) -> dict[str, Any]:
    """Each figure of `patterns` from llama-perplexity's `output`: its value, and ``<name>_se`` its standard error."""
    figures: dict[str, Any] = {}
    for name, pattern in patterns.items():
        found = re.search(pattern, output)
        if found is None:
            raise ValueError(f"llama-perplexity printed no {name}:\n{output[-2000:]}")
        figures[name] = float(found.group(1))
        if found.lastindex and found.lastindex > 1:
            figures[f"{name}_se"] = float(found.group(2))
    return figures


def perplexity_run(binary: Path, model: Path, ubatch: int, chunks: int, threads: int, log_probs: Path) -> str:
    """llama-perplexity's output of one run, which writes the log-probabilities of its rows to `log_probs`."""
    command = [str(binary), "-m", str(model), "-f", str(TEXT), "-c", str(CONTEXT), "-b", str(CONTEXT)]
    command += ["-ub", str(ubatch), "-t", str(threads), "--chunks", str(chunks), "--kl-divergence-base", str(log_probs)]
    return subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout


def measure(model: Path, chunks: int, threads: int) -> dict[str, Any]:
    """The reference and every run of RUNS on `model`: each one's perplexity and seconds, then the figures of
    ``compare`` from their log-probabilities."""
    binaries = {"unpatched": unpatched_perplexity(), "patched": patched_perplexity()}
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="specstate-kl-") as scratch:
        files = {name: Path(scratch) / f"{index}.kld" for index, name in enumerate((REFERENCE, *RUNS))}
        for name, (build, ubatch) in {REFERENCE: ("unpatched", CONTEXT), **RUNS}.items():
            began = time.perf_counter()
            output = perplexity_run(binaries[build], model, ubatch, chunks, threads, files[name])
            runs[name] = parse(output, {"perplexity": FINAL}) | {"seconds": time.perf_counter() - began}
        compared = compare(read_log_probs(files[REFERENCE]), {name: read_log_probs(files[name]) for name in RUNS})
    reference = runs[REFERENCE]["perplexity"]
    for name, figures in runs.items():
        figures["ln_ratio"] = math.log(figures["perplexity"] / reference)
        figures |= compared.get(name, {})
    return {"chunks": chunks, "runs": runs}


# --- llama-perplexity's log-probability files ---------------------------------------------------------------------

#: The first bytes of a log-probability file.
MAGIC = b"_logits_"
#: Rows of every run held in memory at once while comparing.
BLOCK_ROWS = 32
#: llama-perplexity's KL divergence leaves out the reference's tokens less likely than this (log-probability).
KL_FLOOR = -16.0


@dataclass(frozen=True)
class LogProbs:
    """A file llama-perplexity writes with ``--kl-divergence-base``: the header (``_logits_``, the context, the
    vocabulary's size and the chunks, each an int32), the text's tokens (int32, chunks x context), then the rows it
    scores (of each chunk the second half, but for its last token), each a float32 scale and minimum in four uint16
    slots and one uint16 per token of the vocabulary (padded to an even count), the log-probability being
    ``scale * value + minimum``."""

    vocab: int
    #: The token each row predicts.
    next_tokens: npt.NDArray[np.int32]
    #: The rows, as stored.
    rows: npt.NDArray[np.uint16]

    def block(self, start: int, stop: int) -> npt.NDArray[np.float64]:
        """The log-probabilities of rows `start` to `stop`."""
        rows = np.asarray(self.rows[start:stop])
        scale, minimum = np.ascontiguousarray(rows[:, :4]).view(np.float32).astype(np.float64).T
        log_probs: npt.NDArray[np.float64] = scale[:, None] * rows[:, 4 : 4 + self.vocab] + minimum[:, None]
        return log_probs


def read_log_probs(path: Path) -> LogProbs:
    """The file at `path` (``LogProbs``), its size checked against its header."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(raw[: len(MAGIC)]) != MAGIC or len(raw) < len(MAGIC) + 12:
        raise ValueError(f"{path} is not a llama-perplexity log-probability file")
    context, vocab, chunks = (int(n) for n in np.frombuffer(raw[8:20], dtype=np.int32))
    first = context // 2
    scored, width, tokens_end = context - 1 - first, 2 * ((vocab + 1) // 2) + 4, 20 + 4 * chunks * context
    if min(context, vocab, chunks) < 2 or len(raw) != tokens_end + 2 * chunks * scored * width:
        raise ValueError(f"{path}: its size is not that of {chunks} chunks of {context} rows of {vocab} tokens")
    tokens = np.frombuffer(raw[20:tokens_end], dtype=np.int32).reshape(chunks, context)
    next_tokens = tokens[:, first + 1 : first + 1 + scored].reshape(-1)
    rows = np.memmap(path, dtype=np.uint16, mode="r", offset=tokens_end, shape=(chunks * scored, width))
    return LogProbs(vocab, next_tokens, rows)


def compare(reference: LogProbs, runs: Mapping[str, LogProbs]) -> dict[str, dict[str, Any]]:
    """Each run's figures against the reference (``summary``), from the rows' per-token figures."""
    if any((run.vocab, run.rows.shape) != (reference.vocab, reference.rows.shape) for run in runs.values()):
        raise ValueError("the runs scored different rows")
    if any(not np.array_equal(run.next_tokens, reference.next_tokens) for run in runs.values()):
        raise ValueError("the runs decoded different texts")
    parts: dict[str, dict[str, list[npt.NDArray[Any]]]] = {name: {} for name in [REFERENCE, *runs]}
    rows = np.arange(BLOCK_ROWS)
    for start in range(0, len(reference.next_tokens), BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, len(reference.next_tokens))
        base, scored = reference.block(start, stop), (rows[: stop - start], reference.next_tokens[start:stop])
        weights, top = np.where(base > KL_FLOOR, np.exp(base), 0.0), np.argmax(base, axis=1)
        parts[REFERENCE].setdefault("nll", []).append(-base[scored])
        for name, run in runs.items():
            log_probs = run.block(start, stop)
            figures = {
                "nll": -log_probs[scored],
                "kl": (weights * (base - log_probs)).sum(axis=1),
                "same_top": np.argmax(log_probs, axis=1) == top,
            }
            for key, values in figures.items():
                parts[name].setdefault(key, []).append(values)
    per_row = {name: {key: np.concatenate(values) for key, values in run.items()} for name, run in parts.items()}
    return summary(per_row)


def mean_and_se(values: npt.NDArray[Any]) -> tuple[float, float]:
    """The mean of `values` and its standard error."""
    return float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values)))


def summary(per_row: Mapping[str, Mapping[str, npt.NDArray[Any]]]) -> dict[str, dict[str, Any]]:
    """Each run's figures from its rows' (and the reference's): the standard error of ``ln(PPL / PPL(ref))`` (the
    mean of the rows' differences of negative log-likelihood), mean KL with its standard error, 99th percentile and
    maximum, the share of rows whose top token is the reference's (%); for the exact path also ``paired``, its
    difference from each of upstream's small-batch runs, row by row: mean KL and mean negative log-likelihood, each
    with its standard error."""
    reference = per_row[REFERENCE]
    figures: dict[str, dict[str, Any]] = {}
    for name, rows in per_row.items():
        if name == REFERENCE:
            continue
        kl_mean, kl_se = mean_and_se(rows["kl"])
        figures[name] = {
            "paired_ln_ratio_se": mean_and_se(rows["nll"] - reference["nll"])[1],
            "kl_mean": kl_mean,
            "kl_mean_se": kl_se,
            "kl_p99": float(np.percentile(rows["kl"], 99)),
            "kl_max": float(np.max(rows["kl"])),
            "same_top": 100.0 * float(np.mean(rows["same_top"])),
        }
    if EXACT in per_row:
        figures[EXACT]["paired"] = {
            name: paired_difference(per_row[EXACT], per_row[name]) for name in UPSTREAM_SMALL if name in per_row
        }
    return figures


def paired_difference(run: Mapping[str, npt.NDArray[Any]], other: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]:
    """`run`'s mean KL and negative log-likelihood minus `other`'s, row by row, with their standard errors."""
    kl, kl_se = mean_and_se(run["kl"] - other["kl"])
    nll, nll_se = mean_and_se(run["nll"] - other["nll"])
    return {"kl_mean": kl, "kl_mean_se": kl_se, "nll_mean": nll, "nll_mean_se": nll_se}


# --- the verdict --------------------------------------------------------------------------------------------------

#: Standard errors of the exact path's paired difference from an upstream run that its excess over that run may
#: reach and still count as within: what the text cannot tell apart from the runs' own noise.
RESOLUTION = 2.0


def excess(result: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """For each criterion, how far the exact path is past the larger of upstream's two small-batch runs (its mean KL;
    its ``|ln(PPL / PPL(ref))|``), and the standard error of its paired difference from that run."""
    runs = result["runs"]
    exact = runs[EXACT]
    kl_bound = max(UPSTREAM_SMALL, key=lambda name: runs[name]["kl_mean"])
    ppl_bound = max(UPSTREAM_SMALL, key=lambda name: abs(runs[name]["ln_ratio"]))
    return {
        "kl_mean": (exact["kl_mean"] - runs[kl_bound]["kl_mean"], exact["paired"][kl_bound]["kl_mean_se"]),
        "perplexity": (
            abs(exact["ln_ratio"]) - abs(runs[ppl_bound]["ln_ratio"]),
            exact["paired"][ppl_bound]["nll_mean_se"],
        ),
    }


def within(result: Mapping[str, Any], resolution: float = RESOLUTION) -> dict[str, bool]:
    """Whether the exact path stays within upstream's own batch-size variation by each criterion: its excess
    (``excess``) at most `resolution` standard errors (0: no excess at all)."""
    return {key: past <= resolution * se for key, (past, se) in excess(result).items()}


# --- tables -------------------------------------------------------------------------------------------------------


def load_all(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every model's perplexity_kl.json under `directory`, SmolLM2's first, then the others by file size."""
    files = [directory / "perplexity_kl.json", *sorted(directory.glob("models/*/perplexity_kl.json"))]
    results = [json.loads(path.read_text()) for path in files if path.exists()]
    return sorted(results, key=lambda r: (title(r["model"]) != title(None), r.get("model_bytes", 0)))


def _run_cells(run: Mapping[str, Any]) -> str:
    """A run's cells: perplexity, its ln ratio to the reference's with the standard error of that ratio, mean KL with
    its standard error, p99 and max KL, top-token agreement."""
    if "kl_mean" not in run:
        return f"{run['perplexity']:.3f} | (reference) | | | | "
    ratio = f"{run['ln_ratio']:+.4f} ± {run['paired_ln_ratio_se']:.4f}"
    kl = f"{run['kl_mean']:.2e} ± {run['kl_mean_se']:.1e} | {run['kl_p99']:.2e} | {run['kl_max']:.2e}"
    return f"{run['perplexity']:.3f} | {ratio} | {kl} | {run['same_top']:.2f}%"


def tables(results: Iterable[Mapping[str, Any]]) -> str:
    """Two Markdown tables: every model's runs, then the exact path's paired differences from upstream's two
    small-batch runs."""
    results = list(results)
    lines = [
        "| model | run | perplexity | ln(PPL / PPL(ref)) ± s.e. | mean KL ± s.e. | p99 KL | max KL | same top token |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        for name, run in result["runs"].items():
            lines.append(f"| {result['model']} | {name} | {_run_cells(run)} |")
    lines += [
        "",
        f"| model | {EXACT} minus | mean KL ± s.e. | ln(PPL) ± s.e. |",
        "| --- | --- | ---: | ---: |",
    ]
    for result in results:
        for name, difference in result["runs"][EXACT]["paired"].items():
            kl = f"{difference['kl_mean']:+.2e} ± {difference['kl_mean_se']:.1e}"
            nll = f"{difference['nll_mean']:+.4f} ± {difference['nll_mean_se']:.4f}"
            lines.append(f"| {result['model']} | {name} | {kl} | {nll} |")
    return "\n".join(lines)


def verdict(results: Sequence[Mapping[str, Any]]) -> str:
    """On how many models the exact path is within upstream's variation (naming the criteria missed elsewhere, and
    on how many it is within by the point estimates alone), and on how many the patched build's big batches are the
    reference's bits."""
    names = {"kl_mean": "mean KL", "perplexity": "perplexity"}
    missed = []
    for result in results:
        failed = [names[key] for key, held in within(result).items() if not held]
        if failed:
            missed.append(f"{result['model']}: {' and '.join(failed)}")
    strictly = sum(all(within(result, resolution=0.0).values()) for result in results)
    same = sum(result["runs"][SAME_BUILD]["same_top"] == 100.0 for result in results)
    n = len(results)
    text = "Against the same llama.cpp unpatched, the exact path is within upstream's own batch-size variation on "
    text += f"{n - len(missed)} of {n} models" + (f" (not on {'; '.join(missed)})" if missed else "")
    text += f"; by the point estimates alone on {strictly} of {n}"
    if strictly < n - len(missed):
        text += f", past them elsewhere by at most {RESOLUTION:g} standard errors of the paired difference"
    return text + f"; the patched build's big batches agree with the reference on every top token on {same} of {n}"


def kl_fields(results: list[dict[str, Any]]) -> dict[str, str]:
    """The fields of docs/benchmarks.md's subsection (``report.py`` fills the template with them)."""
    if not results:
        return {"kl_setup": "not measured yet", "kl_tables": "", "kl_verdict": "`make bench-quality`"}
    dates = sorted(r["date"] for r in results)
    first = results[0]
    setup = f"{first['chunks']} chunks of {CONTEXT} tokens, {first['threads']} threads, {dates[0]} to {dates[-1]}"
    return {"kl_setup": setup, "kl_tables": tables(results), "kl_verdict": verdict(results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_quality_options(parser, "perplexity_kl.json")
    parser.add_argument("--chunks", type=int, default=8, help="chunks of the text (default %(default)s)")
    args = parser.parse_args()
    record = functools.partial(measure, chunks=args.chunks, threads=args.threads)
    results, _ = record_quality_run(args, TEXT, ROOT, "perplexity_kl.json", record)
    print(tables([results]))
    print(verdict([results]))


if __name__ == "__main__":
    main()
