"""Resume a speculative generation in a fresh process (used by test_sessions.py).

Usage: python resume_worker.py KIND QWEN35 EAGLE3_DRAFT CHECKPOINT_DIR N_DRAFT_MAX N_TOKENS
Prints the committed tokens as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sessions_support import build, models_for
from specstate import GreedyGeneration


def main() -> None:
    kind, qwen35, eagle3, directory, n_draft_max, n_tokens = sys.argv[1:7]
    target_model, draft_model = models_for(kind, Path(qwen35), Path(eagle3))
    setup = build(kind, target_model, draft_model, int(n_draft_max))
    folder = Path(directory)
    cursor = json.loads((folder / "cursor.json").read_text())
    setup.target.set_seq_state(0, (folder / "target.bin").read_bytes())
    setup.draft.set_seq_state(0, (folder / "draft.bin").read_bytes())
    setup.session.restore_speculative_state(0, (folder / "speculative.bin").read_bytes())
    generation = GreedyGeneration(setup.session)
    generation.resume(cursor["n_past"], cursor["id_last"], cursor["tokens"])
    print(json.dumps(generation.generate(int(n_tokens))[: int(n_tokens)]))


if __name__ == "__main__":
    main()
