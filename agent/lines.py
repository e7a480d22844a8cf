"""Line framing: bytes as they arrive (any chunking) → complete lines, decoded.

A line ends at ``\\n``; a ``\\r`` just before it is part of the terminator (CRLF). A partial last
line is held until its newline arrives or the caller says the stream has ended (``finish``).
Bytes that are not UTF-8 are decoded with U+FFFD. A line longer than ``max_line_bytes`` is cut
into pieces of at most that many bytes (never inside a UTF-8 character), so a writer that never
ends its line cannot make the agent hold unbounded memory.
"""

from __future__ import annotations

DEFAULT_MAX_LINE_BYTES = 256 * 1024


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _cut_point(buf: bytes | bytearray, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 character (falls back to limit)."""
    cut = limit
    for _ in range(3):
        if cut > 0 and (buf[cut] & 0xC0) == 0x80:
            cut -= 1
        else:
            break
    return cut if cut > 0 and (buf[cut] & 0xC0) != 0x80 else limit


class LineSplitter:
    """Feed bytes, get lines. ``consumed`` counts the bytes that ended up in returned lines."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < 4:
            raise ValueError("max_line_bytes must be at least 4")
        self.max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self.consumed = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of a partial line held back, waiting for its newline."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[str]:
        if not data:
            return []
        out: list[str] = []
        if self._partial:
            data = bytes(self._partial) + data
            self._partial.clear()
        pieces = data.split(b"\n")
        tail = pieces.pop()
        for piece in pieces:
            self.consumed += len(piece) + 1
            if piece.endswith(b"\r"):
                piece = piece[:-1]
            if len(piece) > self.max_line_bytes:
                out.extend(self._cut(piece, final=True))
            else:
                out.append(decode(piece))
        if len(tail) > self.max_line_bytes:
            out.extend(self._cut(tail, final=False))
        else:
            self._partial += tail
        return out

    def _cut(self, piece: bytes, *, final: bool) -> list[str]:
        """Pieces of at most max_line_bytes; when not final, the remainder stays partial."""
        out = []
        while len(piece) > self.max_line_bytes:
            cut = _cut_point(piece, self.max_line_bytes)
            out.append(decode(piece[:cut]))
            if not final:
                self.consumed += cut
            piece = piece[cut:]
        if final:
            out.append(decode(piece))
        else:
            self._partial += piece
        return out

    def finish(self) -> list[str]:
        """The stream ended: a partial last line becomes a line (a lone trailing CR is dropped)."""
        if not self._partial:
            return []
        piece = bytes(self._partial)
        self._partial.clear()
        self.consumed += len(piece)
        if piece.endswith(b"\r"):
            piece = piece[:-1]
        return [decode(piece)]

    def reset(self) -> None:
        """Forget a partial line (its file was truncated under it and nothing follows it)."""
        self._partial.clear()
