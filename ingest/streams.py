"""Which seqs of every log stream are stored: the writer's dedupe index and the source of gaps.

A stream is (instance_id, source, run_id). Its stored seqs are kept as sorted, disjoint, inclusive
ranges; an agent numbers lines 0, 1, 2, ... so a healthy stream is a single range. The index is
rebuilt from the ``logs`` table at start-up and updated by the writer only
after a commit, so it always describes committed rows. The writer is its only mutator; readers take
snapshots under the lock.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

StreamKey = tuple[str, str, str]  # (instance_id, source, run_id)

# Start-up in two steps. Seqs are unique per stream (the writer dedupes), so a stream whose count
# equals max - min + 1 is one range: one hash aggregate answers every healthy stream (0.24 s at 10 M
# rows against 4.1 s for gaps-and-islands over the whole table). Only streams with holes pay for
# gaps and islands (consecutive seqs share seq - row_number()).
SPANS_SQL = """
SELECT instance_id, source, run_id, min(seq) AS lo, max(seq) AS hi, count(*) AS n
FROM logs GROUP BY instance_id, source, run_id
"""
ISLANDS_SQL = """
SELECT instance_id, source, run_id, min(seq) AS lo, max(seq) AS hi
FROM (
    SELECT l.instance_id, l.source, l.run_id, l.seq,
           l.seq - row_number() OVER (PARTITION BY l.instance_id, l.source, l.run_id ORDER BY l.seq) AS island
    FROM logs l
    SEMI JOIN (SELECT unnest($keys::STRUCT(i VARCHAR, s VARCHAR, r VARCHAR)[], recursive := true)) k
        ON l.instance_id = k.i AND l.source = k.s AND l.run_id = k.r
)
GROUP BY instance_id, source, run_id, island
ORDER BY instance_id, source, run_id, lo
"""


class SeqRanges:
    """Sorted disjoint inclusive ranges of integers, stored as two parallel lists."""

    __slots__ = ("los", "his", "count")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []
        self.count = 0

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self.los, seq) - 1
        return i >= 0 and seq <= self.his[i]

    def overlaps(self, lo: int, hi: int) -> bool:
        """True when any stored seq lies in [lo, hi]."""
        i = bisect.bisect_right(self.los, hi) - 1
        return i >= 0 and self.his[i] >= lo

    def add_range(self, lo: int, hi: int) -> None:
        """Add [lo, hi]; it must not overlap what is stored (the writer checked)."""
        i = bisect.bisect_left(self.los, lo)
        self.count += hi - lo + 1
        merge_left = i > 0 and self.his[i - 1] == lo - 1
        merge_right = i < len(self.los) and self.los[i] == hi + 1
        if merge_left and merge_right:
            self.his[i - 1] = self.his[i]
            del self.los[i], self.his[i]
        elif merge_left:
            self.his[i - 1] = hi
        elif merge_right:
            self.los[i] = lo
        else:
            self.los.insert(i, lo)
            self.his.insert(i, hi)

    @property
    def last(self) -> int | None:
        return self.his[-1] if self.his else None

    def gaps(self) -> list[tuple[int, int]]:
        """Missing ranges between 0 and the last stored seq."""
        out = []
        expected = 0
        for lo, hi in zip(self.los, self.his):
            if lo > expected:
                out.append((expected, lo - 1))
            expected = hi + 1
        return out


def runs_of(seqs: list[int]) -> list[tuple[int, int]]:
    """Collapse sorted distinct seqs into inclusive ranges."""
    if not seqs:
        return []
    if seqs[-1] - seqs[0] + 1 == len(seqs):  # contiguous: the usual case
        return [(seqs[0], seqs[-1])]
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


@dataclass(frozen=True)
class StreamSummary:
    source: str
    run_id: str
    lines: int
    last_seq: int | None
    gaps: list[tuple[int, int]]


class StreamIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[StreamKey, SeqRanges] = {}
        self._by_instance: dict[str, set[StreamKey]] = {}

    def load(self, cursor) -> None:
        """Rebuild from the logs table (called before the writer starts)."""
        holed = []
        for instance_id, source, run_id, lo, hi, n in cursor.execute(SPANS_SQL).fetchall():
            if hi - lo + 1 == n:
                self._ranges((instance_id, source, run_id)).add_range(lo, hi)
            else:
                holed.append({"i": instance_id, "s": source, "r": run_id})
        if holed:
            for instance_id, source, run_id, lo, hi in cursor.execute(ISLANDS_SQL, {"keys": holed}).fetchall():
                self._ranges((instance_id, source, run_id)).add_range(lo, hi)

    def _ranges(self, key: StreamKey) -> SeqRanges:
        ranges = self._streams.get(key)
        if ranges is None:
            ranges = self._streams[key] = SeqRanges()
            self._by_instance.setdefault(key[0], set()).add(key)
        return ranges

    def has_source(self, instance_id: str, source: str) -> bool:
        """Whether any run of (instance_id, source) has stored lines."""
        return any(k[1] == source for k in self._by_instance.get(instance_id, ()))

    def next_seq(self, key: StreamKey) -> int:
        """The seq after the last stored one (for senders that do not number their lines)."""
        ranges = self._streams.get(key)
        return 0 if ranges is None or ranges.last is None else ranges.last + 1

    def is_stored(self, key: StreamKey, seq: int) -> bool:
        ranges = self._streams.get(key)
        return ranges is not None and seq in ranges

    def overlaps(self, key: StreamKey, lo: int, hi: int) -> bool:
        ranges = self._streams.get(key)
        return ranges is not None and ranges.overlaps(lo, hi)

    def commit(self, key: StreamKey, sorted_seqs: list[int]) -> None:
        """Record seqs that are now committed (sorted, distinct, none stored before)."""
        with self._lock:
            ranges = self._ranges(key)
            for lo, hi in runs_of(sorted_seqs):
                ranges.add_range(lo, hi)

    def tail_floor(self, instance_id: str, source: str, n: int) -> tuple[str, int, bool] | None:
        """(run_id, seq, complete): the newest ``n`` stored lines of (instance_id, source), in (run_id,
        seq) order, are that run's lines from that seq on, and ``complete`` says whether they are all of
        the source's lines; None when no line is stored or the newest ``n`` span runs. The tail
        cache's load then reads only ``run_id = ? AND seq >= ?``, which DuckDB's zone maps prune to
        the few row groups written since that seq (all streams advance together)."""
        with self._lock:
            runs = [k for k in self._by_instance.get(instance_id, ()) if k[1] == source]
            if not runs:
                return None
            key = max(runs, key=lambda k: k[2])
            ranges = self._streams[key]
            complete = sum(self._streams[k].count for k in runs) <= n
            if ranges.count < n:
                return (key[2], ranges.los[0], True) if len(runs) == 1 and ranges.los else None
            left = n
            for lo, hi in zip(reversed(ranges.los), reversed(ranges.his)):
                if hi - lo + 1 >= left:
                    return key[2], hi - left + 1, complete
                left -= hi - lo + 1
            return None

    def summaries(self, instance_id: str) -> list[StreamSummary]:
        with self._lock:
            keys = sorted(self._by_instance.get(instance_id, ()))
            return [
                StreamSummary(k[1], k[2], r.count, r.last, r.gaps())
                for k in keys
                for r in (self._streams[k],)
            ]

    def forget(self, instance_id: str) -> None:
        """The instance's logs were deleted (retention)."""
        with self._lock:
            for key in self._by_instance.pop(instance_id, ()):
                del self._streams[key]

    def adopt(self, other: "StreamIndex", instance_ids: set[str]) -> None:
        """Replace what is known of ``instance_ids`` by ``other``'s (lake mode: a slot taken over
        from another node, its ranges read from the lake)."""
        with self._lock:
            for instance_id in instance_ids:
                for key in self._by_instance.pop(instance_id, ()):
                    del self._streams[key]
                for key in other._by_instance.get(instance_id, ()):
                    self._streams[key] = other._streams[key]
                    self._by_instance.setdefault(instance_id, set()).add(key)

    def instances(self) -> list[str]:
        with self._lock:
            return list(self._by_instance)

    def stream_count(self) -> int:
        return len(self._streams)
