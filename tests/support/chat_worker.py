"""Continue a saved conversation in a fresh process (used by test_chat.py).

Usage: python chat_worker.py MODE SAMPLED QWEN35 LLAMA EAGLE3_DRAFT TEMPLATE_FILE CHECKPOINT OUT_DIR MESSAGE...
Restores CHECKPOINT, takes one turn per MESSAGE (12 tokens each) saving a
checkpoint after each to OUT_DIR/turn-<i>.ckpt, and prints the replies as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specstate import Generator, Model
from specstate_testkit.generator_support import draft_for

REPLY_TOKENS = 12


def main() -> None:
    mode, _sampled, qwen35, llama, eagle3, template_file, checkpoint, out_dir, *messages = sys.argv[1:]
    paths = {"qwen35": Path(qwen35), "llama": Path(llama), "eagle3_draft": Path(eagle3)}
    template = Path(template_file).read_text()
    generator = Generator.restore(Path(checkpoint), Model(paths["qwen35"]), draft_model=draft_for(mode, paths))
    replies = []
    for index, message in enumerate(messages):
        replies.append(generator.chat(message, max_tokens=REPLY_TOKENS, template=template))
        generator.save(Path(out_dir) / f"turn-{index}.ckpt")
    print(json.dumps(replies))


if __name__ == "__main__":
    main()
