"""Hypothesis strategies for fuzzing code built on specstate's speculative-session contract.

Requires the optional ``hypothesis`` extra (``pip install specstate[hypothesis]``).

- :func:`valid_configs` / :func:`invalid_configs`: ``(n_seq, n_draft_max,
  n_min, p_min)`` tuples that :func:`specstate.validate_config` accepts /
  rejects.
- :func:`context_capacities`: any :class:`specstate.ContextCapacity`.
- :func:`sufficient_capacities`: ``(target, draft, maximum_draft_tokens)``
  that :func:`specstate.validate_context_capacities` accepts.
- :func:`valid_state_sizes` / :func:`excessive_state_sizes`: sizes that
  :func:`specstate.validate_state_size` accepts / rejects.
"""

from __future__ import annotations

from hypothesis import strategies as st

from specstate._native import (
    MAX_SPECULATIVE_DRAFT_TOKENS,
    MAX_SPECULATIVE_SEQUENCES,
    MAX_SPECULATIVE_STATE_BYTES,
    ContextCapacity,
)
from specstate._typing import U32_MAX

__all__ = [
    "Config",
    "context_capacities",
    "excessive_state_sizes",
    "invalid_configs",
    "sufficient_capacities",
    "valid_configs",
    "valid_state_sizes",
]


#: ``(n_seq, n_draft_max, n_min, p_min)``, the arguments of ``validate_config``.
Config = tuple[int, int, int, float]

# Probabilities whose f32 rounding lies in [0, 1]: every double in [0, 1]
# rounds into [0, 1] (1.0 is exact), so no float32 filtering is needed.
_unit_probabilities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def valid_configs(draw: st.DrawFn) -> Config:
    """Configurations that pass every check of ``validate_config``."""
    n_seq = draw(st.integers(1, MAX_SPECULATIVE_SEQUENCES))
    n_draft_max = draw(st.integers(1, MAX_SPECULATIVE_DRAFT_TOKENS))
    n_min = draw(st.integers(0, n_draft_max))
    return (n_seq, n_draft_max, n_min, draw(_unit_probabilities))


_bad_n_seq = st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_SPECULATIVE_SEQUENCES + 1))
_bad_n_draft_max = st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_SPECULATIVE_DRAFT_TOKENS + 1))
_bad_p_min = st.one_of(
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(float("-inf")),
    st.floats(max_value=-1e-30, allow_nan=False),
    st.floats(min_value=1.0000001, allow_nan=False),
)


@st.composite
def invalid_configs(draw: st.DrawFn) -> Config:
    """Configurations that fail at least one check of ``validate_config``."""
    n_seq, n_draft_max, n_min, p_min = draw(valid_configs())
    broken = draw(st.sets(st.sampled_from(["n_seq", "n_draft_max", "n_min", "p_min"]), min_size=1))
    if "n_seq" in broken:
        n_seq = draw(_bad_n_seq)
    if "n_draft_max" in broken:
        n_draft_max = draw(_bad_n_draft_max)
    if "n_min" in broken:
        n_min = draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=max(n_draft_max, 0) + 1)))
    if "p_min" in broken:
        p_min = draw(_bad_p_min)
    return (n_seq, n_draft_max, n_min, p_min)


def context_capacities(max_value: int = U32_MAX) -> st.SearchStrategy[ContextCapacity]:
    """Any :class:`ContextCapacity` with integer fields in ``0..=max_value``."""
    field = st.integers(0, max_value)
    return st.builds(ContextCapacity, field, field, field, st.booleans())


@st.composite
def sufficient_capacities(draw: st.DrawFn) -> tuple[ContextCapacity, ContextCapacity, int]:
    """``(target, draft, maximum_draft_tokens)`` that the capacity check accepts."""
    maximum = draw(st.integers(0, U32_MAX - 1))

    def capacity() -> ContextCapacity:
        rows = draw(st.integers(maximum + 1, U32_MAX))
        recurrent = draw(st.booleans())
        micro = draw(st.integers(maximum + 1, U32_MAX) if recurrent else st.integers(0, U32_MAX))
        slots = draw(st.integers(maximum, U32_MAX) if recurrent else st.integers(0, U32_MAX))
        return ContextCapacity(rows, micro, slots, recurrent)

    return (capacity(), capacity(), maximum)


def valid_state_sizes() -> st.SearchStrategy[int]:
    """Sizes within ``0..=MAX_SPECULATIVE_STATE_BYTES``."""
    return st.integers(0, MAX_SPECULATIVE_STATE_BYTES)


def excessive_state_sizes() -> st.SearchStrategy[int]:
    """Sizes above ``MAX_SPECULATIVE_STATE_BYTES``, including beyond 64 bits."""
    return st.integers(min_value=MAX_SPECULATIVE_STATE_BYTES + 1)
