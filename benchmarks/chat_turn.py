"""The next turn of a long conversation: restoring its checkpoint against re-prefilling its history.

A fixed conversation (a system message and six user/assistant exchanges written out here, not
generated, ending with a user question) is rendered with SmolLM2-135M-Instruct's chat template and
answered greedily (turn 1, ``--turn1-tokens`` tokens). The generator then holds about 2,000 tokens;
it is saved to a checkpoint file. The next user question (turn 2) is then answered in two ways:

* **restore**: ``Generator.restore(path)`` (file read, validation, new contexts, state load) and
  ``stream_chat(question)``, which decodes only the new turn's tokens after those held;
* **re-prefill**: a new ``Generator`` and ``stream_chat(whole conversation + question)``, which
  renders the conversation again and prefills all of it.

For each path the clock (``time.perf_counter``) runs from before the restore (or the new
``Generator``) to the first text piece the reply yields ("first text"), and to the end of a
``--reply-tokens`` reply ("reply"). The two paths run as interleaved pairs (restore, re-prefill,
restore, ...), one warm-up pair and then ``--pairs`` measured pairs, in ``none`` and ``ngram`` modes
with ``--threads`` threads. Reported: medians, and the median, min and max of the per-pair ratios
re-prefill / restore. Facts checked: the restored reply against the reply of the uninterrupted
generator (greedy: they should be equal), and the re-prefilled reply against it (it may differ,
since the history is re-tokenized from text).

Usage: ``python benchmarks/chat_turn.py [--pairs 5] [--threads 1] [--json benchmarks/results/chat_turn.json]``
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specstate import Generator, Model
from specstate._typing import Mode
from specstate.chat import Messages
from specstate.smollm2 import smollm2_path

MODES: tuple[Mode, ...] = ("none", "ngram")
N_CTX = 4096

SYSTEM = (
    "You are a careful senior software engineer who helps people plan and review small backend services. "
    "Answer concretely, name the trade-offs, and prefer simple designs that a small team can operate."
)

EXCHANGES: tuple[tuple[str, str], ...] = (
    (
        "I run a small bakery chain with four shops and I want to replace our spreadsheet of flour, sugar, "
        "butter and packaging stock with a tiny web service. Each shop manager should record deliveries and "
        "daily usage from a phone, and I want a weekly report of what to reorder. We have one part-time "
        "developer who knows Python. Where would you start?",
        "Start with the data, not the screens. Your domain has four nouns: shops, items (flour, sugar, butter, "
        "boxes), stock movements, and suppliers. Model every change in stock as a movement row: a delivery adds "
        "a quantity, a day's usage subtracts one, and a stock count sets a correction. The current stock of an "
        "item in a shop is then the sum of its movements, which gives you an audit trail for free and makes "
        "mistakes easy to fix with a compensating row instead of an edit.\n\n"
        "For a part-time Python developer I would pick a single Django application with its admin for the "
        "office, a few plain HTML forms for the phones, and PostgreSQL or even SQLite at first. Four shops "
        "writing a handful of rows a day is nothing; the risk is not load but complexity. Avoid a separate "
        "frontend framework, message queues and microservices. Host it on one small managed instance with "
        "daily database backups that you have actually restored once.\n\n"
        "The weekly report is a query: usage over the last four weeks per item and shop, current stock, and a "
        "reorder point per item. Flag items whose stock will not cover the supplier's lead time plus a safety "
        "margin. Build that report first as a page your developer can check against the spreadsheet.",
    ),
    (
        "The managers are not very technical and the shops have patchy mobile reception, especially the one in "
        "the old market hall. What happens if someone records a delivery while offline, or two people record "
        "the same delivery twice?",
        "Both are normal cases, so design for them rather than treating them as errors. For poor reception, "
        "keep the phone forms tiny so they load on a weak signal, and let the browser keep a draft: a small "
        "script can store the unsent form in local storage and submit it when the connection returns. Show a "
        "clear banner that says the entry is saved on the phone but not yet sent, because a silent failure is "
        "what makes people stop trusting the system.\n\n"
        "For duplicates, give each submission an identifier generated on the phone when the form opens, and "
        "make the server store it with a unique constraint. A retry of the same submission then becomes a "
        "harmless no-op instead of a second delivery. Two different people recording the same physical "
        "delivery is a business problem rather than a technical one: attach the supplier's delivery note "
        "number as an optional field and warn, not block, when the same note number appears twice in a "
        "shop within a few days. The manager can then confirm or cancel.\n\n"
        "Finally, never let the phone decide the current stock. The phone sends movements; the server computes "
        "totals. That way an old cached page can never overwrite a newer number, and conflicts simply do not "
        "arise from concurrent edits.",
    ),
    (
        "Our accountant also wants to know the cost of what we used each month, but prices change with every "
        "delivery and butter in particular has become much more expensive this year. How should we value the "
        "stock and the usage?",
        "Record the price on the delivery movement, per unit, exactly as it appears on the invoice, and never "
        "store a price on the item itself except as a convenience default. With prices on deliveries you can "
        "choose a valuation method later, and your accountant will probably have an opinion, so ask before "
        "you build it.\n\n"
        "The two common choices are first in, first out and weighted average cost. First in, first out treats "
        "usage as consuming the oldest delivery first, which matches how a bakery rotates perishable stock and "
        "gives a monthly cost that follows real prices with a delay. Weighted average cost recomputes the "
        "average unit price after every delivery and charges usage at that average. It is much simpler to "
        "implement: keep a running quantity and a running value per item and shop, and each usage removes "
        "quantity times the current average.\n\n"
        "I would implement weighted average first, because it needs no matching of usage to individual "
        "deliveries and it is robust to the corrections your managers will make. Compute it in one function "
        "that replays the movements in time order, test that function with a handful of hand-worked examples "
        "from your real invoices, including a month where butter rose sharply, and store monthly snapshots so "
        "that a late correction does not silently change a report the accountant has already filed.",
    ),
    (
        "Last question on the design: should the developer write tests, and which ones? They say tests slow "
        "them down and that they can just click through the pages before each release.",
        "Clicking through pages catches layout problems, but it will not catch a wrong stock figure, and a "
        "wrong stock figure is the failure that costs you money: a missed flour order on a Saturday, or an "
        "inflated cost in the accounts. So ask for a small number of tests aimed exactly at the numbers.\n\n"
        "First, unit tests for the two pure functions that matter: the one that computes current stock from "
        "movements and the one that computes weighted average cost. Use real examples from your invoices and "
        "delivery notes, written as tables of movements with the expected totals next to them. These tests "
        "run in milliseconds and never slow anyone down.\n\n"
        "Second, one test per form that submits it twice with the same identifier and checks that only one "
        "movement exists, since duplicate protection is easy to break during a refactor and invisible when it "
        "breaks. Third, a test of the weekly reorder report against a small fixture with known answers.\n\n"
        "Skip browser automation for now; it is slow and brittle and your pages are simple. Run the tests on "
        "every push with a free continuous integration service, and make the release step refuse to deploy "
        "when they fail. That is perhaps a day of work, and it will repay itself the first time a change to "
        "the valuation code would have shipped a wrong monthly cost.",
    ),
    (
        "One more thing. The owner of the market hall shop wants to see live numbers on a tablet behind the "
        "counter, and she wants a warning when butter runs low during the day. Is that a big change?",
        "It is a modest change if you keep the same principle: the server computes, the screens display. A "
        "page that shows current stock for one shop, refreshed every minute, is just another view over the "
        "same movements, and polling once a minute from one tablet costs nothing. You do not need websockets "
        "or push notifications for this; a meta refresh or a tiny script that reloads a fragment is enough, "
        "and it keeps working after the tablet sleeps and wakes.\n\n"
        "The low-butter warning needs one new idea: a threshold per item and shop, set by the manager, below "
        "which the item is shown in red at the top of the page. Compute it at display time from the current "
        "stock rather than storing alerts, so there is nothing to clear or to get out of date. If she later "
        "wants a message on her phone as well, add a scheduled job that checks the thresholds every fifteen "
        "minutes during opening hours and sends one message per item per day at most, so that the warning "
        "does not turn into noise that everybody learns to ignore.\n\n"
        "The real constraint is data freshness: the tablet is only as live as the usage records. If staff "
        "record usage once in the evening, the display is a morning snapshot. Decide with her whether staff "
        "will record each batch as it goes into the oven, or whether an estimate from the day's production "
        "plan is good enough.",
    ),
    (
        "How do we avoid losing everything if the server dies? Our developer mentioned backups, but I do not "
        "know what a good setup looks like for something this small.",
        "For a service this size, a good setup has three parts, and the third is the one people skip. First, "
        "a nightly dump of the database, compressed and copied to storage at a different provider from the "
        "server, kept for thirty days, with a monthly copy kept for a year so the accountant's figures can "
        "always be reproduced. Second, everything needed to rebuild the server written down as a short script "
        "or a checklist: the operating system packages, the application version, the environment settings "
        "and where the secrets live.\n\n"
        "Third, a restore drill. Once a quarter, the developer takes last night's dump, builds a fresh server "
        "from the checklist, restores the data, and checks that the stock of a few items matches what the "
        "shops see. Time it. If it takes an afternoon, you know how long the shops would be without the "
        "system, and whether paper forms as a fallback for that afternoon are acceptable. Keep a printed copy "
        "of those paper forms in every shop, and agree in advance who types them in once the service is back, "
        "so that nothing recorded during an outage is lost or entered twice.",
    ),
)

QUESTION_1 = (
    "Thank you, this is very helpful. Given everything we discussed, what should our developer build in the first week?"
)
QUESTION_2 = "Good. And what should wait until next month?"


def history_messages() -> list[dict[str, str]]:
    """The conversation before turn 1's reply: system, six exchanges, and turn 1's question."""
    messages = [{"role": "system", "content": SYSTEM}]
    for user, assistant in EXCHANGES:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*messages, {"role": "user", "content": QUESTION_1}]


@dataclass
class Timing:
    """One answer to turn 2: seconds from the start to the generator being ready, to the first text, to the end."""

    setup_s: float
    first_s: float
    reply_s: float
    text: str
    history_tokens: int


def _timed_reply(started: float, generator: Generator, messages: Messages, reply_tokens: int) -> Timing:
    """Stream ``generator``'s reply to ``messages``; the times count from ``started``."""
    ready = time.perf_counter()
    pieces: Iterator[str] = generator.stream_chat(messages, max_tokens=reply_tokens)
    first = next(pieces, "")
    first_at = time.perf_counter()
    text = first + "".join(pieces)
    done = time.perf_counter()
    return Timing(ready - started, first_at - started, done - started, text, len(generator._native.history))


