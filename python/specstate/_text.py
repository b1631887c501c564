"""Generated text as it arrives: the one incremental UTF-8 decoder and the one stop-string matcher.

:class:`Utf8Decoder` turns tokens' bytes into text, a character split across tokens given once its last byte
comes; :class:`StopMatcher` finds the first stop string in text read piece by piece, in time linear in the text,
and :class:`StopScanner` cuts a stream of text pieces before it.
"""

from __future__ import annotations

import codecs
from collections.abc import Generator, Iterator, Sequence

from specstate._native import Model

__all__ = ["StopMatcher", "StopScanner", "Utf8Decoder"]


class Utf8Decoder:
    """Text of UTF-8 bytes read in pieces: a character whose bytes span pieces is given once its last byte is
    read; bytes that cannot be UTF-8 become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes, *, final: bool = False) -> str:
        """The text that ``data`` completes (``final``: no more bytes come, an unfinished character included)."""
        return self._decoder.decode(data, final)

    def token(self, model: Model, token: int, *, special: bool = False) -> str:
        """The text that ``token``'s bytes complete (``special``: a special token's text too)."""
        return self._decoder.decode(model.token_to_piece(token, special=special))


class StopMatcher:
    """The first of some stop strings in a text read piece by piece, in time linear in the text and the stop
    strings: each stop string's longest partial match at the end of the text is kept up to date character by
    character (Knuth-Morris-Pratt), never searched for again. Empty stop strings never match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [stop for stop in stops if stop]
        self._fallbacks = [_fallback(stop) for stop in self._stops]
        self._lengths = [0] * len(self._stops)
        #: The longest end of the text read that begins a stop string (short of a whole one): text that must be
        #: held back while more could complete it.
        self.partial = 0

    def feed(self, text: str) -> tuple[int, str] | None:
        """Read ``text``: the first stop string in the text read so far, if ``text`` completes one, as ``(start,
        stop)``: where it begins, counted from ``text``'s start (negative when it began in text read before),
        and which one (the longest of those that begin there). Once one is found, nothing more is read."""
        found: tuple[int, str] | None = None
        for index, stop in enumerate(self._stops):
            end = self._advance(index, text)
            if end is not None and (found is None or (end - len(stop), -len(stop)) < (found[0], -len(found[1]))):
                found = (end - len(stop), stop)
        self.partial = max(self._lengths, default=0)
        return found

    def _advance(self, index: int, text: str) -> int | None:
        """Read ``text`` for stop string ``index``: where in ``text`` its first whole match ends, or None."""
        stop, fallback, length = self._stops[index], self._fallbacks[index], self._lengths[index]
        for position, char in enumerate(text):
            while length and stop[length] != char:
                length = fallback[length - 1]
            length += stop[length] == char
            if length == len(stop):
                self._lengths[index] = fallback[length - 1]
                return position + 1
        self._lengths[index] = length
        return None


def _fallback(stop: str) -> list[int]:
    """``result[i]``: the longest proper prefix of ``stop[: i + 1]`` that is also its suffix."""
    result = [0] * len(stop)
    length = 0
    for index in range(1, len(stop)):
        while length and stop[index] != stop[length]:
            length = result[length - 1]
        length += stop[index] == stop[length]
        result[index] = length
    return result


class StopScanner:
    """A stream of text pieces cut before the first stop string (:class:`StopMatcher`); text that could begin
    one is held back (``held``) until it cannot. ``held``: text read before, that the pieces continue."""

    def __init__(self, pieces: Generator[str, None, None], stops: list[str], held: str = "") -> None:
        self._pieces = pieces
        self.stops = stops
        self._matcher = StopMatcher(stops)
        #: Whether a stop string ended the text.
        self.stopped = False
        #: The stop string that ended it, once one did.
        self.matched: str | None = None
        #: Text read and not yet yielded: it could begin a stop string.
        self.held = ""
        self._cut = self._read(held)

    def _read(self, text: str) -> bool:
        """Read ``text`` into ``held``; True (and ``held`` cut before it) if a stop string ends the text."""
        self.held += text
        found = self._matcher.feed(text)
        if found is not None:
            self.stopped, self.matched = True, found[1]
            self.held = self.held[: len(self.held) - len(text) + found[0]]
        return self.stopped

    def __iter__(self) -> Iterator[str]:
        try:
            if not self._cut:
                for piece in self._pieces:
                    if self._read(piece):
                        break
                    ready = len(self.held) - self._matcher.partial
                    if ready > 0:
                        piece, self.held = self.held[:ready], self.held[ready:]
                        yield piece
            if self.held:
                piece, self.held = self.held, ""
                yield piece
        finally:
            self._pieces.close()
