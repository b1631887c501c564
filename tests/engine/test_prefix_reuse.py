"""Exact prompts and the prefixes a :class:`specstate.SharedEngine` keeps between generations.

A prompt decoded in chunks of at most ``EXACT_PROMPT_ROWS`` rows gets, row by row, its single decodes' bits, so its
cells are the same however it was cut (one token at a time included) and at any thread count. A generation on a
shared engine whose own decodes are all that small therefore leaves its cells, when it gives its sequence back,
for a later prompt that starts the same way: that prompt decodes only the rest, and its reply is still, token for
token, the reply of the same request alone. Generations whose decodes are larger neither leave nor take a prefix.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import GenerationError, Generator, Model, SharedEngine, encode_prompt
from specstate._native import EXACT_PROMPT_ROWS
from test_batched import N_CTX, N_THREADS

STEMS = ("Once upon a time, in a small village by the sea,", "def add(a, b):\n    return a + b\n\n")
ENDINGS = ("", " there lived", " a fisher mended nets", "\ndef sub(a, b):\n", " the end.")
REPLY = 16


Reply = tuple[list[int], list[tuple[float, object]]]


def recorded(generator: Generator, tokens: list[int]) -> Reply:
    """``tokens`` with the log-probabilities (and alternatives) ``generator`` recorded for them."""
    return tokens, [(r.logprob, r.top) for r in generator.logprobs if r is not None]


def lone_reply(
    model: Model, prompt: list[int], n_batch: int, n_threads: int = N_THREADS, settings: dict[str, object] | None = None
) -> Reply:
    """The reply of a lone generation of ``prompt`` (:func:`recorded`)."""
    generator = Generator(model, n_ctx=N_CTX, n_threads=n_threads, n_batch=n_batch, **(settings or {}))  # type: ignore[arg-type]
    generator.set_logprobs(3)
    generator._native.prefill(prompt)
    return recorded(generator, generator._native.take(REPLY))


def test_a_prompt_in_exact_chunks_has_the_same_cells_however_it_is_cut(smollm2: Model) -> None:
    prompt = encode_prompt(smollm2, STEMS[1] * 4)
    assert len(prompt) > 3 * EXACT_PROMPT_ROWS
    reference = lone_reply(smollm2, prompt, 1, n_threads=1)
    for n_threads in (1, 2):
        for n_batch in (1, 5, EXACT_PROMPT_ROWS, EXACT_PROMPT_ROWS + 1):
            assert lone_reply(smollm2, prompt, n_batch, n_threads) == reference, (n_batch, n_threads)


prompts = st.tuples(st.integers(0, len(STEMS) - 1), st.integers(0, len(ENDINGS) - 1))
#: A request: its prompt (stem, ending), mode, temperature, and whether it gives its sequence back when done.
requests = st.tuples(prompts, st.sampled_from(["none", "ngram"]), st.sampled_from([0.0, 0.8]), st.booleans())


@given(batch=st.lists(requests, min_size=2, max_size=6), n_seq=st.integers(1, 3))
@settings(max_examples=examples(ci=6, dev=3), deadline=None)
def test_a_prompt_that_starts_like_an_earlier_one_reuses_its_cells_and_gets_its_lone_reply(
    smollm2: Model, batch: list[tuple[tuple[int, int], str, float, bool]], n_seq: int
) -> None:
    engine = SharedEngine(smollm2, n_seq=n_seq, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, n_threads=N_THREADS)
    held: list[Generator] = []
    given_back: int | None = None  # the stem of the request just before, if it gave its sequence back
    for (stem, ending), mode, temperature, give_back in batch:
        prompt = encode_prompt(smollm2, STEMS[stem] + ENDINGS[ending])
        settings: dict[str, object] = {"mode": mode, "temperature": temperature, "seed": 7}
        if len(held) == n_seq:  # a full engine: the oldest generation gives its sequence back
            held.pop(0)._native.release_sequence()
        before = engine.reused_tokens
        generator = Generator(smollm2, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, engine=engine, **settings)  # type: ignore[arg-type]
        generator.set_logprobs(3)
        generator._native.prefill(prompt)
        alone = lone_reply(smollm2, prompt, EXACT_PROMPT_ROWS, settings=settings)
        assert recorded(generator, generator._native.take(REPLY)) == alone
        if given_back == stem:
            assert engine.reused_tokens >= before + len(encode_prompt(smollm2, STEMS[stem])) - 1
        given_back = stem if give_back else None
        if give_back:
            generator._native.release_sequence()
        else:
            held.append(generator)


def test_what_reuses_a_prefix_and_what_does_not(smollm2: Model) -> None:
    engine = SharedEngine(smollm2, n_seq=2, n_ctx=N_CTX, n_batch=512, n_threads=N_THREADS)
    prompt = encode_prompt(smollm2, STEMS[0] + ENDINGS[1])

    def generate(**settings: object) -> list[int]:
        generator = Generator(smollm2, n_ctx=N_CTX, engine=engine, **settings)  # type: ignore[arg-type]
        generator._native.prefill(prompt)
        return [*generator._native.take(REPLY)]  # the generator is dropped: its sequence goes back

    wide = generate(n_batch=512)  # prompt chunks of 512 rows: its cells depend on the chunks, nothing is kept
    assert generate(n_batch=512) == wide and engine.reused_tokens == 0
    exact = generate(n_batch=EXACT_PROMPT_ROWS)
    assert engine.reused_tokens == 0  # the wide generation kept nothing
    assert generate(n_batch=EXACT_PROMPT_ROWS) == exact and engine.reused_tokens == len(prompt) - 1
    assert generate(n_batch=512) == wide and engine.reused_tokens == len(prompt) - 1  # a wide one takes none


def test_a_refused_prompt_after_a_kept_prefix_leaves_the_sequence_clean(smollm2: Model) -> None:
    engine = SharedEngine(smollm2, n_seq=1, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, n_threads=1)
    prompt = encode_prompt(smollm2, STEMS[0])
    first = Generator(smollm2, n_ctx=N_CTX, n_threads=1, n_batch=EXACT_PROMPT_ROWS, engine=engine)
    first._native.prefill(prompt)
    first._native.take(4)
    first._native.release_sequence()
    second = Generator(smollm2, n_ctx=N_CTX, n_threads=1, n_batch=EXACT_PROMPT_ROWS, engine=engine)
    with pytest.raises(ValueError, match="leaves no room"):
        second._native.prefill(prompt + [prompt[-1]] * N_CTX)
    assert not second.tokens
    second._native.prefill(prompt)
    alone = Generator(smollm2, n_ctx=N_CTX, n_threads=1, n_batch=EXACT_PROMPT_ROWS)
    alone._native.prefill(prompt)
    assert second._native.take(REPLY) == alone._native.take(REPLY)
    with pytest.raises(GenerationError, match="gave its sequence back"):
        first.checkpoint()


@pytest.mark.parametrize("cache_bytes", [0, 1 << 10, 32 << 20])
def test_a_prompt_cache_keeps_given_back_states_after_their_sequence_is_taken(smollm2: Model, cache_bytes: int) -> None:
    """One sequence, prompts that alternate: only the states kept in memory (``prompt_cache_bytes``, the least
    recently used dropped first; a state larger than the cache is not kept) let each prompt find its earlier cells;
    every reply is its lone reply either way."""
    engine = SharedEngine(
        smollm2, n_seq=1, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, n_threads=N_THREADS, prompt_cache_bytes=cache_bytes
    )
    prompts = [encode_prompt(smollm2, STEMS[stem] + ENDINGS[1]) for stem in (0, 1, 0, 1)]
    for prompt in prompts:
        generator = Generator(smollm2, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, engine=engine, mode="ngram")
        generator.set_logprobs(3)
        generator._native.prefill(prompt)
        assert recorded(generator, generator._native.take(REPLY)) == lone_reply(
            smollm2, prompt, EXACT_PROMPT_ROWS, settings={"mode": "ngram"}
        )
        generator._native.release_sequence()
    expected = sum(len(prompt) - 1 for prompt in prompts[2:]) if cache_bytes >= 1 << 20 else 0
    assert engine.reused_tokens == expected


def test_a_prefix_is_reused_only_under_its_reuse_key(smollm2: Model) -> None:
    """Cells and states kept under one reuse key serve no generation of another key (a server's tenants), and a
    generation without a key (None) neither keeps nor reuses any; every reply is its lone reply either way."""
    engine = SharedEngine(
        smollm2, n_seq=1, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, n_threads=N_THREADS, prompt_cache_bytes=32 << 20
    )
    prompt = encode_prompt(smollm2, STEMS[0] + ENDINGS[1])

    def generate(key: str | None) -> tuple[int, list[int]]:
        """The prompt tokens a generation of ``key`` reused, and its reply (its sequence given back after)."""
        generator = Generator(smollm2, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, engine=engine)
        assert generator.reuse_key == ""  # every generation's key unless told otherwise
        generator.set_reuse_key(key)
        before = engine.reused_tokens
        generator._native.prefill(prompt)
        reply = [*generator._native.take(REPLY)]
        generator._native.release_sequence()
        return engine.reused_tokens - before, reply

    first, alone = generate("a")
    assert first == 0
    assert generate("b") == (0, alone)  # a's kept cells are not b's
    assert generate("a") == (len(prompt) - 1, alone)  # a's state, kept in memory after b took the sequence
    assert generate(None) == (0, alone)  # no key: nothing reused ...
    assert generate("") == (0, alone)  # ... and nothing kept
    with pytest.raises(ValueError, match="at most 1024 bytes"):
        Generator(smollm2, n_ctx=N_CTX, n_batch=EXACT_PROMPT_ROWS, engine=engine).set_reuse_key("k" * 1025)
