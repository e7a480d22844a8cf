"""A bounded on-disk queue of records to send, in order, that survives the agent being killed.

Records live in append-only segment files ``<dir>/000000000001.seg``, ... Each record is framed::

    kind (1 byte: L logs, E event, M metrics) | meta length (u32) | payload length (u32) | crc32 (u32)
    meta (JSON: what the agent needs to recover, e.g. file positions) | payload (the JSON sent as is)

A position in the queue is a ``Ptr`` (segment, offset). Everything before ``acked`` has been
acknowledged by the server. A record torn by a crash (the last one of the last segment) fails its
length or CRC check and is cut off when the spool is opened again.

Bounded: when appending would take the unacknowledged bytes past ``max_bytes``, the full policy
decides. ``drop_oldest`` deletes the oldest segment (the newest lines, where a failure shows, are
kept); ``drop_newest`` refuses the new records. Either way every dropped record is handed to
``on_drop`` (which counts its lines), and ``before_delete`` runs before any segment file is removed
so that the owner can first save what those records recorded (the file positions).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import orjson

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<cIII")
KINDS = {"logs": b"L", "event": b"E", "metrics": b"M"}
KIND_NAMES = {v: k for k, v in KINDS.items()}
FULL_POLICIES = ("drop_oldest", "drop_newest")
MAX_META_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 30
READ_CHUNK_BYTES = 1024 * 1024


class Ptr(NamedTuple):
    segment: int
    offset: int


@dataclass(frozen=True)
class Record:
    kind: str  # logs | event | metrics
    meta: dict
    payload: bytes

    def encode(self) -> bytes:
        meta = orjson.dumps(self.meta)
        kind = KINDS[self.kind]
        crc = zlib.crc32(self.payload, zlib.crc32(meta, zlib.crc32(kind)))
        return HEADER.pack(kind, len(meta), len(self.payload), crc) + meta + self.payload


@dataclass(frozen=True)
class Entry:
    start: Ptr
    end: Ptr
    record: Record


def _frame_len(buf: bytes, at: int) -> int | None:
    """The length of the record at ``at`` from its header, or None when the header is not there."""
    if len(buf) - at < HEADER.size:
        return None
    _kind, meta_len, payload_len, _crc = HEADER.unpack_from(buf, at)
    if meta_len > MAX_META_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        return None
    return HEADER.size + meta_len + payload_len


def _decode(buf: bytes, at: int) -> tuple[Record, int] | None:
    """The record at ``at`` and its length, or None when it is incomplete or corrupt."""
    if len(buf) - at < HEADER.size:
        return None
    kind, meta_len, payload_len, crc = HEADER.unpack_from(buf, at)
    if kind not in KIND_NAMES or meta_len > MAX_META_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        return None
    body = at + HEADER.size
    end = body + meta_len + payload_len
    if end > len(buf):
        return None
    meta, payload = buf[body : body + meta_len], buf[body + meta_len : end]
    if zlib.crc32(payload, zlib.crc32(meta, zlib.crc32(kind))) != crc:
        return None
    try:
        return Record(KIND_NAMES[kind], orjson.loads(meta), bytes(payload)), end - at
    except orjson.JSONDecodeError:
        return None


class Spool:
    def __init__(
        self,
        directory: str,
        *,
        max_bytes: int,
        full_policy: str = "drop_oldest",
        segment_max_bytes: int | None = None,
        fsync: bool = False,
        on_drop: Callable[[list[Record], str], None] = lambda records, reason: None,
        before_delete: Callable[[], None] = lambda: None,
    ) -> None:
        if full_policy not in FULL_POLICIES:
            raise ValueError(f"full_policy: expected one of {', '.join(FULL_POLICIES)}, got {full_policy!r}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.full_policy = full_policy
        self.segment_max_bytes = segment_max_bytes or max(64 * 1024, min(4 * 1024 * 1024, max_bytes // 8))
        self.fsync = fsync
        self.on_drop = on_drop
        self.before_delete = before_delete
        self._sizes: dict[int, int] = {}  # segment number -> bytes
        self._fd: int | None = None  # the segment being written
        self.acked = Ptr(1, 0)
        self._inflight_end = Ptr(1, 0)  # records read for sending but not yet acked are not dropped

    # ---- opening -------------------------------------------------------------------------

    def open(self, acked: Ptr | None = None) -> None:
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.endswith(".seg") and name[:-4].isdigit():
                self._sizes[int(name[:-4])] = os.path.getsize(self._path(int(name[:-4])))
        acked = Ptr(*acked) if acked else None
        if acked is None or (self._sizes and acked.segment < min(self._sizes)):
            acked = Ptr(min(self._sizes), 0) if self._sizes else Ptr(1, 0)
        self.acked = acked
        for seg in [s for s in self._sizes if s < acked.segment]:
            self._unlink(seg)
        if self._sizes:
            self._repair(max(self._sizes))
        else:
            self._sizes[max(acked.segment, 1)] = 0
        last = max(self._sizes)
        self._fd = os.open(self._path(last), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if self.acked > self.end:  # a state from elsewhere, or segments deleted by hand
            logger.warning("spool acknowledged up to %s, past its end %s; starting from its end", tuple(self.acked), tuple(self.end))
            self.acked = self.end
        self._inflight_end = self.acked

    def _repair(self, seg: int) -> None:
        """Cut a torn last record off the last segment."""
        with open(self._path(seg), "rb") as f:
            buf = f.read()
        at = 0
        while at < len(buf):
            decoded = _decode(buf, at)
            if decoded is None:
                logger.warning("spool segment %d: cutting %d bytes of a torn record at offset %d", seg, len(buf) - at, at)
                os.truncate(self._path(seg), at)
                break
            at += decoded[1]
        self._sizes[seg] = at

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- state -------------------------------------------------------------------------

    @property
    def end(self) -> Ptr:
        last = max(self._sizes)
        return Ptr(last, self._sizes[last])

    @property
    def unacked_bytes(self) -> int:
        total = 0
        for seg, size in self._sizes.items():
            if seg > self.acked.segment:
                total += size
            elif seg == self.acked.segment:
                total += max(0, size - self.acked.offset)
        return total

    @property
    def empty(self) -> bool:
        return self.acked >= self.end

    def _path(self, seg: int) -> str:
        return os.path.join(self.directory, f"{seg:012d}.seg")

    # ---- writing -------------------------------------------------------------------------

    def append(self, records: list[Record]) -> Ptr:
        """Write records after everything else; the full policy applies first. Returns the new end."""
        if not records:
            return self.end
        data = b"".join(r.encode() for r in records)
        if len(data) > self.max_bytes:
            self.on_drop(records, "spool_full")
            return self.end
        while self.unacked_bytes + len(data) > self.max_bytes:
            if self.full_policy == "drop_newest" or not self._drop_oldest_segment():
                self.on_drop(records, "spool_full")
                return self.end
        if self._sizes[max(self._sizes)] and self._sizes[max(self._sizes)] + len(data) > self.segment_max_bytes:
            self._rotate()
        assert self._fd is not None
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:])
        if self.fsync:
            os.fsync(self._fd)
        self._sizes[max(self._sizes)] += len(data)
        return self.end

    def _rotate(self) -> None:
        nxt = max(self._sizes) + 1
        fd = os.open(self._path(nxt), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if self._fd is not None:
            if self.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
        self._fd = fd
        self._sizes[nxt] = 0
        if self.fsync:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _drop_oldest_segment(self) -> bool:
        """Delete the oldest unacknowledged segment; False when nothing can be dropped."""
        if len(self._sizes) == 1:
            if not self.unacked_bytes:
                return False
            self._rotate()
        oldest = min(self._sizes)
        start = max(self.acked, self._inflight_end, Ptr(oldest, 0))
        dropped = [e.record for e in self._segment_entries(oldest, start.offset)] if start.segment == oldest else []
        self.before_delete()
        self._unlink(oldest)
        if self.acked.segment <= oldest:
            self.acked = Ptr(min(self._sizes), 0)
        if dropped:
            self.on_drop(dropped, "spool_full")
        return True

    def _unlink(self, seg: int) -> None:
        try:
            os.unlink(self._path(seg))
        except FileNotFoundError:
            pass
        self._sizes.pop(seg, None)

    # ---- reading and acknowledging ----------------------------------------------------------

    def _scan(self, seg: int, offset: int, max_bytes: int) -> list[Entry]:
        """Records of one segment from ``offset``: at least one, then up to about ``max_bytes``."""
        size = self._sizes.get(seg, 0)
        if offset >= size:
            return []
        try:
            fd = os.open(self._path(seg), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        try:
            buf = os.pread(fd, min(size - offset, max(max_bytes, READ_CHUNK_BYTES)), offset)
            at = 0
            while offset + at < size and (not out or at < max_bytes):
                if len(buf) - at < HEADER.size:  # the chunk ended inside a header
                    buf = buf[at:] + os.pread(fd, READ_CHUNK_BYTES, offset + len(buf))
                    offset, at = offset + at, 0
                need = _frame_len(buf, at)
                if need is not None and at + need > len(buf):  # a record longer than what was read
                    buf = buf[at:] + os.pread(fd, at + need - len(buf), offset + len(buf))
                    offset, at = offset + at, 0
                decoded = _decode(buf, at)
                if decoded is None:  # cannot happen after _repair unless the disk corrupted it
                    logger.error("spool segment %d: unreadable record at offset %d; skipping the rest", seg, offset + at)
                    break
                record, n = decoded
                out.append(Entry(Ptr(seg, offset + at), Ptr(seg, offset + at + n), record))
                at += n
        finally:
            os.close(fd)
        return out

    def _segment_entries(self, seg: int, offset: int) -> Iterator[Entry]:
        while True:
            chunk = self._scan(seg, offset, READ_CHUNK_BYTES)
            if not chunk:
                return
            yield from chunk
            offset = chunk[-1].end.offset

    def entries(self, start: Ptr) -> Iterator[Entry]:
        """Every record from ``start`` on (a start in a deleted segment moves to the next one)."""
        for seg in sorted(s for s in self._sizes if s >= start.segment):
            yield from self._segment_entries(seg, start.offset if seg == start.segment else 0)

    def read(self, start: Ptr, max_bytes: int) -> list[Entry]:
        """Records from ``start``, at least one, up to about ``max_bytes``; marks them in flight."""
        out: list[Entry] = []
        size = 0
        for seg in sorted(s for s in self._sizes if s >= start.segment):
            offset = start.offset if seg == start.segment else 0
            for entry in self._scan(seg, offset, max_bytes - size):
                n = entry.end.offset - entry.start.offset
                if out and size + n > max_bytes:
                    break
                out.append(entry)
                size += n
            if size >= max_bytes:
                break
        if out:
            self._inflight_end = max(self._inflight_end, out[-1].end)
        return out

    def ack(self, upto: Ptr) -> None:
        if upto > self.acked:
            self.acked = Ptr(*upto)
        if self._sizes and self.acked < Ptr(min(self._sizes), 0):
            self.acked = Ptr(min(self._sizes), 0)

    def releasable(self) -> bool:
        """Are there segments that are wholly acknowledged (and not being written)?"""
        last = max(self._sizes)
        return any(s < self.acked.segment or (s == self.acked.segment and self.acked.offset >= size and s != last) for s, size in self._sizes.items())

    def release(self) -> None:
        """Delete wholly acknowledged segments. Call after saving what their records recorded."""
        last = max(self._sizes)
        for seg, size in list(self._sizes.items()):
            if seg != last and (seg < self.acked.segment or (seg == self.acked.segment and self.acked.offset >= size)):
                self._unlink(seg)
        if self.acked.segment not in self._sizes:
            self.acked = Ptr(min(s for s in self._sizes if s > self.acked.segment), 0)
