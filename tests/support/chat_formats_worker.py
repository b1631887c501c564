"""Continue a saved Gemma 3 chat in a fresh process (used by tests/api/test_chat_formats.py).

Usage: python chat_formats_worker.py MODEL MODE CHECKPOINT MAX_TOKENS MESSAGES_JSON
Builds ``Llama(MODEL, chat_format="gemma", mode=MODE)``, restores CHECKPOINT as its conversation, sends the whole
history MESSAGES_JSON (which extends the saved conversation by one user message) and prints the reply's content
and the generator's history as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specstate import Llama
from specstate._typing import Mode


def main() -> None:
    model, mode, checkpoint, max_tokens, messages = sys.argv[1:]
    modes: dict[str, Mode] = {"none": "none", "ngram": "ngram"}
    llm = Llama(model, chat_format="gemma", mode=modes[mode], n_ctx=512, n_threads=2, verbose=False)
    llm.restore_chat(Path(checkpoint))
    reply = llm.create_chat_completion(json.loads(messages), max_tokens=int(max_tokens), temperature=0)
    generator = llm.chat_generator
    assert generator is not None
    print(json.dumps({"content": reply["choices"][0]["message"]["content"], "history": generator._native.history}))


if __name__ == "__main__":
    main()
