"""Copies of a GGUF model with its 2-D weights in another quantization type (for the exactness tests).

Every 2-D weight is dequantized and quantized to the target with the `gguf` package (0.19.0);
1-D tensors (norms) stay F32. The `gguf` package cannot quantize K-quants, so Q4_K blocks are
made here (a plain min/max fit per 32-value sub-block; any valid Q4_K bits exercise the same
kernels). A row whose length is not a multiple of 256 cannot be Q4_K: such tensors take Q5_0,
llama.cpp's own fallback for Q4_K (llama-quant.cpp).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants


def fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Blocks of 256: d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles."""
    blocks = rows.reshape(-1, 8, 32).astype(np.float32)
    nb = blocks.shape[0]
    lo = np.minimum(blocks.min(axis=-1), 0.0)  # per sub-block minimum (<= 0)
    hi = blocks.max(axis=-1)
    scale = (hi - lo) / 15.0
    d = (scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.rint(-lo / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = (d[:, None] * sc)[..., None]
        off = (dmin[:, None] * m)[..., None]
        q = np.where(step > 0, np.rint((blocks + off) / step), 0).clip(0, 15).astype(np.uint8)
    scales = np.zeros((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    q = q.reshape(nb, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    out = np.concatenate([fp16(d), fp16(dmin), scales, qs], axis=-1)
    return out.reshape(rows.shape[0], -1)


def target_type(kind: T, shape: tuple[int, ...]) -> T:
    if kind == T.Q4_K and shape[-1] % 256 != 0:
        return T.Q5_0
    return kind


def requantize(src: Path, dst: Path, kind: T) -> Path:
    """Write ``src`` to ``dst`` with every 2-D weight in ``kind`` (1-D tensors as they are); return ``dst``."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    partial = dst.with_name(dst.name + ".partial")
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith(
            "GGUF."
        ):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))  # numpy order: rows, columns
        if len(shape) != 2:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
            continue
        weights = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        qtype = target_type(kind, shape)
        packed = quantize_q4_k(weights) if qtype == T.Q4_K else quants.quantize(weights, qtype)
        writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(dst)
    return dst


def cached_copy(src: Path, kind: T, directory: Path) -> Path:
    """``src`` requantized to ``kind``, built once into ``directory`` (named after the source's size and type)."""
    dst = directory / f"{src.stem}.{src.stat().st_size}.{kind.name}.gguf"
    if not dst.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        requantize(src, dst, kind)
    return dst
