"""The batched engine (``specstate.BatchEngine``): every reply is, token for token, the reply the same generator
gives alone, whatever its neighbours do.

SmolLM2-135M-Instruct Q4_1, ``none`` and ``ngram`` modes, greedy and sampled. A request has a budget of reply
tokens; each round may commit at most what is left of it (``set_budget`` in the batch, ``take(max_commit=...)``
alone), so the batch and the lone generator run the same rounds. Hypothesis draws mixes of requests that arrive
between steps (prefilled by the engine or alone first, prompts in one chunk or several) and leave mid-reply
(dropped, taken out to go on alone, parked in a checkpoint and joined back, or copied through a checkpoint into a
second sequence); the lone runs are computed once per request and cached. Sequences also move through checkpoints
into this and another process, a lone generation's checkpoint joins a busy batch, refusals leave the batch as it
was, and the step report counts what the step did.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import BatchEngine, GenerationError, Generator, Model, StepReport, encode_prompt

N_CTX = 512
N_THREADS = 2
#: The most rows one decode of a step holds (specstate's exact-rows patch; src/limits.rs MAX_EXACT_ROWS).
MAX_EXACT_ROWS = 17
#: Short prompts; the code one repeats itself, so that prompt lookup (``ngram``) drafts and is often right.
PROMPTS = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def mul(a, b):\n    return a * b\n\n# The same functions again, unchanged:\n",
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "Once upon a time, in a small village by the sea,",
    "Q: Why is the sky blue?\nA:",
)
CODE = 0

ModeName = Literal["none", "ngram"]


@dataclass(frozen=True)
class Request:
    """One generation: a prompt of PROMPTS, its settings and its budget of reply tokens."""

    prompt: int
    mode: ModeName
    temperature: float
    seed: int
    budget: int
    #: Rows of one prompt chunk (a small one decodes the prompt in several decodes).
    n_batch: int = 512

    def key(self, n_threads: int) -> tuple[int, str, float, int, int, int, int]:
        seed = self.seed if self.temperature > 0 else 0  # greedy replies do not depend on the seed
        return (self.prompt, self.mode, self.temperature, seed, self.budget, self.n_batch, n_threads)


def make_generator(model: Model, request: Request, n_threads: int = N_THREADS) -> Generator:
    return Generator(
        model,
        mode=request.mode,
        n_ctx=N_CTX,
        n_batch=request.n_batch,
        n_threads=n_threads,
        temperature=request.temperature,
        seed=request.seed,
    )


def go_on_alone(generator: Generator, reply: list[int], budget: int, rounds: int | None = None) -> list[int]:
    """Continue ``generator`` alone until ``reply`` has ``budget`` tokens (or it finishes, or ``rounds`` takes
    ran), each round committing at most what is left; returns ``reply`` extended."""
    reply = list(reply)
    taken = 0
    while len(reply) < budget and (rounds is None or taken < rounds):
        left = budget - len(reply)
        tokens = generator._native.take(left, max_commit=left)
        if not tokens:
            break
        reply += tokens
        taken += 1
    return reply


class Solo:
    """Replies of lone generators, computed once per request (and thread count)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tokens = [encode_prompt(model, text) for text in PROMPTS]
        self.cache: dict[tuple[int, str, float, int, int, int, int], list[int]] = {}

    def __call__(self, request: Request, n_threads: int = N_THREADS) -> list[int]:
        key = request.key(n_threads)
        if key not in self.cache:
            generator = make_generator(self.model, request, n_threads)
            generator._native.prefill(self.tokens[request.prompt])
            self.cache[key] = go_on_alone(generator, [], request.budget)
        return self.cache[key]


@pytest.fixture(scope="module")
def solo(smollm2: Model) -> Solo:
    return Solo(smollm2)


@dataclass
class Live:
    """A request in the batch: the reply handed out so far and the steps it has been in."""

    request: Request
    reply: list[int]
    departure: tuple[int, str] | None = None
    steps: int = 0


