"""The one tokenizer vocabulary of specstate's tiny test models (GPT-2 style bytes and merges, BOS and EOS)."""

from __future__ import annotations

from dataclasses import dataclass

import gguf

__all__ = ["BOS_ID", "EOS_ID", "N_VOCAB", "VOCAB", "Vocab", "printable_tokens"]

# A few English merges in GPT-2's byte spelling ('\u0120' is the space byte).
# Each merge's operands exist by the time it is listed.
_MERGES: tuple[tuple[str, str], ...] = (
    ("\u0120", "t"),
    ("\u0120", "a"),
    ("h", "e"),
    ("i", "n"),
    ("r", "e"),
    ("o", "n"),
    ("\u0120t", "he"),
    ("e", "r"),
    ("\u0120", "s"),
    ("a", "t"),
    ("\u0120", "w"),
    ("\u0120", "o"),
    ("e", "n"),
    ("\u0120", "c"),
    ("i", "t"),
    ("i", "s"),
    ("a", "n"),
    ("o", "r"),
    ("e", "s"),
    ("\u0120", "b"),
    ("e", "d"),
    ("\u0120", "f"),
    ("in", "g"),
    ("\u0120", "p"),
    ("o", "u"),
    ("\u0120a", "n"),
    ("a", "l"),
    ("a", "r"),
    ("\u0120t", "o"),
    ("\u0120", "m"),
    ("\u0120o", "f"),
    ("\u0120", "in"),
    ("\u0120", "d"),
    ("\u0120", "h"),
    ("\u0120an", "d"),
    ("l", "e"),
)

_BOS_TEXT = "<|bos|>"
_EOS_TEXT = "<|endoftext|>"


def _byte_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character mapping, indexed by byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    mapping: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


@dataclass(frozen=True)
class Vocab:
    """The shared tokenizer vocabulary.

    Token ``b`` (0-255) is byte ``b``; the merges follow in :data:`_MERGES`
    order; BOS and EOS are the last two tokens.
    """

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int

    def write_to(self, writer: gguf.GGUFWriter) -> None:
        """Add the tokenizer metadata to ``writer``."""
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(list(self.tokens))
        writer.add_token_types(list(self.token_types))
        writer.add_token_merges(list(self.merges))
        writer.add_bos_token_id(self.bos_id)
        writer.add_eos_token_id(self.eos_id)
        writer.add_add_bos_token(False)
        writer.add_add_eos_token(False)


def _make_vocab() -> Vocab:
    tokens = _byte_to_unicode()
    types = [int(gguf.TokenType.NORMAL)] * 256
    known = set(tokens)
    merges: list[str] = []
    for left, right in _MERGES:
        if left not in known or right not in known:
            raise AssertionError(f"merge operand missing: {left!r} {right!r}")
        merged = left + right
        if merged in known:
            raise AssertionError(f"duplicate merge result: {merged!r}")
        known.add(merged)
        tokens.append(merged)
        types.append(int(gguf.TokenType.NORMAL))
        merges.append(f"{left} {right}")
    bos_id = len(tokens)
    tokens.append(_BOS_TEXT)
    types.append(int(gguf.TokenType.CONTROL))
    eos_id = len(tokens)
    tokens.append(_EOS_TEXT)
    types.append(int(gguf.TokenType.CONTROL))
    return Vocab(tuple(tokens), tuple(types), tuple(merges), bos_id, eos_id)


#: The one vocabulary every builder writes.
VOCAB = _make_vocab()
#: Number of tokens in :data:`VOCAB` (294).
N_VOCAB = len(VOCAB.tokens)
#: Token id of BOS (not added automatically: ``add_bos_token`` is false).
BOS_ID = VOCAB.bos_id
#: Token id of EOS (never produced by greedy decoding: its output row is zero).
EOS_ID = VOCAB.eos_id


def printable_tokens() -> tuple[int, ...]:
    """Ids of the tokens the models can emit: printable ASCII bytes and merges.

    Their text is printable ASCII, so any sequence of them is valid UTF-8.
    """
    byte_to_char = _byte_to_unicode()
    char_to_byte = {c: b for b, c in enumerate(byte_to_char)}
    ids = []
    for token_id, text in enumerate(VOCAB.tokens):
        if VOCAB.token_types[token_id] != int(gguf.TokenType.NORMAL):
            continue
        data = bytes(char_to_byte[c] for c in text)
        if all(0x20 <= b <= 0x7E for b in data):
            ids.append(token_id)
    return tuple(ids)
