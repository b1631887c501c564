"""Speculation that pays, measured in interleaved rounds (``make bench-speculation``; part of ``make bench``).

On each prompt (story: text that does not repeat; code: rewrite a given file; quotes: quote a given notice;
edit: rename a function in a given file, the answer mostly the file copied) every contender generates the same
number of greedy tokens once per round, all contenders back to back with the order rotating
(``specstate.bench.interleave``), so each ratio is the median of per-round pairs measured in the same stretch
of time, printed with its range. Contenders: plain decoding (``none``); ``ngram`` with fixed draft lengths 4,
8 and 16; ``ngram`` with the adaptive draft policy (at most 16: MAX_DRAFT); llama-cpp-python's prompt lookup
(``num_pred_tokens=10``, a persistent process of the benchmark's peer venv); llama.cpp's own n-gram
speculation (``common_speculative``, ngram-simple with 4-token n-grams and drafts of up to 16, through the
driver in ``benchmarks/llama_spec``), built twice: with specstate's x86-64-v3 kernel flags and with
``GGML_NATIVE`` (this CPU's own, VNNI or AVX-512 included). With a draft model, ``draft`` at the generator's
fixed draft length and ``draft adaptive`` (the adaptive policy, at most 15). ``--contenders`` measures some of them
(``none`` always). Everything is built before the first measurement.
The column "equal to none" counts a contender's tokens equal to plain greedy's from the first on (the last
round's run of each): every specstate mode's should be all of them, since specstate's llama.cpp patch gives
each verified row exactly its single decode's logits.

The bound printed for the adaptive policy is what its own cost curve and the run's acceptance allow:
``max_k (1 + a + ... + a^k) / cost(k + 1)`` with ``a`` = accepted / drafted, the best rate a policy
could reach if every round had a draft of that quality.

Usage: python benchmarks/speculation.py [--rounds 5] [--threads 2] [--tokens 160] [--skip-peers] [--model M]
    [--draft-model D] [--prompts NAME ...] [--contenders NAME ...]
Writes speculation.json and speculation.md into benchmarks/results, or, for a run on anything but SmolLM2 alone,
under benchmarks/results/models/ (``bench_models.results_dir``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from bench_models import add_model_options, resolve, results_dir, title
from peer_venv import peer_python
from specstate import Generator, Model
from specstate._defaults import N_BATCH
from specstate.bench import (
    CODE_PROMPT,
    EDIT_PROMPT,
    QUOTE_PROMPT,
    STORY_PROMPT,
    interleave,
    pair_ratio,
    timed_generation,
)

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = {"story": STORY_PROMPT, "code": CODE_PROMPT, "quotes": QUOTE_PROMPT, "edit": EDIT_PROMPT}
#: The longest draft a generator verifies at its default ``n_batch`` (the most rows that decode exactly): a
#: verification of ``n_draft + 1`` rows must fit one batch, so ``n_draft`` is at most ``n_batch - 1``.
MAX_DRAFT = N_BATCH - 1
FIXED_LENGTHS = (4, 8, MAX_DRAFT)
ADAPTIVE = "ngram adaptive"
NONE = "none"
LOOKUP = "llama-cpp-python prompt lookup"
LLAMA_CPP = "llama.cpp ngram-simple"
LLAMA_CPP_NATIVE = "llama.cpp ngram-simple, native build"
#: llama.cpp's draft-model speculation (``draft-simple``, the driver's x86-64-v3 build), a contender only where a
#: benchmark puts its driver among the peers under this name and gives a draft model (``benchmarks/real_models.py``).
LLAMA_CPP_DRAFT = "llama.cpp draft-simple"
#: Its draft length: llama.cpp's default (``common_params_speculative_draft.n_max``).
LLAMA_CPP_DRAFT_MAX = 3
DRAFT = "draft"
DRAFT_ADAPTIVE = "draft adaptive"
#: The draft-model contenders' settings: the generator's fixed draft length, and the adaptive policy as for ngram.
DRAFTS: dict[str, dict[str, Any]] = {DRAFT: {}, DRAFT_ADAPTIVE: {"n_draft": MAX_DRAFT, "draft_policy": "adaptive"}}
#: The peer configurations, and the kernel build of each llama.cpp one.
PEERS = (LOOKUP, LLAMA_CPP, LLAMA_CPP_NATIVE)
LLAMA_CPP_BUILDS = {LLAMA_CPP: "x86-64-v3", LLAMA_CPP_NATIVE: "native"}
#: Issue 36's goals for `ngram` adaptive against `none`, per prompt (on every prompt also >= 1.0 of the fastest peer).
GOALS_X_NONE = {"story": 1.0, "code": 1.3, "quotes": 1.8, "edit": 2.0}
#: llama.cpp's ngram-simple looks up 12-token n-grams by default and then never drafts on the story prompt;
#: it runs here with specstate's lookup length (4) and drafts of up to 16 tokens, like for like.
LLAMA_CPP_SIZES = (4, 16)


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def adaptive_bound(generator: Generator) -> float | None:
    """Tokens per second the generator's cost curve allows at its measured per-token acceptance."""
    curve = generator.cost_curve
    if not curve or not generator.drafted:
        return None
    alpha = generator.accepted / generator.drafted
    best, expected, power = 0.0, 0.0, 1.0
    for cost in curve:  # draft lengths 0, 1, 2, ...: a batch of one more row each
        expected += power
        power *= alpha
        best = max(best, expected / cost)
    return best * 1e6


