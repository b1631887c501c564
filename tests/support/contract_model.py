"""An independent pure-Python model of the speculative-session contract, for differential tests.

Written from the speculative-session contract alone (``../shared/seed/speculative.rs`` in the project's shared folder,
outside this repository; ``src/speculative.rs`` implements it to the letter): it must not import anything from
specstate, so that a bug there cannot hide in here too.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

MAX_STATE_BYTES = 64 * 1024 * 1024
MAX_SEQUENCES = 4_096
MAX_DRAFT_TOKENS = 4_096
MAX_PROMPT_TOKENS = 1_048_576
U32_MAX = 2**32 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def saturate(value: int, low: int, high: int) -> int:
    """What the binding passes natively for an integer outside the native range."""
    return min(max(value, low), high)


def to_f32(value: object) -> float:
    """C's double-to-float conversion: round to nearest, overflow to infinity."""
    if isinstance(value, float):
        double = value
    else:
        integer = operator.index(value)  # type: ignore[arg-type]
        try:
            double = float(integer)
        except OverflowError:
            double = float("inf") if integer > 0 else float("-inf")
    with np.errstate(over="ignore"):
        return float(np.float32(double))


def config_error(n_seq: int, n_draft_max: int, n_min: int, p_min: object) -> str | None:
    """The contract's ``validate_config`` message, or None when it passes."""
    n_seq = saturate(n_seq, 0, U32_MAX)
    n_draft_max = saturate(n_draft_max, I32_MIN, I32_MAX)
    n_min = saturate(n_min, I32_MIN, I32_MAX)
    p = to_f32(p_min)
    if n_seq == 0 or n_seq > MAX_SEQUENCES:
        return "n_seq is outside the supported bound"
    if not 1 <= n_draft_max <= MAX_DRAFT_TOKENS:
        return "n_draft_max is outside the supported bound"
    if n_min < 0 or n_min > n_draft_max:
        return "n_min must be between zero and n_draft_max"
    if p != p or p in (float("inf"), float("-inf")) or not 0.0 <= p <= 1.0:
        return "p_min must be finite and between zero and one"
    return None


@dataclass(frozen=True)
class Capacity:
    batch: int
    micro_batch: int
    recurrent_slots: int
    recurrent_or_hybrid: bool


def capacity_error(target: Capacity, draft: Capacity, maximum_draft_tokens: int) -> str | None:
    """The contract's ``validate_context_capacities`` message, or None when it passes."""
    maximum = min(maximum_draft_tokens, U32_MAX)
    if maximum + 1 > U32_MAX:
        return "n_draft_max plus one exceeds u32"
    rows = maximum + 1
    if target.batch < rows or draft.batch < rows:
        return "target or draft batch capacity is smaller than n_draft_max plus one"
    if any(c.recurrent_or_hybrid and c.micro_batch < rows for c in (target, draft)):
        return "recurrent micro-batch capacity is smaller than n_draft_max plus one"
    if any(c.recurrent_or_hybrid and c.recurrent_slots < maximum for c in (target, draft)):
        return "recurrent context capacity is smaller than n_draft_max"
    return None


def state_size_excessive(size: int) -> bool:
    return size > MAX_STATE_BYTES


#: The contract's Display texts, keyed by the Rust variant name.
DISPLAY = {
    "Null": "speculative state operation received a null native value",
    "BadSequence": "speculative state sequence id is outside the configured range",
    "NotQuiescent": "speculative state is available only at a quiescent boundary",
    "SizeChanged": "speculative state size changed from {0} to {1} bytes",
    "BufferTooSmall": "the speculative state buffer was too small",
    "Unavailable": "the active speculative implementation did not expose complete state",
    "Invalid": "speculative state is invalid for this session",
    "Overflow": "speculative state size overflowed",
    "Exception": "the native speculative-state operation raised an exception",
    "Excessive": "speculative state is {0} bytes, exceeding the {1}-byte bound",
    "Unknown": "unknown speculative state status {0}",
}

#: Native status codes of the `mtp_state_status` enum and the variant each maps to.
STATUS_VARIANTS = {
    1: "Null",
    2: "BadSequence",
    3: "NotQuiescent",
    4: "BufferTooSmall",
    5: "Unavailable",
    6: "Invalid",
    7: "Overflow",
    8: "Exception",
}
