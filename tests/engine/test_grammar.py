"""Grammars (GBNF, and JSON Schemas through llama.cpp's converter) in the sampler chain, exact under speculation.

A grammar constrains each reply (the tokens generated after the prompt or a new turn): greedy speculation with
a grammar commits what plain decoding with it commits, in every mode, a drafted token the grammar forbids being
rejected; sampled generations resume exactly in another process (the grammar's state is rebuilt by following
the reply); rejection sampling keeps the constrained distribution; bad grammars and replies that do not follow
a grammar are refused before anything changes. A grammar whose alternatives multiply its parse stacks is refused
in milliseconds (llama.cpp's engine is bounded by specstate's patch 0004), from a caller or a checkpoint, and
one that explodes only after its first character fails the generation cleanly.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checkpoint_codec as codec
from conftest import examples
from generator_worker import resume_elsewhere
from specstate import CorruptCheckpointError, Generator, Model, inspect_checkpoint, json_schema_to_grammar
from specstate._typing import Mode
from specstate_testkit.generator_support import MODES, tiny_generator

TESTS = Path(__file__).resolve().parent.parent / "support"  # the worker scripts
TEXT = "abc abc abd. abc abc"
#: Words of a, b, c, d and e, then a full stop: the tiny models' free text has every byte in it.
WORDS = 'root ::= [a-e ]+ "."'
WORDS_TEXT = re.compile(r"[a-e ]+\.")
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
CHAT_PROMPT = "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n"


def _nested_alternatives(levels: int, root: str = "l1") -> str:
    """`levels` rules of ten alternatives (a rule of the next level, then a digit): 10**levels parse stacks."""
    rules = [f"root ::= {root}"]
    for level in range(1, levels + 1):
        inner = f"l{level + 1} " if level < levels else ""
        rules.append(f"l{level} ::= " + " | ".join(f'{inner}"{digit}"' for digit in range(10)))
    return "\n".join(rules) + "\n"


#: 552 bytes asking llama.cpp's engine for a million parse stacks from the start (unbounded, it took hours).
EXPLODING = _nested_alternatives(6)
#: Two parse stacks at the start, a million once an "a" is read.
EXPLODING_AFTER_A = _nested_alternatives(6, root='"a" l1 | "b"')
#: What llama.cpp's engine says of both (patch 0004), after specstate's "the grammar is refused by ...".
TOO_MANY_STACKS = "(grammar too complex: more than 1024 parse stacks at one point (LLAMA_GRAMMAR_MAX_STACKS)"
#: Loose: a refusal takes milliseconds; the bound is that it is not hours.
QUICKLY = 10.0


def _text(generator: Generator) -> str:
    return generator.model.detokenize(generator.tokens)


@pytest.mark.parametrize("mode", MODES)
def test_greedy_speculation_with_a_grammar_equals_plain_decoding(tiny_map: dict[str, Path], mode: str) -> None:
    free = tiny_generator("none", tiny_map)
    prompt = free.model.tokenize(TEXT)
    free.generate(prompt, max_tokens=60)
    plain = tiny_generator("none", tiny_map, grammar=WORDS)
    plain.generate(prompt, max_tokens=60)
    assert not WORDS_TEXT.fullmatch(_text(free))
    assert plain.stopped_by == "eos" and WORDS_TEXT.fullmatch(plain.model.detokenize(plain.tokens[:-1]))
    # Without grammar drafts, a drafter's tokens reach verification as they are; with them (the default), a
    # drafted token the grammar forbids ends the draft before it is verified.
    speculative = tiny_generator(mode, tiny_map, grammar=WORDS, grammar_drafts=False)
    speculative.generate(prompt, max_tokens=60)
    assert speculative.tokens == plain.tokens
    if mode != "none":
        assert speculative.drafted > speculative.accepted  # the grammar rejected drafted tokens
    pruned = tiny_generator(mode, tiny_map, grammar=WORDS)
    pruned.generate(prompt, max_tokens=60)
    assert pruned.tokens == plain.tokens


@pytest.mark.parametrize("mode", MODES)
def test_a_sampled_generation_with_a_grammar_resumes_in_another_process(
    tiny_map: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    grammar = 'root ::= ([a-e] [a-e ]*) ("." [a-e ]+)*'  # never ends: the 60 tokens all follow it
    settings: dict[str, Any] = {"temperature": 1.0, "top_k": 40, "seed": 7, "grammar": grammar}
    boundary = random.Random(f"grammar-{mode}").randint(5, 40)
    reference = tiny_generator(mode, tiny_map, **settings)
    prompt = reference.model.tokenize(TEXT)
    reference.generate(prompt, max_tokens=60)
    assert re.fullmatch(r"[a-e][a-e .]*", _text(reference))
    generator = tiny_generator(mode, tiny_map, **settings)
    generator.generate(prompt, max_tokens=boundary)
    path = tmp_path / "grammar.ckpt"
    generator.save(path)
    assert inspect_checkpoint(path.read_bytes())["config"]["grammar"] == grammar
    assert resume_elsewhere(tiny_map, mode, path, 60) == reference.tokens


def test_rejection_sampling_keeps_the_constrained_distribution(tiny_map: dict[str, Path]) -> None:
    """Two-sample chi-square: the second token of `draft` mode (a draft from the draft model's own distribution,
    which ignores the grammar, then verified) against plain sampling, over 400 seeds each."""
    grammar = 'root ::= [a-d] [a-d] "."'
    counts: dict[str, Counter[tuple[int, ...]]] = {}
    for mode in ("none", "draft"):
        counts[mode] = Counter()
        for seed in range(400):
            generator = tiny_generator(mode, tiny_map, n_draft=1, temperature=8.0, seed=seed, grammar=grammar)
            generator.generate(generator.model.tokenize(TEXT), max_tokens=2)
            counts[mode][tuple(generator.tokens)] += 1
    plain, speculative = counts["none"], counts["draft"]
    cells = sorted(set(plain) | set(speculative))
    assert all(re.fullmatch("[a-d]{2}", Model.detokenize(_tiny(tiny_map), list(cell))) for cell in cells)
    statistic = sum((plain[c] - speculative[c]) ** 2 / (plain[c] + speculative[c]) for c in cells)
    # At most 16 cells: the 99.9th percentile of chi-square with 15 degrees of freedom is 37.7.
    assert len(cells) > 4 and statistic < 37.7, (statistic, plain, speculative)


def _tiny(paths: dict[str, Path]) -> Model:
    return Model(paths["qwen35"])


def test_a_grammar_set_in_the_middle_of_a_reply_must_fit_it(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map)
    generator.generate(generator.model.tokenize(TEXT), max_tokens=5)
    before = list(generator.tokens)
    generator.set_sampling(grammar='root ::= "zzz"')
    with pytest.raises(ValueError, match=r"token \d+ at reply position 0 is not allowed"):
        generator.generate(max_tokens=5)
    assert generator.tokens == before
    generator.set_sampling(grammar="")  # taken away: the generation goes on
    generator.generate(max_tokens=5)
    assert generator.tokens[:5] == before and len(generator.tokens) == 10


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ("root ::= foo", "grammar does not parse"),
        ("expr ::= [a-z]", "grammar does not parse"),
        ("root ::= root [a]", "left-recursive"),
        ("   ", "grammar is empty"),
        ("root ::= [a]\0", "NUL"),
        ("root ::= " + '"a" ' * 600_000, "more than 1048576"),
    ],
)
def test_bad_grammars_are_refused_before_anything_changes(
    tiny_map: dict[str, Path], grammar: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_generator("none", tiny_map, grammar=grammar)
    generator = tiny_generator("none", tiny_map, temperature=0.5, seed=3)
    with pytest.raises(ValueError, match=re.escape(message)):
        generator.set_sampling(grammar=grammar, temperature=0.0)
    assert generator.config["temperature"] == 0.5 and generator.config["grammar"] is None


def test_a_checkpoint_whose_reply_does_not_follow_its_grammar_is_corrupt(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map, grammar=WORDS)
    generator.generate(generator.model.tokenize(TEXT), max_tokens=6)
    data = generator.checkpoint()
    meta = codec.meta(data)
    assert meta["sampler"]["grammar"] == WORDS
    meta["sampler"]["grammar"] = 'root ::= "." [a-e]+'
    crafted = codec.reseal_sections(data, {"meta": json.dumps(meta).encode()})
    other = tiny_generator("ngram", tiny_map, grammar=WORDS)
    other.generate(other.model.tokenize("abd"), max_tokens=3)
    kept = other.checkpoint()
    with pytest.raises(CorruptCheckpointError, match=r"meta\.grammar: the reply does not follow the grammar"):
        other.load(crafted)
    assert other.checkpoint() == kept
    other.load(data)
    generator.generate(max_tokens=10)
    other.generate(max_tokens=10)
    assert other.tokens == generator.tokens


def test_a_json_schema_constrains_smollm2_and_speculation_keeps_the_text(smollm2: Model) -> None:
    grammar = json_schema_to_grammar(json.dumps(PERSON))
    prompt = smollm2.tokenize(CHAT_PROMPT, add_special=False, parse_special=True)
    texts = {}
    for mode in ("none", "ngram"):
        generator = Generator(smollm2, mode=mode, grammar=grammar, n_threads=2)
        generator.generate(prompt, max_tokens=60)
        assert generator.stopped_by == "eos"
        texts[mode] = generator.tokens
    reply = json.loads(smollm2.detokenize(texts["none"][:-1]))
    assert set(reply) == {"name", "age"} and isinstance(reply["age"], int)
    assert texts["ngram"] == texts["none"]


@pytest.mark.parametrize("schema", ["{", '{"type": "object", "properties": 3}', "", "[]x"])
def test_bad_schemas_are_refused(schema: str) -> None:
    with pytest.raises(ValueError):
        json_schema_to_grammar(schema)


def test_a_grammar_of_a_million_parse_stacks_is_refused_at_once(tiny_map: dict[str, Path]) -> None:
    started = time.monotonic()
    with pytest.raises(
        ValueError, match=re.escape("grammar is refused by llama.cpp's grammar engine " + TOO_MANY_STACKS)
    ):
        tiny_generator("none", tiny_map, grammar=EXPLODING)
    generator = tiny_generator("none", tiny_map, temperature=0.5, seed=3)
    with pytest.raises(ValueError, match=re.escape(TOO_MANY_STACKS)):
        generator.set_sampling(grammar=EXPLODING, temperature=0.0)
    assert time.monotonic() - started < QUICKLY
    assert generator.config["temperature"] == 0.5 and generator.config["grammar"] is None
    generator.generate(generator.model.tokenize(TEXT), max_tokens=3)
    assert len(generator.tokens) == 3


@pytest.mark.parametrize("grammar", [EXPLODING, EXPLODING_AFTER_A], ids=["from-the-start", "after-an-a"])
def test_a_checkpoint_whose_grammar_explodes_is_corrupt(tiny_map: dict[str, Path], grammar: str) -> None:
    """Restore compiles the grammar (the first one is refused there) and follows the reply with it (the reply
    starts with an "a", so the second is refused there)."""
    generator = tiny_generator("ngram", tiny_map, grammar='root ::= "a" [a-e ]+ "."')
    generator.generate(generator.model.tokenize(TEXT), max_tokens=6)
    data = generator.checkpoint()
    meta = codec.meta(data)
    meta["sampler"]["grammar"] = grammar
    crafted = codec.reseal_sections(data, {"meta": json.dumps(meta).encode()})
    kept = generator.checkpoint()
    started = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match=r"meta\.grammar.*" + re.escape(TOO_MANY_STACKS)):
        Generator.restore(crafted, _tiny(tiny_map))
    with pytest.raises(CorruptCheckpointError, match=r"meta\.grammar.*" + re.escape(TOO_MANY_STACKS)):
        generator.load(crafted)
    assert time.monotonic() - started < QUICKLY
    assert generator.checkpoint() == kept


@pytest.mark.parametrize("mode", MODES)
def test_a_grammar_whose_stacks_explode_after_its_first_character_fails_the_reply_cleanly(
    tiny_map: dict[str, Path], mode: str
) -> None:
    """The grammar compiles (two stacks); checking the first token's candidates, those that start with an "a",
    would need a million: the prompt's decode is undone and the generator goes on with another grammar."""
    generator = tiny_generator(mode, tiny_map, grammar=EXPLODING_AFTER_A)
    prompt = generator.model.tokenize(TEXT)
    started = time.monotonic()
    with pytest.raises(
        ValueError, match=re.escape("the grammar is refused by llama.cpp's grammar engine " + TOO_MANY_STACKS)
    ):
        generator.generate(prompt, max_tokens=10)
    assert time.monotonic() - started < QUICKLY
    assert generator.tokens == []
    generator.set_sampling(grammar=WORDS)
    generator.generate(prompt, max_tokens=60)
    reference = tiny_generator(mode, tiny_map, grammar=WORDS)
    reference.generate(prompt, max_tokens=60)
    assert generator.tokens == reference.tokens


