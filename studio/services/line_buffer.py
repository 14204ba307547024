"""Byte-level line framing for a child process's pipes.

A pipe read can end anywhere: mid-line, mid-UTF-8 character, or after several lines. Buffering bytes
and splitting on b"\\n" before decoding is the only order that gets all three right (decoding a chunk
first would corrupt a multi-byte character cut in two).
"""

from __future__ import annotations

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A line longer than this without a newline is a broken writer, not a message; it is cut off."""


class LineBuffer:
    """Collects bytes and hands back complete decoded lines (without the newline)."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._pending = bytearray()
        self._max = max_line_bytes

    def feed(self, data: bytes) -> list[str]:
        """Add a chunk; return every line it completed, in order."""
        self._pending += data
        if b"\n" not in data:
            if len(self._pending) > self._max:
                return [self.flush() or ""]
            return []
        *complete, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        return [_decode(line) for line in complete]

    def flush(self) -> str | None:
        """The unterminated tail, if any (at end of stream); the buffer is emptied."""
        if not self._pending:
            return None
        line = _decode(bytes(self._pending))
        self._pending.clear()
        return line

    def __len__(self) -> int:
        return len(self._pending)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")
