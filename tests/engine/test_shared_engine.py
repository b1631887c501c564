"""Generators on several threads sharing one target context (``specstate.SharedEngine``): each thread uses its
generator as usual and the rounds asked for at about the same time are decoded together; every reply is, token
for token, the reply the same generator gives alone.

The lone replies come from ``test_batched``'s cache (same requests, same budgets: each round commits at most what
is left of its budget, alone and shared).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import GenerationError, Generator, Model, SharedEngine
from test_batched import N_CTX, N_THREADS, PROMPTS, Request, Solo, go_on_alone, make_generator
from test_batched import solo as solo  # the fixture of lone replies

requests = st.builds(
    Request,
    prompt=st.integers(0, len(PROMPTS) - 1),
    mode=st.sampled_from(["none", "ngram"]),
    temperature=st.sampled_from([0.0, 0.8]),
    seed=st.integers(0, 3),
    budget=st.integers(4, 24),
    # Small prompt chunks share decodes with the other sequences' rounds; 512 decodes a prompt in one.
    n_batch=st.sampled_from([512, 16, 9]),
)


def shared_reply(engine: SharedEngine, solo: Solo, request: Request, delay: float) -> list[int]:
    """``request`` run on a generator attached to ``engine``, from the calling thread, after ``delay`` seconds."""
    time.sleep(delay)
    generator = Generator(
        solo.model,
        mode=request.mode,
        n_ctx=N_CTX,
        n_batch=request.n_batch,
        temperature=request.temperature,
        seed=request.seed,
        engine=engine,
    )
    generator._native.prefill(solo.tokens[request.prompt])
    return go_on_alone(generator, [], request.budget)


def run_threads(engine: SharedEngine, solo: Solo, batch: list[Request], delays: list[float]) -> list[list[int]]:
    replies: list[list[int]] = [[] for _ in batch]
    failures: list[BaseException] = []

    def work(index: int) -> None:
        try:
            replies[index] = shared_reply(engine, solo, batch[index], delays[index])
        except BaseException as error:  # reported below, on the test's thread
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batch))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads), "a shared round never finished"
    return replies


@given(batch=st.lists(requests, min_size=2, max_size=5), seed=st.integers(0, 1 << 16))
@settings(max_examples=examples(ci=6, dev=3), deadline=None)
def test_threads_sharing_an_engine_get_their_lone_replies(solo: Solo, batch: list[Request], seed: int) -> None:
    engine = SharedEngine(solo.model, n_seq=len(batch), n_ctx=N_CTX, n_threads=N_THREADS)
    delays = [random.Random(seed + i).choice([0.0, 0.0, 0.005, 0.03]) for i in range(len(batch))]
    replies = run_threads(engine, solo, batch, delays)
    assert replies == [solo(request) for request in batch]
    assert engine.attached == 0  # every generator gave its sequence back
    decodes, rows, sequences = engine.stats
    assert decodes > 0 and rows >= sequences >= decodes


def test_rounds_asked_together_share_decodes(solo: Solo) -> None:
    batch = [Request(prompt, "none", 0.0, 0, 16) for prompt in range(4)]
    engine = SharedEngine(solo.model, n_seq=4, n_ctx=N_CTX, n_threads=N_THREADS)
    assert run_threads(engine, solo, batch, [0.0] * 4) == [solo(request) for request in batch]
    decodes, rows, sequences = engine.stats
    # The first token of each reply comes with its prompt; the other 15 of each in shared rounds.
    assert rows == sequences == 4 * 15 and decodes < rows


def test_an_attached_generation_goes_on_alone_and_back(solo: Solo, smollm2: Model) -> None:
    request = Request(0, "ngram", 0.8, 1, 24)
    engine = SharedEngine(smollm2, n_seq=2, n_ctx=N_CTX, n_threads=1)
    alone = make_generator(smollm2, request)
    alone._native.prefill(solo.tokens[request.prompt])
    reply = go_on_alone(alone, [], request.budget, rounds=3)
    alone.attach(engine)  # the lone generation moves onto the engine
    assert engine.attached == 1
    reply = go_on_alone(alone, reply, request.budget, rounds=3)
    restored = Generator.restore(alone.checkpoint(), smollm2, n_threads=N_THREADS)  # and back, alone
    assert go_on_alone(restored, reply, request.budget) == solo(request)
    assert go_on_alone(alone, reply, request.budget) == solo(request)


def test_refusals_change_nothing(solo: Solo, smollm2: Model, smollm2_file: Path) -> None:
    engine = SharedEngine(smollm2, n_seq=1, n_ctx=N_CTX, n_threads=1)
    with pytest.raises(ValueError, match="takes no draft model"):
        Generator(smollm2, mode="draft", draft_model=smollm2, n_ctx=N_CTX, engine=engine)
    with pytest.raises(ValueError, match="n_ctx is 1024, the batch's sequences have 512"):
        Generator(smollm2, n_ctx=1024, engine=engine)
    with pytest.raises(ValueError, match="another Model object"):
        Generator(Model(smollm2_file), n_ctx=N_CTX, engine=engine)
    drafted = Generator(smollm2, mode="draft", draft_model=smollm2, n_ctx=N_CTX)
    with pytest.raises(ValueError, match="mode 'draft' cannot join a batch"):
        drafted.attach(engine)
    assert engine.attached == 0
    request = Request(1, "none", 0.0, 0, 12)
    first = Generator(smollm2, n_ctx=N_CTX, engine=engine)
    with pytest.raises(GenerationError, match="all attached"):
        Generator(smollm2, n_ctx=N_CTX, engine=engine)
    alone = make_generator(smollm2, request)
    alone._native.prefill(solo.tokens[request.prompt])
    with pytest.raises(GenerationError, match="all attached"):
        alone.attach(engine)
    assert go_on_alone(alone, [], request.budget) == solo(request)  # the refused generator goes on, alone
    first._native.prefill(solo.tokens[request.prompt])
    assert go_on_alone(first, [], request.budget) == solo(request)
    with pytest.raises(ValueError, match="n_seq must be between 1 and 256"):
        SharedEngine(smollm2, n_seq=0)


def test_a_released_sequence_is_free_at_once_and_its_generator_refuses_to_go_on(smollm2: Model) -> None:
    """release_sequence (what a Llama letting go of its generations calls): the engine's place is free at once,
    whatever still holds the generator, which keeps its record but can neither decode nor checkpoint."""
    engine = SharedEngine(smollm2, n_seq=1, n_ctx=N_CTX, n_threads=1)
    first = Generator(smollm2, n_ctx=N_CTX, n_threads=1, engine=engine)
    first.generate(PROMPTS[0], max_tokens=4)
    tokens = list(first.tokens)
    with pytest.raises(GenerationError, match="all attached"):
        Generator(smollm2, n_ctx=N_CTX, n_threads=1, engine=engine)
    first._native.release_sequence()
    assert engine.attached == 0 and first.tokens == tokens
    for go_on in (lambda: first.generate(max_tokens=2), first.checkpoint):
        with pytest.raises(GenerationError, match="gave its sequence back"):
            go_on()
    second = Generator(smollm2, n_ctx=N_CTX, n_threads=1, engine=engine)
    assert second.generate(PROMPTS[0], max_tokens=4) == first.text and engine.attached == 1
    first._native.release_sequence()  # twice: nothing more happens
    alone = Generator(smollm2, n_ctx=N_CTX, n_threads=1)
    alone._native.release_sequence()  # a context of its own: nothing
    assert alone.generate(PROMPTS[0], max_tokens=4) == first.text


def test_an_adaptive_generator_measuring_its_costs_leaves_the_other_sequences_alone(solo: Solo) -> None:
    """The adaptive policy times decodes on the generator's own sequence before its prompt: emptying the memory
    after each timing must empty that sequence only, not another generation's in the middle of its reply."""
    request = Request(0, "ngram", 0.0, 0, 24)
    engine = SharedEngine(solo.model, n_seq=2, n_ctx=N_CTX, n_threads=N_THREADS)
    going = Generator(solo.model, mode="ngram", n_ctx=N_CTX, engine=engine)
    going._native.prefill(solo.tokens[request.prompt])
    reply = go_on_alone(going, [], request.budget, rounds=2)
    measuring = Generator(solo.model, mode="ngram", n_ctx=N_CTX, draft_policy="adaptive", engine=engine)
    measuring._native.prefill(solo.tokens[1])
    assert measuring.cost_curve is not None
    assert go_on_alone(going, reply, request.budget) == solo(request)


def decoder_threads(expected: int | None = None) -> int:
    """Threads of this process named after a shared engine's decoder; with `expected`, once there are that many or
    after 10 s (a new thread names itself when it first runs, which a busy machine may delay)."""
    deadline = time.monotonic() + 10
    while True:
        names = [path.read_text().strip() for path in Path("/proc/self/task").glob("*/comm")]
        count = names.count("specstate-decod")  # the kernel keeps 15 characters of a thread's name
        if expected is None or count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def test_every_engine_decodes_on_one_thread_of_its_own_that_ends_with_it(smollm2: Model) -> None:
    before = decoder_threads()
    engines = [SharedEngine(smollm2, n_seq=1, n_ctx=N_CTX, n_threads=1) for _ in range(3)]
    assert decoder_threads(before + 3) == before + 3
    generator = Generator(smollm2, n_ctx=N_CTX, n_threads=1, engine=engines[0])
    generator.generate(PROMPTS[0], max_tokens=3)
    del generator, engines
    assert decoder_threads(before) == before
