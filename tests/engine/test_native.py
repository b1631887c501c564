"""The safe native layer from Python: models, contexts, batches, sequence state."""

from __future__ import annotations

import pickle
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specstate
from specstate import Batch, Context, Model, ModelLoadError, SequenceStateError, ThreadAffinityError
from specstate_testkit import models
from specstate_testkit.reference import error_from_another_thread, outcomes_during


def greedy(context: Context, prompt: list[int], n_tokens: int, seq_id: int = 0) -> list[int]:
    """Plain greedy decoding, one token per decode."""
    context.decode(prompt, 0, seq_id=seq_id)
    out = [context.argmax()]
    pos = len(prompt)
    while len(out) < n_tokens:
        context.decode([out[-1]], pos, seq_id=seq_id)
        pos += 1
        out.append(context.argmax())
    return out


# --- models -----------------------------------------------------------------------------------------


def test_native_info_lists_the_devices_llama_cpp_sees() -> None:
    info = specstate.native_info()
    cpus = [device for device in info["devices"] if device["type"] == "cpu"]
    assert len(cpus) == 1, info["devices"]
    assert cpus[0]["name"] and cpus[0]["description"]
    assert 0 < cpus[0]["memory_free"] <= cpus[0]["memory_total"]
    if info["backends"] == ["cpu"]:  # the default build: the CPU alone
        assert info["devices"] == cpus


def test_all_layers_on_the_gpu_loads_and_generates_on_a_cpu_build(llama_model: Model) -> None:
    if any(device["type"] != "cpu" for device in specstate.native_info()["devices"]):
        pytest.skip("a GPU is present: offloaded arithmetic may differ in the last bits")
    everything = Model(llama_model.path, n_gpu_layers=-1)
    prompt = llama_model.tokenize("the same tokens")
    expected = greedy(Context(llama_model, n_ctx=64, n_threads=1), prompt, 12)
    assert greedy(Context(everything, n_ctx=64, n_threads=1), prompt, 12) == expected


@pytest.mark.parametrize("n_gpu_layers", [-2, -1000])
def test_n_gpu_layers_below_minus_one_is_refused(llama_model: Model, n_gpu_layers: int) -> None:
    with pytest.raises(ValueError, match="n_gpu_layers must be -1"):
        Model(llama_model.path, n_gpu_layers=n_gpu_layers)


def test_tiny_llama_describes_itself(llama_model: Model) -> None:
    assert llama_model.architecture == "llama"
    assert llama_model.n_vocab == models.N_VOCAB
    assert (llama_model.n_embd, llama_model.n_layer, llama_model.n_layer_nextn) == (64, 4, 0)
    assert not llama_model.is_recurrent and not llama_model.is_hybrid
    assert llama_model.metadata["general.architecture"] == "llama"
    assert llama_model.eos == models.EOS_ID and llama_model.is_eog(models.EOS_ID)
    assert "llama" in repr(llama_model)


def test_qwen35_has_one_mtp_layer(qwen35_model: Model) -> None:
    assert qwen35_model.architecture == "qwen35"
    assert qwen35_model.n_layer_nextn == 1
    assert qwen35_model.is_hybrid


def test_smollm2_is_the_real_model(smollm2: Model) -> None:
    assert (smollm2.architecture, smollm2.n_vocab, smollm2.n_layer, smollm2.n_embd) == ("llama", 49152, 30, 576)
    tokens = smollm2.tokenize("Hello world, this is a test.", add_special=False)
    assert tokens == [19556, 905, 28, 451, 314, 253, 1028, 30]
    assert smollm2.detokenize(tokens) == "Hello world, this is a test."


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60))
@settings(max_examples=100)
def test_tiny_tokenizer_round_trips(llama_model: Model, text: str) -> None:
    tokens = llama_model.tokenize(text, add_special=False)
    assert llama_model.detokenize(tokens) == text
    assert b"".join(llama_model.token_to_piece(t) for t in tokens) == text.encode()


def test_token_outside_vocabulary_is_a_value_error(llama_model: Model) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llama_model.token_to_piece(models.N_VOCAB)
    with pytest.raises(ValueError):
        llama_model.detokenize([-1])


def test_missing_model_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.gguf"
    with pytest.raises(ModelLoadError) as caught:
        Model(path)
    assert isinstance(caught.value, OSError)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    clone = pickle.loads(pickle.dumps(caught.value))
    assert (clone.path, clone.reason) == (caught.value.path, caught.value.reason)


@pytest.mark.parametrize("content", [b"", b"GG", b"not a model at all", b"\x00" * 64, b"GGUF"])
def test_non_gguf_files_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=r"bad\.gguf"):
        Model(path)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        Model(tmp_path)


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_models_are_refused(tmp_path: Path, tiny_paths: object, fraction: float) -> None:
    source = tiny_paths.qwen35  # type: ignore[attr-defined]
    data = source.read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: max(5, int(len(data) * fraction))])
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf"):
        Model(path)