class Peer:
    """llama-cpp-python measuring one generation per request, in the benchmark's peer venv."""

    def __init__(self, python: Path, model: Path, threads: int) -> None:
        script = ROOT / "benchmarks" / "peer_llama_cpp_python.py"
        self.process = subprocess.Popen(
            [str(python), str(script), "--serve", str(model), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self, llm: str, prompt: str, tokens: int) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps({"llm": llm, "prompt": prompt, "tokens": tokens}) + "\n")
        stdin.flush()
        answer: dict[str, Any] = json.loads(stdout.readline())
        return answer

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def close(self) -> None:
        self._pipes()[0].close()
        self.process.wait(timeout=60)


class Contenders:
    """Every contender of one prompt as a measurement, keeping what the last run of each showed."""

    def __init__(
        self,
        model: Model,
        prompt: str,
        args: argparse.Namespace,
        peers: dict[str, Any],
        draft_model: Model | None,
        drafts: tuple[str, ...] = tuple(DRAFTS),
    ) -> None:
        self.model, self.prompt, self.args, self.peers = model, prompt, args, peers
        self.draft_model, self.drafts = draft_model, drafts
        self.last: dict[str, dict[str, Any]] = {}
        self.bounds: list[float | None] = []

    def specstate(self, name: str, **settings: Any) -> Callable[[], float]:
        def once() -> float:
            speed, generator = timed_generation(
                self.model, self.prompt, self.args.tokens, n_threads=self.args.threads, **settings
            )
            self.last[name] = {"acceptance": generator.acceptance_rate, "tokens": generator.tokens}
            if name == ADAPTIVE:
                self.bounds.append(adaptive_bound(generator))
                self.last[name]["cost_curve"] = generator.cost_curve
            return speed

        return once

    def lookup(self) -> float:
        answer = self.peers["llama_cpp_python"].measure("prompt_lookup", self.prompt, self.args.tokens)
        self.last[LOOKUP] = {"tokens": answer["tokens"]}
        return float(answer["tokens_per_s"])

    def llama_cpp(self, name: str) -> Callable[[], float]:
        """llama.cpp's ngram-simple through the driver of peer configuration `name` (a key of LLAMA_CPP_BUILDS)."""
        from llama_cpp_spec import llama_cpp_ngram

        def once() -> float:
            figures = llama_cpp_ngram(
                self.peers[name],
                self.peers["model"],
                self.prompt,
                self.args.tokens,
                self.args.threads,
                16,
                sizes=LLAMA_CPP_SIZES,
            )
            accepted, drafted = figures["accepted"], figures["drafted"]
            self.last[name] = {"acceptance": accepted / drafted if drafted else 0.0, "tokens": figures["tokens"]}
            return float(figures["tokens_per_s"])

        return once

    def llama_cpp_draft(self) -> float:
        """llama.cpp's draft-model speculation with the draft model, through the driver under LLAMA_CPP_DRAFT."""
        from llama_cpp_spec import llama_cpp_ngram

        assert self.draft_model is not None
        figures = llama_cpp_ngram(
            self.peers[LLAMA_CPP_DRAFT],
            self.peers["model"],
            self.prompt,
            self.args.tokens,
            self.args.threads,
            LLAMA_CPP_DRAFT_MAX,
            draft_model=Path(self.draft_model.path),
        )
        accepted, drafted = figures["accepted"], figures["drafted"]
        self.last[LLAMA_CPP_DRAFT] = {"acceptance": accepted / drafted if drafted else 0.0, "tokens": figures["tokens"]}
        return float(figures["tokens_per_s"])

    def all(self) -> dict[str, Callable[[], float]]:
        contenders = {NONE: self.specstate(NONE, mode="none")}
        for length in FIXED_LENGTHS:
            contenders[f"ngram k={length}"] = self.specstate(f"ngram k={length}", mode="ngram", n_draft=length)
        contenders[ADAPTIVE] = self.specstate(ADAPTIVE, mode="ngram", n_draft=MAX_DRAFT, draft_policy="adaptive")
        if self.draft_model is not None:
            for name in self.drafts:
                contenders[name] = self.specstate(name, mode="draft", draft_model=self.draft_model, **DRAFTS[name])
        if "llama_cpp_python" in self.peers:
            contenders[LOOKUP] = self.lookup
        for name in LLAMA_CPP_BUILDS:
            if name in self.peers:
                contenders[name] = self.llama_cpp(name)
        if LLAMA_CPP_DRAFT in self.peers and self.draft_model is not None:
            contenders[LLAMA_CPP_DRAFT] = self.llama_cpp_draft
        chosen = getattr(self.args, "contenders", None)
        return {name: measure for name, measure in contenders.items() if chosen is None or name in (NONE, *chosen)}


