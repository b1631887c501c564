"""The five-mode Generator: faithful speculation, exact resume, stop conditions.

Tiny models for every mode (hypothesis picks the checkpoint boundary, the
draft length and the prompt); SmolLM2-135M-Instruct Q4_1 for the real-model
cases of `none`, `ngram` and `draft` (SmolLM2 has no MTP head and no EAGLE-3
draft exists for it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from specstate import GenerationError, Generator, Model, inspect_checkpoint
from specstate_testkit.generator_support import (
    MODES,
    TINY_CTX,
    resume_matches,
    sampling,
    tiny_generator,
    tiny_resume_matches,
)
from specstate_testkit.reference import plain_greedy

TESTS = Path(__file__).resolve().parent.parent / "support"  # the worker scripts
#: A prompt that repeats itself, so that prompt lookup drafts and gets accepted.
REPEATING = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n\n"
    "# The same four functions again, unchanged:\n"
)


# --- faithful speculation ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@given(
    text=st.text(alphabet="abcdefgh ij.,", min_size=1, max_size=30),
    n_draft=st.integers(1, 8),
    n_threads=st.sampled_from([1, 2]),
)
@settings(max_examples=examples(ci=100, dev=20), deadline=None)
def test_every_mode_commits_the_targets_greedy_tokens_on_tiny_models(
    tiny_map: dict[str, Path], mode: str, text: str, n_draft: int, n_threads: int
) -> None:
    """Speculation never changes greedy text: token for token what one-token decodes at one thread give."""
    generator = tiny_generator(mode, tiny_map, n_draft=n_draft, n_threads=n_threads)
    prompt = generator.model.tokenize(text)
    generator.generate(prompt, max_tokens=100)
    plain, _ = plain_greedy(generator.model, prompt, len(generator.tokens), n_ctx=TINY_CTX, n_rs_seq=0)
    assert generator.tokens == plain
    if mode in ("draft", "mtp", "eagle3") and len(generator.tokens) > 8:  # (prompt lookup needs repetition)
        assert generator.drafted > 0


@pytest.fixture(scope="module")
def smollm2_draft_path(smollm2_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specstate_testkit.smollm2_draft import build_smollm2_draft

    return build_smollm2_draft(smollm2_file, tmp_path_factory.mktemp("draft") / "smollm2-draft.gguf")


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculation_on_smollm2_matches_plain_greedy(smollm2: Model, smollm2_draft_path: Path, mode: str) -> None:
    draft = Model(smollm2_draft_path) if mode == "draft" else None
    prompt = smollm2.tokenize(REPEATING)
    none = Generator(smollm2, n_ctx=1024)
    none.generate(prompt, max_tokens=128)
    speculative = Generator(smollm2, mode=mode, draft_model=draft, n_ctx=1024)  # type: ignore[arg-type]
    speculative.generate(prompt, max_tokens=128)
    assert speculative.tokens == none.tokens  # exact verification: speculation never changes the text
    print(f"SmolLM2 {mode}: acceptance {speculative.accepted}/{speculative.drafted}")
    assert speculative.accepted > 0
    assert speculative.rounds < 127


def test_draft_mode_copies_a_repeated_passage_without_the_draft_model(smollm2: Model, smollm2_draft_path: Path) -> None:
    """Where the history's end repeats an earlier passage (8 tokens agreeing), draft mode drafts what followed it by
    prompt lookup: the round runs no draft model decode, and the reply is still plain greedy decoding's."""
    functions = smollm2.tokenize(REPEATING, add_special=False)
    prompt = functions + functions[:12]
    generator = Generator(smollm2, mode="draft", draft_model=Model(smollm2_draft_path), n_ctx=512, n_draft=6)
    generator.generate(prompt, max_tokens=1)
    generator.generate(max_tokens=1)
    _, draft_memory = generator._native.memory_positions
    assert draft_memory == (-1, -1)  # the draft model has decoded nothing, not even the prompt
    assert generator.drafted == 6
    generator.generate(max_tokens=40)
    none = Generator(smollm2, n_ctx=512)
    none.generate(prompt, max_tokens=len(generator.tokens))
    assert generator.tokens == none.tokens