def test_a_copied_model_loads_the_same(tmp_path: Path, tiny_paths: object) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copy(tiny_paths.llama, copy)  # type: ignore[attr-defined]
    assert Model(copy).metadata == Model(tiny_paths.llama).metadata  # type: ignore[attr-defined]


# --- contexts ---------------------------------------------------------------------------------------


def test_greedy_decoding_is_deterministic(llama_model: Model) -> None:
    prompt = llama_model.tokenize("the tiny model")
    runs = [greedy(Context(llama_model, n_ctx=128, n_threads=1), prompt, 40) for _ in range(2)]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 5


def test_context_reports_its_capacity(qwen35_model: Model) -> None:
    context = Context(qwen35_model, n_ctx=128, n_batch=64, n_ubatch=8, n_rs_seq=3)
    assert context.capacity == specstate.ContextCapacity(64, 8, 3, True)
    assert context.n_ctx >= 128 and context.kind == "default" and context.model is not None


def test_recurrent_rollback_needs_a_larger_micro_batch(qwen35_model: Model) -> None:
    with pytest.raises(specstate.ContextError, match="n_ubatch"):
        Context(qwen35_model, n_ubatch=4, n_rs_seq=3)


def test_bad_context_arguments(llama_model: Model) -> None:
    with pytest.raises(ValueError, match="kind"):
        Context(llama_model, kind="eagle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_batch"):
        Context(llama_model, n_batch=0)
    with pytest.raises(specstate.ContextError):
        Context(llama_model, kind="mtp")  # no nextn layer


def test_decode_errors_are_typed(llama_model: Model) -> None:
    context = Context(llama_model, n_ctx=64, n_batch=16)
    with pytest.raises(ValueError, match="n_batch"):
        context.decode(list(range(17)), 0)
    with pytest.raises(ValueError, match="empty"):
        context.decode([], 0)
    with pytest.raises(specstate.DecodeError) as caught:
        context.decode([models.N_VOCAB + 5], 0)
    assert caught.value.status != 0
    with pytest.raises(ValueError, match="logits"):
        Context(llama_model, n_ctx=64).logits(0)


def test_sequence_state_resumes_exactly(llama_model: Model) -> None:
    prompt = llama_model.tokenize("state is exact")
    reference = greedy(Context(llama_model, n_ctx=128, n_threads=1), prompt, 30)
    first = Context(llama_model, n_ctx=128, n_threads=1)
    head = greedy(first, prompt, 10)
    state = first.seq_state()
    second = Context(llama_model, n_ctx=128, n_threads=1)
    second.set_seq_state(0, state)
    assert second.seq_state() == state
    assert second.seq_pos_max() == len(prompt) + 8
    out = head[:]
    pos = len(prompt) + 9
    while len(out) < 30:
        second.decode([out[-1]], pos)
        pos += 1
        out.append(second.argmax())
    assert out == reference


