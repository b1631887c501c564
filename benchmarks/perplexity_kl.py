"""Part of ``make bench-quality``: specstate's patched llama.cpp against the same llama.cpp unpatched, with llama.cpp's
own ``llama-perplexity --kl-divergence``.

Both binaries are built here from the llama.cpp source inside the pinned llama-cpp-sys-4 crate, with the same
x86-64-v3 kernel flags as every peer: ``unpatched`` as it ships (the llama-bench build of ``llama_cpp_spec.py``),
``patched`` from a copy of it configured with specstate's toolchain file (``llama-cpp-sys-4/specstate.cmake``, which
applies ``llama-cpp-sys-4/patches``), so the two differ by specstate's patches alone. Each run decodes the same text
(``--chunks`` chunks of ``-c`` 512 tokens of ``docs/verification-numerics.md``, llama.cpp's own tokenization) with
``-b`` 512 and a micro-batch (``-ub``) of its own:

- ``unpatched ub 512``: the reference, upstream's usual big-batch path; its log-probabilities are kept
  (``--kl-divergence-base``) and every other run is compared with them;
- ``unpatched ub 1`` and ``unpatched ub 16``: upstream's own batch-size variation, at the two batch sizes specstate's
  exact path replaces (one-token decodes; verification and prompt chunks of up to 16 rows);
- ``patched ub 16``: the exact path, as specstate decodes a prompt (chunks of 16 rows, each row its single decode's
  bits);
- ``patched ub 512``: the patched build's big batches, which keep llama.cpp's kernels: the same bits as the
  reference, which shows that the two builds are the same llama.cpp.

For each run: the perplexity of the text (from its own logits), its ratio to the reference's as ``ln(PPL / PPL(ref))``
with the standard error llama-perplexity gives that ratio (paired, token by token), and, against the reference,
llama-perplexity's mean KL divergence (with its standard error), 99th percentile and maximum, and the share of rows
whose top token agrees.
The exact path is within upstream's variation when its mean KL is no larger than that of the larger of upstream's
two small-batch runs, and its perplexity no further from the reference's (as ``|ln(PPL / PPL(ref))|``) than theirs.

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
from pathlib import Path
from typing import Any

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

#: The figures read from llama-perplexity's output: name, pattern (value, and standard error where it gives one).
FIGURES = {
    "perplexity": r"Mean PPL\(Q\)\s*:\s*([\d.]+) ±\s*([\d.]+)",
    "paired_ln_ratio": r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*(-?[\d.]+) ±\s*([\d.]+)",
    "kl_mean": r"Mean\s+KLD:\s*(-?[\d.]+) ±\s*([\d.]+)",
    "kl_p99": r"99\.0%\s+KLD:\s*(-?[\d.]+)",
    "kl_max": r"Maximum KLD:\s*(-?[\d.]+)",
    "same_top": r"Same top p:\s*([\d.]+) ±\s*([\d.]+) %",
}
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


def perplexity_run(binary: Path, model: Path, ubatch: int, chunks: int, threads: int, base: Path, kl: bool) -> str:
    """llama-perplexity's output of one run: writing the reference's log-probabilities to `base`, or (`kl`)
    comparing with them."""
    command = [str(binary), "-m", str(model), "-f", str(TEXT), "-c", str(CONTEXT), "-b", str(CONTEXT)]
    command += ["-ub", str(ubatch), "-t", str(threads), "--chunks", str(chunks), "--kl-divergence-base", str(base)]
    command += ["--kl-divergence"] if kl else []
    return subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout


def measure(model: Path, chunks: int, threads: int) -> dict[str, Any]:
    """The reference and every run of RUNS on `model`, each with its seconds."""
    binaries = {"unpatched": unpatched_perplexity(), "patched": patched_perplexity()}
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="specstate-kl-") as scratch:
        base = Path(scratch) / "reference.kld"
        began = time.perf_counter()
        output = perplexity_run(binaries["unpatched"], model, CONTEXT, chunks, threads, base, kl=False)
        runs[REFERENCE] = parse(output, {"perplexity": FINAL}) | {"seconds": time.perf_counter() - began}
        for name, (build, ubatch) in RUNS.items():
            began = time.perf_counter()
            output = perplexity_run(binaries[build], model, ubatch, chunks, threads, base, kl=True)
            runs[name] = parse(output, FIGURES) | {"seconds": time.perf_counter() - began}
    reference = runs[REFERENCE]["perplexity"]
    for figures in runs.values():
        figures["ln_ratio"] = math.log(figures["perplexity"] / reference)
    return {"chunks": chunks, "runs": runs}


def within(result: Mapping[str, Any]) -> dict[str, bool]:
    """Whether the exact path stays within upstream's own batch-size variation (module documentation)."""
    runs = result["runs"]
    return {
        "kl_mean": runs[EXACT]["kl_mean"] <= max(runs[name]["kl_mean"] for name in UPSTREAM_SMALL),
        "perplexity": abs(runs[EXACT]["ln_ratio"]) <= max(abs(runs[name]["ln_ratio"]) for name in UPSTREAM_SMALL),
    }


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
    """One Markdown table of every model's runs, and a line per model with the verdict of each criterion."""
    lines = [
        "| model | run | perplexity | ln(PPL / PPL(ref)) ± s.e. | mean KL ± s.e. | p99 KL | max KL | same top token |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        for name, run in result["runs"].items():
            lines.append(f"| {result['model']} | {name} | {_run_cells(run)} |")
    return "\n".join(lines)


def verdict(results: Sequence[Mapping[str, Any]]) -> str:
    """On how many models the exact path is within upstream's variation (naming the criteria missed elsewhere), and
    on how many the patched build's big batches are the reference's bits."""
    names = {"kl_mean": "mean KL", "perplexity": "perplexity"}
    missed = []
    for result in results:
        failed = [names[key] for key, held in within(result).items() if not held]
        if failed:
            missed.append(f"{result['model']}: {' and '.join(failed)}")
    same = sum(result["runs"][SAME_BUILD]["same_top"] == 100.0 for result in results)
    n = len(results)
    text = "Against the same llama.cpp unpatched, the exact path is within upstream's own batch-size variation on "
    text += f"{n - len(missed)} of {n} models" + (f" (not on {'; '.join(missed)})" if missed else "")
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
