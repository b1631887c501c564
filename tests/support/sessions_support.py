"""Building speculative sessions over the tiny models, shared by tests and subprocesses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specstate import Context, DraftSession, Eagle3Session, Model, MtpSession

#: Session kinds under test: MTP over the hybrid qwen35 model, EAGLE-3 over
#: the same hybrid target (whose speculative state llama.cpp makes complete).
KINDS = ("mtp", "eagle3")
N_CTX = 256


@dataclass
class Setup:
    """A target context, a draft context and the session pairing them."""

    target: Context
    draft: Context
    session: DraftSession


def build(kind: str, target_model: Model, draft_model: Model | None, n_draft_max: int = 3) -> Setup:
    """Fresh contexts and a fresh session of `kind` ('mtp', 'eagle3')."""
    slots = max(n_draft_max, 1)
    recurrent = dict(n_rs_seq=slots, n_ubatch=slots + 2) if target_model.is_hybrid else {}
    target = Context(target_model, n_ctx=N_CTX, n_threads=1, **recurrent)  # type: ignore[arg-type]
    if kind == "mtp":
        draft = Context(target_model, n_ctx=N_CTX, n_threads=1, kind="mtp", **recurrent)  # type: ignore[arg-type]
        return Setup(target, draft, MtpSession(target, draft, n_draft_max=n_draft_max))
    assert draft_model is not None
    draft = Context(draft_model, n_ctx=N_CTX, n_threads=1)
    return Setup(target, draft, Eagle3Session(target, draft, n_draft_max=n_draft_max))


def models_for(kind: str, qwen35: Path, eagle3_draft: Path) -> tuple[Model, Model | None]:
    """The target (and EAGLE-3 draft) models of `kind`."""
    target = Model(qwen35)
    return (target, None) if kind == "mtp" else (target, Model(eagle3_draft))
