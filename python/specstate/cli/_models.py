"""The files a command reads: models, checkpoints, and the models a checkpoint names (found next to it or in
the specstate cache)."""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath, PureWindowsPath

from specstate import Generator, Model, ModelFingerprint, errors, inspect_checkpoint
from specstate._files import read_checkpoint as _read_file
from specstate._files import special_kind
from specstate.cli._args import UsageError
from specstate.smollm2 import cache_dir


def load(path: Path, what: str, use_mmap: bool = False) -> Model:
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist")
    return Model(path, use_mmap=use_mmap)


def read_checkpoint(path: Path) -> bytes:
    """The checkpoint file's bytes (:func:`specstate._files.read_checkpoint`: never blocks, bounded).

    A path that is missing, or is not a regular file, is one line saying which.
    """
    try:
        return _read_file(path)
    except FileNotFoundError as error:
        raise UsageError(f"checkpoint {path} does not exist") from error
    except (IsADirectoryError, errors.NotARegularFileError) as error:
        raise UsageError(f"checkpoint {path} is {special_kind(path) or 'not a regular file'}") from error


def base_name(file_name: str) -> str | None:
    """The last component of a name recorded in a checkpoint, ``/`` or ``\\`` separated; None if there is none."""
    name = PureWindowsPath(PurePosixPath(file_name).name).name
    return None if name in ("", ".", "..") else name


def find_model(checkpoint: Path, named: Path | None, entry: ModelFingerprint | None, role: str) -> Path | None:
    """The model given, else the checkpoint's by base name next to it or in the cache (never elsewhere)."""
    if named is not None:
        return named
    if entry is None:
        return None
    file_name = entry["file"]
    name = base_name(file_name)
    for directory in (checkpoint.parent, cache_dir()):
        if name is not None and (directory / name).is_file():
            return directory / name
    raise UsageError(
        f"the checkpoint's {role} model {file_name!r} was not found next to it or in {cache_dir()}; "
        f"pass --{'model' if role == 'target' else 'draft-model'}"
    )


def restore_saved(checkpoint: Path, args: argparse.Namespace) -> Generator:
    """The generation saved in ``checkpoint``, on the models given or found next to it or in the cache."""
    data = read_checkpoint(checkpoint)
    info = inspect_checkpoint(data)
    target_path = find_model(checkpoint, args.model, info["target_model"], "target")
    draft_path = find_model(checkpoint, args.draft_model, info["draft_model"], "draft")
    assert target_path is not None
    model = load(target_path, "model", args.mmap)
    draft = load(draft_path, "draft model", args.mmap) if draft_path else None
    return Generator.restore(data, model, draft_model=draft, n_threads=args.threads, max_n_batch=args.max_n_batch)
