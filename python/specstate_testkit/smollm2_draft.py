"""A layer-truncated copy of SmolLM2-135M-Instruct, as a separate draft model.

Speculative decoding with a separate draft model needs a draft that shares the
target's vocabulary and tokenizer. :func:`build_smollm2_draft` makes one from
the real test model (:func:`specstate.smollm2.smollm2_path`) by keeping only its
first ``n_layers`` transformer blocks: every metadata field is copied
(tokenizer included) except ``{arch}.block_count``, which becomes ``n_layers``,
and ``general.name``, which says that the file is a truncated draft. The token
embedding, the output norm, the output head (when the model has one; SmolLM2
ties it to the embedding and has none) and every ``blk.{i}.*`` tensor with
``i < n_layers`` are copied byte for byte in their original (quantized) types.

The copy follows gguf's own ``gguf_new_metadata.py``: string values are copied
as their raw bytes, other values through ``ReaderField.contents()`` with the
field's own value types, and each tensor as ``ReaderTensor.data`` with
``raw_shape=data.shape`` and ``raw_dtype=tensor_type`` (for quantized tensors
``data`` is a ``uint8`` array of shape ``(..., bytes per row)``, which the
writer turns back into the element shape). The output is a pure function of
the source file and ``n_layers``: the same bytes every time.

Run ``python -m specstate_testkit.smollm2_draft OUT.gguf [--n-layers N]`` to build one.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import gguf

from specstate_testkit.gguf_files import gguf_writer

__all__ = ["DEFAULT_N_LAYERS", "build_smollm2_draft", "draft_tensor_names"]

#: Default number of blocks kept. Greedy agreement with the full 30-block
#: target (same history, teacher-forced) is measured in this module's report;
#: 4 blocks keep the file at about 40 % of the target's size.
DEFAULT_N_LAYERS = 4

_BLOCK = re.compile(r"blk\.(\d+)\.")
_GLOBAL_TENSORS = frozenset({"token_embd.weight", "output_norm.weight", "output.weight"})


def _keep_tensor(name: str, n_layers: int) -> bool:
    match = _BLOCK.match(name)
    if match is not None:
        return int(match.group(1)) < n_layers
    return name in _GLOBAL_TENSORS


def draft_tensor_names(reader: gguf.GGUFReader, n_layers: int) -> list[str]:
    """The names of the source tensors a draft of ``n_layers`` blocks keeps, in file order."""
    return [tensor.name for tensor in reader.tensors if _keep_tensor(tensor.name, n_layers)]


def _field_value(field: gguf.ReaderField) -> tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]:
    """``(value, type, sub_type)`` of a metadata field, strings as their raw bytes."""
    value_type = field.types[0]
    if value_type == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), value_type, None
    if value_type == gguf.GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise ValueError(f"{field.name}: nested arrays are not supported")
        sub_type = field.types[1]
        if sub_type == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[index]) for index in field.data], value_type, sub_type
        return field.contents(), value_type, sub_type
    return field.contents(), value_type, None


def _architecture(reader: gguf.GGUFReader, source: Path) -> tuple[str, str, int]:
    """``(architecture, its block-count key, block count)`` of the source model."""
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise ValueError(f"{source}: no {gguf.Keys.General.ARCHITECTURE}")
    arch = str(arch_field.contents())
    block_count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    block_count_field = reader.get_field(block_count_key)
    if block_count_field is None:
        raise ValueError(f"{source}: no {block_count_key}")
    return arch, block_count_key, int(block_count_field.contents())


def _copy_metadata(
    reader: gguf.GGUFReader, writer: gguf.GGUFWriter, *, block_count_key: str, n_layers: int, name: str, note: str
) -> None:
    """Every metadata field of the source but the block count (``n_layers``) and the name, which gets ``note``.

    A source without a name gets ``name`` and the note.
    """
    alignment_field = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment_field is not None:
        writer.data_alignment = int(alignment_field.contents())
    for field in reader.fields.values():
        # Virtual fields (GGUF.*) and the architecture are written by GGUFWriter itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value, value_type, sub_type = _field_value(field)
        if field.name == block_count_key:
            value = n_layers
        elif field.name == gguf.Keys.General.NAME:
            value = f"{bytes(value).decode('utf-8', 'replace')} {note}"
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    if reader.get_field(gguf.Keys.General.NAME) is None:
        writer.add_name(f"{name} {note}")


def _copy_tensors(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, source: Path, n_layers: int) -> None:
    """The source's tensors a draft of ``n_layers`` blocks keeps, byte for byte in their own types."""
    kept = 0
    for tensor in reader.tensors:
        if not _keep_tensor(tensor.name, n_layers):
            continue
        writer.add_tensor(
            tensor.name,
            tensor.data,
            raw_shape=tensor.data.shape,
            raw_dtype=tensor.tensor_type,
            tensor_endianess=reader.endianess,
        )
        kept += 1
    if kept == 0:
        raise ValueError(f"{source}: no tensors to keep")


def build_smollm2_draft(source: Path, target: Path, *, n_layers: int = DEFAULT_N_LAYERS) -> Path:
    """Write to ``target`` a copy of ``source`` that keeps only its first ``n_layers`` blocks.

    Returns ``target``. The file is written to a temporary file in the same
    folder and renamed into place, so ``target`` is never seen half-written.
    """
    source = Path(source)
    target = Path(target)
    reader = gguf.GGUFReader(source, "r")
    arch, block_count_key, block_count = _architecture(reader, source)
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= block_count:
        raise ValueError(f"n_layers must be an integer in 1..{block_count}, got {n_layers!r}")
    with gguf_writer(target, arch, endianess=reader.endianess) as writer:
        note = f"(draft: first {n_layers} of {block_count} layers)"
        _copy_metadata(reader, writer, block_count_key=block_count_key, n_layers=n_layers, name=source.stem, note=note)
        _copy_tensors(reader, writer, source, n_layers)
    return target


def main(argv: list[str] | None = None) -> None:
    from specstate.smollm2 import smollm2_path

    parser = argparse.ArgumentParser(description="Build a layer-truncated SmolLM2-135M-Instruct draft model.")
    parser.add_argument("output", type=Path, help="path of the draft GGUF file to write")
    parser.add_argument(
        "--n-layers",
        type=int,
        default=DEFAULT_N_LAYERS,
        help=f"number of leading blocks to keep (default {DEFAULT_N_LAYERS})",
    )
    args = parser.parse_args(argv)
    path = build_smollm2_draft(smollm2_path(), args.output, n_layers=args.n_layers)
    print(f"{path}: {path.stat().st_size} bytes, {args.n_layers} layers")


if __name__ == "__main__":
    main()
