"""Copies of a GGUF model with its 2-D weights in another quantization type (for the exactness tests).

Every 2-D weight is dequantized and quantized to the target with the `gguf` package (0.19.0),
a block of rows at a time (a copy of a 1.5B model stays within a few hundred MB beyond the file);
1-D tensors (norms) stay F32. The `gguf` package cannot quantize K-quants, so Q4_K, Q5_K and Q6_K blocks
are made here (a plain min/max or absolute-maximum fit per sub-block; any valid bits exercise the
same kernels). A row whose length is not a multiple of 256 cannot be a K-quant: such tensors take
llama.cpp's own fallback (llama-quant.cpp): Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants


def fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _k_quant_blocks(rows: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's shared layout, for quants of 0 to `top`: per block of 256 the f16 d and dmin, the 12 bytes
    of 6-bit sub-block scales and minimums, and each value's quant (blocks x 8 sub-blocks x 32)."""
    blocks = rows.reshape(-1, 8, 32).astype(np.float32)
    nb = blocks.shape[0]
    lo = np.minimum(blocks.min(axis=-1), 0.0)  # per sub-block minimum (<= 0)
    hi = blocks.max(axis=-1)
    scale = (hi - lo) / float(top)
    d = (scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.rint(-lo / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = (d[:, None] * sc)[..., None]
        off = (dmin[:, None] * m)[..., None]
        q = np.where(step > 0, np.rint((blocks + off) / step), 0).clip(0, top).astype(np.uint8)
    scales = np.zeros((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return fp16(d), fp16(dmin), scales, q


def _nibbles(q: np.ndarray) -> np.ndarray:
    """The low nibbles of a block's 8 x 32 quants, two sub-blocks a 32-byte run (low, then high nibble)."""
    low = (q & 0x0F).reshape(q.shape[0], 4, 2, 32)
    return (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(q.shape[0], 128)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Blocks of 256: d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles."""
    d, dmin, scales, q = _k_quant_blocks(rows, 15)
    return np.concatenate([d, dmin, scales, _nibbles(q)], axis=-1).reshape(rows.shape[0], -1)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """Blocks of 256: d, dmin (f16), 12 bytes of 6-bit scales/mins (as Q4_K), 32 bytes of fifth bits, 128 of nibbles.

    Value l of sub-block k (32 values) is ``d * sc[k] * q - dmin * m[k]``, q's low nibble in byte ``32 * (k // 2) + l``
    of the nibbles (the high nibble for odd k) and its fifth bit at bit k of byte l of the fifth bits (ggml's
    dequantize_row_q5_K)."""
    d, dmin, scales, q = _k_quant_blocks(rows, 31)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for k in range(8):
        qh |= (q[:, k, :] >> 4) << k
    return np.concatenate([d, dmin, scales, qh, _nibbles(q)], axis=-1).reshape(rows.shape[0], -1)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Blocks of 256: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 values), d (f16).

    Value j of a block's half h (128 values) is ``d * scales[8h + j // 16] * (q - 32)``, q's low nibble in byte
    ``j % 64`` of the half's 64 (the high nibble for j >= 64) and its high two bits at bit ``2 * (j // 32)`` of byte
    ``j % 32`` of the half's 32 (ggml's dequantize_row_q6_K)."""
    blocks = rows.reshape(-1, 16, 16).astype(np.float32)
    nb = blocks.shape[0]
    scale = np.abs(blocks).max(axis=-1) / 31.0  # per 16 values, q - 32 in [-31, 31]
    d = (scale.max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 127).astype(np.int8)
        step = (d[:, None] * sc)[..., None]
        q = (np.where(step > 0, np.rint(blocks / step), 0).clip(-32, 31) + 32).astype(np.uint8)
    q = q.reshape(nb, 2, 4, 32)  # half, value // 32 within the half, value % 32
    low = q & 0x0F
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1)
    high = q >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), fp16(d)], axis=-1)
    return out.reshape(rows.shape[0], -1)


#: The types a copy can take, with their quantizers (the `gguf` package's for the others).
QUANTIZERS: dict[T, Callable[[np.ndarray], np.ndarray] | None] = {
    T.Q4_0: None,
    T.Q4_1: None,
    T.Q5_0: None,
    T.Q5_1: None,
    T.Q8_0: None,
    T.Q4_K: quantize_q4_k,
    T.Q5_K: quantize_q5_k,
    T.Q6_K: quantize_q6_k,
}
#: llama.cpp's fallback for a K-quant whose rows are not a multiple of 256 long.
K_QUANT_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
#: Weights dequantized at a time (as f32) while a tensor is requantized.
CHUNK_VALUES = 1 << 24


def target_type(kind: T, shape: tuple[int, ...]) -> T:
    if kind in K_QUANT_FALLBACK and shape[-1] % 256 != 0:
        return K_QUANT_FALLBACK[kind]
    return kind


def quantized(data: np.ndarray, source: T, shape: tuple[int, ...], kind: T) -> np.ndarray:
    """A 2-D tensor's `data` (in `source`, `shape` rows by columns) in `kind`, a block of rows at a time."""
    rows = data.reshape(shape[0], -1)
    step = max(1, CHUNK_VALUES // shape[1])
    quantize = QUANTIZERS[kind]
    parts = []
    for start in range(0, shape[0], step):
        weights = quants.dequantize(rows[start : start + step], source).reshape(-1, shape[1])
        parts.append(quantize(weights) if quantize is not None else quants.quantize(weights, kind))
    return np.concatenate(parts)


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
        qtype = target_type(kind, shape)
        packed = quantized(tensor.data, tensor.tensor_type, shape, qtype)
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