class Batch:
    """An engine and its requests, run step by step and checked against the lone replies."""

    def __init__(self, solo: Solo, *, n_seq: int, n_threads: int = N_THREADS) -> None:
        self.solo = solo
        self.model = solo.model
        self.n_threads = n_threads
        self.engine = BatchEngine(self.model, n_seq=n_seq, n_ctx=N_CTX, n_threads=n_threads)
        self.live: dict[int, Live] = {}
        #: Replies that are over: (request, reply, whether it was cut short by a removal).
        self.over: list[tuple[Request, list[int], bool]] = []

    def arrive(
        self, request: Request, *, prefilled_alone: bool = False, departure: tuple[int, str] | None = None
    ) -> int:
        """Join a new generator for ``request`` (prefilled alone first, or by the engine); hand out its first token."""
        generator = make_generator(self.model, request, self.n_threads)
        tokens = self.solo.tokens[request.prompt]
        if prefilled_alone:
            generator._native.prefill(tokens)
        seq = self.engine.join(generator)
        if not prefilled_alone:
            self.engine.prefill(seq, tokens)
        self.live[seq] = Live(request, self.engine.take(seq), departure)
        self.retire_if_over(seq)
        return seq

    def join(self, generator: Generator, request: Request, reply: list[int]) -> int:
        """Join a generator already ``reply`` tokens into ``request``."""
        seq = self.engine.join(generator)
        self.live[seq] = Live(request, reply + self.engine.take(seq))
        self.retire_if_over(seq)
        return seq

    def retire_if_over(self, seq: int) -> None:
        """Remove ``seq`` from the batch if its reply is over (its budget spent, or finished)."""
        live = self.live[seq]
        if len(live.reply) >= live.request.budget or self.engine.done(seq):
            self.engine.remove(seq)
            del self.live[seq]
            self.over.append((live.request, live.reply, False))

    def depart(self, seq: int, kind: str) -> None:
        """Sequence ``seq`` leaves: dropped, taken out to go on alone, or parked in a checkpoint and joined back
        (``fork``: a copy from its checkpoint joins as another sequence, where there is room, and both go on)."""
        if kind == "fork" and len(self.engine) < self.engine.n_seq:
            copy = Generator.restore(self.engine.snapshot(seq).checkpoint(), self.model, n_threads=self.n_threads)
            self.join(copy, self.live[seq].request, self.live[seq].reply)
            return
        live = self.live.pop(seq)
        request = live.request
        if kind == "remove":
            self.engine.remove(seq)
            self.over.append((request, live.reply, True))
        elif kind == "leave":
            alone = self.engine.leave(seq)
            self.over.append((request, go_on_alone(alone, live.reply, request.budget), False))
        else:
            data = self.engine.snapshot(seq).checkpoint()
            self.engine.remove(seq)
            restored = Generator.restore(data, self.model, n_threads=self.n_threads)
            self.join(restored, request, live.reply)

    def departures(self) -> None:
        """The departures due: each sequence that has been in the batch as many steps as its departure says."""
        for seq, live in list(self.live.items()):
            departure = live.departure
            if departure is not None and departure[0] == live.steps:
                live.departure = None
                self.depart(seq, departure[1])

    def step(self) -> StepReport:
        """Set each sequence's budget to what is left of its reply, run a step, hand out its tokens, retire the
        finished, and check the report against what was handed out."""
        for seq, live in self.live.items():
            self.engine.set_budget(seq, live.request.budget - len(live.reply))
        running = len(self.live)
        report = self.engine.step()
        committed = 0
        for seq, live in list(self.live.items()):
            tokens = self.engine.take(seq)
            left = live.request.budget - len(live.reply)
            assert 1 <= len(tokens) <= left, (seq, tokens, left)  # every round commits, never past the budget
            committed += len(tokens)
            live.reply += tokens
            live.steps += 1
            self.retire_if_over(seq)
        assert report.sequences == running  # every sequence held wants a round: its tokens are all handed out
        assert report.committed == committed
        if report.sequences:
            assert report.sequences <= report.rows
            assert math.ceil(report.rows / MAX_EXACT_ROWS) <= report.decodes <= report.sequences
        else:
            assert report == StepReport(0, 0, 0, 0)
        return report

    def check(self) -> None:
        """Every reply that is over equals its lone run (a removed one, a prefix of it)."""
        for request, reply, cut in self.over:
            expected = self.solo(request, self.n_threads)
            if cut:
                assert reply == expected[: len(reply)], request
            else:
                assert reply == expected, request