def agreement(a: list[int], b: list[int]) -> int:
    """Tokens at the start of `a` and `b` that are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def prompt_figures(
    model: Model,
    prompt: str,
    args: argparse.Namespace,
    peers: dict[str, Any],
    draft_model: Model | None = None,
    drafts: tuple[str, ...] = tuple(DRAFTS),
) -> dict[str, Any]:
    """Every contender on `prompt` in interleaved rounds (``args``: rounds, threads, tokens, and optionally
    ``contenders``, the names to measure besides ``none``); with `draft_model`, the `drafts` contenders too."""
    contenders = Contenders(model, prompt, args, peers, draft_model, drafts)
    speeds = interleave(contenders.all(), args.rounds)
    rows: dict[str, Any] = {}
    plain_tokens = contenders.last[NONE]["tokens"]
    for name, values in speeds.items():
        row = {"tokens_per_s": statistics.median(values), "runs": values}
        row["x_none"] = vars(pair_ratio(values, speeds[NONE]))
        for peer in PEERS:
            if peer in speeds:
                row[f"x_{peer}"] = vars(pair_ratio(values, speeds[peer]))
        last = contenders.last.get(name, {})
        row["acceptance"] = last.get("acceptance")
        row["tokens_equal_to_none"] = agreement(last.get("tokens", []), plain_tokens)
        row["tokens_of_none"] = len(plain_tokens)
        rows[name] = row
    if ADAPTIVE in rows:
        rows[ADAPTIVE].update(adaptive_figures(rows, speeds, contenders))
    return rows


def adaptive_figures(rows: dict[str, Any], speeds: dict[str, list[float]], contenders: Contenders) -> dict[str, Any]:
    """The adaptive policy against the best fixed length and the fastest peer (those measured), and its bound."""
    adaptive = speeds[ADAPTIVE]
    figures: dict[str, Any] = {}
    fixed = [k for k in FIXED_LENGTHS if f"ngram k={k}" in rows]
    if fixed:
        best = max(fixed, key=lambda k: rows[f"ngram k={k}"]["tokens_per_s"])
        figures["best_fixed"] = best
        figures["x_best_fixed"] = vars(pair_ratio(adaptive, speeds[f"ngram k={best}"]))
    bounds = [b for b in contenders.bounds[-len(adaptive) :] if b]
    if len(bounds) == len(adaptive):
        figures["bound_tokens_per_s"] = statistics.median(bounds)
        figures["x_bound"] = vars(pair_ratio(adaptive, bounds))
    figures["cost_curve_us"] = contenders.last[ADAPTIVE]["cost_curve"]
    measured = [peer for peer in PEERS if peer in speeds]
    if measured:
        fastest = max(measured, key=lambda peer: rows[peer]["tokens_per_s"])
        figures["fastest_peer"] = fastest
        figures["x_fastest_peer"] = rows[ADAPTIVE][f"x_{fastest}"]
    return figures


def build_peers(args: argparse.Namespace, model_path: Path) -> dict[str, Any]:
    """Build (once) and start the peers, before any measurement."""
    if args.skip_peers:
        return {}
    from llama_cpp_spec import build_llama_spec

    log("building the peers (once; several minutes on 2 cores)")
    drivers = {name: build_llama_spec(kernels) for name, kernels in LLAMA_CPP_BUILDS.items()}
    return {"llama_cpp_python": Peer(peer_python(), model_path, args.threads), **drivers, "model": model_path}


def ratio_text(entry: dict[str, float] | None) -> str:
    return "" if entry is None else f"x{entry['median']:.2f} ({entry['low']:.2f}-{entry['high']:.2f})"


def tokens_of_none(prompt: dict[str, Any], row: dict[str, Any]) -> int:
    """How many tokens plain greedy (``none``) generated on a prompt: a row's ``tokens_of_none``, or, in results
    written before rows carried it, ``none``'s own agreement with itself."""
    total: int = row.get("tokens_of_none", prompt[NONE]["tokens_equal_to_none"])
    return total


