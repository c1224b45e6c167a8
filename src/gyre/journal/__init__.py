"""What a run journals: the append-only journal files (here), and the token-exact call records (`records`).

The journal is one JSON line per record, written before anything downstream sees it. A line is flushed to the OS
before ``append`` returns, so a crash of the process loses nothing that was acknowledged; with ``fsync`` a power loss
does not either. The router and the runtime write journals; the driver (`gyre.driver`: resume, report, SFT) and the
trainer's trajectory processor (`gyre.train.prefixtree`) read them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")
_encoder = msgspec.json.Encoder()


class Journal:
    """Appends msgspec Structs as JSON lines to ``directory/name``."""

    def __init__(self, directory: str | Path, name: str = "calls.jsonl", fsync: bool = False) -> None:
        self.path = Path(directory) / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync = fsync
        self.written = 0

    def append(self, item: object) -> None:
        """Write one record as one line (one ``write`` call, so lines never interleave)."""
        line = _encoder.encode(item) + b"\n"
        os.write(self._fd, line)
        if self._fsync:
            os.fsync(self._fd)
        self.written += 1

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def repair_journal(path: str | Path) -> int:
    """Cut a torn last line (a crash mid-write) off a journal before appending to it again, so the next record
    starts a line of its own; returns the bytes cut (0: the file ended with a whole line, or does not exist)."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:  # back to just after the last newline
            chunk = min(end, 1 << 16)
            f.seek(end - chunk)
            block = f.read(chunk)
            at = block.rfind(b"\n")
            if at >= 0:
                end = end - chunk + at + 1
                break
            end -= chunk
        if end < size:
            f.truncate(end)
        return size - end


def read_journal(path: str | Path, type_: type[T]) -> Iterator[T]:
    """Decode every line of a journal file; a torn last line (crash mid-write) is skipped."""
    decoder = msgspec.json.Decoder(type_)
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n"):
                yield decoder.decode(line)