# --- batch invariance -------------------------------------------------------------------------------


requests = st.builds(
    Request,
    prompt=st.integers(0, len(PROMPTS) - 1),
    mode=st.sampled_from(("none", "ngram")),
    temperature=st.sampled_from((0.0, 0.8)),
    seed=st.integers(1, 3),
    budget=st.integers(8, 40),
    n_batch=st.sampled_from((512, 512, 16)),
)


@dataclass(frozen=True)
class Arrival:
    request: Request
    at: int
    prefilled_alone: bool
    departure: tuple[int, str] | None


arrivals = st.builds(
    Arrival,
    request=requests,
    at=st.integers(0, 8),
    prefilled_alone=st.booleans(),
    departure=st.none() | st.tuples(st.integers(0, 6), st.sampled_from(("remove", "leave", "rejoin", "fork"))),
)


@given(n_seq=st.integers(2, 4), plan=st.lists(arrivals, min_size=2, max_size=6))
@settings(max_examples=examples(ci=12, dev=4), deadline=None)
def test_every_reply_is_the_lone_reply_whatever_joins_and_leaves(solo: Solo, n_seq: int, plan: list[Arrival]) -> None:
    batch = Batch(solo, n_seq=n_seq)
    pending = sorted(plan, key=lambda arrival: arrival.at)
    step = 0
    most = 2 * sum(arrival.request.budget for arrival in plan) + 20  # every round commits (forks at most double)
    while pending or batch.live:
        assert step < most, "the batch does not end"
        while pending and pending[0].at <= step and len(batch.engine) < n_seq:
            arrival = pending.pop(0)
            batch.arrive(arrival.request, prefilled_alone=arrival.prefilled_alone, departure=arrival.departure)
        batch.departures()
        assert len(batch.engine) == len(batch.live) <= n_seq
        batch.step()
        step += 1
    assert len(batch.engine) == 0
    assert len(batch.over) >= len(plan)  # (forks add replies)
    batch.check()


def test_a_mixed_batch_at_one_thread_gives_the_lone_replies(solo: Solo) -> None:
    batch = Batch(solo, n_seq=3, n_threads=1)
    leaving = batch.arrive(Request(CODE, "ngram", 0.0, 0, 40))
    batch.arrive(Request(2, "ngram", 0.8, 7, 24), prefilled_alone=True)
    batch.step()
    batch.arrive(Request(1, "none", 0.8, 3, 16), departure=(4, "rejoin"))
    batch.step()
    assert leaving in batch.live
    batch.depart(leaving, "leave")
    while batch.live:
        batch.departures()
        batch.step()
    assert len(batch.over) == 3
    batch.check()


# --- park, resume, migrate --------------------------------------------------------------------------

WORKER = """
import json, sys
from specstate import Generator, Model
path, model, have, budget = sys.argv[1:5]
generator = Generator.restore(path, Model(model))
reply = []
while int(have) + len(reply) < int(budget):
    left = int(budget) - int(have) - len(reply)
    tokens = generator._native.take(left, max_commit=left)
    if not tokens:
        break
    reply += tokens
print(json.dumps(reply))
"""


def test_a_parked_sequence_resumes_here_and_in_another_process(
    solo: Solo, smollm2: Model, smollm2_file: Path, tmp_path: Path
) -> None:
    batch = Batch(solo, n_seq=3)
    parked = Request(CODE, "ngram", 0.8, 5, 36)
    seq = batch.arrive(parked)
    batch.arrive(Request(3, "none", 0.8, 2, 40))
    batch.arrive(Request(2, "ngram", 0.0, 0, 40))
    for _ in range(3):
        batch.step()
    reply = list(batch.live[seq].reply)
    assert 0 < len(reply) < parked.budget
    data = batch.engine.snapshot(seq).checkpoint()
    path = tmp_path / "sequence.ckpt"
    path.write_bytes(data)
    here = go_on_alone(Generator.restore(data, smollm2), reply, parked.budget)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(WORKER),
            str(path),
            str(smollm2_file),
            str(len(reply)),
            str(parked.budget),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    there = reply + json.loads(result.stdout.strip().splitlines()[-1])
    while batch.live:  # the sequence itself stays in the batch and goes on
        batch.step()
    batch.check()
    in_batch = next(reply for request, reply, _ in batch.over if request == parked)
    assert here == in_batch == there == solo(parked)


