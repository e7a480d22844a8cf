"""Follow one log file by its path, whatever happens to it, and say exactly how far it was read.

What the path may do, and what the tailer does about it:

- not exist yet, or disappear: it is tried again at every poll; a file that appears is read
  from its first byte.
- be renamed away and replaced (logrotate ``create``, Python's RotatingFileHandler): the old file
  stays open and is read to its end; it is closed once it has not grown for ``rotate_wait_s``
  (a writer may still hold it), and the new file is read from its first byte.
- be rotated several times between two polls: a file created at the path and rotated away before
  a poll saw it is found among the siblings (``NAME.1``, ``NAME-2026...``, not ``.gz``): each sibling
  is known by its inode and first bytes, and one that appears when the path changes (renamed,
  recreated, truncated) and is neither known nor a copy of what was read is a generation never
  seen: it is read from its first byte, oldest first, before the file now at the path.
- be truncated in place (logrotate ``copytruncate``): the bytes written between the last read and
  the copy are recovered from the copy when a sibling (``NAME.1``, ``NAME-2026...``) starts with the
  same bytes as the file did; then the file is read again from its start. When no such copy is
  found, or the copy ends before what was already read (the writer went on between the copy and
  the truncation), a loss cannot be excluded: it is counted (``lost_lines``, at least one per
  such truncation, and ``lost_bytes`` when known) and logged, never passed over in silence. A copy
  of bytes the file holds but the tailer has not read yet (the next copytruncate's copy made, its
  truncation not yet) is looked at again until they are read: the truncation may come first. The
  bytes written between logrotate's copy and its truncation, when no poll fell in between, are
  lost for every reader, and cannot be seen (logrotate's own manual says so).
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
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from agent.lines import DEFAULT_MAX_LINE_BYTES, LineSplitter

logger = logging.getLogger(__name__)

HEAD_BYTES = 1024
IDENTITY_BYTES = 256  # a sibling is known by its inode and the checksum of its first bytes
MAX_KNOWN_SIBLINGS = 4096
RESCAN_POLLS = 3  # after a rotation, the siblings are looked at again for this many polls
COPY_LISTINGS = 3  # listings of the siblings that look for the copy of a truncated file
READ_CHUNK_BYTES = 256 * 1024
MAX_READ_PER_POLL_BYTES = 1024 * 1024
ROTATED_SUFFIXES_SKIPPED = (".gz", ".bz2", ".xz", ".zst", ".zip")
_NUMBERED = re.compile(r"[.\-_][0-9]")


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
        self._known: dict[tuple[int, int], tuple[int, int]] | None = None  # sibling (dev, ino) -> (len, crc) of its first bytes
        self._rescans = 0  # polls left that look at the siblings again (a listing may miss a file being renamed)
        self._seen_size = 0  # the largest size of the current file seen since it was last read from its start
        self.more = False  # the last poll stopped at its read budget: poll again soon
        self.lost_files = 0  # files named in a restored position that could not be found
        self.lost_lines = 0  # truncations that may have cost lines (each at least one line)
        self.lost_bytes = 0  # bytes known to be lost (a lower bound; 0 when the extent is unknown)
        self._lost_taken = (0, 0)

    # ---- positions -------------------------------------------------------------------------

    def restore(self, positions: list[dict]) -> None:
        """Resume from a ``snapshot()`` taken by an earlier process; call before the first poll."""
        self._restore = [dict(p) for p in positions]

    def snapshot(self) -> list[dict]:
        files = ([self._cur] if self._cur else []) + self._draining
        return [f.position() for f in files] + self._finished

    def take_losses(self) -> tuple[int, int]:
        """(lines, bytes) lost since the last call: see ``lost_lines`` and ``lost_bytes``."""
        taken = (self.lost_lines - self._lost_taken[0], self.lost_bytes - self._lost_taken[1])
        self._lost_taken = (self.lost_lines, self.lost_bytes)
        return taken

    # ---- reading ---------------------------------------------------------------------------

    def poll(self) -> list[str]:
        lines: list[str] = []
        self.more = False
        if self._done:
            return lines
        if self._restore:
            self._apply_restore()
        if self._known is None:  # what is there at the start is history, not a missed generation
            self._known = {}
            self._remember_siblings()
        for old in list(self._draining):
            lines += self._read(old)
            if self.clock() - old.last_growth >= self.rotate_wait_s:
                lines += self._close(old)
        if self._cur is None:
            self._cur = self._open_path(offset=0)
            if self._cur is not None:  # appeared again: a generation may have come and gone meanwhile
                lines += self._read_missed_generations()
        if self._cur is not None:
            lines += self._check_current()
        if self._rescans:
            self._rescans -= 1
            lines += self._read_missed_generations(copies_of=self._cur, again=True)
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
                self._finished = [f.position() | {"finished": True}]
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
                if pos.get("finished"):  # read to its end when the last run stopped
                    logger.info("%s: the file read up to offset %d is no longer there (replaced or deleted)", self.path, pos["offset"])
                else:  # it went while the agent was down: what it held after the offset may be lost
                    self.lost_lines += 1
                    logger.warning(
                        "%s: the file read up to offset %d is no longer there, nor a copy of it (rotated and deleted while the agent was down):"
                        " lines written to it since may be lost; counted as dropped", self.path, pos["offset"],
                    )
                continue
            fd, st, at_path = found
            f = self._new(fd, st, pos["offset"])
            f.cut = bool(pos.get("cut"))
            if at_path and self._cur is None:
                self._cur = f
            else:
                self._draining.append(f)

    def _find(self, pos: dict) -> tuple[int, os.stat_result, bool] | None:
        """The file ``pos`` describes, at the path or renamed; else a copy of it (copytruncate while
        the agent was down: the copy holds what came after the offset)."""
        copy: tuple[int, os.stat_result, bool] | None = None
        for candidate, at_path in [(self.path, True)] + [(p, False) for p in self._siblings()]:
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            if _matches(fd, st, pos):
                if copy is not None:
                    os.close(copy[0])
                return fd, st, at_path
            if copy is None and not at_path and _matches(fd, st, pos | {"dev": st.st_dev, "ino": st.st_ino}):
                copy = (fd, st, False)
                continue
            os.close(fd)
        return copy

    def _siblings(self, numbered: bool = False) -> list[str]:
        """Files a rotation may have produced from this path: NAME.1, NAME-20261129, NAME_old...

        ``numbered``: only those whose suffix starts with a digit (NAME.1, NAME-20261129,
        NAME.2026-11-29_12-00): the ones read whole when they were never seen, so that a
        NAME.lock or NAME.truth beside the log is never taken for a generation of it.
        """
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
        if numbered:
            out = [p for p in out if _NUMBERED.match(p[len(self.path) :])]
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
            self._seen_size = 0
            return lines + self._read_missed_generations()
        fst = os.fstat(cur.fd)
        truncated = fst.st_size < cur.read_pos
        changed = fst.st_mtime_ns != cur.last_mtime_ns
        if not truncated and changed:
            truncated = not cur.head_matches(cur.fd)
        cur.last_mtime_ns = fst.st_mtime_ns
        if truncated:
            return self._truncated(cur)
        self._seen_size = max(self._seen_size, fst.st_size)
        if changed and not cur.head and self._known is not None:
            # Nothing read from it yet, so a truncation cannot be seen in it: written, copied and
            # truncated since the last poll, its content is only in a copy among the siblings.
            return self._read_missed_generations(copies_of=cur, again=True)
        return []

    def _truncated(self, cur: _Open) -> list[str]:
        """copytruncate: finish the old content from its copy if one is found, read the copies of
        generations truncated since (copytruncate twice between two polls), then start over."""
        lines: list[str] = []
        copy = self._find_copy(cur)
        copied_to = None
        if copy is not None:
            fd, st = copy
            copied_to = st.st_size
            if self._known is not None:  # read now: not a generation of its own
                self._known[(st.st_dev, st.st_ino)] = self._identity(fd, st)
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
        lines += cur.splitter.finish()
        if copied_to is None or copied_to < cur.read_pos:
            self._count_loss(cur, copied_to)
        cur.splitter = LineSplitter(self.max_line_bytes)
        cur.base = cur.read_pos = 0
        cur.head = bytearray()
        cur.last_mtime_ns = -1
        self._seen_size = 0
        return lines + self._read_missed_generations(copies_of=cur)

    def _count_loss(self, cur: _Open, copied_to: int | None) -> None:
        """The file shrank and what it held after our last read may not have been read by anyone."""
        known = max(0, self._seen_size - max(cur.read_pos, copied_to or 0))
        self.lost_lines += 1
        self.lost_bytes += known
        if copied_to is None:
            why = "no copy of it was found among its siblings (a compressed or moved copy is not read)"
        else:
            why = f"its copy ends at offset {copied_to}, before what was read: the writer went on between the copy and the truncation"
        logger.warning(
            "%s was truncated after offset %d and %s: lines written since may be lost (%s); counted as dropped",
            self.path, cur.read_pos, why, f"at least {known} bytes" if known else "how many is unknown",
        )

    def _find_copy(self, cur: _Open) -> tuple[int, os.stat_result] | None:
        """The sibling that starts with the bytes the file started with: the one agreeing on the
        most of them, then the newest (a copy that ends before what was read is still the copy,
        and says the writer went on after it). The siblings are listed by name and opened one by
        one, so a rotation shifting them (NAME.1 -> NAME.2) meanwhile can hide the copy from one
        listing: up to COPY_LISTINGS are tried before the copy is taken for gone."""
        for _ in range(COPY_LISTINGS):
            found = self._find_copy_once(cur)
            if found is not None:
                return found
        return None

    def _find_copy_once(self, cur: _Open) -> tuple[int, os.stat_result] | None:
        best: tuple[tuple[int, int], int, os.stat_result] | None = None
        for candidate in self._siblings():
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            n = min(st.st_size, len(cur.head))
            if (st.st_dev, st.st_ino) != (cur.dev, cur.ino) and n and os.pread(fd, n, 0) == bytes(cur.head[:n]):
                rank = (n, st.st_ctime_ns)
                if best is None or rank > best[0]:
                    if best is not None:
                        os.close(best[1])
                    best = (rank, fd, st)
                    continue
            os.close(fd)
        return (best[1], best[2]) if best is not None else None

    # ---- generations never seen -------------------------------------------------------------

    def _identity(self, fd: int, st: os.stat_result) -> tuple[int, int]:
        head = os.pread(fd, min(st.st_size, IDENTITY_BYTES), 0)
        return len(head), zlib.crc32(head)

    def _is_known(self, fd: int, st: os.stat_result) -> bool:
        assert self._known is not None
        known = self._known.get((st.st_dev, st.st_ino))
        if known is None:
            return False
        length, crc = known
        return st.st_size >= length and zlib.crc32(os.pread(fd, length, 0)) == crc  # else: the inode was reused

    def _ours(self, st: os.stat_result) -> bool:
        files = ([self._cur] if self._cur else []) + self._draining
        return any((f.dev, f.ino) == (st.st_dev, st.st_ino) for f in files)

    def _remember_siblings(self) -> list[tuple[int, os.stat_result, str]]:
        """Record every sibling as known; return the open ones that were not (the caller closes them)."""
        assert self._known is not None
        unknown: list[tuple[int, os.stat_result, str]] = []
        present: dict[tuple[int, int], tuple[int, int]] = {}
        for candidate in self._siblings(numbered=True):
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key in present:  # listed under two names: renamed (NAME.1 -> NAME.2) during the listing
                os.close(fd)
                continue
            if self._is_known(fd, st) or self._ours(st):
                present[key] = self._known.get(key) or self._identity(fd, st)
                os.close(fd)
                continue
            if st.st_size == 0:  # nothing to tell it by yet (a copy being made?): looked at again later
                os.close(fd)
                continue
            present[key] = self._identity(fd, st)
            unknown.append((fd, st, candidate))
        # A sibling missing from this listing may be one being renamed (NAME.1 -> NAME.2): it stays
        # known. A reused inode is told apart by its first bytes.
        for key in present:
            self._known.pop(key, None)
        self._known.update(present)
        while len(self._known) > MAX_KNOWN_SIBLINGS:
            del self._known[next(iter(self._known))]
        return unknown

    def _read_missed_generations(self, copies_of: _Open | None = None, again: bool = False) -> list[str]:
        """The path changed: read the siblings that appeared and were never seen, oldest first.

        ``copies_of``: the file now at the path; a sibling that starts with its bytes is a copy of
        what will be read from it (copytruncate), not a generation of its own. ``again``: one of
        the polls that look once more after a rotation.
        """
        if self._known is None:
            return []
        lines: list[str] = []
        if not again:
            self._rescans = RESCAN_POLLS
        unknown = self._remember_siblings()
        unknown.sort(key=lambda u: (u[1].st_mtime_ns, u[2]))
        for fd, st, candidate in unknown:
            copy = self._copy_of_current(fd, copies_of) if copies_of is not None else None
            if copy == "unread":  # of bytes still to be read from the file, which may be truncated first
                self._known.pop((st.st_dev, st.st_ino), None)  # so it is looked at again until they are read
                self._rescans = max(self._rescans, 1)
            if copy:
                os.close(fd)
                continue
            logger.info("%s: %s appeared since the last poll and was never read: reading it from its start", self.path, candidate)
            f = self._new(fd, st, 0)
            self._draining.append(f)
            lines += self._read(f)
        return lines

    @staticmethod
    def _copy_of_current(fd: int, cur: _Open) -> str | None:
        """Does the sibling start as the current file did when we read it ("read": it may have been
        truncated since, and ``_truncated`` reads the copy's end then), or as it does now, beyond what
        we read of it ("unread": skipped for now, but the file may be truncated before we read those
        bytes, the next copytruncate's copy made and its truncation not yet: then they are only in the
        copy, which is looked at again)? None: not a copy. A copy being written may be shorter than
        either: the bytes it has so far are compared."""
        size = os.fstat(fd).st_size
        n = min(size, len(cur.head))
        if n and os.pread(fd, n, 0) == bytes(cur.head[:n]):
            return "read"
        n = min(os.fstat(cur.fd).st_size, size, HEAD_BYTES)
        return "unread" if n > 0 and os.pread(fd, n, 0) == os.pread(cur.fd, n, 0) else None

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
        if self._known is not None:  # read: when it shows up among the siblings again, it is not new
            self._known[(f.dev, f.ino)] = self._identity(f.fd, os.fstat(f.fd))
        os.close(f.fd)
        if f in self._draining:
            self._draining.remove(f)
        return lines