def equal_to_none(prompt: dict[str, Any], row: dict[str, Any]) -> str:
    """How many of a contender's tokens equal plain greedy's (``none``), from the first, as ``n/total``."""
    return f"{row['tokens_equal_to_none']}/{tokens_of_none(prompt, row)}"


def exactness(spec: dict[str, Any]) -> tuple[str, str, str, str]:
    """(measure, value, target, verdict): every specstate contender's tokens equal plain greedy's, on every prompt."""
    upstream = (*PEERS, LLAMA_CPP_DRAFT)
    rows = [(prompt, row) for prompt in spec.values() for name, row in prompt.items() if name not in upstream]
    exact = [row for prompt, row in rows if row["tokens_equal_to_none"] == tokens_of_none(prompt, row)]
    verdict = "met" if len(exact) == len(rows) else "**missed**"
    return ("specstate runs: every token equal to none", f"{len(exact)} of {len(rows)}", "all", verdict)


def targets(spec: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, value, target, verdict) for speculation's targets, from each prompt's figures."""
    rows = []

    def add(measure: str, entry: dict[str, float] | None, target: float) -> None:
        verdict = "not measured" if entry is None else ("met" if entry["median"] >= target else "**missed**")
        rows.append((measure, ratio_text(entry), f">= {target}", verdict))

    # Issue 36's goals: never slower than plain decoding or the fastest peer, well faster where text repeats.
    measured = {name: rows for name, rows in spec.items() if ADAPTIVE in rows}
    for name, target in GOALS_X_NONE.items():
        if name in measured:
            add(f"{name}: ngram adaptive / none", measured[name][ADAPTIVE]["x_none"], target)
    for name in measured:
        adaptive = measured[name][ADAPTIVE]
        fastest = f" ({adaptive['fastest_peer']})" if "fastest_peer" in adaptive else ""
        add(f"{name}: ngram adaptive / fastest peer{fastest}", adaptive.get("x_fastest_peer"), 1.0)
    rows.append(exactness(spec))
    return rows


def targets_table(prompts: dict[str, Any]) -> list[str]:
    """The targets as markdown table lines."""
    return [
        "| measure | median pair ratio (range) | target | verdict |",
        "| --- | ---: | ---: | --- |",
        *(f"| {m} | {v} | {t} | {d} |" for m, v, t, d in targets(prompts)),
    ]


def contenders_table(prompts: dict[str, Any]) -> list[str]:
    """Every contender on every prompt as markdown table lines."""
    lines = [
        "| prompt | contender | tokens/s | acceptance | vs none | vs prompt lookup | vs llama.cpp "
        "| vs llama.cpp native | equal to none |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, rows in prompts.items():
        for contender, row in rows.items():
            acceptance = "" if row.get("acceptance") is None else f"{row['acceptance']:.0%}"
            lines.append(
                f"| {name} | {contender} | {row['tokens_per_s']:.1f} | {acceptance} | {ratio_text(row['x_none'])} "
                + "".join(f"| {ratio_text(row.get(f'x_{peer}'))} " for peer in PEERS)
                + f"| {equal_to_none(rows, row)} |"
            )
        adaptive = rows.get(ADAPTIVE, {})
        if "bound_tokens_per_s" in adaptive:
            bound = adaptive["bound_tokens_per_s"]
            lines.append(f"| {name} | bound of the adaptive policy | {bound:.1f} | | | | | | |")
    return lines


def draft_text(results: dict[str, Any]) -> str:
    """``, draft model FILE`` for results of a run with a draft model named by ``--draft-model``, else nothing."""
    return f", draft model {results['draft_model']}" if results.get("draft_model") else ""


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{title(results.get('model'))}{draft_text(results)}, {results['threads']} threads, {results['tokens']} "
        "greedy tokens, "
        f"{results['rounds']} interleaved rounds, {results['date']}",
        "",
        *targets_table(results["prompts"]),
        "",
        *contenders_table(results["prompts"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--skip-peers", action="store_true", help="no llama-cpp-python or llama.cpp")
    add_model_options(parser, draft="adds the draft and draft adaptive contenders")
    parser.add_argument("--out", type=Path, help="results path without suffix (default: in bench_models.results_dir)")
    parser.add_argument("--prompts", nargs="+", choices=list(PROMPTS), default=list(PROMPTS))
    names = [f"ngram k={k}" for k in FIXED_LENGTHS] + [ADAPTIVE, *DRAFTS, *PEERS]
    parser.add_argument("--contenders", nargs="+", choices=names, help="measure these besides none (default: all)")
    args = parser.parse_args()
    path = resolve(args.model)
    draft = Model(resolve(args.draft_model)) if args.draft_model else None
    wanted = set(PEERS) if args.contenders is None else set(args.contenders) & set(PEERS)
    peers = build_peers(argparse.Namespace(skip_peers=args.skip_peers or not wanted, threads=args.threads), path)
    model = Model(path)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "model": path.name,
        "draft_model": draft and Path(draft.path).name,
        "threads": args.threads,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "prompts": {},
    }
    try:
        for name in args.prompts:
            log(f"{name}: {args.rounds} interleaved rounds")
            results["prompts"][name] = prompt_figures(model, PROMPTS[name], args, peers, draft_model=draft)
    finally:
        if "llama_cpp_python" in peers:
            peers["llama_cpp_python"].close()
    print(write_results(results, args.out or results_dir(args.model, args.draft_model) / "speculation"))


def write_results(results: dict[str, Any], out: Path) -> str:
    """`out`.json and `out`.md (the page's speculation section reads the JSON); returns the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    out.with_suffix(".md").write_text(text)
    return text


if __name__ == "__main__":
    main()
