"""``LookupCorpus``: earlier texts that ``ngram`` mode's prompt lookup copies besides the history. It changes the
proposals, never the text: greedy and seeded replies equal plain decoding's with or without a corpus, and the
drafts copied from it are accepted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import Generator, LookupCorpus, Model
from specstate._typing import Mode
from specstate.bench import STORY_PROMPT

TOKENS = 48


def _reply(model: Model, corpus: LookupCorpus | None = None, mode: Mode = "ngram", **settings: Any) -> Generator:
    generator = Generator(model, mode=mode, n_draft=8, n_ctx=512, n_threads=2, **settings)
    if corpus is not None:
        generator.set_lookup_corpus(corpus)
    generator.generate(STORY_PROMPT, max_tokens=TOKENS)
    return generator


def test_an_earlier_reply_in_the_corpus_is_drafted_and_changes_no_token(smollm2: Model) -> None:
    plain = _reply(smollm2, mode="none")
    alone = _reply(smollm2)
    corpus = LookupCorpus()
    corpus.add(smollm2.tokenize(STORY_PROMPT, add_special=False, parse_special=True) + plain.tokens)
    helped = _reply(smollm2, corpus)
    assert alone.tokens == helped.tokens == plain.tokens
    # The story does not repeat itself: alone, lookup finds little; the earlier reply is copied nearly whole.
    assert helped.accepted >= TOKENS - 8 > alone.accepted
    assert helped.rounds < alone.rounds


@given(seed=st.integers(0, 2**32 - 1), temperature=st.sampled_from([0.3, 0.8, 1.5]))
@settings(max_examples=examples(ci=6, dev=2), deadline=None)
def test_seeded_replies_are_plain_samplings_whatever_the_corpus_holds(
    smollm2: Model, seed: int, temperature: float
) -> None:
    chain: dict[str, Any] = dict(temperature=temperature, top_k=40, top_p=0.95, seed=seed)
    plain = _reply(smollm2, mode="none", **chain)
    corpus = LookupCorpus()
    corpus.add(plain.tokens)
    corpus.add(_reply(smollm2, mode="none", temperature=temperature, seed=seed + 1).tokens)
    assert _reply(smollm2, corpus, **chain).tokens == plain.tokens


def test_drafts_stop_before_ids_outside_the_vocabulary(smollm2: Model) -> None:
    plain = _reply(smollm2, mode="none")
    corpus = LookupCorpus()
    poisoned = [token if index % 5 else 2**31 - 1 for index, token in enumerate(plain.tokens)]
    corpus.add(smollm2.tokenize(STORY_PROMPT, add_special=False, parse_special=True) + poisoned)
    helped = _reply(smollm2, corpus)
    assert helped.tokens == plain.tokens and helped.accepted > 0


def test_the_budget_keeps_the_newest_texts() -> None:
    corpus = LookupCorpus(max_tokens=6)
    assert (corpus.max_tokens, corpus.n_documents, corpus.n_tokens) == (6, 0, 0)
    corpus.add([1, 2, 3])
    corpus.add([4, 5, 6])
    corpus.add([7, 8])
    assert (corpus.n_documents, corpus.n_tokens) == (2, 5)
    corpus.add(range(100))
    assert (corpus.n_documents, corpus.n_tokens) == (1, 6)
    assert repr(corpus) == "LookupCorpus(max_tokens=6, n_documents=1, n_tokens=6)"
    corpus.clear()
    assert (corpus.n_documents, corpus.n_tokens) == (0, 0)


@pytest.mark.parametrize("max_tokens", [0, -1, 2**22 + 1, 2**80])
def test_bad_budgets_are_refused(max_tokens: int) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        LookupCorpus(max_tokens=max_tokens)


def test_bad_texts_and_modes_are_refused_and_change_nothing(smollm2: Model) -> None:
    corpus = LookupCorpus()
    corpus.add([5, 6])
    with pytest.raises(ValueError, match="non-negative"):
        corpus.add([1, -3])
    assert (corpus.n_documents, corpus.n_tokens) == (1, 2)
    with pytest.raises(TypeError):
        corpus.add(["a"])  # type: ignore[list-item]
    plain = Generator(smollm2, mode="none", n_ctx=256, n_threads=1)
    with pytest.raises(ValueError, match="mode 'ngram', not 'none'"):
        plain.set_lookup_corpus(corpus)
    plain.set_lookup_corpus(None)
    LookupCorpus.check_mode("ngram")  # the rule both refusals apply
    with pytest.raises(ValueError, match="mode 'ngram', not 'draft'"):
        LookupCorpus.check_mode("draft")


def test_one_corpus_serves_generators_on_several_threads(smollm2: Model) -> None:
    plain = _reply(smollm2, mode="none")
    corpus = LookupCorpus()
    corpus.add(smollm2.tokenize(STORY_PROMPT, add_special=False, parse_special=True) + plain.tokens)
    replies: list[list[int]] = []

    def generate() -> None:
        replies.append(_reply(smollm2, corpus).tokens)
        corpus.add(replies[-1])

    threads = [threading.Thread(target=generate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert replies == [plain.tokens, plain.tokens]
    assert corpus.n_documents == 3


def test_a_llama_learns_each_finished_completion_and_drafts_from_it(smollm2_file: Path) -> None:
    from specstate.llama import Llama

    corpus = LookupCorpus()
    first = Llama(str(smollm2_file), mode="ngram", n_ctx=512, n_threads=2, lookup_corpus=corpus)
    text = first.create_completion(STORY_PROMPT, max_tokens=TOKENS, temperature=0.0)["choices"][0]["text"]
    assert corpus.n_documents == 1 and first.lookup_corpus is corpus
    alone = Llama(str(smollm2_file), mode="ngram", n_ctx=512, n_threads=2)
    helped = Llama(str(smollm2_file), mode="ngram", n_ctx=512, n_threads=2, lookup_corpus=corpus)
    for llm in (alone, helped):
        assert llm.create_completion(STORY_PROMPT, max_tokens=TOKENS, temperature=0.0)["choices"][0]["text"] == text
    assert helped._last is not None and alone._last is not None
    assert helped._last.accepted > alone._last.accepted
    assert corpus.n_documents == 2


def test_a_llama_learns_each_finished_tool_chat(smollm2_file: Path) -> None:
    from specstate.llama import Llama

    corpus = LookupCorpus()
    llm = Llama(str(smollm2_file), mode="ngram", n_ctx=512, n_threads=2, lookup_corpus=corpus)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    messages = [{"role": "user", "content": "What time is it?"}]
    reply = llm.create_chat_completion(messages, tools=[tool], max_tokens=8, temperature=0.0)
    assert reply["choices"][0]["message"]["role"] == "assistant" and corpus.n_documents == 1
    stream = llm.create_chat_completion(messages, tools=[tool], max_tokens=8, temperature=0.0, stream=True)
    assert list(stream) and corpus.n_documents == 2  # a streamed one once its last chunk is read
    assert llm._last is not None
    assert corpus.n_tokens == 2 * (len(llm._last.prompt_tokens) + len(llm._last.tokens))


def test_a_llama_refuses_a_corpus_outside_ngram_mode(smollm2_file: Path) -> None:
    from specstate.llama import Llama

    with pytest.raises(ValueError, match="mode 'ngram'"):
        Llama(str(smollm2_file), mode="none", lookup_corpus=LookupCorpus())
    with pytest.raises(TypeError, match="LookupCorpus"):
        Llama(str(smollm2_file), mode="ngram", lookup_corpus=[1, 2])  # type: ignore[arg-type]
