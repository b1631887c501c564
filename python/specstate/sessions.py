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

from typing import SupportsIndex

from specstate._native import Context, DraftSession

__all__ = ["Eagle3Session", "MtpSession"]


class MtpSession(DraftSession):
    """Multi-token-prediction drafting: the target model's own nextn head drafts."""

    def __new__(
        cls,
        target: Context,
        draft: Context,
        *,
        n_seq: int = 1,
        n_draft_max: int = 3,
        n_min: int = 0,
        p_min: float | SupportsIndex = 0.0,
    ) -> MtpSession:
        return super().__new__(
            cls, target, draft, spec_type="mtp", n_seq=n_seq, n_draft_max=n_draft_max, n_min=n_min, p_min=p_min
        )


class Eagle3Session(DraftSession):
    """EAGLE-3 drafting: a separate draft model reads the target's hidden states."""

    def __new__(
        cls,
        target: Context,
        draft: Context,
        *,
        n_seq: int = 1,
        n_draft_max: int = 3,
        n_min: int = 0,
        p_min: float | SupportsIndex = 0.0,
    ) -> Eagle3Session:
        return super().__new__(
            cls, target, draft, spec_type="eagle3", n_seq=n_seq, n_draft_max=n_draft_max, n_min=n_min, p_min=p_min
        )
