"""MTP and EAGLE-3 sessions on real llama.cpp over tiny GGUF models.

The heart of the speculative-session contract: speculative generation commits exactly the target's
greedy tokens, and a generation checkpointed at a quiescent boundary (target
sequence state, draft sequence state, speculative state) resumes in fresh
contexts -- and in a fresh process -- token for token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specstate
from conftest import TinyModels, examples
from sessions_support import KINDS, N_CTX, Setup, build
from specstate import (
    BadSequenceError,
    CapacityError,
    ConfigError,
    Context,
    ContextError,
    Eagle3Session,
    ExcessiveStateError,
    GreedyGeneration,
    InvalidStateError,
    Model,
    MtpSession,
    NotQuiescentError,
    SessionError,
    StateUnavailableError,
    ThreadAffinityError,
)
from specstate_testkit.reference import error_from_another_thread, outcomes_during
from specstate_testkit.reference import plain_greedy as reference_greedy

TESTS = Path(__file__).resolve().parent.parent / "support"  # the worker scripts
PROMPTS = ["hello speculative world", "the quick brown fox", "abc", "state is exact; resume it!"]


@pytest.fixture(scope="module")
def models_by_kind(qwen35_model: Model, eagle3_draft_model: Model) -> dict[str, tuple[Model, Model | None]]:
    return {"mtp": (qwen35_model, None), "eagle3": (qwen35_model, eagle3_draft_model)}


def setup_for(models_by_kind: dict[str, tuple[Model, Model | None]], kind: str, n_draft_max: int = 3) -> Setup:
    target, draft = models_by_kind[kind]
    return build(kind, target, draft, n_draft_max)


def plain_greedy(model: Model, prompt: list[int], n_tokens: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding of the target with the top-two logit gap at each step."""
    recurrent = dict(n_rs_seq=3, n_ubatch=8) if model.is_hybrid else {}
    return reference_greedy(model, prompt, n_tokens, n_ctx=N_CTX, **recurrent)


def generate(setup: Setup, prompt: list[int], n_tokens: int) -> GreedyGeneration:
    generation = GreedyGeneration(setup.session)
    generation.prefill(prompt)
    generation.generate(n_tokens)
    return generation


# --- faithful speculation ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", PROMPTS)
def test_speculation_commits_the_targets_greedy_tokens(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str, text: str
) -> None:
    target_model = models_by_kind[kind][0]
    prompt = target_model.tokenize(text)
    generation = generate(setup_for(models_by_kind, kind), prompt, 80)
    plain, _ = plain_greedy(target_model, prompt, 80)
    assert generation.tokens[:80] == plain
    print(f"{kind}: accepted {generation.n_accepted}/{generation.n_drafted}")


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_are_sometimes_accepted_and_sometimes_rejected(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str
) -> None:
    setup = setup_for(models_by_kind, kind)
    generation = generate(setup, models_by_kind[kind][0].tokenize("acceptance"), 120)
    assert 0 < generation.n_accepted < generation.n_drafted
    assert setup.session.n_drafted >= generation.n_drafted
    assert setup.session.n_accepted == generation.n_accepted
    assert generation.rounds < len(generation.tokens)  # fewer target passes than tokens


def test_eagle3_over_a_transformer_target_matches_plain_greedy(llama_model: Model, eagle3_draft_model: Model) -> None:
    setup = build("eagle3", llama_model, eagle3_draft_model)
    prompt = llama_model.tokenize("transformer target")
    generation = generate(setup, prompt, 80)
    plain, _ = plain_greedy(llama_model, prompt, 80)
    assert generation.tokens[:80] == plain
    assert generation.n_accepted > 0


def test_eagle3_state_over_a_transformer_target_is_unavailable(llama_model: Model, eagle3_draft_model: Model) -> None:
    setup = build("eagle3", llama_model, eagle3_draft_model)
    generate(setup, llama_model.tokenize("x"), 10)
    with pytest.raises(StateUnavailableError, match="did not expose complete state"):
        setup.session.speculative_state()


# --- exact resume -----------------------------------------------------------------------------------