def answer_restored(path: Path, model: Model, reply_tokens: int, threads: int) -> Timing:
    """Turn 2 after restoring the checkpoint file: only the new turn's tokens are decoded."""
    started = time.perf_counter()
    generator = Generator.restore(path, model, n_threads=threads)
    return _timed_reply(started, generator, QUESTION_2, reply_tokens)


def answer_reprefilled(
    conversation: Sequence[dict[str, str]], model: Model, mode: Mode, reply_tokens: int, threads: int
) -> Timing:
    """Turn 2 on a new generator: the whole conversation is rendered again and prefilled."""
    messages = [*conversation, {"role": "user", "content": QUESTION_2}]
    started = time.perf_counter()
    generator = Generator(model, mode=mode, n_ctx=N_CTX, n_threads=threads)
    return _timed_reply(started, generator, messages, reply_tokens)


@dataclass
class Saved:
    """The conversation after turn 1, as the checkpoint holds it, and the uninterrupted turn 2."""

    turn1_s: float
    turn1_reply: str
    history_tokens: int
    checkpoint_bytes: int
    save_s: float
    conversation: list[dict[str, str]]
    uninterrupted_reply: str


def answer_turn1(model: Model, mode: Mode, path: Path, turn1_tokens: int, reply_tokens: int, threads: int) -> Saved:
    """Answer turn 1, save the checkpoint to ``path``, then answer turn 2 on the same generator."""
    started = time.perf_counter()
    generator = Generator(model, mode=mode, n_ctx=N_CTX, n_threads=threads)
    reply = generator.chat(history_messages(), max_tokens=turn1_tokens)
    turn1_s = time.perf_counter() - started
    held = len(generator._native.history)
    saving = time.perf_counter()
    generator.save(path)
    save_s = time.perf_counter() - saving
    conversation = [{"role": m["role"], "content": m["content"]} for m in generator.messages]
    uninterrupted = generator.chat(QUESTION_2, max_tokens=reply_tokens)
    return Saved(turn1_s, reply, held, path.stat().st_size, save_s, conversation, uninterrupted)


