"""The spool: records come back as written, in order, across segments, reopening and crashes."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.spool import Ptr, Record, Spool

records = st.builds(
    Record,
    kind=st.sampled_from(["logs", "event", "metrics"]),
    meta=st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20)), max_size=4),
    payload=st.binary(max_size=3000),
)


def spool_at(path, **kw) -> Spool:
    kw.setdefault("max_bytes", 1 << 30)
    spool = Spool(str(path), **kw)
    return spool


def read_all(spool: Spool, start: Ptr | None = None) -> list[Record]:
    return [e.record for e in spool.entries(start or spool.acked)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(records, min_size=1, max_size=5), max_size=12), st.integers(0, 12), st.integers(1, 5000))
def test_spool_round_trips_records_across_segments_and_reopening(tmp_path, groups, reopen_at, read_bytes):
    directory = tmp_path / f"spool-{os.urandom(4).hex()}"
    spool = spool_at(directory, segment_max_bytes=4096)
    spool.open()
    written = []
    for i, group in enumerate(groups):
        if i == reopen_at:
            spool.close()
            spool = spool_at(directory, segment_max_bytes=4096)
            spool.open(spool.acked)
        spool.append(group)
        written += group
    assert read_all(spool) == written
    got, at = [], spool.acked  # the shipper's way: bounded reads, then acknowledgements
    while batch := spool.read(at, read_bytes):
        got += [e.record for e in batch]
        at = batch[-1].end
        spool.ack(at)
        spool.release()
    assert got == written
    assert spool.empty and spool.unacked_bytes == 0
    spool.close()


def test_spool_cuts_a_record_torn_by_a_crash(tmp_path):
    spool = spool_at(tmp_path)
    spool.open()
    a, b = Record("logs", {"n": 1}, b'{"a":1}'), Record("event", {"kind": "bench_done"}, b'{"b":2}')
    spool.append([a])
    end = spool.append([b])
    spool.close()
    os.truncate(os.path.join(tmp_path, f"{end.segment:012d}.seg"), end.offset - 3)  # the write of b was cut short
    spool = spool_at(tmp_path)
    spool.open()
    assert read_all(spool) == [a]
    c = Record("logs", {"n": 2}, b'{"c":3}')
    spool.append([c])
    assert read_all(spool) == [a, c]
    spool.close()


def test_spool_resumes_after_what_was_acknowledged(tmp_path):
    spool = spool_at(tmp_path, segment_max_bytes=64 * 1024)
    spool.open()
    rs = [Record("logs", {"i": i}, b"x" * 20_000) for i in range(8)]
    spool.append(rs[:4])
    acked = spool.append(rs[4:6])
    spool.append(rs[6:])
    spool.ack(acked)
    spool.release()
    spool.close()
    spool = spool_at(tmp_path, segment_max_bytes=64 * 1024)
    spool.open(acked)
    assert read_all(spool) == rs[6:]
    spool.close()


def test_full_spool_drops_the_oldest_and_says_what(tmp_path):
    dropped: list[Record] = []
    deletes = []
    spool = spool_at(
        tmp_path, max_bytes=64 * 1024, segment_max_bytes=16 * 1024,
        on_drop=lambda rs, reason: dropped.extend(rs), before_delete=lambda: deletes.append(1),
    )
    spool.open()
    rs = [Record("logs", {"i": i}, b"y" * 1000) for i in range(200)]
    for r in rs:
        spool.append([r])
    kept = read_all(spool)
    assert dropped + kept == rs  # the oldest went, in order; nothing vanished uncounted
    assert dropped and spool.unacked_bytes <= 64 * 1024
    assert len(deletes) >= 1
    spool.close()


def test_full_spool_with_drop_newest_keeps_the_oldest(tmp_path):
    dropped: list[Record] = []
    spool = spool_at(tmp_path, max_bytes=64 * 1024, full_policy="drop_newest", on_drop=lambda rs, reason: dropped.extend(rs))
    spool.open()
    rs = [Record("logs", {"i": i}, b"z" * 1000) for i in range(200)]
    for r in rs:
        spool.append([r])
    kept = read_all(spool)
    assert kept + dropped == rs
    assert kept[0] == rs[0]
    spool.close()


def test_full_spool_does_not_drop_records_being_sent(tmp_path):
    dropped: list[Record] = []
    spool = spool_at(tmp_path, max_bytes=64 * 1024, segment_max_bytes=16 * 1024, on_drop=lambda rs, reason: dropped.extend(rs))
    spool.open()
    rs = [Record("logs", {"i": i}, b"w" * 1000) for i in range(60)]
    spool.append(rs[:10])
    in_flight = spool.read(spool.acked, 5000)
    for r in rs[10:]:
        spool.append([r])
    assert not set(map(id, (e.record for e in in_flight))) & set(map(id, dropped))
    assert all(r not in dropped for r in (e.record for e in in_flight))
    spool.close()