def test_a_lone_generations_checkpoint_joins_a_busy_batch(solo: Solo, smollm2: Model) -> None:
    request = Request(CODE, "ngram", 0.8, 9, 32)
    generator = make_generator(smollm2, request)
    generator._native.prefill(solo.tokens[CODE])
    reply = go_on_alone(generator, [], request.budget, rounds=4)
    data = generator.checkpoint()
    batch = Batch(solo, n_seq=3)
    batch.arrive(Request(1, "ngram", 0.0, 0, 30))
    batch.arrive(Request(4, "none", 0.8, 1, 30))
    batch.step()
    batch.step()
    restored = Generator.restore(data, smollm2, n_threads=N_THREADS)
    seq = batch.join(restored, request, reply)
    assert batch.engine.history(seq) == restored._native.history == solo.tokens[CODE] + reply
    while batch.live:
        batch.step()
    batch.check()
    # The generator that joined is left as it was: it goes on alone as the sequence did.
    assert go_on_alone(restored, reply, request.budget) == solo(request)
    assert len(batch.over) == 3


# --- refusals ---------------------------------------------------------------------------------------


def test_refusals_leave_the_batch_as_it_was(solo: Solo, smollm2: Model, smollm2_file: Path) -> None:
    batch = Batch(solo, n_seq=3)
    engine = batch.engine
    first = batch.arrive(Request(CODE, "ngram", 0.8, 4, 30))
    batch.arrive(Request(2, "none", 0.0, 0, 30))
    batch.step()

    def refused(error: type[Exception], fragment: str, call: Callable[[], object]) -> None:
        held = len(engine)
        before = {seq: engine.history(seq) for seq in batch.live}
        with pytest.raises(error, match=fragment):
            call()
        assert len(engine) == held
        assert {seq: engine.history(seq) for seq in batch.live} == before

    refused(
        ValueError,
        "mode 'draft' cannot join a batch",
        lambda: engine.join(Generator(smollm2, mode="draft", draft_model=smollm2, n_ctx=N_CTX)),
    )
    refused(
        ValueError,
        "the generation's n_ctx is 256, the batch's sequences have 512",
        lambda: engine.join(Generator(smollm2, n_ctx=256)),
    )
    refused(
        ValueError, "another model than the batch's", lambda: engine.join(Generator(Model(smollm2_file), n_ctx=N_CTX))
    )
    for call in (
        lambda: engine.take(7),
        lambda: engine.prefill(7, solo.tokens[1]),
        lambda: engine.remove(7),
        lambda: engine.remove(-1),
        lambda: engine.set_budget(5, 3),
        lambda: engine.snapshot(3),
        lambda: engine.leave(4),
        lambda: engine.done(6),
        lambda: engine.history(7),
        lambda: engine.take(2),  # a free place
    ):
        refused(GenerationError, "the batch holds no sequence", call)
    refused(GenerationError, "the sequence already has a prompt", lambda: engine.prefill(first, solo.tokens[1]))
    refused(ValueError, "max_commit must not be negative", lambda: engine.set_budget(first, -1))
    batch.step()
    # The last place: a prompt out of the vocabulary, or empty, is refused and the sequence waits for one.
    last = Request(CODE, "ngram", 0.8, 2, 20, n_batch=16)
    seq = engine.join(make_generator(smollm2, last))
    assert engine.history(seq) == [] and not engine.done(seq)
    tokens = solo.tokens[last.prompt]
    refused(ValueError, "outside the vocabulary", lambda: engine.prefill(seq, [*tokens, 49152]))
    refused(ValueError, "outside the vocabulary", lambda: engine.prefill(seq, [*tokens, -1]))
    refused(ValueError, "the prompt is empty", lambda: engine.prefill(seq, []))
    assert batch.step().sequences == 2  # a sequence without a prompt runs no round
    engine.prefill(seq, tokens)
    batch.live[seq] = Live(last, engine.take(seq))
    refused(
        GenerationError, "the batch's 3 sequences are all taken", lambda: engine.join(Generator(smollm2, n_ctx=N_CTX))
    )
    while batch.live:
        batch.step()
    assert len(batch.over) == 3
    batch.check()
    for n_seq in (0, 257):
        with pytest.raises(ValueError, match=f"n_seq must be between 1 and 256, not {n_seq}"):
            BatchEngine(smollm2, n_seq=n_seq, n_ctx=N_CTX)


