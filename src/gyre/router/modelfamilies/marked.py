"""Sampled ids to marked text, incrementally: each added token as its own marked text, the rest decoded in runs.

A run of ordinary ids is decoded as a whole (byte-level tokens only make characters together); while it grows, only
its undecided tail is decoded again: text already given out is never re-decoded, and a tail that ends inside a
UTF-8 sequence (``\\ufffd``) is held until the sequence completes. So a reply's marked text costs its length, and
the pieces `MarkedDecoder.feed` returns join to ``marked_text(all ids)`` however the ids were cut.
"""

from __future__ import annotations

from collections.abc import Callable

from gyre.router.modelfamilies.replyparser import MARK_CLOSE, MARK_OPEN

_WINDOW = 6  # ids decoded again before the undecided tail: enough for any byte-level character


class MarkedDecoder:
    """Turns one reply's ids, fed in any chunks, into marked text."""

    def __init__(self, decode: Callable[[list[int]], str], added: dict[int, str]) -> None:
        self._decode, self._added = decode, added
        self._run: list[int] = []  # ordinary ids since the last added token
        self._start = 0  # ids of the run whose text was given out, but for the context window before _emitted
        self._emitted = 0  # ids of the run whose text was given out

    def feed(self, ids: list[int]) -> str:
        """The marked text these ids complete (possibly empty: a character may need the next id)."""
        out: list[str] = []
        for i in ids:
            text = self._added.get(i)
            if text is None:
                self._run.append(i)
                continue
            out.append(self._flush())
            out.append(f"{MARK_OPEN}{text}{MARK_CLOSE}")
        out.append(self._pending(final=False))
        return "".join(out)

    def finish(self) -> str:
        """Whatever text is still held, an incomplete character included."""
        return self._flush()

    def _flush(self) -> str:
        text = self._pending(final=True)
        self._run, self._start, self._emitted = [], 0, 0
        return text

    def _pending(self, final: bool) -> str:
        if self._emitted == len(self._run):
            return ""
        context = self._run[self._start : self._emitted]
        before = self._decode(context) if context else ""
        whole = self._decode(self._run[self._start :])
        if not whole.startswith(
            before
        ):  # a decoder that rewrites earlier text: decode the run from its start
            before, whole = self._decode(self._run[: self._emitted]), self._decode(self._run)
            self._start = 0
        new = whole[len(before) :]
        if not final and new.endswith("\ufffd"):
            return ""
        self._emitted = len(self._run)
        self._start = max(0, self._emitted - _WINDOW)
        return new


def marked_text(decode: Callable[[list[int]], str], added: dict[int, str], ids: list[int]) -> str:
    """The marked text of a whole reply."""
    decoder = MarkedDecoder(decode, added)
    return decoder.feed(ids) + decoder.finish()
