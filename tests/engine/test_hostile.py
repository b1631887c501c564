"""Hostile input: every row of the hardening issue's table, and each suspicion read in the code.

Checkpoints here are crafted with a valid CRC (and, where said, valid section bindings), so
they reach the content checks. Each must end in a typed ``CheckpointError`` (or in correct
behaviour); arguments out of range end in a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import checkpoint_codec as codec
from specstate import Batch, Context, Generator, Model, _native, model_fingerprint
from specstate.errors import (
    AllocationLimitError,
    ConfigMismatchError,
    ContextError,
    CorruptCheckpointError,
    ModelChangedError,
    ModelLoadError,
    ModelMismatchError,
    SequenceStateError,
    SessionError,
)
from specstate_testkit import models
from specstate_testkit.generator_support import TINY_CTX, assert_refused_and_unchanged, draft_for, tiny_generator


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (a crash fails the test, not the run)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent / "support",
    )


@pytest.fixture(scope="module")
def runs(tiny_map: dict[str, Path]) -> dict[str, tuple[Generator, bytes, bytes]]:
    """Per mode: a generator and checkpoints taken after 6 and after 14 tokens of one run."""
    made = {}
    for mode in ("none", "draft", "mtp", "eagle3"):
        generator = tiny_generator(mode, tiny_map)
        generator.generate("hostile input", max_tokens=6)
        early = generator.checkpoint()
        generator.generate(max_tokens=8)
        made[mode] = (generator, early, generator.checkpoint())
    return made


def restore(data: bytes, mode: str, tiny_map: dict[str, Path]) -> Generator:
    return Generator.restore(data, Model(tiny_map["qwen35"]), draft_model=draft_for(mode, tiny_map), n_threads=1)


def with_state_field(data: bytes, index: int, value: int) -> bytes:
    state = bytearray(codec.sections(data)["state"])
    struct.pack_into("<Q", state, 8 * index, value)
    return codec.reseal_sections(data, {"state": bytes(state)})


# --- the table ------------------------------------------------------------------------------------


def test_a_huge_n_batch_in_meta_is_a_checkpoint_error(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path]
) -> None:
    data = codec.rewrite_meta(runs["none"][2], n_batch=2**31 - 1)
    with pytest.raises(CorruptCheckpointError, match="n_batch"):
        restore(data, "none", tiny_map)


@pytest.mark.parametrize("capacity", [2**31 - 1, 2**20 + 1, 0, -1, 2**70])
def test_a_batch_capacity_out_of_range_is_a_value_error(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        Batch(capacity)


def test_delivered_that_wraps_around_is_refused(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path]
) -> None:
    generator, _, data = runs["none"]
    n_prompt = len(generator.prompt_tokens)
    hostile = with_state_field(data, 7, 2**64 - n_prompt)
    with pytest.raises(CorruptCheckpointError, match="delivered"):
        restore(hostile, "none", tiny_map)
    assert_refused_and_unchanged(generator, hostile)


@pytest.mark.parametrize("mode", ["none", "draft", "mtp", "eagle3"])
@pytest.mark.parametrize("rebind", [False, True], ids=["bindings-kept", "bindings-recomputed"])
def test_a_target_state_from_an_earlier_checkpoint_is_refused(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path], mode: str, rebind: bool
) -> None:
    generator, early, late = runs[mode]
    spliced = codec.reseal_sections(late, {"target_state": codec.sections(early)["target_state"]})
    if not rebind:  # put back the binding the state recorded for the late target state
        spliced = codec.reseal_sections(spliced, {"state": codec.sections(late)["state"]})
    with pytest.raises(CorruptCheckpointError, match="target_state"):
        restore(spliced, mode, tiny_map)
    assert "target_state" in str(assert_refused_and_unchanged(generator, spliced))
    assert generator.generate(max_tokens=4) is not None  # the loaded generator is not stuck


@pytest.mark.parametrize(
    "changes",
    [
        {"temperature": -1.0},
        {"top_p": 2.0},
        {"top_p": 0.0},
        {"n_draft": 0},
        {"n_draft": 4097},
        {"n_batch": 0},
        {"n_batch": 1},
        {"n_ctx": 1},
        {"ngram": [0, 0]},
        {"mode": "warp"},
        {"seed": -1},
        {"n_ctx": -1},
    ],
    ids=str,
)
def test_settings_out_of_range_are_checkpoint_errors_naming_the_field(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path], changes: dict[str, object]
) -> None:
    generator, _, data = runs["mtp"]
    hostile = codec.rewrite_meta(data, **changes)
    with pytest.raises(CorruptCheckpointError) as caught:
        restore(hostile, "mtp", tiny_map)
    field = next(iter(changes))
    assert field in str(caught.value) or "meta" in str(caught.value)
    assert_refused_and_unchanged(generator, hostile)


@pytest.mark.parametrize("section", ["target_state", "draft_state"])
def test_a_changed_byte_inside_a_sequence_state_is_a_checkpoint_error(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path], section: str
) -> None:
    generator, _, data = runs["draft"]
    payload = bytearray(codec.sections(data)[section])
    for offset in (0, 4, 8):
        payload[offset] ^= 0xFF
    hostile = codec.reseal_sections(data, {section: bytes(payload)})
    with pytest.raises(CorruptCheckpointError, match=section):
        restore(hostile, "draft", tiny_map)
    assert_refused_and_unchanged(generator, hostile)


def test_a_context_larger_than_the_model_was_trained_for_is_refused(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path]
) -> None:
    data = codec.rewrite_meta(runs["none"][2], n_ctx=1_000_000)
    with pytest.raises(ConfigMismatchError, match="n_ctx"):
        restore(data, "none", tiny_map)


def test_the_caller_can_cap_the_context_of_a_restore(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path]
) -> None:
    data = runs["none"][2]
    with pytest.raises(ConfigMismatchError, match="at most 128"):
        Generator.restore(data, Model(tiny_map["qwen35"]), n_threads=1, max_n_ctx=128)
    assert Generator.restore(data, Model(tiny_map["qwen35"]), n_threads=1, max_n_ctx=TINY_CTX).model is not None


def test_a_forged_draft_length_on_a_hybrid_model_is_refused_before_its_contexts_exist(
    runs: dict[str, tuple[Generator, bytes, bytes]], tiny_map: dict[str, Path]
) -> None:
    """n_draft 1000 (so n_batch 1001) would have a 4 MB model's contexts reserve gigabytes: refused first."""
    target = Model(tiny_map["qwen35"])
    rows = codec.rewrite_meta(runs["mtp"][2], n_draft=1000, n_batch=1001, n_ctx=1024)
    with pytest.raises(AllocationLimitError, match="n_batch of 1001") as refused:
        Generator.restore(rows, target, n_threads=1)
    assert (refused.value.field, refused.value.requested, refused.value.maximum) == ("n_batch", 1001, 512)
    # Within the rows, but one recurrent-state snapshot per drafted token: 200 of them outweigh the model.
    # (Mode draft: an MTP session's own state records its draft length, which then would not match.)
    data, draft = runs["draft"][2], draft_for("draft", tiny_map)
    snapshots = codec.rewrite_meta(data, n_draft=200, n_batch=512, n_ctx=512)
    with pytest.raises(AllocationLimitError, match="rollback snapshots") as refused:
        Generator.restore(snapshots, target, draft_model=draft, n_threads=1)
    assert refused.value.field == "n_draft" and refused.value.maximum == target.size < refused.value.requested
    # The caller who names max_n_batch accepts them; a draft length whose snapshots fit needs nothing.
    fitting = codec.rewrite_meta(data, n_draft=40, n_batch=512, n_ctx=512)
    for accepted, limit in ((snapshots, 512), (fitting, None)):
        generator = Generator.restore(accepted, target, draft_model=draft, n_threads=1, max_n_batch=limit)
        assert len(generator.generate(max_tokens=4)) > 0