# --- the step report --------------------------------------------------------------------------------


def test_the_step_report_counts_sequences_rows_and_decodes(solo: Solo) -> None:
    batch = Batch(solo, n_seq=4)
    engine = batch.engine
    greedy = [Request(prompt, "none", 0.0, 0, 10) for prompt in range(1, 5)]
    seqs = [batch.arrive(request) for request in greedy]
    assert engine.step() == StepReport(sequences=4, rows=4, decodes=1, committed=4)
    for seq in seqs:
        batch.live[seq].reply += engine.take(seq)
    for seq in seqs:
        engine.set_budget(seq, None)
    assert engine.step() == StepReport(4, 4, 1, 4)
    # A sequence with tokens not yet handed out (the first keeps its token) runs no round.
    for seq in seqs[1:]:
        batch.live[seq].reply += engine.take(seq)
    assert engine.step() == StepReport(3, 3, 1, 3)
    for seq in seqs:
        batch.live[seq].reply += engine.take(seq)
    # Nor does one whose budget is spent.
    engine.set_budget(seqs[1], 0)
    assert engine.step() == StepReport(3, 3, 1, 3)
    assert engine.take(seqs[1]) == [] and not engine.done(seqs[1])
    for seq in seqs:
        batch.live[seq].reply += engine.take(seq)
    while batch.live:
        batch.step()
    assert engine.step() == StepReport(0, 0, 0, 0)
    batch.check()


def test_a_lead_lets_a_sequence_run_ahead_of_what_it_hands_out(solo: Solo) -> None:
    """set_lead(seq, n): the sequence keeps running rounds while it holds fewer than n tokens not handed out (what
    the Ray worker uses), and its tokens are still its lone reply's."""
    batch = Batch(solo, n_seq=2)
    engine = batch.engine
    ahead, behind = (batch.arrive(Request(prompt, "none", 0.0, 0, 12)) for prompt in (1, 2))
    for seq in (ahead, behind):
        batch.live[seq].reply += engine.take(seq)
    engine.set_lead(ahead, 3)
    engine.set_lead(behind, 0)  # below 1 counts as 1: the default
    assert engine.step() == StepReport(2, 2, 1, 2)
    assert engine.step() == StepReport(1, 1, 1, 1)  # only the one with a lead
    assert engine.step() == StepReport(1, 1, 1, 1)
    assert engine.step() == StepReport(0, 0, 0, 0)  # three ahead: it waits too
    taken = engine.take(ahead)
    assert len(taken) == 3
    batch.live[ahead].reply += taken
    batch.live[behind].reply += engine.take(behind)
    engine.set_lead(ahead, 1)
    with pytest.raises(GenerationError, match="the batch holds no sequence 7"):
        engine.set_lead(7, 2)
    while batch.live:
        batch.step()
    batch.check()


def test_ngram_drafts_are_decoded_together_in_decodes_of_at_most_17_rows(solo: Solo) -> None:
    batch = Batch(solo, n_seq=4)
    for seed in (1, 2, 3, 4):
        batch.arrive(Request(CODE, "ngram", 0.0 if seed == 1 else 0.8, seed, 40))
    reports = []
    while batch.live:
        reports.append(batch.step())
    assert any(report.rows > report.sequences for report in reports), "ngram never drafted"
    assert any(report.decodes > 1 for report in reports), "the rows never needed a second decode"
    batch.check()
