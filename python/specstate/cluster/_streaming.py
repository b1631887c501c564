"""Streaming: the caller's text of a generation, handed out by position so that no piece is given twice or skipped.

Every stream of a generation shares one position (:attr:`Generation.handed`) and one UTF-8 decoder, so joining
the pieces of every stream gives the text once. ``pump`` runs the pool while a stream waits for tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from specstate.cluster._records import Generation
from specstate.cluster.errors import GenerationPreempted


def stream(generation: Generation, pump: Callable[[], None]) -> Iterator[str]:
    """The generation's text from the streams' position on, as it is committed; :class:`GenerationPreempted`
    once everything produced before a preemption is handed out."""
    while True:
        while generation.handed < len(generation.pieces):
            piece = generation.pieces[generation.handed]
            generation.handed += 1
            text = generation.decoder.decode(piece)
            if text:
                yield text
        if generation.done:
            break
        if generation.pending is None:
            raise GenerationPreempted(generation.handle.id, "stream")
        pump()
    tail = generation.decoder.decode(b"", final=True)
    if tail:
        yield tail


def take_text(generation: Generation) -> str:
    """The text produced and not yet handed out; it moves the streams' position."""
    pieces = generation.pieces[generation.handed :]
    generation.handed += len(pieces)
    text = "".join(generation.decoder.decode(piece) for piece in pieces)
    return text + (generation.decoder.decode(b"", final=True) if generation.done else "")


def result(generation: Generation, pump: Callable[[], None]) -> str:
    """The whole text from its start, once the generation is over (:class:`GenerationPreempted` if it is
    preempted first); the streams' position does not move."""
    while not generation.done:
        if generation.pending is None:
            raise GenerationPreempted(generation.handle.id, "result")
        pump()
    return b"".join(generation.pieces).decode("utf-8", errors="replace")