def test_a_sequence_state_claiming_two_recurrent_cells_is_refused_not_an_abort(qwen35_model: Model) -> None:
    """llama.cpp would assert (GGML_ASSERT, an abort) on such a state in a context of two sequences."""
    context = Context(qwen35_model, n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=2, n_threads=1)
    context.decode([1, 2, 3, 4, 5], 0, seq_id=0)
    state = context.seq_state(0)
    # The recurrent part: one cell, at position 4, naming no sequence; then s_trans 0.
    at = state.find(struct.pack("<IiII", 1, 4, 0, 0))
    assert at > 0 and state.count(struct.pack("<IiII", 1, 4, 0, 0)) == 1
    context.set_seq_state(1, state)
    before = context.seq_state(1)
    assert context.seq_pos_max(1) == 4
    forged = state[:at] + struct.pack("<IiIiI", 2, 3, 0, 4, 0) + state[at + 12 :]
    with pytest.raises(SequenceStateError, match="holds 2 cells"):
        context.set_seq_state(1, forged)
    with pytest.raises(SequenceStateError, match="not laid out"):
        context.set_seq_state(1, state[: at + 2])
    assert context.seq_state(1) == before


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("n_threads", 5000),
        ("n_threads", -1),
        ("n_ctx", -1),
        ("n_ctx", 10**6),
        ("n_ctx", 2**40),
        ("seed", -1),
        ("n_batch", -5),
        ("top_k", 2**32),
        ("n_draft", 2**33),
        ("ngram_max", -1),
    ],
)
def test_generator_arguments_out_of_range_are_value_errors_naming_them(
    llama_model: Model, argument: str, value: int
) -> None:
    with pytest.raises(ValueError, match=argument):
        Generator(llama_model, mode="ngram", **{argument: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("n_threads", 513),
        ("n_ctx", 10**6),
        ("n_ctx", -3),
        ("n_batch", 0),
        ("n_batch", 2**21),
        ("n_seq_max", 257),
        ("n_ubatch", -1),
    ],
)
def test_context_arguments_out_of_range_are_value_errors_naming_them(
    llama_model: Model, argument: str, value: int
) -> None:
    with pytest.raises(ValueError, match=argument):
        Context(llama_model, **{argument: value})  # type: ignore[arg-type]


