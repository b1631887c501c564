"""Resume a saved generation in a fresh process (used by test_generator.py, test_sampler_chain.py, test_grammar.py).

Usage: python generator_worker.py MODE QWEN35 LLAMA EAGLE3 CHECKPOINT N_TOKENS [SMOLLM2 [DRAFT]]
Prints the generated tokens as JSON. :func:`resume_elsewhere` runs it on the tiny models.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specstate import Generator, Model
from specstate_testkit.generator_support import draft_for


def main() -> None:
    mode, qwen35, llama, eagle3, checkpoint, n_tokens = sys.argv[1:7]
    if len(sys.argv) > 7:
        target = Model(sys.argv[7])
        draft = Model(sys.argv[8]) if len(sys.argv) > 8 else None
    else:
        paths = {"qwen35": Path(qwen35), "llama": Path(llama), "eagle3_draft": Path(eagle3)}
        target, draft = Model(paths["qwen35"]), draft_for(mode, paths)
    generator = Generator.restore(checkpoint, target, draft_model=draft, n_threads=1)
    generator.generate(max_tokens=int(n_tokens) - len(generator.tokens))
    print(json.dumps(generator.tokens))


def resume_elsewhere(paths: dict[str, Path], mode: str, checkpoint: Path, n_tokens: int) -> list[int]:
    """The tokens of `checkpoint` (over the tiny models `paths`) continued to `n_tokens` in a fresh process."""
    models = [str(paths[name]) for name in ("qwen35", "llama", "eagle3_draft")]
    here = Path(__file__).resolve()
    command = [sys.executable, str(here), mode, *models, str(checkpoint), str(n_tokens)]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=here.parent)
    tokens: list[int] = json.loads(result.stdout.strip().splitlines()[-1])
    return tokens


if __name__ == "__main__":
    main()
