"""Speculative draft sessions: :class:`MtpSession` and :class:`Eagle3Session`.

Both pair a target context with a draft context over llama.cpp's
``common_speculative`` (through the ``mtp_session_*`` shim) and share one
lifecycle: ``decode`` (target decode + ``process``), ``begin``, ``draft``,
``accept``, and exact state capture/restore at quiescent boundaries. See
:class:`specstate._native.DraftSession` for the methods.

How the contexts must be built:

- MTP: the draft context comes from the *same* model, ``kind="mtp"``. For a
  hybrid (recurrent) target, ``n_rs_seq >= n_draft_max`` and
  ``n_ubatch > n_rs_seq + 1`` on the target.
- EAGLE-3: the draft context comes from a separate EAGLE-3 draft model,
  ``kind="default"``; pass ``other=target`` when the draft has no token
  embedding or output head of its own.
- The draft context's ``n_batch`` bounds every batch processed; create the
  session before decoding anything the session must see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, SupportsIndex

from specstate._native import Context, DraftSession

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Eagle3Session", "MtpSession"]


class _OneStrategySession(DraftSession):
    """A draft session whose strategy its class fixes (``_SPEC_TYPE``)."""

    _SPEC_TYPE: ClassVar[Literal["mtp", "eagle3"]]

    def __new__(
        cls,
        target: Context,
        draft: Context,
        *,
        n_seq: int = 1,
        n_draft_max: int = 3,
        n_min: int = 0,
        p_min: float | SupportsIndex = 0.0,
    ) -> Self:
        return super().__new__(
            cls, target, draft, spec_type=cls._SPEC_TYPE, n_seq=n_seq, n_draft_max=n_draft_max, n_min=n_min, p_min=p_min
        )


class MtpSession(_OneStrategySession):
    """Multi-token-prediction drafting: the target model's own nextn head drafts."""

    _SPEC_TYPE = "mtp"


class Eagle3Session(_OneStrategySession):
    """EAGLE-3 drafting: a separate draft model reads the target's hidden states."""

    _SPEC_TYPE = "eagle3"