def test_many_threads_within_the_bound_run(llama_model: Model) -> None:
    generator = Generator(llama_model, n_ctx=64, n_batch=16, n_threads=64)
    assert len(generator.generate([1, 2, 3], max_tokens=3)) >= 0


def test_a_hybrid_generator_with_a_tiny_batch_is_not_an_abort(qwen35_model: Model) -> None:
    generator = Generator(qwen35_model, mode="ngram", n_ctx=64, n_batch=5, n_draft=4, n_threads=1)
    generator.generate([3, 4, 5, 3, 4, 5, 3, 4], max_tokens=8)
    assert len(generator.tokens) == 8


def test_a_hybrid_context_shorter_than_its_snapshots_need_is_refused_not_an_abort(qwen35_model: Model) -> None:
    """llama.cpp caps n_batch at n_ctx, so n_ctx = n_draft + 1 would leave a compute pass no longer than the
    rollback snapshots, and the first decode would hit GGML_ASSERT(n_ubatch > n_keep_tail)."""
    with pytest.raises(ContextError, match="must exceed n_rs_seq"):
        Generator(qwen35_model, mode="ngram", n_ctx=12, n_batch=12, n_draft=11, n_threads=1)
    generator = Generator(qwen35_model, mode="ngram", n_ctx=13, n_batch=12, n_draft=11, n_threads=1)
    generator.generate([3, 4, 5, 3, 4, 5, 3, 4], max_tokens=4)
    assert len(generator.tokens) == 4


# --- suspicions from reading the code -------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = run_isolated(
        f"""
        from specstate import Model
        from specstate.errors import ModelLoadError
        try:
            Model({str(fifo)!r})
        except ModelLoadError as error:
            print("refused:", error)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "not a regular file" in result.stdout


def test_a_device_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="not a regular file"):
        Model("/dev/zero")


def test_the_fingerprint_is_of_the_file_that_was_loaded(tiny_map: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    original = tiny_map["llama"].read_bytes()
    path.write_bytes(original)
    model = Model(path)
    generator = Generator(model, mode="ngram", n_ctx=64, n_batch=16, n_threads=1)
    generator.generate([1, 2, 3], max_tokens=2)
    path.write_bytes(original[:-8] + bytes(8))  # another file now sits at the path
    recorded = codec.meta(generator.checkpoint())["target_model"]
    assert recorded["sha256"] == hashlib.sha256(original).hexdigest()


def _greedy_tokens(model: Model) -> list[int]:
    generator = Generator(model, n_ctx=64, n_batch=16, n_threads=1)
    generator.generate([1, 2, 3], max_tokens=12)
    return generator.tokens


@pytest.fixture()
def two_models(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A tiny llama at a path of its own, its bytes, and those of another llama of the same size."""
    path = models.build_llama(tmp_path / "model.gguf", seed=0)
    other = models.build_llama(tmp_path / "other.gguf", seed=1)
    assert _greedy_tokens(Model(other)) != _greedy_tokens(Model(path))  # the weights tell them apart
    original, replacement = path.read_bytes(), other.read_bytes()
    assert len(original) == len(replacement)
    return path, original, replacement


