"""The generator's defaults, typed for Python: read from the native core, which owns them
(``_native.GENERATOR_DEFAULTS``, the constructor's own defaults). Every Python layer (``Llama``, the server, the
command line, the benchmarks) takes its defaults from here rather than writing them again."""

from __future__ import annotations

from typing import cast

from specstate._native import GENERATOR_DEFAULTS
from specstate._typing import DraftPolicy, Mode

__all__ = ["DRAFT_POLICY", "GRAMMAR_DRAFTS", "MODE", "N_BATCH", "N_CTX", "N_DRAFT", "N_THREADS", "REPEAT_LAST_N"]


def _count(name: str) -> int:
    value = GENERATOR_DEFAULTS[name]
    assert isinstance(value, int), name
    return value


#: Speculative mode.
MODE = cast(Mode, GENERATOR_DEFAULTS["mode"])
#: How long each round's draft is in speculative modes.
DRAFT_POLICY = cast(DraftPolicy, GENERATOR_DEFAULTS["draft_policy"])
#: Whether rounds under a grammar draft the tokens it forces (a runtime option: checkpoints do not carry it).
GRAMMAR_DRAFTS = bool(GENERATOR_DEFAULTS["grammar_drafts"])
#: Most tokens drafted per round.
N_DRAFT = _count("n_draft")
#: Context length in tokens.
N_CTX = _count("n_ctx")
#: Rows per decode.
N_BATCH = _count("n_batch")
#: Threads (0: the default thread count, docs/threads.md).
N_THREADS = _count("n_threads")
#: Tokens of the history the repetition penalties count.
REPEAT_LAST_N = _count("repeat_last_n")