@pytest.mark.parametrize("corrupt", ["garbage", "truncated", "empty", "other-model"])
def test_bad_sequence_state_leaves_the_sequence_unchanged(
    llama_model: Model, qwen35_model: Model, corrupt: str
) -> None:
    context = Context(llama_model, n_ctx=128)
    greedy(context, llama_model.tokenize("keep me"), 5)
    before = context.seq_state()
    if corrupt == "other-model":
        other = Context(qwen35_model, n_ctx=128, n_batch=16, n_ubatch=16)
        other.decode(qwen35_model.tokenize("x"), 0)
        data = other.seq_state()
    else:
        data = {"garbage": b"\x07" * 300, "truncated": before[: len(before) // 2], "empty": b""}[corrupt]
    with pytest.raises(SequenceStateError):
        context.set_seq_state(0, data)
    assert context.seq_state() == before


def test_batch_decoding_matches_token_decoding(llama_model: Model) -> None:
    prompt = llama_model.tokenize("batch rows")
    batch = Batch(32)
    for pos, token in enumerate(prompt):
        batch.add(token, pos, logits=pos == len(prompt) - 1)
    assert len(batch) == len(prompt) and batch.capacity == 32
    first, second = Context(llama_model, n_ctx=64), Context(llama_model, n_ctx=64)
    first.decode_batch(batch)
    second.decode(prompt, 0)
    assert first.logits() == second.logits()
    assert first.top_logits(k=3)[0][0] == first.argmax()
    batch.clear()
    assert len(batch) == 0
    with pytest.raises(ValueError, match="full"):
        for pos in range(33):
            batch.add(1, pos)


def test_contexts_refuse_other_threads(llama_model: Model) -> None:
    context = Context(llama_model, n_ctx=64)
    assert isinstance(error_from_another_thread(lambda: context.decode([1, 2], 0)), ThreadAffinityError)
    context.decode([1, 2], 0)  # still fine on its own thread


def test_decode_releases_the_gil(smollm2: Model) -> None:
    prompt = smollm2.tokenize("The quick brown fox jumps over the lazy dog. " * 40)[:480]
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    context = Context(smollm2, n_ctx=512, n_threads=1)
    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.01)
    before = ticks
    started = time.perf_counter()
    context.decode(prompt, 0)
    elapsed = time.perf_counter() - started
    during = ticks - before
    done.set()
    counter.join()
    # A thread holding the GIL through a long native call would freeze the counter.
    assert elapsed > 0.05
    assert during >= 5, f"only {during} ticks during a {elapsed:.2f} s decode"


def test_a_context_decoding_answers_other_threads(smollm2: Model) -> None:
    """While the owner decodes (GIL released), another thread reads the fixed getters and is refused
    everything else with ThreadAffinityError, never a borrow error."""
    prompt = smollm2.tokenize("The quick brown fox jumps over the lazy dog. " * 60)[:480]
    context = Context(smollm2, n_ctx=512, n_threads=1)
    values: dict[str, Callable[[], object]] = {
        "model": lambda: context.model,
        "n_ctx": lambda: context.n_ctx,
        "kind": lambda: context.kind,
        "capacity": lambda: context.capacity,
    }
    refused: dict[str, Callable[[], object]] = {
        "decode": lambda: context.decode([1], 0, seq_id=1),
        "decode_batch": lambda: context.decode_batch(Batch(1)),
        "logits": context.logits,
        "argmax": context.argmax,
        "top_logits": context.top_logits,
        "seq_state": context.seq_state,
        "set_seq_state": lambda: context.set_seq_state(0, b""),
        "seq_rm": context.seq_rm,
        "seq_clear": context.seq_clear,
        "seq_pos_max": context.seq_pos_max,
    }
    seen, rounds = outcomes_during(lambda: context.decode(prompt, 0), values | refused)
    assert rounds >= 1
    assert seen == {name: {"value"} for name in values} | {name: {"ThreadAffinityError"} for name in refused}
    assert context.seq_pos_max() == 479 and context.kind == "default"


def test_a_batch_being_decoded_waits_for_the_decode(smollm2: Model) -> None:
    """Another thread's add and len of a batch the owner is decoding wait for the decode (the rows
    decoded are the ones it started with), never a borrow error."""
    prompt = smollm2.tokenize("The quick brown fox jumps over the lazy dog. " * 60)[:480]
    assert len(prompt) == 480
    context = Context(smollm2, n_ctx=512, n_threads=1)
    batch = Batch(1024)
    for pos, token in enumerate(prompt):
        batch.add(token, pos, logits=pos == len(prompt) - 1)
    added: list[int] = []

    def add() -> None:
        if not added:  # once: the first call waits for the decode
            batch.add(prompt[0], 480)
            added.append(len(batch))

    calls: dict[str, Callable[[], object]] = {"add": add, "len": lambda: len(batch), "capacity": lambda: batch.capacity}
    seen, rounds = outcomes_during(lambda: context.decode_batch(batch), calls)
    assert rounds >= 1 and added == [481] and len(batch) == 481
    assert seen == {name: {"value"} for name in calls}
    assert context.seq_pos_max() == 479  # the row added is not decoded
    reference = Context(smollm2, n_ctx=512, n_threads=1)
    reference.decode(prompt, 0)
    assert context.argmax() == reference.argmax()


@pytest.mark.parametrize("seq_id", [-3, -2, 1, 64, 2**31 - 1])
def test_sequence_ids_outside_the_context_are_refused(llama_model: Model, seq_id: int) -> None:
    """llama.cpp asserts (aborts the process) on such ids; the safe layer refuses them first."""
    context = Context(llama_model, n_ctx=64)
    context.decode([1, 2, 3], 0)
    state = context.seq_state()
    for call in (
        lambda: context.seq_state(seq_id),
        lambda: context.set_seq_state(seq_id, state),
        lambda: context.seq_pos_max(seq_id),
        lambda: context.seq_clear(seq_id),
    ):
        with pytest.raises(ValueError, match="outside this context"):
            call()
    assert context.seq_rm(seq_id) is False
    with pytest.raises(specstate.DecodeError):
        context.decode([4], 3, seq_id=seq_id)
    assert context.seq_state() == state  # nothing happened to the real sequence
    assert context.seq_rm(-1) is True  # -1 still means every sequence
