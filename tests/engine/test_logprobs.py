"""Log-probabilities of generated tokens (``Generator.set_logprobs``, llama-cpp-python's ``logprobs``): the
log-softmax of the target's logits at each position, which speculation does not change (a verified row's logits
are a plain decode's, bit for bit), kept across checkpoints for the tokens not yet handed out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import checkpoint_codec as codec
from specstate import CorruptCheckpointError, Generator, Model, TokenLogprobs
from specstate_testkit.generator_support import MODES, tiny_generator

TEXT = "abc abc abd. abc abc"


def _check_record(record: TokenLogprobs | None, top_n: int) -> TokenLogprobs:
    assert record is not None and len(record.top) == top_n
    assert all(a[1] >= b[1] for a, b in zip(record.top, record.top[1:]))
    assert record.logprob <= 0 and record.top[0][1] >= record.logprob
    return record


@pytest.mark.parametrize("mode", MODES)
def test_speculation_reports_the_log_probabilities_of_plain_decoding(tiny_map: dict[str, Path], mode: str) -> None:
    plain = tiny_generator("none", tiny_map)
    plain.set_logprobs(5)
    prompt = plain.model.tokenize(TEXT)
    plain.generate(prompt, max_tokens=40)
    speculative = tiny_generator(mode, tiny_map)
    speculative.set_logprobs(5)
    speculative.generate(prompt, max_tokens=40)
    assert speculative.tokens == plain.tokens
    assert speculative.logprobs == plain.logprobs  # bit for bit (floats compared exactly)
    for token, record in zip(plain.tokens, plain.logprobs):
        checked = _check_record(record, 5)
        assert checked.token == token and checked.top[0][0] == token  # greedy: the most likely token
    first = _check_record(plain.logprobs[0], 5)
    probabilities = [math.exp(lp) for _, lp in first.top]
    assert sum(probabilities) <= 1.0 + 1e-6


def test_recording_starts_when_asked_and_stops(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map)
    generator.generate(generator.model.tokenize(TEXT), max_tokens=5)
    generator.set_logprobs(0)
    generator.generate(max_tokens=5)
    records = generator.logprobs
    assert records[:5] == [None] * 5 and all(r is not None and r.top == [] for r in records[5:])
    generator.set_logprobs(0)  # the same request keeps the records
    assert generator.logprobs == records
    generator.set_logprobs(None)
    assert generator.logprobs == [None] * 10
    for bad in (-1, 21):
        with pytest.raises(ValueError, match="top_logprobs"):
            generator.set_logprobs(bad)


@pytest.mark.parametrize("mode", ["ngram", "draft", "mtp"])
def test_a_checkpoint_keeps_the_records_of_tokens_not_yet_handed_out(tiny_map: dict[str, Path], mode: str) -> None:
    reference = tiny_generator(mode, tiny_map, sampled=True)
    reference.set_logprobs(3)
    prompt = reference.model.tokenize(TEXT)
    reference.generate(prompt, max_tokens=40)
    generator = tiny_generator(mode, tiny_map, sampled=True)
    generator.set_logprobs(3)
    generator.stream(prompt, max_tokens=40).__next__()  # one token out; its round committed more
    data = generator.checkpoint()
    restored = Generator.restore(data, generator.model, draft_model=generator.draft_model)
    restored.generate(max_tokens=40 - len(restored.tokens))
    assert restored.tokens == reference.tokens
    handed_out = len(generator.tokens)
    assert restored.logprobs[:handed_out] == [None] * handed_out
    assert restored.logprobs[handed_out:] == reference.logprobs[handed_out:]


def _with_tokens_waiting(tiny_map: dict[str, Path]) -> Generator:
    """An ngram generation recording 2 alternatives, stopped where a round committed tokens not handed out."""
    generator = tiny_generator("ngram", tiny_map)
    generator.set_logprobs(2)
    generator.generate(generator.model.tokenize("abc abc abc abc abc abc"), max_tokens=1)
    while not generator._native.undelivered:
        generator.generate(max_tokens=1)
    return generator


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda entry: entry.update(top_n=21), "top_n 21 is above 20"),
        (lambda entry: entry.update(start=0), "unknown field"),
        (lambda entry: entry["records"].pop(), "do not end with the reply"),
        (lambda entry: entry["records"][-1].update(logprob=0.5), "a record is not a log-probability"),
        (lambda entry: entry["records"][-1]["top"].append([10**6, -1.0]), "a record is not a log-probability"),
    ],
)
def test_bad_records_are_refused(tiny_map: dict[str, Path], change: object, message: str) -> None:
    generator = _with_tokens_waiting(tiny_map)
    data = generator.checkpoint()
    meta = codec.meta(data)
    entry = meta["logprobs"]
    assert entry["top_n"] == 2 and entry["from"] == len(generator.tokens) and entry["records"]
    change(entry)  # type: ignore[operator]
    crafted = codec.reseal_sections(data, {"meta": json.dumps(meta).encode()})
    with pytest.raises(CorruptCheckpointError, match=message):
        Generator.restore(crafted, generator.model)


def test_smollm2_log_probabilities_are_a_distribution(smollm2: Model) -> None:
    generator = Generator(smollm2, mode="ngram", n_threads=2)
    generator.set_logprobs(20)
    generator.generate("The capital of France is", max_tokens=4)
    first = _check_record(generator.logprobs[0], 20)
    assert smollm2.token_to_piece(first.token).strip() == b"Paris"
    assert 0.5 < sum(math.exp(lp) for _, lp in first.top) <= 1.0 + 1e-6
