"""The checkpoint format under attack: every bad input gets its own typed error
under CheckpointError, nothing crashes, and a generator given a bad checkpoint
is left exactly as it was."""

from __future__ import annotations

import json
import os
import pickle
import random
import struct
import zlib
from pathlib import Path

import pytest

import checkpoint_codec as codec
import specstate
from specstate import (
    ChecksumMismatchError,
    ConfigMismatchError,
    CorruptCheckpointError,
    Generator,
    Model,
    ModelMismatchError,
    NotACheckpointError,
    SectionTooLargeError,
    TruncatedCheckpointError,
    UnsupportedVersionError,
    default_threads,
    inspect_checkpoint,
)
from specstate_testkit.generator_support import assert_refused_and_unchanged, draft_for, tiny_generator

HEADER = 32
ENTRY = 24


def table(data: bytes) -> list[tuple[int, int, int]]:
    """(kind, offset, length) of each section."""
    count = struct.unpack_from("<I", data, 12)[0]
    return [struct.unpack_from("<I4xQQ", data, HEADER + ENTRY * i) for i in range(count)]


def reseal(body: bytes) -> bytes:
    """Recompute the CRC-32 trailer (to craft checkpoints that pass the checksum)."""
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.fixture()
def mtp_generator(tiny_map: dict[str, Path]) -> Generator:
    generator = tiny_generator("mtp", tiny_map, sampled=True)
    generator.generate("checkpoint me", max_tokens=30)
    return generator


@pytest.fixture()
def checkpoint(mtp_generator: Generator) -> bytes:
    return mtp_generator.checkpoint()


def test_a_checkpoint_has_every_section(checkpoint: bytes, tiny_map: dict[str, Path]) -> None:
    info = inspect_checkpoint(checkpoint)
    names = [name for name, _ in info["sections"]]
    assert names == ["meta", "state", "tokens", "target_state", "draft_state", "speculative_state"]
    assert checkpoint[:8] == b"SPECSTAT"
    assert info["format_version"] == 5 and info["size"] == len(checkpoint)
    assert info["config"]["mode"] == "mtp"
    assert info["llama_cpp_sys_version"] == specstate.native_info()["llama_cpp_sys_version"]
    target = info["target_model"]
    sha, size = specstate.model_fingerprint(Model(tiny_map["qwen35"]))
    assert (target["file"], target["sha256"], target["size"]) == ("qwen35.gguf", sha, size)


def test_every_header_and_table_bit_flip_is_refused(mtp_generator: Generator, checkpoint: bytes) -> None:
    end = HEADER + ENTRY * len(table(checkpoint))
    kinds: dict[str, int] = {}
    for byte in range(end):
        for bit in range(8):
            corrupt = bytearray(checkpoint)
            corrupt[byte] ^= 1 << bit
            error = assert_refused_and_unchanged(mtp_generator, bytes(corrupt))
            kinds[type(error).__name__] = kinds.get(type(error).__name__, 0) + 1
    print(f"{end * 8} flips in the header and table: {kinds}")
    assert sum(kinds.values()) == end * 8


def test_payload_bit_flips_are_refused(mtp_generator: Generator, checkpoint: bytes) -> None:
    rng = random.Random(7)
    start = HEADER + ENTRY * len(table(checkpoint))
    for _ in range(300):
        corrupt = bytearray(checkpoint)
        position = rng.randrange(start, len(checkpoint))
        corrupt[position] ^= 1 << rng.randrange(8)
        error = assert_refused_and_unchanged(mtp_generator, bytes(corrupt))
        assert isinstance(error, ChecksumMismatchError)