def test_a_json_schema_of_a_thousand_choices_stays_within_the_bounds(smollm2: Model) -> None:
    """An enum of 1000 strings is 1000 parse stacks at its start, near the engine's 1024: followed on SmolLM2."""
    choices = [f"item-{index:04d}" for index in range(1000)]
    grammar = json_schema_to_grammar(json.dumps({"enum": choices}))
    prompt = smollm2.tokenize(CHAT_PROMPT.replace("a person", "an item"), add_special=False, parse_special=True)
    generator = Generator(smollm2, mode="none", grammar=grammar, n_threads=2)
    started = time.monotonic()
    generator.generate(prompt, max_tokens=30)
    assert time.monotonic() - started < 30
    assert (
        json.loads(smollm2.detokenize(generator.tokens[:-1] if generator.stopped_by == "eos" else generator.tokens))
        in choices
    )


# --- drafts from the grammar ---------------------------------------------------------------------------------

#: Runs of text the grammar alone decides, between short free words.
FORCED_RUNS = 'root ::= "abc abd. " [a-e]{1,3} " abc abd. " [a-e]{1,3} "."'
#: Keys and value types the schemas of the property are drawn from.
KEYS = ["name", "city", "start_time", "attendees", "is_online", "description"]
VALUES: list[dict[str, Any]] = [
    {"type": "string"},
    {"type": "integer"},
    {"type": "boolean"},
    {"enum": ["red", "green", "blue"]},
]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("mode", MODES)
def test_grammar_drafts_change_no_reply_in_any_mode(tiny_map: dict[str, Path], mode: str, sampled: bool) -> None:
    replies = {}
    for on in (True, False):
        generator = tiny_generator(mode, tiny_map, sampled=sampled, grammar=FORCED_RUNS, grammar_drafts=on)
        assert generator.grammar_drafts is on
        generator.generate(generator.model.tokenize(TEXT), max_tokens=40)
        replies[on] = generator.tokens, generator.accepted, generator.rounds
    assert replies[True][0] == replies[False][0]
    # Fewer rounds where the grammar drafts: not in `none` mode on the tiny target (hybrid: `none` mode keeps no
    # snapshots to roll a draft back), nor beside a draft model that samples or a session (they draft alone).
    if mode == "ngram" or (mode == "draft" and not sampled):
        assert replies[True][2] < replies[False][2]


