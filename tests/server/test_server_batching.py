"""``specstate serve --slots N`` decodes the slots' generations together on one engine: concurrent
chats get, token for token, the replies the same requests get alone (drafting from the server's corpus of earlier
requests changes none of them), and ``/metrics`` counts the shared decodes."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from specstate import Llama
from specstate._native import EXACT_PROMPT_ROWS
from specstate._typing import DraftPolicy
from specstate.serve.cache import DEFAULT_TENANT
from test_server import Live, config

PROMPTS = [
    "Name three colors.",
    "Count from one to ten.",
    "Copy this twice: the quick brown fox jumps over the lazy dog.",
    "Write a haiku about the sea.",
    "What is two plus two?",
    "List four animals.",
]


def ask(live: Live, prompt: str, seed: int) -> str:
    options: dict[str, Any] = {"max_tokens": 24, "temperature": 0.8 if seed % 2 else 0.0, "seed": seed}
    name = live.client().models.list().data[0].id
    reply = live.client().chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}], **options)
    return reply.choices[0].message.content or ""


def alone(path: Path, prompt: str, seed: int, cost_curve: list[int] | None = None) -> str:
    """The same request on a Llama of its own (its own model and contexts), its prompt in the server's exact chunks,
    its drafts chosen from the server's cost curve (adaptive; None: the fixed policy)."""
    policy: DraftPolicy = "fixed" if cost_curve is None else "adaptive"
    llama = Llama(
        path,
        mode="ngram",
        n_ctx=512,
        n_threads=2,
        n_batch=EXACT_PROMPT_ROWS,
        draft_policy=policy,
        cost_curve=cost_curve,
    )
    options: dict[str, Any] = {"max_tokens": 24, "temperature": 0.8 if seed % 2 else 0.0, "seed": seed}
    reply = llama.create_chat_completion([{"role": "user", "content": prompt}], **options)
    return str(reply["choices"][0]["message"]["content"])


def test_concurrent_chats_on_batched_slots_get_their_lone_replies(smollm2_file: Path) -> None:
    live = Live(config(smollm2_file, slots=3, n_threads=2, n_ctx=512))
    try:
        assert live.state.engine is not None and live.state.engine.n_seq == 3  # one sequence a slot
        replies: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda i=i: replies.__setitem__(i, ask(live, PROMPTS[i], i)))
            for i in range(len(PROMPTS))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        # In ngram mode a reply's text does not depend on its draft lengths: nothing is pinned, each generation
        # corrects its own estimated curve, and the replies are those of the fixed policy.
        assert all(slot.cost_curve is None for slot in live.state.slots)
        expected = [alone(smollm2_file, p, i) for i, p in enumerate(PROMPTS)]
        assert [replies[i] for i in range(len(PROMPTS))] == expected
        # Every slot drafted from the corpus of the requests' one tenant (one API key, no user), which holds each
        # finished request (the replies above are the lone ones all the same: a corpus changes proposals only).
        assert live.state.corpora is not None and len(live.state.corpora) == 1
        corpus = live.state.corpora.get(DEFAULT_TENANT)
        assert corpus.n_documents == len(PROMPTS)
        assert all(slot.llama is not None and slot.llama.lookup_corpus is corpus for slot in live.state.slots)
        metrics = live.get("/metrics")[1]
        counted = {name: int(value) for name, value in re.findall(r"specstate_batch_(\w+)_total (\d+)", metrics)}
        assert counted["decodes"] > 0 and counted["rows"] >= counted["sequences"] >= counted["decodes"]
    finally:
        live.stop()


def test_separate_slots_keep_a_model_each(smollm2_file: Path) -> None:
    live = Live(config(smollm2_file, slots=2, n_threads=1, n_ctx=512, separate_slots=True))
    try:
        assert live.state.engine is None
        assert ask(live, PROMPTS[1], 1) == alone(smollm2_file, PROMPTS[1], 1, live.state.slots[0].cost_curve)
    finally:
        live.stop()