def test_every_truncation_class_is_refused(mtp_generator: Generator, checkpoint: bytes) -> None:
    cuts = {0, 1, 4, 7, 8, 9, 10, 16, 24, 31, 32, 40, HEADER + ENTRY, len(checkpoint) - 4, len(checkpoint) - 1}
    for _, offset, length in table(checkpoint):
        cuts |= {offset, offset + 1, offset + length // 2, offset + length - 1}
    for cut in sorted(c for c in cuts if 0 <= c < len(checkpoint)):
        error = assert_refused_and_unchanged(mtp_generator, checkpoint[:cut])
        expected = NotACheckpointError if cut == 0 else TruncatedCheckpointError
        assert isinstance(error, expected), (cut, error)


def test_extra_bytes_are_refused(mtp_generator: Generator, checkpoint: bytes) -> None:
    error = assert_refused_and_unchanged(mtp_generator, checkpoint + b"\x00")
    assert isinstance(error, CorruptCheckpointError)


def test_other_files_are_not_checkpoints(mtp_generator: Generator) -> None:
    for data in [b"GGUF" + bytes(100), b"hello world, not a checkpoint", bytes(64), b"SPECSTA"[:3] + b"x"]:
        error = assert_refused_and_unchanged(mtp_generator, data)
        assert isinstance(error, NotACheckpointError)


def test_an_unsupported_version_is_named(mtp_generator: Generator, checkpoint: bytes) -> None:
    data = bytearray(checkpoint[:-4])
    data[8:10] = struct.pack("<H", 6)
    error = assert_refused_and_unchanged(mtp_generator, reseal(bytes(data)))
    assert isinstance(error, UnsupportedVersionError)
    assert (error.found, error.supported) == (6, 5)  # type: ignore[attr-defined]


def test_a_section_too_large_is_refused_before_anything_is_read(mtp_generator: Generator, checkpoint: bytes) -> None:
    data = bytearray(checkpoint[:-4])
    struct.pack_into("<Q", data, HEADER + 16, (16 << 20) + 1)  # the meta section's length
    error = assert_refused_and_unchanged(mtp_generator, reseal(bytes(data)))
    assert isinstance(error, SectionTooLargeError)
    assert (error.section, error.size, error.maximum) == ("meta", (16 << 20) + 1, 16 << 20)  # type: ignore[attr-defined]


def test_corrupt_content_with_a_valid_checksum_is_refused(mtp_generator: Generator, checkpoint: bytes) -> None:
    _, offset, length = table(checkpoint)[0]
    meta = checkpoint[offset : offset + length]
    broken = meta.replace(b'"mode":"mtp"', b'"mode":"xyz"')
    assert broken != meta
    error = assert_refused_and_unchanged(
        mtp_generator, reseal(checkpoint[:offset] + broken + checkpoint[offset + length : -4])
    )
    assert isinstance(error, CorruptCheckpointError)


def test_another_model_is_refused(tiny_map: dict[str, Path], checkpoint: bytes) -> None:
    with pytest.raises(ModelMismatchError) as caught:
        Generator.restore(checkpoint, Model(tiny_map["llama"]))
    assert caught.value.role == "target"  # type: ignore[attr-defined]
    assert "qwen35.gguf" in str(caught.value)


def test_a_different_draft_model_is_refused(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("draft", tiny_map)
    generator.generate("draft", max_tokens=10)
    with pytest.raises(ModelMismatchError) as caught:
        Generator.restore(generator.checkpoint(), Model(tiny_map["qwen35"]), draft_model=Model(tiny_map["qwen35"]))
    assert caught.value.role == "draft"  # type: ignore[attr-defined]
    with pytest.raises(ModelMismatchError):
        Generator.restore(generator.checkpoint(), Model(tiny_map["qwen35"]))  # no draft model given


@pytest.mark.parametrize("other", ["ngram", "mtp-n_draft-2"])
def test_another_mode_or_configuration_is_refused(tiny_map: dict[str, Path], checkpoint: bytes, other: str) -> None:
    """(Sampling parameters may change between calls: a load takes the checkpoint's; see test_sampler_chain.py.)"""
    generator = {
        "ngram": lambda: tiny_generator("ngram", tiny_map, sampled=True),
        "mtp-n_draft-2": lambda: tiny_generator("mtp", tiny_map, sampled=True, n_draft=2),
    }[other]()
    generator.generate("other", max_tokens=5)
    error = assert_refused_and_unchanged(generator, checkpoint)
    assert isinstance(error, ConfigMismatchError)
    assert error.field in ("mode", "n_draft")


def test_a_good_load_replaces_the_generation(tiny_map: dict[str, Path], checkpoint: bytes) -> None:
    generator = tiny_generator("mtp", tiny_map, sampled=True)
    generator.generate("something else", max_tokens=12)
    generator.load(checkpoint)
    assert generator.checkpoint() == checkpoint


def test_checkpoint_errors_pickle_with_their_fields(checkpoint: bytes) -> None:
    with pytest.raises(TruncatedCheckpointError) as caught:
        inspect_checkpoint(checkpoint[:100])
    clone = pickle.loads(pickle.dumps(caught.value))
    assert type(clone) is TruncatedCheckpointError and str(clone) == str(caught.value)
    assert (clone.expected, clone.actual) == (len(checkpoint), 100)  # type: ignore[attr-defined]


def test_save_is_atomic_and_restorable(tiny_map: dict[str, Path], mtp_generator: Generator, tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    path.write_bytes(b"old contents")
    mtp_generator.save(path)
    assert path.read_bytes() == mtp_generator.checkpoint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]  # no temporary file left
    restored = Generator.restore(path, Model(tiny_map["qwen35"]), draft_model=draft_for("mtp", tiny_map))
    assert restored.tokens == mtp_generator.tokens
    assert json.loads(json.dumps(inspect_checkpoint(path.read_bytes())["config"]))["mode"] == "mtp"
    assert os.stat(path).st_size == len(mtp_generator.checkpoint())


def test_checkpoints_are_deterministic(tiny_map: dict[str, Path]) -> None:
    runs = []
    for _ in range(2):
        generator = tiny_generator("eagle3", tiny_map, sampled=True)
        generator.generate("same bytes", max_tokens=25)
        runs.append(generator.checkpoint())
    assert runs[0] == runs[1]


@pytest.mark.parametrize("section", [4, 5, 6], ids=["target_state", "draft_state", "speculative_state"])
def test_a_state_llama_cpp_refuses_is_rolled_back(mtp_generator: Generator, checkpoint: bytes, section: int) -> None:
    """A checkpoint that passes every check of the format (CRC and section
    bindings recomputed) but holds a state llama.cpp (or the shim) refuses: a
    CheckpointError naming the section, and the generator gets its previous
    state back."""
    other = tiny_generator_from(mtp_generator)
    name = codec.NAMES[section]
    length = len(codec.sections(checkpoint)[name])
    garbage = bytes((i * 37 + 11) % 256 for i in range(length))
    crafted = codec.reseal_sections(checkpoint, {name: garbage})
    before = other.checkpoint()
    with pytest.raises(CorruptCheckpointError, match=name):
        other.load(crafted)
    assert other.checkpoint() == before
    other.load(checkpoint)  # and a good one still loads
    assert other.checkpoint() == checkpoint


def tiny_generator_from(generator: Generator) -> Generator:
    """Another generator with the same mode, configuration and models, in another state."""
    other = Generator(
        generator.model,
        mode="mtp",
        n_ctx=256,
        n_batch=64,
        n_draft=4,
        n_threads=1,
        temperature=1.5,
        top_k=40,
        top_p=0.95,
        seed=1234,
    )
    other.generate("a different prompt", max_tokens=9)
    return other


def test_a_history_token_outside_the_vocabulary_is_corrupt(mtp_generator: Generator, checkpoint: bytes) -> None:
    tokens = bytearray(codec.sections(checkpoint)["tokens"])
    tokens[-4:] = struct.pack("<i", 10**6)
    crafted = codec.reseal_sections(checkpoint, {"tokens": bytes(tokens)})
    error = assert_refused_and_unchanged(mtp_generator, crafted)
    assert isinstance(error, CorruptCheckpointError) and "vocabulary" in str(error)


def test_a_restore_decodes_with_the_recorded_thread_count_by_default(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map)  # n_threads=1
    generator.generate("abc", max_tokens=4)
    data = generator.checkpoint()
    assert inspect_checkpoint(data)["n_threads"] == 1
    model = generator.model
    assert Generator.restore(data, model)._native.n_threads == 1
    assert Generator.restore(data, model, n_threads=2)._native.n_threads == 2


def test_a_recorded_thread_count_above_the_cpus_is_capped_and_continues_exactly(tiny_map: dict[str, Path]) -> None:
    """A file cannot push the thread count past the CPUs: a restore without ``n_threads`` uses at most the default
    thread count (docs/threads.md), an explicit count is obeyed, and either continues token for token (the count
    changes speed only)."""
    generator = tiny_generator("ngram", tiny_map)  # n_threads=1
    generator.generate("abc", max_tokens=4)
    data = generator.checkpoint()
    generator.generate(max_tokens=6)
    cpus = default_threads()
    model = generator.model
    for recorded in (cpus + 1, 512):
        forged = codec.rewrite_meta(data, n_threads=recorded)
        capped = Generator.restore(forged, model)
        assert capped._native.n_threads == cpus
        capped.generate(max_tokens=6)
        assert capped.tokens == generator.tokens
        restored = Generator.restore(forged, model, n_threads=1)  # an explicit count is obeyed
        assert restored._native.n_threads == 1
        restored.generate(max_tokens=6)
        assert restored.tokens == generator.tokens
        with pytest.raises(ValueError, match="n_threads"):  # and bounded as for a new generator
            Generator.restore(forged, model, n_threads=513)