def test_a_loaded_model_does_not_follow_writes_to_its_file(two_models: tuple[Path, bytes, bytes]) -> None:
    """By default the weights are read into memory: writing the file in place, or truncating it, changes nothing."""
    path, original, replacement = two_models
    pristine = path.with_name("pristine.gguf")
    pristine.write_bytes(original)
    reference = _greedy_tokens(Model(pristine))
    model = Model(path)
    assert not model.use_mmap
    with path.open("r+b") as file:  # in place: the same inode, as `cp` or `rsync --inplace` write it
        file.write(replacement)
    assert _greedy_tokens(model) == reference
    assert model_fingerprint(model) == (hashlib.sha256(original).hexdigest(), len(original))
    truncated = run_isolated(  # a mapped file cut short would end the process with SIGBUS
        f"""
        import os
        from specstate import Generator, Model
        model = Model({str(pristine)!r})
        os.truncate({str(pristine)!r}, 0)
        generator = Generator(model, n_ctx=64, n_batch=16, n_threads=1)
        generator.generate([1, 2, 3], max_tokens=12)
        print(generator.tokens)
        """
    )
    assert truncated.returncode == 0, truncated.stderr
    assert truncated.stdout.strip() == str(reference)


def test_a_mapped_model_whose_file_changed_takes_part_in_no_checkpoint(
    two_models: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    path, _, replacement = two_models
    model = Model(path, use_mmap=True)
    assert model.use_mmap
    generator = Generator(model, n_ctx=64, n_batch=16, n_threads=1)
    generator.generate([1, 2, 3], max_tokens=4)
    data = generator.checkpoint()
    with path.open("r+b") as file:
        file.write(replacement)
    with pytest.raises(ModelChangedError) as caught:
        generator.checkpoint()
    error = caught.value
    assert error.path == str(path) and str(path) in str(error) and "use_mmap" in str(error)
    assert vars(pickle.loads(pickle.dumps(error))) == vars(error)
    saved = tmp_path / "run.ckpt"
    with pytest.raises(ModelChangedError):
        generator.save(saved)
    assert not saved.exists()
    with pytest.raises(ModelChangedError, match=r"model\.gguf"):
        Generator.restore(data, model, n_threads=1)
    with pytest.raises(ModelMismatchError):  # a model loaded now is of the new bytes
        Generator.restore(data, Model(path), n_threads=1)


def test_a_mapped_model_keeps_its_file_when_another_replaces_the_path(
    two_models: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    """A rename puts a new file at the path; the mapping keeps the one loaded, so its checkpoints stay true."""
    path, original, replacement = two_models
    model = Model(path, use_mmap=True)
    generator = Generator(model, n_ctx=64, n_batch=16, n_threads=1)
    generator.generate([1, 2, 3], max_tokens=4)
    staged = tmp_path / "staged.gguf"
    staged.write_bytes(replacement)
    os.replace(staged, path)
    assert codec.meta(generator.checkpoint())["target_model"]["sha256"] == hashlib.sha256(original).hexdigest()


def test_a_freed_batch_cannot_stand_in_for_a_new_one(qwen35_model: Model) -> None:
    """`process()` keys on a stamp that is never reused, not on a batch's address."""
    from specstate import MtpSession

    target = Context(qwen35_model, n_ctx=128, n_batch=16, n_ubatch=16, n_rs_seq=3, n_threads=1)
    draft = Context(qwen35_model, kind="mtp", n_ctx=128, n_batch=16, n_ubatch=16, n_rs_seq=3, n_threads=1)
    session = MtpSession(target, draft, n_draft_max=3)
    for _ in range(20):
        decoded = Batch(8)
        decoded.add(1, 0, logits=True)
        target.decode_batch(decoded)
        del decoded
        fresh = Batch(8)
        fresh.add(1, 0, logits=True)
        with pytest.raises(SessionError):
            session.process(fresh)
        target.seq_rm(0, 0, -1)


def test_a_linked_context_over_a_model_of_another_width_is_refused(llama_model: Model, smollm2: Model) -> None:
    source = Context(smollm2, n_ctx=64, n_threads=1)
    with pytest.raises(ContextError, match="does not match"):
        Context(llama_model, n_ctx=64, n_threads=1, other=source)


def test_method_integers_out_of_range_are_value_errors_naming_them(llama_model: Model) -> None:
    context = Context(llama_model, n_ctx=64, n_batch=16, n_threads=1)
    context.decode([1, 2, 3], 0)
    batch = Batch(4)
    calls: dict[str, Callable[[int], object]] = {
        "start_pos": lambda v: context.decode([1], v),
        "row": lambda v: context.logits(v),
        "k": lambda v: context.top_logits(-1, v),
        "seq_id": lambda v: context.seq_state(v),
        "p0": lambda v: context.seq_rm(0, v),
        "pos": lambda v: batch.add(1, v),
        "token": lambda v: llama_model.token_to_piece(v),
        "n_gpu_layers": lambda v: Model(llama_model.path, n_gpu_layers=v),
    }
    for name, call in calls.items():
        for value in (2**70, -(2**70)):
            with pytest.raises(ValueError, match=name):
                call(value)
    assert llama_model.is_eog(2**70) is False
    generator = Generator(llama_model, n_ctx=64, n_batch=16, n_threads=1)
    assert len(generator.generate([1, 2, 3], max_tokens=2**70)) > 0  # "all": up to the context's end


# --- checkpoint paths that are not checkpoint files -------------------------------------------------


def test_a_checkpoint_path_is_checked_before_it_is_read_and_read_within_the_format_s_bound(
    tiny_map: dict[str, Path], tmp_path: Path
) -> None:
    """FIFOs, devices, sockets and directories are refused without blocking; files are read within bounds.

    In a subprocess under a 4 GiB address-space limit, so that a hang is a timeout and a file read whole
    is a ``MemoryError``, not the end of the test run.
    """
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "directory").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "socket"))
    (tmp_path / "link to a fifo").symlink_to(tmp_path / "fifo")
    with open(tmp_path / "too large", "wb") as sparse:  # sparse files: no disk space used
        sparse.truncate(_native.MAX_CHECKPOINT_BYTES + 1)
    with open(tmp_path / "8 GiB of zeros", "wb") as sparse:
        sparse.truncate(8 << 30)
    paths = {name: str(tmp_path / name) for name in os.listdir(tmp_path)}
    paths.update({"/dev/zero": "/dev/zero", "/dev/null": "/dev/null"})
    result = run_isolated(
        f"""
        import json, resource
        from pathlib import Path
        from specstate_testkit.generator_support import tiny_generator
        from specstate import Generator
        generator = tiny_generator("none", {{k: Path(v) for k, v in {json.dumps(stringify(tiny_map))}.items()}})
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
        outcomes = {{}}
        for name, path in {json.dumps(paths)}.items():
            for how in ("restore", "load"):
                try:
                    Generator.restore(path, generator.model) if how == "restore" else generator.load(path)
                    outcomes[name + " " + how] = "accepted"
                except Exception as error:
                    fields = {{k: v for k, v in vars(error).items() if k in ("path", "kind", "size", "maximum")}}
                    outcomes[name + " " + how] = [type(error).__name__, str(error), fields]
        print(json.dumps(outcomes))
        """,
        timeout=60,
    )
    server.close()
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    kinds = {
        "fifo": "a FIFO",
        "link to a fifo": "a FIFO",
        "socket": "a socket",
        "/dev/zero": "a character device",
        "/dev/null": "a character device",
    }
    maximum = _native.MAX_CHECKPOINT_BYTES
    for how in ("restore", "load"):
        for name, kind in kinds.items():
            fields = {"path": paths[name], "kind": kind}
            expected = ["NotARegularFileError", f"{paths[name]} is {kind}, not a regular file", fields]
            assert outcomes[f"{name} {how}"] == expected
        assert outcomes[f"directory {how}"][0] == "IsADirectoryError"
        assert paths["directory"] in outcomes[f"directory {how}"][1]
        error, message, fields = outcomes[f"too large {how}"]
        assert error == "CheckpointTooLargeError" and fields == {
            "path": paths["too large"],
            "size": maximum + 1,
            "maximum": maximum,
        }
        assert message == f"{paths['too large']} is at least {maximum + 1} bytes, " + (
            f"more than the {maximum} bytes a checkpoint can hold"
        )
        assert outcomes[f"8 GiB of zeros {how}"][:2] == ["NotACheckpointError", "not a specstate checkpoint"]


def stringify(paths: dict[str, Path]) -> dict[str, str]:
    return {name: str(path) for name, path in paths.items()}
