"""The most recent lines of each (instance, source), in memory, so that "last N lines" never scans.

A scan of the logs table for one stream's tail costs ~250 ms at 10 M interleaved rows and DuckDB's
ART index does not serve ``ORDER BY ... LIMIT`` (MEASUREMENTS.md), so the server keeps what the old
manager's ring buffer kept, but only as a cache: the database stays the record.

An entry is filled either from the start (the stream did not exist when it was first written in
this process) or lazily from the database on the first read, with the lines that read asks for (a
longer tail later loads again: ``begin_load`` claims an entry too short for it); while a load runs, the writer's
commits for that key are parked in ``pending`` and merged when the load finishes, so no committed
line is missed. Lines are ordered by (run_id, seq). The writer thread writes; request handlers read.

Sized in lines per stream, in streams, and in bytes over all streams (``max_bytes``, a share of the
memory budget): past it, the least recently used streams leave first, and a single stream bigger
than the whole share keeps only its newest lines.
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

TailKey = tuple[str, str]  # (instance_id, source)
TailRow = tuple[str, int, int, str]  # (run_id, seq, ts_us, line)


_LINE = operator.itemgetter(3)
# A row's tuple (with the collector's header), its two ints, the line's string header rounded up by pymalloc and the
# list's pointer, beyond the text: 190 B measured with tracemalloc (tests/test_bounds.py); 160 counted a 64 MiB
# share as ~70 MiB held.
ROW_OVERHEAD_BYTES = 200


def row_bytes(row: TailRow) -> int:
    return ROW_OVERHEAD_BYTES + len(row[3])


def rows_bytes(rows: list[TailRow]) -> int:
    return ROW_OVERHEAD_BYTES * len(rows) + sum(map(len, map(_LINE, rows)))  # C-level loops: ~1% of ingest


@dataclass
class _Entry:
    rows: list[TailRow] = field(default_factory=list)
    complete: bool = True  # rows hold every stored line of the stream (never trimmed)
    pending: list[TailRow] | None = None  # not None while a load from the database runs
    nbytes: int = 0  # row_bytes of rows


class TailCache:
    def __init__(self, capacity_lines: int, max_streams: int, max_bytes: int = 0) -> None:
        self.capacity = capacity_lines
        self.max_streams = max_streams
        self.max_bytes = max_bytes  # 0: no limit in bytes
        self.nbytes = 0  # held by every entry's rows
        self._lock = threading.Lock()
        self._entries: OrderedDict[TailKey, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0 and self.max_streams > 0

    # -- writer side ---------------------------------------------------------------------------
    def on_commit(self, key: TailKey, rows: list[TailRow], new_stream: bool, trimmed: bool = False) -> None:
        """Called by the writer after a commit with that commit's rows of ``key``.

        ``new_stream``: the database held no line of this (instance, source) before the commit, so
        an entry started now holds the stream's whole history. ``trimmed``: the commit held more
        lines than ``rows`` (the writer passes only those that can be among the newest ``capacity``).
        """
        if not self.enabled:
            return
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if not new_stream:
                    return
                entry = self._entries[key] = _Entry()
            if entry.pending is not None:
                entry.pending.extend(rows)
            else:
                self._merge(entry, rows)
            if trimmed:
                entry.complete = False
            self._evict()

    def _merge(self, entry: _Entry, rows: list[TailRow]) -> None:
        """Merge sorted ``rows`` into the entry and keep the newest ``capacity``."""
        current = entry.rows
        if not rows:
            return
        before = entry.nbytes
        if not current or rows[0][:2] > current[-1][:2]:  # the usual case: newer than all held
            if len(rows) > self.capacity:
                entry.complete = False
            kept = rows[-self.capacity:]
            current.extend(kept)
            entry.nbytes += rows_bytes(kept)
            rows = []
        for row in rows:
            if not current or row[:2] > current[-1][:2]:
                current.append(row)
            else:
                bisect.insort(current, row)
            entry.nbytes += row_bytes(row)
        excess = len(current) - self.capacity
        if excess > 0:
            entry.nbytes -= rows_bytes(current[:excess])
            del current[:excess]
            entry.complete = False
        self.nbytes += entry.nbytes - before

    def _evict(self) -> None:
        while len(self._entries) > self.max_streams or (self.max_bytes and self.nbytes > self.max_bytes and len(self._entries) > 1):
            _key, entry = self._entries.popitem(last=False)
            self.nbytes -= entry.nbytes
        if self.max_bytes and self.nbytes > self.max_bytes and self._entries:  # one stream over the whole share
            entry = next(iter(self._entries.values()))
            while entry.rows and self.nbytes > self.max_bytes:
                cost = row_bytes(entry.rows.pop(0))
                entry.nbytes -= cost
                self.nbytes -= cost
                entry.complete = False

    # -- reader side ---------------------------------------------------------------------------
    def tail(self, key: TailKey, n: int, *, count: bool = True) -> list[TailRow] | None:
        """The last ``n`` lines, oldest first, or None when the cache cannot answer.

        ``count``: whether this read counts as a hit or a miss (not for the read right after a load).
        """
        if not self.enabled:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.pending is not None or (len(entry.rows) < n and not entry.complete):
                self.misses += count
                return None
            self._entries.move_to_end(key)
            self.hits += count
            return entry.rows[-n:] if n else []

    def begin_load(self, key: TailKey, n: int | None = None) -> bool:
        """Claim the load of ``key``'s newest ``n`` lines; False when they are cached or another reader
        loads it. An entry with fewer (not complete) is claimed again: its lines stay until the load
        replaces them, commits meanwhile are parked as for a new entry."""
        if not self.enabled:
            return False
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                if entry.pending is not None or entry.complete or len(entry.rows) >= (n or 0):
                    return False
                entry.pending = []
                return True
            self._entries[key] = _Entry(pending=[])
            self._evict()
            return key in self._entries

    def finish_load(self, key: TailKey, rows: list[TailRow], complete: bool) -> None:
        """Install the rows a reader read from the database (the newest ``capacity`` of them)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.pending is None:
                return
            loaded = {row[:2]: row for row in rows}
            for row in entry.pending:
                loaded[row[:2]] = row
            self.nbytes -= entry.nbytes
            entry.rows = []
            entry.nbytes = 0
            entry.complete = complete
            entry.pending = None
            self._merge(entry, sorted(loaded.values()))
            self._evict()

    def abort_load(self, key: TailKey) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.pending is not None:
                del self._entries[key]
                self.nbytes -= entry.nbytes

    def forget(self, instance_id: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == instance_id]:
                self.nbytes -= self._entries.pop(key).nbytes

    def stream_count(self) -> int:
        return len(self._entries)