def checkpoint(setup: Setup, generation: GreedyGeneration) -> tuple[bytes, bytes, bytes, int, int, list[int]]:
    assert setup.session.is_quiescent()
    assert generation.n_past is not None and generation.id_last is not None
    return (
        setup.target.seq_state(0),
        setup.draft.seq_state(0),
        setup.session.speculative_state(0),
        generation.n_past,
        generation.id_last,
        generation.tokens,
    )


def resume(setup: Setup, saved: tuple[bytes, bytes, bytes, int, int, list[int]]) -> GreedyGeneration:
    target_state, draft_state, speculative_state, n_past, id_last, tokens = saved
    setup.target.set_seq_state(0, target_state)
    setup.draft.set_seq_state(0, draft_state)
    setup.session.restore_speculative_state(0, speculative_state)
    generation = GreedyGeneration(setup.session)
    generation.resume(n_past, id_last, tokens)
    return generation


@pytest.mark.parametrize("kind", KINDS)
@given(
    rounds=st.integers(0, 20),
    n_draft_max=st.integers(1, 6),
    text=st.text(alphabet="abcdefghij klmnop.,!", min_size=1, max_size=40),
)
@settings(max_examples=examples(ci=60, dev=15), deadline=None)
def test_resume_at_a_quiescent_boundary_is_exact(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str, rounds: int, n_draft_max: int, text: str
) -> None:
    n_tokens = 64
    prompt = models_by_kind[kind][0].tokenize(text)
    uninterrupted = generate(setup_for(models_by_kind, kind, n_draft_max), prompt, n_tokens).tokens[:n_tokens]

    first = setup_for(models_by_kind, kind, n_draft_max)
    generation = GreedyGeneration(first.session)
    generation.prefill(prompt)
    for _ in range(rounds):
        generation.step()
    saved = checkpoint(first, generation)
    del first, generation

    resumed = resume(setup_for(models_by_kind, kind, n_draft_max), saved)
    assert resumed.generate(n_tokens)[:n_tokens] == uninterrupted