def test_the_tokens_a_grammar_forces_are_drafted_in_none_mode(smollm2: Model) -> None:
    schema = {"type": "object", "properties": {key: {"type": "string"} for key in KEYS[:3]}, "required": KEYS[:3]}
    grammar = json_schema_to_grammar(json.dumps(schema))
    prompt = smollm2.tokenize(CHAT_PROMPT, add_special=False, parse_special=True)
    runs = {}
    for on in (True, False):
        generator = Generator(smollm2, grammar=grammar, n_ctx=256, n_threads=2, grammar_drafts=on)
        generator.generate(prompt, max_tokens=60)
        runs[on] = generator
    assert runs[True].tokens == runs[False].tokens
    assert runs[False].drafted == 0
    # The key names and the punctuation around them are drafted and accepted: fewer rounds for the same reply.
    assert runs[True].accepted >= 6 and runs[True].rounds < runs[False].rounds
    # A runtime choice: switched off between calls, and not part of the checkpoint.
    restored = Generator.restore(runs[True].checkpoint(), smollm2, grammar_drafts=False)
    assert not restored.grammar_drafts and restored.config == runs[True].config


@given(
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
    values=st.lists(st.sampled_from(range(len(VALUES))), min_size=4, max_size=4),
    mode=st.sampled_from(["none", "ngram"]),
    seed=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
@settings(max_examples=examples(ci=5, dev=20), deadline=None)
def test_grammar_drafts_keep_every_reply_under_small_schemas(
    smollm2: Model, keys: list[str], values: list[int], mode: Mode, seed: int | None
) -> None:
    """Greedy (no seed) or seeded: the reply under a schema is the same with grammar drafts on and off."""
    schema = {
        "type": "object",
        "properties": {key: VALUES[index] for key, index in zip(keys, values)},
        "required": keys,
    }
    grammar = json_schema_to_grammar(json.dumps(schema))
    sampling: dict[str, Any] = {} if seed is None else {"temperature": 0.8, "top_k": 40, "seed": seed}
    prompt = smollm2.tokenize(CHAT_PROMPT, add_special=False, parse_special=True)
    replies = []
    for on in (True, False):
        generator = Generator(
            smollm2, mode=mode, grammar=grammar, n_ctx=256, n_threads=2, grammar_drafts=on, **sampling
        )
        generator.generate(prompt, max_tokens=32)
        replies.append(generator.tokens)
    assert replies[0] == replies[1]