def spread(ratios: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-pair ratios."""
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def summarize(restored: Sequence[Timing], reprefilled: Sequence[Timing]) -> dict[str, Any]:
    """Medians of both paths and the per-pair ratios re-prefill / restore."""
    summary: dict[str, Any] = {}
    for key in ("setup_s", "first_s", "reply_s"):
        a = [getattr(t, key) for t in restored]
        b = [getattr(t, key) for t in reprefilled]
        summary[key] = {
            "restore_median": statistics.median(a),
            "reprefill_median": statistics.median(b),
            "ratios": [y / x for x, y in zip(a, b)],
        }
        summary[key]["ratio"] = spread(summary[key]["ratios"])
    return summary


def run_mode(model: Model, mode: Mode, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """One mode: turn 1 and its checkpoint, then a warm-up pair and ``args.pairs`` interleaved pairs."""
    path = directory / f"chat_turn_{mode}.ckpt"
    saved = answer_turn1(model, mode, path, args.turn1_tokens, args.reply_tokens, args.threads)
    print(f"[{mode}] turn 1 in {saved.turn1_s:.1f} s, {saved.history_tokens} tokens held, {saved.checkpoint_bytes} B")
    pairs: list[tuple[Timing, Timing]] = []
    for index in range(args.pairs + 1):
        a = answer_restored(path, model, args.reply_tokens, args.threads)
        gc.collect()
        b = answer_reprefilled(saved.conversation, model, mode, args.reply_tokens, args.threads)
        gc.collect()
        label = "warm-up" if index == 0 else f"pair {index}"
        print(
            f"[{mode}] {label}: first text {a.first_s:.3f} s vs {b.first_s:.3f} s, reply {a.reply_s:.3f} s vs "
            f"{b.reply_s:.3f} s"
        )
        pairs.append((a, b))
    warmup, measured = pairs[0], pairs[1:]
    restored, reprefilled = [a for a, _ in measured], [b for _, b in measured]
    texts = {t.text for t in restored}
    return {
        "turn1": {key: value for key, value in asdict(saved).items() if key != "conversation"},
        "warmup": {"restore": asdict(warmup[0]), "reprefill": asdict(warmup[1])},
        "restore": [asdict(t) for t in restored],
        "reprefill": [asdict(t) for t in reprefilled],
        "summary": summarize(restored, reprefilled),
        "restored_reply": restored[0].text,
        "reprefilled_reply": reprefilled[0].text,
        "restored_replies_all_equal": len(texts) == 1,
        "restored_equals_uninterrupted": texts == {saved.uninterrupted_reply},
        "reprefilled_equals_restored": all(t.text == restored[0].text for t in reprefilled),
        "history_tokens_after_turn2": {
            "restore": restored[0].history_tokens,
            "reprefill": reprefilled[0].history_tokens,
        },
    }


def table(results: dict[str, dict[str, Any]], reply_tokens: int) -> str:
    """The medians and per-pair ratios as a markdown table."""
    lines = [
        "| mode | tokens held | checkpoint | path | first text (median) | ratio (min-max) "
        f"| {reply_tokens}-token reply (median) | ratio (min-max) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for mode, result in results.items():
        turn1, summary = result["turn1"], result["summary"]
        first, reply = summary["first_s"], summary["reply_s"]
        size = f"{turn1['checkpoint_bytes'] / 2**20:.1f} MiB"
        for path, key in (("restore", "restore_median"), ("re-prefill", "reprefill_median")):
            if path == "restore":
                ratios = ["base", "base"]
            else:
                ratios = [
                    f"{s['ratio']['median']:.1f}x ({s['ratio']['min']:.1f}-{s['ratio']['max']:.1f})"
                    for s in (first, reply)
                ]
            lines.append(
                f"| {mode} | {turn1['history_tokens']} | {size} | {path} | {first[key]:.3f} s | {ratios[0]} "
                f"| {reply[key]:.3f} s | {ratios[1]} |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="measured pairs per mode, after one warm-up pair")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--turn1-tokens", type=int, default=32, help="most tokens of turn 1's reply")
    parser.add_argument("--reply-tokens", type=int, default=32, help="most tokens of turn 2's reply")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "chat_turn.json")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    model_path = smollm2_path()
    model = Model(str(model_path))
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for mode in MODES:
            results[mode] = run_mode(model, mode, args, Path(directory))
    print()
    print(table(results, args.reply_tokens))
    for name, result in results.items():
        print(f"\n[{name}] restored reply: {result['restored_reply']!r}")
        print(
            f"[{name}] restored replies all equal: {result['restored_replies_all_equal']}, equal to the "
            f"uninterrupted generator's: {result['restored_equals_uninterrupted']}; re-prefilled reply equal: "
            f"{result['reprefilled_equals_restored']} ({result['reprefilled_reply']!r})"
        )
    run_s = time.perf_counter() - started
    print(f"\nrun time {run_s:.0f} s")
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": model_path.name,
        "threads": args.threads,
        "n_ctx": N_CTX,
        "pairs": args.pairs,
        "turn1_tokens": args.turn1_tokens,
        "reply_tokens": args.reply_tokens,
        "question_1": QUESTION_1,
        "question_2": QUESTION_2,
        "history_tokens": {name: r["turn1"]["history_tokens"] for name, r in results.items()},
        "checkpoint_bytes": {name: r["turn1"]["checkpoint_bytes"] for name, r in results.items()},
        "modes": results,
        "run_s": run_s,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
