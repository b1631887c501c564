"""What a full lookup corpus costs a generation: `ngram` mode on the code prompt with no corpus and with a
``LookupCorpus`` at its largest budget (4,194,304 tokens), interleaved rounds, the ratio of their tokens/s.

Prompt lookup asks the corpus for a proposal every round, plain rounds included. The corpus is filled with text
like the prompt's (``make bench``'s four prompts tokenized, repeated with one token in ten replaced at random, in
texts of 4,096 tokens), so its two-token keys recur as a real corpus's do, and the replies must stay token for
token the same (a corpus changes proposals only).

Usage: python benchmarks/lookup_corpus.py [--rounds 4] [--tokens 96] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import resource
import time

from specstate import Generator, LookupCorpus, Model
from specstate.bench import CODE_PROMPT, EDIT_PROMPT, QUOTE_PROMPT, STORY_PROMPT, interleave, pair_ratio
from specstate.smollm2 import smollm2_path

#: The largest budget a corpus may have (``LookupCorpus(max_tokens=...)``).
FULL = 1 << 22
TEXT_TOKENS = 4096


def filled_corpus(model: Model) -> LookupCorpus:
    """A corpus at its largest budget, of the bench prompts' tokens with one in ten replaced."""
    rng = random.Random(0)
    source = [t for p in (STORY_PROMPT, CODE_PROMPT, QUOTE_PROMPT, EDIT_PROMPT) for t in model.tokenize(p)]
    n_vocab = model.n_vocab
    corpus = LookupCorpus(max_tokens=FULL)
    for _ in range(FULL // TEXT_TOKENS):
        start = rng.randrange(len(source))
        text = [source[(start + i) % len(source)] for i in range(TEXT_TOKENS)]
        corpus.add([rng.randrange(n_vocab) if rng.random() < 0.1 else t for t in text])
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = Model(smollm2_path())
    prompt = model.tokenize(CODE_PROMPT, add_special=False, parse_special=True)
    started, rss = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    full = filled_corpus(model)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    seconds = time.perf_counter() - started
    print(f"[bench] a corpus of {full.n_tokens} tokens in {full.n_documents} texts: {seconds:.1f} s, {grown:.0f} MiB")
    replies: dict[str, list[int]] = {}

    def speed(corpus: LookupCorpus | None, name: str) -> float:
        generator = Generator(model, mode="ngram", n_ctx=1024, n_threads=args.threads)
        generator.set_lookup_corpus(corpus)
        pieces = iter(generator.stream(prompt, max_tokens=args.tokens))
        next(pieces)  # the prompt's decode and the first token, untimed
        begun = time.perf_counter()
        for _ in pieces:
            pass
        replies[name] = generator.tokens
        return (len(generator.tokens) - 1) / (time.perf_counter() - begun)

    figures = interleave({"none": lambda: speed(None, "none"), "full": lambda: speed(full, "full")}, args.rounds)
    print(
        f"ngram on the code prompt, {args.tokens} tokens, {args.threads} threads, {args.rounds} interleaved rounds: "
        f"no corpus {max(figures['none']):.1f} tok/s, a full corpus {max(figures['full']):.1f} tok/s; "
        f"full / none {pair_ratio(figures['full'], figures['none'])}; same reply: {replies['none'] == replies['full']}"
    )


if __name__ == "__main__":
    main()