@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_a_new_process_is_exact(
    models_by_kind: dict[str, tuple[Model, Model | None]], tiny_paths: TinyModels, kind: str, tmp_path: Path
) -> None:
    prompt = models_by_kind[kind][0].tokenize("a new process")
    uninterrupted = generate(setup_for(models_by_kind, kind, 4), prompt, 90).tokens[:90]
    setup = setup_for(models_by_kind, kind, 4)
    generation = GreedyGeneration(setup.session)
    generation.prefill(prompt)
    for _ in range(7):
        generation.step()
    target_state, draft_state, speculative_state, n_past, id_last, tokens = checkpoint(setup, generation)
    (tmp_path / "target.bin").write_bytes(target_state)
    (tmp_path / "draft.bin").write_bytes(draft_state)
    (tmp_path / "speculative.bin").write_bytes(speculative_state)
    (tmp_path / "cursor.json").write_text(json.dumps({"n_past": n_past, "id_last": id_last, "tokens": tokens}))
    result = subprocess.run(
        [
            sys.executable,
            str(TESTS / "resume_worker.py"),
            kind,
            str(tiny_paths.qwen35),
            str(tiny_paths.eagle3_draft),
            str(tmp_path),
            "4",
            "90",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=TESTS,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == uninterrupted


# --- invalid restores leave everything as it was ----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "corrupt", ["garbage", "truncated", "extended", "empty", "other-config", "other-seq", "flipped-header", "too-large"]
)
def test_invalid_speculative_state_leaves_the_session_unchanged(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str, corrupt: str
) -> None:
    setup = setup_for(models_by_kind, kind)
    prompt = models_by_kind[kind][0].tokenize("keep this state")
    generation = generate(setup, prompt, 20)
    before = setup.session.speculative_state()
    other = setup_for(models_by_kind, kind, n_draft_max=5)
    generate(other, prompt, 20)
    data = {
        "garbage": bytes(range(256)) * 2,
        "truncated": before[:-3],
        "extended": before + b"\x00",
        "empty": b"",
        "other-config": other.session.speculative_state(),
        "other-seq": before[:40] + (1).to_bytes(4, "little") + before[44:],  # the header's seq_id field
        "flipped-header": bytes([before[0] ^ 1]) + before[1:],
        "too-large": bytes(specstate.MAX_SPECULATIVE_STATE_BYTES + 1),
    }[corrupt]
    expected = ExcessiveStateError if corrupt == "too-large" else InvalidStateError
    with pytest.raises(expected):
        setup.session.restore_speculative_state(0, data)
    assert setup.session.speculative_state() == before
    # ... and the generation carries on exactly as an untouched one would.
    reference = setup_for(models_by_kind, kind)
    expected_tokens = generate(reference, prompt, 60).tokens[:60]
    assert generation.generate(60)[:60] == expected_tokens


@pytest.mark.parametrize("kind", KINDS)
def test_state_for_another_sequence_slot_is_invalid(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str
) -> None:
    target_model, draft_model = models_by_kind[kind]
    recurrent = dict(n_rs_seq=3, n_ubatch=8)
    target = Context(target_model, n_ctx=N_CTX, n_seq_max=2, **recurrent)  # type: ignore[arg-type]
    if kind == "mtp":
        draft = Context(target_model, n_ctx=N_CTX, n_seq_max=2, kind="mtp", **recurrent)  # type: ignore[arg-type]
        session: specstate.DraftSession = MtpSession(target, draft, n_seq=2)
    else:
        assert draft_model is not None
        draft = Context(draft_model, n_ctx=N_CTX, n_seq_max=2)
        session = Eagle3Session(target, draft, n_seq=2)
    state0, state1 = session.speculative_state(0), session.speculative_state(1)
    with pytest.raises(InvalidStateError):
        session.restore_speculative_state(1, state0)
    assert session.speculative_state(1) == state1
    with pytest.raises(BadSequenceError):
        session.speculative_state(2)
    with pytest.raises(BadSequenceError):
        session.restore_speculative_state(-1, state0)


# --- lifecycle errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_lifecycle_errors_are_typed(models_by_kind: dict[str, tuple[Model, Model | None]], kind: str) -> None:
    setup = setup_for(models_by_kind, kind, n_draft_max=4)
    session = setup.session
    prompt = models_by_kind[kind][0].tokenize("lifecycle")
    generation = GreedyGeneration(session)
    first = generation.prefill(prompt)
    with pytest.raises(SessionError, match="no pending proposal"):
        session.accept(0)
    proposal: list[int] = []
    n_past = len(prompt)
    while not proposal:  # drafts can be empty; find one that is not
        proposal = session.draft(n_past, first)
    assert session.has_pending_proposal() and not session.is_quiescent()
    with pytest.raises(SessionError, match="already pending"):
        session.draft(n_past, first)
    with pytest.raises(NotQuiescentError):
        session.speculative_state()
    with pytest.raises(NotQuiescentError):
        session.restore_speculative_state(0, b"LLSPEC1\x00" + bytes(40))
    with pytest.raises(SessionError, match="cannot accept"):
        session.accept(len(proposal) + 1)
    with pytest.raises(SessionError, match="pending"):
        session.begin(prompt)
    with pytest.raises(BadSequenceError):
        session.draft(n_past, first, seq_id=1)
    with pytest.raises(BadSequenceError):
        session.has_pending_proposal(7)
    session.accept(0)
    assert session.is_quiescent() and not session.has_pending_proposal()
    with pytest.raises(SessionError, match="MAX_SPECULATIVE_PROMPT_TOKENS"):
        session.begin([1] * (specstate.MAX_SPECULATIVE_PROMPT_TOKENS + 1))


def test_process_takes_only_the_batch_decoded_last(models_by_kind: dict[str, tuple[Model, Model | None]]) -> None:
    setup = setup_for(models_by_kind, "mtp")
    batch = specstate.Batch(8)
    for pos, token in enumerate(models_by_kind["mtp"][0].tokenize("abc")):
        batch.add(token, pos, logits=True)
    with pytest.raises(SessionError, match="decoded last"):
        setup.session.process(batch)  # never decoded
    setup.target.decode_batch(batch)
    setup.session.process(batch)
    batch.add(5, 10)
    with pytest.raises(SessionError, match="decoded last"):
        setup.session.process(batch)  # changed since it was decoded


def test_a_batch_decoded_before_the_session_is_refused(qwen35_model: Model) -> None:
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    draft = Context(qwen35_model, n_ctx=N_CTX, kind="mtp", n_rs_seq=3, n_ubatch=8)
    batch = specstate.Batch(8)
    batch.add(1, 0, logits=True)
    target.decode_batch(batch)
    session = MtpSession(target, draft)
    with pytest.raises(SessionError, match="after the session was created"):
        session.process(batch)


def test_configuration_is_validated_before_allocation(
    qwen35_model: Model, llama_model: Model, eagle3_draft_model: Model
) -> None:
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    draft = Context(qwen35_model, n_ctx=N_CTX, kind="mtp", n_rs_seq=3, n_ubatch=8)
    with pytest.raises(ConfigError, match=r"^n_draft_max is outside the supported bound$"):
        MtpSession(target, draft, n_draft_max=0)
    with pytest.raises(ConfigError, match=r"^p_min must be finite"):
        MtpSession(target, draft, p_min=float("nan"))
    with pytest.raises(ConfigError, match=r"^n_seq"):
        MtpSession(target, draft, n_seq=0)
    with pytest.raises(CapacityError, match=r"^recurrent context capacity is smaller than n_draft_max$"):
        MtpSession(target, draft, n_draft_max=4)
    # A hybrid context this narrow is refused when it is made (llama.cpp would abort on its
    # first decode: every compute pass must exceed n_rs_seq + 1 rows) ...
    with pytest.raises(ContextError, match="must exceed n_rs_seq"):
        Context(qwen35_model, n_ctx=N_CTX, n_batch=3, n_rs_seq=3, n_ubatch=8)
    # ... so the contract's batch check is met with a transformer target.
    small = Context(llama_model, n_ctx=N_CTX, n_batch=3)
    with pytest.raises(CapacityError, match=r"^target or draft batch capacity"):
        Eagle3Session(small, Context(eagle3_draft_model, n_ctx=N_CTX, other=small))


def test_incompatible_contexts_are_refused(qwen35_model: Model, llama_model: Model, eagle3_draft_model: Model) -> None:
    recurrent = dict(n_rs_seq=3, n_ubatch=8)
    target = Context(qwen35_model, n_ctx=N_CTX, **recurrent)  # type: ignore[arg-type]
    mtp_draft = Context(qwen35_model, n_ctx=N_CTX, kind="mtp", **recurrent)  # type: ignore[arg-type]
    plain_draft = Context(qwen35_model, n_ctx=N_CTX, **recurrent)  # type: ignore[arg-type]
    eagle_draft = Context(eagle3_draft_model, n_ctx=N_CTX)
    with pytest.raises(ContextError, match="kind 'mtp'"):
        MtpSession(target, plain_draft)
    with pytest.raises(ContextError, match="kind 'default'"):
        Eagle3Session(target, mtp_draft)
    with pytest.raises(ContextError, match="target context must be of kind 'default'"):
        MtpSession(mtp_draft, target)
    with pytest.raises(ContextError, match="different contexts"):
        MtpSession(target, target)
    with pytest.raises(ContextError, match="separate EAGLE-3 draft model"):
        Eagle3Session(target, plain_draft)
    with pytest.raises(ContextError, match="target's own model"):
        MtpSession(Context(llama_model, n_ctx=N_CTX), mtp_draft)
    with pytest.raises(ContextError, match="sequences"):
        MtpSession(target, mtp_draft, n_seq=2)
    with pytest.raises(ContextError):
        Eagle3Session(target, Context(llama_model, n_ctx=N_CTX))  # not an EAGLE-3 model
    assert Eagle3Session(target, eagle_draft).spec_type == "eagle3"


def test_sessions_refuse_other_threads(models_by_kind: dict[str, tuple[Model, Model | None]]) -> None:
    setup = setup_for(models_by_kind, "mtp")
    assert isinstance(error_from_another_thread(setup.session.speculative_state), ThreadAffinityError)


def test_a_generation_running_answers_other_threads(qwen35_model: Model) -> None:
    """While the owner generates (GIL released), another thread reads the session's and the contexts' fixed
    getters and is refused everything else with ThreadAffinityError, never a borrow error."""
    setup = build("mtp", qwen35_model, None)
    session, target = setup.session, setup.target
    prompt = qwen35_model.tokenize("the quick brown fox")
    generation = GreedyGeneration(session)
    generation.prefill(prompt)
    state = (target.seq_state(), setup.draft.seq_state(), session.speculative_state())
    n_past, id_last = generation.n_past, generation.id_last
    assert n_past is not None and id_last is not None
    values: dict[str, Callable[[], object]] = {
        "spec_type": lambda: session.spec_type,
        "n_seq": lambda: session.n_seq,
        "n_draft_max": lambda: session.n_draft_max,
        "n_min": lambda: session.n_min,
        "p_min": lambda: session.p_min,
        "target": lambda: session.target,
        "draft_context": lambda: session.draft_context,
        "seq_id": lambda: generation.seq_id,
        "target.n_ctx": lambda: target.n_ctx,
        "target.capacity": lambda: target.capacity,
    }
    refused: dict[str, Callable[[], object]] = {
        "n_drafted": lambda: session.n_drafted,
        "n_accepted": lambda: session.n_accepted,
        "need_embd": lambda: session.need_embd,
        "need_embd_pre_norm": lambda: session.need_embd_pre_norm,
        "begin": lambda: session.begin(prompt),
        "decode": lambda: session.decode([1], 0),
        "process": lambda: session.process(specstate.Batch(1)),
        "draft": lambda: session.draft(len(prompt), prompt[-1]),
        "accept": lambda: session.accept(0),
        "is_quiescent": session.is_quiescent,
        "has_pending_proposal": session.has_pending_proposal,
        "speculative_state": session.speculative_state,
        "restore_speculative_state": lambda: session.restore_speculative_state(0, state[2]),
        "GreedyGeneration": lambda: GreedyGeneration(session),
        "tokens": lambda: generation.tokens,
        "n_past": lambda: generation.n_past,
        "id_last": lambda: generation.id_last,
        "finished": lambda: generation.finished,
        "rounds": lambda: generation.rounds,
        "generation.n_drafted": lambda: generation.n_drafted,
        "generation.n_accepted": lambda: generation.n_accepted,
        "prefill": lambda: generation.prefill(prompt),
        "resume": lambda: generation.resume(len(prompt), prompt[-1]),
        "step": generation.step,
        "generate": lambda: generation.generate(1),
        "target.logits": target.logits,
        "target.seq_pos_max": target.seq_pos_max,
    }
    seen, rounds = outcomes_during(lambda: generation.generate(200), values | refused)
    assert rounds >= 1
    assert seen == {name: {"value"} for name in values} | {name: {"ThreadAffinityError"} for name in refused}
    # Nothing reached the generation from the other thread: it is the same as one run alone.
    alone = build("mtp", qwen35_model, None)
    for context, data in zip((alone.target, alone.draft), state):
        context.set_seq_state(0, data)
    alone.session.restore_speculative_state(0, state[2])
    resumed = GreedyGeneration(alone.session)
    resumed.resume(n_past, id_last)
    assert resumed.generate(200) == generation.tokens


def test_session_properties(models_by_kind: dict[str, tuple[Model, Model | None]]) -> None:
    setup = setup_for(models_by_kind, "mtp", n_draft_max=2)
    session = setup.session
    assert (session.spec_type, session.n_seq, session.n_draft_max, session.n_min, session.p_min) == (
        "mtp",
        1,
        2,
        0,
        0.0,
    )
    assert session.target is setup.target and session.draft_context is setup.draft
    assert session.need_embd_pre_norm and not session.need_embd
    assert isinstance(session, MtpSession) and isinstance(session, specstate.DraftSession)


def test_eagle3_draft_without_its_own_head_reads_the_targets(qwen35_model: Model, tmp_path: Path) -> None:
    from specstate_testkit import models

    _, headless = models.build_eagle3_pair(
        tmp_path / "t.gguf", tmp_path / "headless.gguf", seed=0, draft_own_head=False
    )
    draft_model = Model(headless)
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    with pytest.raises(ContextError):
        Context(draft_model, n_ctx=N_CTX)  # needs the target's embedding and head
    draft = Context(draft_model, n_ctx=N_CTX, other=target)
    session = Eagle3Session(target, draft)
    generation = generate(Setup(target, draft, session), qwen35_model.tokenize("headless"), 60)
    plain, _ = plain_greedy(qwen35_model, qwen35_model.tokenize("headless"), 60)
    assert generation.tokens[:60] == plain
    assert generation.n_accepted > 0


def test_a_linked_context_keeps_its_source_alive(qwen35_model: Model, tmp_path: Path) -> None:
    import gc

    from specstate_testkit import models

    _, headless = models.build_eagle3_pair(
        tmp_path / "t.gguf", tmp_path / "headless.gguf", seed=0, draft_own_head=False
    )
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    draft = Context(Model(headless), n_ctx=N_CTX, other=target)
    session = Eagle3Session(target, draft)
    del target
    gc.collect()
    generation = GreedyGeneration(session)
    generation.prefill(qwen35_model.tokenize("still here"))
    assert len(generation.generate(20)) >= 20


def test_eagle3_draft_for_another_target_width_is_refused(qwen35_model: Model, tmp_path: Path) -> None:
    from specstate_testkit import models

    _, wide = models.build_eagle3_pair(tmp_path / "t128.gguf", tmp_path / "e128.gguf", seed=0, n_embd=128)
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    with pytest.raises(ContextError, match="128-wide"):
        Eagle3Session(target, Context(Model(wide), n_ctx=N_CTX))


@pytest.mark.parametrize("kind", KINDS)
def test_token_ids_outside_the_vocabulary_are_refused(
    models_by_kind: dict[str, tuple[Model, Model | None]], kind: str
) -> None:
    """llama.cpp's drafters abort on such ids; the session refuses them first."""
    setup = setup_for(models_by_kind, kind)
    prompt = models_by_kind[kind][0].tokenize("vocabulary")
    GreedyGeneration(setup.session).prefill(prompt)
    for bad in (-1, 10**6):
        with pytest.raises(SessionError, match="vocabulary"):
            setup.session.draft(len(prompt), bad)
        with pytest.raises(SessionError, match="vocabulary"):
            setup.session.begin([bad])
    with pytest.raises(SessionError, match="negative"):
        setup.session.draft(-5, prompt[0])
    resumed = GreedyGeneration(setup_for(models_by_kind, kind).session)
    resumed.resume(3, 10**6)
    with pytest.raises(SessionError, match="vocabulary"):
        resumed.step()
    assert setup.session.is_quiescent()


HUGE = 2**40


def test_huge_integers_are_refused_by_name_never_overflow_errors(qwen35_model: Model) -> None:
    """Integers beyond the native types meet the same rules as any other out-of-range value."""
    target = Context(qwen35_model, n_ctx=N_CTX, n_rs_seq=3, n_ubatch=8)
    draft = Context(qwen35_model, n_ctx=N_CTX, kind="mtp", n_rs_seq=3, n_ubatch=8)
    for name in ("n_seq", "n_draft_max", "n_min"):
        for value in (HUGE, -HUGE):
            with pytest.raises(ConfigError, match=rf"^{name}"):
                MtpSession(target, draft, **{name: value})
    session = MtpSession(target, draft)
    with pytest.raises(ValueError, match="start_pos must be between"):
        session.decode([1, 2], HUGE)
    with pytest.raises(ValueError, match="seq_id must be between"):
        session.decode([1, 2], 0, seq_id=HUGE)
    with pytest.raises(specstate.DecodeError):  # llama.cpp refuses the id (as any other outside the vocabulary)
        session.decode([1, HUGE], 0)
    with pytest.raises(ValueError, match="seq_id must be between"):
        GreedyGeneration(session, seq_id=HUGE)
    template = specstate.ChatTemplate(qwen35_model, "chatml")
    with pytest.raises(ValueError, match="last_token must be between"):
        template.next_turn_tokens([("user", "Hi")], HUGE, [("user", "Again")])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        qwen35_model.detokenize([HUGE])