# --- exact resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", MODES)
@given(
    rounds=st.integers(0, 12),
    n_draft=st.integers(1, 6),
    text=st.text(alphabet="abcdefgh ij.,", min_size=1, max_size=30),
)
@settings(max_examples=examples(ci=12, dev=4), deadline=None)
def test_resume_is_exact_in_every_mode(
    tiny_map: dict[str, Path], mode: str, sampled: bool, rounds: int, n_draft: int, text: str
) -> None:
    resumed, uninterrupted = tiny_resume_matches(tiny_map, mode, text, rounds, 60, sampled=sampled, n_draft=n_draft)
    assert resumed == uninterrupted


@pytest.mark.parametrize("mode", MODES)
def test_resume_in_another_process(tiny_map: dict[str, Path], mode: str, tmp_path: Path) -> None:
    sampled = mode in ("ngram", "mtp")  # one sampled and one greedy case per kind of drafter
    generator = tiny_generator(mode, tiny_map, sampled=sampled)
    reference = tiny_generator(mode, tiny_map, sampled=sampled)
    prompt = generator.model.tokenize("another process")
    reference.generate(prompt, max_tokens=80)
    generator.generate(prompt, max_tokens=30)
    path = tmp_path / "generation.ckpt"
    generator.save(path)
    result = subprocess.run(
        [
            sys.executable,
            str(TESTS / "generator_worker.py"),
            mode,
            str(tiny_map["qwen35"]),
            str(tiny_map["llama"]),
            str(tiny_map["eagle3_draft"]),
            str(path),
            "80",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=TESTS,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == reference.tokens


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", ["none", "ngram", "draft"])
@given(rounds=st.integers(0, 14))
@settings(max_examples=examples(ci=3, dev=1), deadline=None)
def test_resume_on_smollm2(smollm2: Model, smollm2_draft_path: Path, mode: str, sampled: bool, rounds: int) -> None:
    draft = Model(smollm2_draft_path) if mode == "draft" else None

    def make() -> Generator:
        return Generator(smollm2, mode=mode, draft_model=draft, n_ctx=512, **sampling(sampled))  # type: ignore[arg-type]

    resumed, uninterrupted = resume_matches(
        make,
        smollm2.tokenize(REPEATING),
        rounds,
        48,
        lambda data: Generator.restore(data, smollm2, draft_model=draft),
    )
    assert resumed == uninterrupted


def test_smollm2_resume_in_another_process(
    smollm2: Model, smollm2_file: Path, tmp_path: Path, tiny_map: dict[str, Path]
) -> None:
    reference = Generator(smollm2, mode="ngram", n_ctx=512, **sampling(True))
    reference.generate(REPEATING, max_tokens=64)
    generator = Generator(smollm2, mode="ngram", n_ctx=512, **sampling(True))
    generator.generate(REPEATING, max_tokens=20)
    path = tmp_path / "smollm2.ckpt"
    generator.save(path)
    result = subprocess.run(
        [
            sys.executable,
            str(TESTS / "generator_worker.py"),
            "ngram",
            str(tiny_map["qwen35"]),
            str(tiny_map["llama"]),
            str(tiny_map["eagle3_draft"]),
            str(path),
            "64",
            str(smollm2_file),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=TESTS,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == reference.tokens


# --- sampling, stop conditions, counters ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_seeded_sampling_is_reproducible(tiny_map: dict[str, Path], mode: str) -> None:
    runs = []
    for _ in range(2):
        generator = tiny_generator(mode, tiny_map, sampled=True)
        generator.generate("seeded", max_tokens=40)
        runs.append(generator.tokens)
    assert runs[0] == runs[1]
    greedy = tiny_generator(mode, tiny_map)
    greedy.generate("seeded", max_tokens=40)
    assert greedy.tokens != runs[0]


def _sampled_pair(
    smollm2: Model, seed: int, temperature: float, n_draft: int, policy: str
) -> tuple[Generator, Generator]:
    """The same seeded reply to ``REPEATING`` from plain sampling and from ``ngram`` (its cost curve pinned)."""
    chain: dict[str, Any] = dict(temperature=temperature, top_k=40, top_p=0.95, seed=seed)
    plain = Generator(smollm2, n_ctx=512, n_threads=2, **chain)
    plain.generate(REPEATING, max_tokens=40)
    curve = [5_000 + 4_000 * rows for rows in range(1, n_draft + 2)]  # pinned: no timing in the test
    adaptive: dict[str, Any] = {"draft_policy": "adaptive", "cost_curve": curve} if policy == "adaptive" else {}
    spec = Generator(smollm2, mode="ngram", n_draft=n_draft, n_ctx=512, n_threads=2, **chain, **adaptive)
    spec.generate(REPEATING, max_tokens=40)
    return plain, spec


@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.3, 0.8, 1.5]),
    n_draft=st.integers(1, 12),
    policy=st.sampled_from(["fixed", "adaptive"]),
)
@settings(max_examples=examples(ci=12, dev=4), deadline=None)
def test_sampled_prompt_lookup_commits_the_tokens_plain_sampling_commits(
    smollm2: Model, seed: int, temperature: float, n_draft: int, policy: str
) -> None:
    """``ngram`` drafts carry no distribution: each verified row's token is drawn as plain sampling draws it and
    the draft kept while it matches, so a seeded reply is plain sampling's whatever the drafts' lengths."""
    plain, spec = _sampled_pair(smollm2, seed, temperature, n_draft, policy)
    assert spec.tokens == plain.tokens


def test_sampled_prompt_lookup_accepts_drafts(smollm2: Model) -> None:
    plain, spec = _sampled_pair(smollm2, seed=1, temperature=0.3, n_draft=8, policy="fixed")
    assert spec.tokens == plain.tokens and spec.accepted > 0  # drafts verified and kept, not skipped


@pytest.mark.parametrize("mode", MODES)
def test_max_tokens_is_exact_across_calls(tiny_map: dict[str, Path], mode: str) -> None:
    generator = tiny_generator(mode, tiny_map, n_draft=6)
    pieces = list(generator.stream("count", max_tokens=13))
    assert len(generator.tokens) == 13 and generator.stopped_by == "max_tokens"
    assert "".join(pieces) == generator.text
    generator.generate(max_tokens=7)
    assert len(generator.tokens) == 20
    assert generator.generate(max_tokens=0) == "" and len(generator.tokens) == 20


def test_stop_strings_end_the_text_before_them(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map)
    full = tiny_generator("ngram", tiny_map)
    text = full.generate("stop", max_tokens=60)
    stop = text[20:23]
    cut = text.index(stop)
    assert generator.generate("stop", max_tokens=60, stop=[stop]) == text[:cut]
    assert generator.stopped_by == "stop"


def _self_drafting(paths: dict[str, Path]) -> Generator:
    """Draft mode with the target as its own draft: every draft is accepted, rounds commit n_draft + 1 tokens."""
    target = Model(paths["llama"])
    return Generator(target, mode="draft", draft_model=target, n_ctx=TINY_CTX, n_draft=6, n_threads=1)


STOP_CASES = [*MODES, "self-draft"]


def _stop_generator(case: str, paths: dict[str, Path]) -> Generator:
    return _self_drafting(paths) if case == "self-draft" else tiny_generator(case, paths, n_draft=6)


@pytest.mark.parametrize("case", STOP_CASES)
def test_a_stop_string_leaves_the_rest_of_the_round_undelivered(tiny_map: dict[str, Path], case: str) -> None:
    full = _stop_generator(case, tiny_map)
    text = full.generate("stop here", max_tokens=60)
    stop = text[30:33]
    cut = text.index(stop)
    generator = _stop_generator(case, tiny_map)
    first = generator.generate("stop here", max_tokens=60, stop=stop)
    assert first == text[:cut] and generator.stopped_by == "stop"
    # Handed out: exactly the tokens up to the one that completes the stop string.
    n = len(generator.tokens)
    assert generator.tokens == full.tokens[:n]
    assert len(generator.model.detokenize(full.tokens[: n - 1])) < cut + len(stop) <= len(generator.text)
    saved = generator.checkpoint()
    rest = generator.generate(max_tokens=60 - n)
    assert first + stop + rest == text == generator.text
    draft = generator.draft_model
    restored = Generator.restore(saved, generator.model, draft_model=draft, n_threads=1)
    restored.generate(max_tokens=60 - n)
    assert restored.tokens == full.tokens


def test_a_stream_closed_early_keeps_its_text_for_the_next_call(tiny_map: dict[str, Path]) -> None:
    full = _self_drafting(tiny_map)
    text = full.generate("close me", max_tokens=40)
    generator = _self_drafting(tiny_map)
    stream = generator.stream("close me", max_tokens=40, stop=["never there, but long enough to hold text"])
    first = next(stream)
    assert isinstance(stream, types.GeneratorType)
    stream.close()
    assert first + generator.generate(max_tokens=40 - len(generator.tokens)) == text


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda g: g.generate("Hello", max_tokens=2.5), TypeError, "max_tokens must be an integer, not float"),
        (lambda g: g.generate("Hello", max_tokens=True), TypeError, "max_tokens must be an integer, not bool"),
        (lambda g: g.generate("Hello", max_tokens=-1), ValueError, "max_tokens must not be negative"),
        (lambda g: g.generate("Hello", max_tokens=2, stop=[1]), TypeError, "stop must be a string"),
        (lambda g: g.generate("Hello", max_tokens=2, literal="no"), TypeError, "literal must be a bool"),
        (lambda g: g.generate([1, 2.5], max_tokens=2), TypeError, "prompt token must be an integer"),
        (lambda g: g.generate(b"Hello", max_tokens=2), TypeError, "prompt must be a str"),
        (lambda g: g.chat("Hello", max_tokens=2.5, template="chatml"), TypeError, "max_tokens must be an integer"),
        (lambda g: g.chat("Hello", max_tokens=0, template="chatml"), ValueError, "max_tokens must be at least 1"),
        (lambda g: g.chat("Hello", max_tokens=2, template=5), TypeError, "template must be a str or None"),
    ],
)
def test_arguments_are_checked_before_anything_changes(
    tiny_map: dict[str, Path], call: object, error: type[Exception], message: str
) -> None:
    generator = tiny_generator("ngram", tiny_map)
    with pytest.raises(error, match=message):
        call(generator)  # type: ignore[operator]
    assert generator._native.history == []
    # The same generator then works as if the refused call had never been made.
    assert len(generator.chat("Hello", max_tokens=4, template="chatml")) > 0
    assert [m["role"] for m in generator.messages] == ["user", "assistant"]


