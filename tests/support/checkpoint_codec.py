"""Read and rewrite specstate checkpoint files in tests (layout: docs/checkpoint-format.md).

Tests craft checkpoints that pass every checksum but carry chosen content (a
model file name, a section payload) with :func:`reseal_sections` and
:func:`rewrite_meta`. Both byte layouts are handled:

* version 1: a CRC-32 trailer over everything before it;
* versions 2 to 5 (5 is what specstate writes): in addition the ``state``
  section (117 bytes instead of 97) binds the other sections by their CRC-32s,
  u32 little-endian at state offsets 97 (``meta``), 101 (``tokens``), 105
  (``target_state``), 109 (``draft_state``, 0 when absent) and 113
  (``speculative_state``, 0 when absent). Versions 3 to 5 changed only what
  ``meta`` holds (docs/checkpoint-format.md, Compatibility), not the bytes
  around it.

A rewritten section gets its binding updated (versions 2 to 5), the table its
new offsets and lengths, the header its new total length, the file a new
trailer.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

HEADER = 32
ENTRY = 24
TRAILER = 4
NAMES = {1: "meta", 2: "state", 3: "tokens", 4: "target_state", 5: "draft_state", 6: "speculative_state"}
STATE_V2_LENGTH = 117
BINDINGS = {"meta": 97, "tokens": 101, "target_state": 105, "draft_state": 109, "speculative_state": 113}


def table(data: bytes) -> list[tuple[int, int, int, int]]:
    """(kind, flags, offset, length) of each section, in table order."""
    count = struct.unpack_from("<I", data, 12)[0]
    return [struct.unpack_from("<IIQQ", data, HEADER + ENTRY * i) for i in range(count)]


def sections(data: bytes) -> dict[str, bytes]:
    """Each section's payload by name, in table order."""
    return {NAMES[kind]: data[offset : offset + length] for kind, _, offset, length in table(data)}


def meta(data: bytes) -> dict[str, Any]:
    """The ``meta`` section's JSON object."""
    parsed: dict[str, Any] = json.loads(sections(data)["meta"])
    return parsed


def bind(state: bytes, payloads: Mapping[str, bytes], names: set[str]) -> bytes:
    """``state`` with the bindings of ``names`` set to their payloads' CRC-32s (versions 2 to 5; version 1 has none)."""
    if len(state) != STATE_V2_LENGTH:
        return state
    bound = bytearray(state)
    for name in BINDINGS.keys() & names:
        struct.pack_into("<I", bound, BINDINGS[name], zlib.crc32(payloads[name]))
    return bytes(bound)


def reseal_sections(data: bytes, changes: Mapping[str, bytes]) -> bytes:
    """``data`` with the named sections' payloads replaced, every length, offset, binding and checksum made right.

    A ``state`` given in ``changes`` is taken as it is, then the bindings of
    the other changed sections are written into it.
    """
    entries = table(data)
    payloads = sections(data)
    unknown = changes.keys() - payloads.keys()
    if unknown:
        raise KeyError(f"no such sections: {sorted(unknown)}")
    payloads.update(changes)
    payloads["state"] = bind(payloads["state"], payloads, set(changes) - {"state"})
    offset = HEADER + ENTRY * len(entries)
    header = bytearray(data[:HEADER])
    struct.pack_into("<Q", header, 16, offset + sum(map(len, payloads.values())) + TRAILER)
    rows = []
    for kind, flags, _, _ in entries:
        payload = payloads[NAMES[kind]]
        rows.append(struct.pack("<IIQQ", kind, flags, offset, len(payload)))
        offset += len(payload)
    body = bytes(header) + b"".join(rows) + b"".join(payloads[NAMES[kind]] for kind, _, _, _ in entries)
    return body + struct.pack("<I", zlib.crc32(body))


def rewrite_meta(data: bytes, **changes: Any) -> bytes:
    """``data`` with these top-level ``meta`` keys set (see :func:`meta` to read the current ones), resealed."""
    content = meta(data)
    content.update(changes)
    return reseal_sections(data, {"meta": json.dumps(content, separators=(",", ":")).encode()})


# --- layouts, for crafting structurally wrong checkpoints (tests/support/checkpoint_fuzz.py) -----------


def parse(data: bytes) -> tuple[dict[str, Any], list[tuple[int, str, int, bytes]]]:
    """Header fields and ``(kind, name, flags, payload)`` of each table entry, in table order.

    Header fields: ``version``, ``header_size``, ``count``, ``total`` and
    ``reserved`` (8 bytes). Unknown kinds are named ``kind<N>``. Meant for
    checkpoints whose table is in bounds (the table is read as declared).
    """
    version, header_size, count, total = struct.unpack_from("<HHIQ", data, 8)
    header = {
        "version": version,
        "header_size": header_size,
        "count": count,
        "total": total,
        "reserved": data[24:HEADER],
    }
    entries = [
        (kind, NAMES.get(kind, f"kind{kind}"), flags, data[offset : offset + length])
        for kind, flags, offset, length in table(data)
    ]
    return header, entries


def assemble(
    entries: list[tuple[int, int, bytes]],
    *,
    version: int,
    header_size: int = HEADER,
    reserved: bytes = bytes(8),
    count: int | None = None,
    total_delta: int = 0,
) -> bytes:
    """A checkpoint of ``(kind, flags, payload)`` entries, payloads tiled in table order, CRC-32 trailer right.

    ``count`` (default: the number of entries) and ``total_delta`` (added to
    the true total length) write wrong header fields on purpose. Bindings are
    written as the ``state`` payload given holds them.
    """
    offset = HEADER + ENTRY * len(entries)
    total = offset + sum(len(payload) for _, _, payload in entries) + TRAILER
    body = bytearray(b"SPECSTAT")
    body += struct.pack("<HHIQ", version, header_size, len(entries) if count is None else count, total + total_delta)
    body += reserved
    for kind, flags, payload in entries:
        body += struct.pack("<IIQQ", kind, flags, offset, len(payload))
        offset += len(payload)
    for _, _, payload in entries:
        body += payload
    return bytes(body) + struct.pack("<I", zlib.crc32(body))
