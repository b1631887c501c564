"""Type stubs of ``specstate._native``, the Rust extension module.

Integer arguments accept anything ``operator.index`` accepts except ``bool``
(a ``TypeError``). An integer outside the native type's range fails the seed's
own bound check with the seed's own message; it never raises ``OverflowError``.
"""

from typing import Final, SupportsIndex, final

from specstate._typing import NativeInfo

__all__ = [
    "MAX_SPECULATIVE_DRAFT_TOKENS",
    "MAX_SPECULATIVE_PROMPT_TOKENS",
    "MAX_SPECULATIVE_SEQUENCES",
    "MAX_SPECULATIVE_STATE_BYTES",
    "ContextCapacity",
    "_raise_for_status",
    "_seed_error_display",
    "native_info",
    "validate_config",
    "validate_context_capacities",
    "validate_state_size",
]

#: Maximum speculative continuation bytes copied through the safe API (64 MiB).
MAX_SPECULATIVE_STATE_BYTES: Final[int]
#: Maximum concurrent sequence slots allocated by one speculative session (4,096).
MAX_SPECULATIVE_SEQUENCES: Final[int]
#: Maximum tokens requested from one speculative draft boundary (4,096).
MAX_SPECULATIVE_DRAFT_TOKENS: Final[int]
#: Maximum prompt tokens copied into one speculative session (1,048,576).
MAX_SPECULATIVE_PROMPT_TOKENS: Final[int]

@final
class ContextCapacity:
    """The capacities of one llama.cpp context that bound a speculative batch.

    Immutable, hashable, comparable and picklable. Each integer field must lie
    in ``0..=2**32-1`` (``ValueError`` naming the field otherwise);
    ``recurrent_or_hybrid`` must be a ``bool`` (``TypeError`` otherwise).
    """

    def __new__(
        cls,
        batch: SupportsIndex,
        micro_batch: SupportsIndex,
        recurrent_slots: SupportsIndex,
        recurrent_or_hybrid: bool,
    ) -> ContextCapacity: ...
    @property
    def batch(self) -> int:
        """Rows one decode call may hold (``n_batch``)."""
    @property
    def micro_batch(self) -> int:
        """Rows one compute pass may hold (``n_ubatch``)."""
    @property
    def recurrent_slots(self) -> int:
        """Recurrent state slots of the context (``n_rs_seq``)."""
    @property
    def recurrent_or_hybrid(self) -> bool:
        """Whether the model has recurrent layers (recurrent or hybrid)."""
    def __getnewargs__(self) -> tuple[int, int, int, bool]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __ne__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def validate_config(
    n_seq: SupportsIndex,
    n_draft_max: SupportsIndex,
    n_min: SupportsIndex,
    p_min: float | SupportsIndex,
) -> None:
    """Check a speculative session configuration against the seed's bounds.

    Checks, in order: ``1 <= n_seq <= MAX_SPECULATIVE_SEQUENCES``;
    ``1 <= n_draft_max <= MAX_SPECULATIVE_DRAFT_TOKENS``;
    ``0 <= n_min <= n_draft_max``; ``p_min`` (converted to ``f32``: round to
    nearest, overflow to infinity) finite and in ``[0, 1]``.

    Raises:
        ConfigError: with the seed's message for the first failing check.
        TypeError: for an argument of the wrong type (``bool`` included).
    """

def validate_context_capacities(
    target: ContextCapacity,
    draft: ContextCapacity,
    maximum_draft_tokens: SupportsIndex,
) -> None:
    """Check that both contexts hold a draft of ``maximum_draft_tokens`` plus one.

    Raises:
        CapacityError: with the seed's message (``maximum_draft_tokens >=
            2**32-1`` gives "n_draft_max plus one exceeds u32").
        ValueError: for a negative ``maximum_draft_tokens``.
        TypeError: for an argument of the wrong type.
    """

def validate_state_size(size: SupportsIndex) -> None:
    """Check a speculative state size against ``MAX_SPECULATIVE_STATE_BYTES``.

    Raises:
        ExcessiveStateError: carrying ``size`` (even beyond 64 bits) and
            ``maximum``.
        ValueError: for a negative size.
        TypeError: for an argument of the wrong type.
    """

def native_info() -> NativeInfo:
    """Describe the native build.

    Keys: ``specstate_version``; ``llama_cpp_sys_version`` (the pinned
    ``llama-cpp-sys-4``); ``llama_cpp_build`` and ``llama_cpp_commit`` (the
    llama.cpp it vendors); ``backends`` compiled in (``cpu``, ``cuda``,
    ``metal``); ``cpu_baseline`` and the ``simd_features`` ggml's CPU kernels
    were compiled for; ``system_info``, llama.cpp's own summary.
    """

def _raise_for_status(status: int) -> None:
    """Raise what the seed maps native status ``status`` to (testing aid)."""

def _seed_error_display(variant: str, first: int = 0, second: int = 0) -> str:
    """The Rust ``Display`` text of a seed error variant (testing aid)."""