def test_eos_ends_a_generation(smollm2: Model) -> None:
    prompt = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
    )
    generator = Generator(smollm2, mode="ngram", n_ctx=512)
    text = generator.generate(smollm2.tokenize(prompt, add_special=False, parse_special=True), max_tokens=200)
    assert generator.finished and generator.stopped_by == "eos"
    assert smollm2.is_eog(generator.tokens[-1]) and text
    assert generator.generate(max_tokens=10) == "" and generator.stopped_by == "eos"
    restored = Generator.restore(generator.checkpoint(), smollm2)
    assert restored.finished and restored.generate(max_tokens=5) == ""


def test_counters_and_properties(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("draft", tiny_map)
    generator.generate("counters", max_tokens=50)
    assert generator.mode == "draft" and generator.draft_model is not None
    assert 0 < generator.accepted <= generator.drafted
    assert generator.acceptance_rate == generator.accepted / generator.drafted
    assert generator.tokens_per_second > 0
    assert generator.config["n_draft"] == 4 and generator.config["mode"] == "draft"
    assert generator.prompt_tokens == generator.model.tokenize("counters")


def test_generator_usage_errors(tiny_map: dict[str, Path]) -> None:
    target = Model(tiny_map["qwen35"])
    with pytest.raises(ValueError, match="needs a draft model"):
        Generator(target, mode="draft")
    with pytest.raises(ValueError, match="takes no draft model"):
        Generator(target, mode="ngram", draft_model=Model(tiny_map["llama"]))
    with pytest.raises(ValueError, match="mode"):
        Generator(target, mode="beam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature"):
        Generator(target, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        Generator(target, temperature=1.0, top_p=0.0)
    generator = Generator(target, n_ctx=TINY_CTX)
    with pytest.raises(ValueError, match="prompt is needed"):
        generator.generate(max_tokens=3)
    with pytest.raises(GenerationError, match="checkpoint"):
        generator.checkpoint()
    with pytest.raises(ValueError, match="empty"):
        generator.generate([], max_tokens=3)
    with pytest.raises(ValueError, match="vocabulary"):
        generator.generate([10**6], max_tokens=3)
    generator.generate("ok", max_tokens=2)
    with pytest.raises(GenerationError, match="already has a prompt"):
        generator.generate("again", max_tokens=2)


def test_a_hybrid_draft_model_is_refused_and_a_hybrid_target_rolls_back(tiny_map: dict[str, Path]) -> None:
    """A hybrid draft model cannot roll back a rejected draft: refused; a hybrid target can."""
    llama, qwen35 = Model(tiny_map["llama"]), Model(tiny_map["qwen35"])
    with pytest.raises(ValueError, match=r"draft model \(qwen35\) is recurrent or hybrid"):
        Generator(llama, mode="draft", draft_model=qwen35, n_ctx=TINY_CTX, n_batch=64, n_threads=1)
    # The other way round, the hybrid target rolls back rejected drafts, call after call.
    generator = tiny_generator("draft", tiny_map, sampled=True)
    for call in range(3):
        generator.generate("a hybrid target" if call == 0 else None, max_tokens=20)
    assert len(generator.tokens) == 60 and generator.drafted > generator.accepted > 0


def test_a_full_context_ends_the_generation(tiny_map: dict[str, Path]) -> None:
    generator = Generator(Model(tiny_map["llama"]), mode="ngram", n_ctx=64, n_batch=32, n_threads=1)
    generator.generate("fill the context up", max_tokens=500)
    assert generator.stopped_by == "context"
    assert len(generator.prompt_tokens) + len(generator.tokens) == generator.context_length


def test_checkpoint_size_is_the_state_in_use(smollm2: Model) -> None:
    generator = Generator(smollm2, mode="ngram", n_ctx=2048)
    generator.generate(REPEATING * 6, max_tokens=40)
    data = generator.checkpoint()
    info = inspect_checkpoint(data)
    sections = dict(info["sections"])
    in_use = sections["target_state"] + sections["tokens"]
    ratio = len(data) / in_use
    print(f"checkpoint {len(data)} bytes for {info['n_tokens']} tokens; ratio to the state in use {ratio:.4f}")
    assert ratio <= 1.05
    # No logits and no empty cells: about 23,040 bytes of f16 K and V per token.
    assert sections["target_state"] < 23_100 * info["n_tokens"]


def test_getters_from_another_thread_wait_for_a_running_call(smollm2: Model) -> None:
    """Reads from a second thread while the owner generates: values, never a borrow error."""
    generator = Generator(smollm2, mode="ngram", n_ctx=512, n_threads=1)
    generator.generate("Count from one to fifty: one, two, three,", max_tokens=1)
    done = threading.Event()
    errors: list[BaseException] = []
    reads = 0

    def read() -> None:
        nonlocal reads
        native = generator._native
        while not done.is_set():
            try:
                values = (native.history, native.finished, native.config, native.delivered, native.rounds)
                assert len(values[0]) >= native.n_prompt
                reads += 1
            except BaseException as error:
                errors.append(error)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        generator.generate(max_tokens=60)
    finally:
        done.set()
        reader.join()
    assert errors == [] and reads > 0
    assert len(generator.tokens) == 61


def test_n_ctx_0_is_the_trained_length_and_n_batch_is_clamped_to_n_ctx(tiny_map: dict[str, Path]) -> None:
    """As in llama.cpp and llama-cpp-python: resolved once in the core, recorded resolved."""
    model = Model(tiny_map["llama"])
    trained = model.n_ctx_train
    assert trained >= 2
    generator = Generator(model, mode="ngram", n_ctx=0, n_batch=2 * trained, n_threads=1)
    assert (generator.config["n_ctx"], generator.config["n_batch"]) == (trained, trained)
    assert generator.context_length >= trained
    generator.generate("the whole trained context", max_tokens=4)
    data = generator.checkpoint()
    assert (inspect_checkpoint(data)["config"]["n_ctx"], inspect_checkpoint(data)["config"]["n_batch"]) == (
        trained,
        trained,
    )
    assert Generator.restore(data, model, max_n_batch=trained).config == generator.config
    clamped = Generator(model, mode="ngram", n_ctx=64, n_batch=512, n_threads=1)
    assert (clamped.config["n_ctx"], clamped.config["n_batch"]) == (64, 64)
    with pytest.raises(ValueError, match=f"n_ctx must be between 2 and the model's trained context length {trained}"):
        Generator(model, n_ctx=trained + 1)
    with pytest.raises(ValueError, match=r"n_ctx must be between 2 and .* \(0: that length\), not 1"):
        Generator(model, n_ctx=1)
