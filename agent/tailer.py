"""Follow one log file by its path, whatever happens to it, and say exactly how far it was read.

What the path may do, and what the tailer does about it:

- not exist yet, or disappear: it is tried again at every poll; a file that appears is read
  from its first byte.
- be renamed away and replaced (logrotate ``create``, Python's RotatingFileHandler): the old file
  stays open and is read to its end; it is closed once it has not grown for ``rotate_wait_s``
  (a writer may still hold it), and the new file is read from its first byte.
- be truncated in place (logrotate ``copytruncate``): the bytes written between the last read and
  the copy are recovered from the copy when a sibling (``NAME.1``, ``NAME-2026...``) starts with the
  same bytes as the file did; then the file is read again from its start.
- end without a newline: the partial line is held until its newline arrives, or until the file is
  finished (``finish``), rotated away for good, or truncated.

A file is known by its (device, inode) and a checksum of its first bytes (an inode can be reused
by the next file). ``snapshot()`` gives, per open file, the offset just after the last line that
``poll`` has returned, never further: it is what the caller stores *with* those lines (the spool),
so that a restarted agent resumes exactly after the last line it kept (loki#1540 was a position
saved ahead of its lines).
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from agent.lines import DEFAULT_MAX_LINE_BYTES, LineSplitter

logger = logging.getLogger(__name__)

HEAD_BYTES = 1024
READ_CHUNK_BYTES = 256 * 1024
MAX_READ_PER_POLL_BYTES = 1024 * 1024
ROTATED_SUFFIXES_SKIPPED = (".gz", ".bz2", ".xz", ".zst", ".zip")


@dataclass
class _Open:
    fd: int
    dev: int
    ino: int
    base: int  # offset where this splitter started
    read_pos: int
    splitter: LineSplitter
    head: bytearray = field(default_factory=bytearray)  # the file's first bytes, as this process read them
    last_growth: float = 0.0
    last_mtime_ns: int = -1
    cut: bool = False  # ``finish`` ended a partial line here: its newline, when it comes, is not a line

    @property
    def committed(self) -> int:
        return self.base + self.splitter.consumed

    def position(self) -> dict:
        pos = {"dev": self.dev, "ino": self.ino, "offset": self.committed, "head_len": len(self.head), "head_crc": zlib.crc32(self.head)}
        if self.cut:
            pos["cut"] = True
        return pos

    def head_matches(self, fd: int) -> bool:
        """Does the file open as ``fd`` start with the bytes this one started with?"""
        return os.pread(fd, len(self.head), 0) == self.head if self.head else True


def _head_crc(fd: int, length: int) -> int:
    return zlib.crc32(os.pread(fd, length, 0)) if length else 0


def _matches(fd: int, st: os.stat_result, pos: dict) -> bool:
    """Is this open file the one ``pos`` describes (same inode, same first bytes, long enough)?"""
    if (st.st_dev, st.st_ino) != (pos["dev"], pos["ino"]) or st.st_size < pos["offset"]:
        return False
    return st.st_size >= pos["head_len"] and _head_crc(fd, pos["head_len"]) == pos["head_crc"]


class FileTailer:
    """Poll-driven: call ``poll()`` as often as wanted; it never blocks on the writer."""

    def __init__(
        self,
        path: str,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        rotate_wait_s: float = 2.0,
        on_bytes: Callable[[bytes], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.path.abspath(path)
        self.max_line_bytes = max_line_bytes
        self.rotate_wait_s = rotate_wait_s
        self.on_bytes = on_bytes
        self.clock = clock
        self._cur: _Open | None = None
        self._draining: list[_Open] = []
        self._restore: list[dict] = []
        self._finished: list[dict] = []  # positions of the files ``finish`` closed
        self._done = False  # finished: polls read nothing more
        self._warned_open = False
        self.more = False  # the last poll stopped at its read budget: poll again soon
        self.lost_files = 0  # files named in a restored position that could not be found

    # ---- positions -------------------------------------------------------------------------

    def restore(self, positions: list[dict]) -> None:
        """Resume from a ``snapshot()`` taken by an earlier process; call before the first poll."""
        self._restore = [dict(p) for p in positions]

    def snapshot(self) -> list[dict]:
        files = ([self._cur] if self._cur else []) + self._draining
        return [f.position() for f in files] + self._finished

    # ---- reading ---------------------------------------------------------------------------

    def poll(self) -> list[str]:
        lines: list[str] = []
        self.more = False
        if self._done:
            return lines
        if self._restore:
            self._apply_restore()
        for old in list(self._draining):
            lines += self._read(old)
            if self.clock() - old.last_growth >= self.rotate_wait_s:
                lines += self._close(old)
        if self._cur is None:
            self._cur = self._open_path(offset=0)
        if self._cur is not None:
            lines += self._check_current()
        if self._cur is not None:
            lines += self._read(self._cur)
        return lines

    def finish(self) -> list[str]:
        """Read everything there is now, end every partial line, and close all files.

        The file at the path keeps its final position in ``snapshot()``, so that a later tailer
        of the same path resumes after it instead of reading it again.
        """
        lines = self.poll()
        for f in ([self._cur] if self._cur else []) + self._draining:
            end = os.fstat(f.fd).st_size  # a writer still writing must not keep us here
            while f.read_pos < end:
                before = f.read_pos
                lines += self._read(f)
                if f.read_pos == before:
                    break
            ended = self._close(f)
            lines += ended
            if f is self._cur:
                f.cut = f.cut or bool(ended)
                self._finished = [f.position()]
        self._cur = None
        self._draining = []
        self._done = True
        return lines

    def close(self) -> None:
        for f in ([self._cur] if self._cur else []) + self._draining:
            os.close(f.fd)
        self._cur = None
        self._draining = []

    # ---- internals -------------------------------------------------------------------------

    def _new(self, fd: int, st: os.stat_result, offset: int) -> _Open:
        f = _Open(fd, st.st_dev, st.st_ino, offset, offset, LineSplitter(self.max_line_bytes), last_growth=self.clock())
        if offset:  # resumed: the bytes before offset were checked against the saved head just now
            f.head = bytearray(os.pread(fd, min(offset, HEAD_BYTES), 0))
        return f

    def _open_path(self, offset: int) -> _Open | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ENOENT and not self._warned_open:
                logger.warning("cannot open %s: %s (will keep trying)", self.path, e)
                self._warned_open = True
            return None
        self._warned_open = False
        return self._new(fd, os.fstat(fd), offset)

    def _apply_restore(self) -> None:
        """Reopen the files of a snapshot: the one at the path, and rotated ones among its siblings."""
        positions, self._restore = self._restore, []
        for pos in positions:
            found = self._find(pos)
            if found is None:
                self.lost_files += 1
                logger.info("%s: the file read up to offset %d is no longer there (replaced or deleted)", self.path, pos["offset"])
                continue
            fd, st, at_path = found
            f = self._new(fd, st, pos["offset"])
            f.cut = bool(pos.get("cut"))
            if at_path and self._cur is None:
                self._cur = f
            else:
                self._draining.append(f)

    def _find(self, pos: dict) -> tuple[int, os.stat_result, bool] | None:
        for candidate, at_path in [(self.path, True)] + [(p, False) for p in self._siblings()]:
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            if _matches(fd, st, pos):
                return fd, st, at_path
            os.close(fd)
        return None

    def _siblings(self) -> list[str]:
        """Files a rotation may have produced from this path: NAME.1, NAME-20261129, NAME_old..."""
        directory, name = os.path.split(self.path)
        try:
            entries = os.listdir(directory)
        except OSError:
            return []
        out = [
            os.path.join(directory, e)
            for e in entries
            if e != name and e.startswith(name) and e[len(name)] in ".-_" and not e.endswith(ROTATED_SUFFIXES_SKIPPED)
        ]
        return sorted(out)

    def _check_current(self) -> list[str]:
        """Notice a rename, a deletion or a truncation of the file we have open."""
        cur = self._cur
        assert cur is not None
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == (cur.dev, cur.ino)
        except FileNotFoundError:
            same = False
        if not same:  # renamed away or deleted: read what it has, keep it open a while
            lines = self._read(cur)
            cur.last_growth = self.clock()
            self._draining.append(cur)
            self._cur = self._open_path(offset=0)
            return lines
        fst = os.fstat(cur.fd)
        truncated = fst.st_size < cur.read_pos
        if not truncated and fst.st_mtime_ns != cur.last_mtime_ns:
            truncated = not cur.head_matches(cur.fd)
        cur.last_mtime_ns = fst.st_mtime_ns
        return self._truncated(cur) if truncated else []

    def _truncated(self, cur: _Open) -> list[str]:
        """copytruncate: finish the old content from its copy if one is found, then start over."""
        lines: list[str] = []
        copy = self._find_copy(cur)
        if copy is not None:
            fd, _st = copy
            try:
                data_from = cur.read_pos
                while True:
                    data = os.pread(fd, READ_CHUNK_BYTES, data_from)
                    if not data:
                        break
                    data_from += len(data)
                    if self.on_bytes:
                        self.on_bytes(data)
                    lines += cur.splitter.feed(data)
            finally:
                os.close(fd)
        else:
            logger.warning("%s was truncated at offset %d and no copy was found: lines written since the last read may be lost", self.path, cur.read_pos)
        lines += cur.splitter.finish()
        cur.splitter = LineSplitter(self.max_line_bytes)
        cur.base = cur.read_pos = 0
        cur.head = bytearray()
        cur.last_mtime_ns = -1
        return lines

    def _find_copy(self, cur: _Open) -> tuple[int, os.stat_result] | None:
        for candidate in self._siblings():
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (cur.dev, cur.ino) and st.st_size >= cur.read_pos and cur.head_matches(fd):
                return fd, st
            os.close(fd)
        return None

    def _read(self, f: _Open) -> list[str]:
        lines: list[str] = []
        budget = MAX_READ_PER_POLL_BYTES
        while budget > 0:
            data = os.pread(f.fd, min(READ_CHUNK_BYTES, budget), f.read_pos)
            if not data:
                break
            if f.read_pos < HEAD_BYTES and f.read_pos == len(f.head):  # the head from our own reads, never re-read
                f.head += data[: HEAD_BYTES - f.read_pos]
            f.read_pos += len(data)
            budget -= len(data)
            f.last_growth = self.clock()
            if f.cut:
                f.cut = False
                skip = 2 if data.startswith(b"\r\n") else 1 if data.startswith(b"\n") else 0
                data = data[skip:]
                f.base += skip
            if self.on_bytes:
                self.on_bytes(data)
            lines += f.splitter.feed(data)
            if len(data) < READ_CHUNK_BYTES:
                break
        else:
            self.more = True
        return lines

    def _close(self, f: _Open) -> list[str]:
        lines = f.splitter.finish()
        os.close(f.fd)
        if f in self._draining:
            self._draining.remove(f)
        return lines
