"""The tail load's commit-time window (StreamIndex marks + ``reads.load_tail``) never loses a line.

The window is what lets the load skip row groups; a window one microsecond too narrow would silently
drop lines from a tail. These tests attack it with commits whose clock steps back, restarts, the
start-up narrowing, folded marks, and loads racing commits.
"""

from __future__ import annotations

import asyncio
import logging
from unittest import mock

import duckdb
import pytest
from hypothesis import given, settings, strategies as st

from ingest.db import reads, seqindex as streams
from ingest.db.seqindex import StreamIndex, TailBounds
from tests.test_read_api import get_json, push_lines

INSTANCE, SOURCE = "C.32733029", "benchout"

commits = st.tuples(
    st.sampled_from(["0", "1"]),  # run
    st.lists(st.integers(0, 120), min_size=1, max_size=25),  # seqs (resends and backfills included)
    st.integers(1_000_000, 1_000_400),  # received_us: the clock may step back between commits
    st.integers(0, 4),  # the commit's rows stamped received_us to received_us + this (its blocks stamped apart)
)
ops = st.lists(st.one_of(commits, st.just("restart"), st.just("refine")), max_size=30)


def _table() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("""CREATE TABLE logs (instance_id VARCHAR, source VARCHAR, run_id VARCHAR, seq BIGINT, ts TIMESTAMP,
                   received_at TIMESTAMP, line VARCHAR)""")
    return con


@given(ops, st.integers(1, 40), st.integers(1, 8), st.integers(1, 60))
@settings(max_examples=150, deadline=None)
def test_window_holds_every_newest_line_whatever_the_commits(steps, n, bucket, span):
    with mock.patch.object(streams, "MARK_BUCKET_SEQS", bucket), mock.patch.object(streams, "MARK_SPAN_SEQS", span):
        con, index, stored = _table(), StreamIndex(), {}
        for step in steps:
            if step == "restart":
                index = StreamIndex()
                index.load(con)
            elif step == "refine":
                index.refine(con.cursor(), n)
            else:
                run_id, seqs, received_us, spread = step
                new = sorted({s for s in seqs if (run_id, s) not in stored})
                for s in new:
                    stored[(run_id, s)] = received_us + s % (spread + 1)
                    con.execute("INSERT INTO logs VALUES (?, ?, ?, ?, make_timestamp(?), make_timestamp(?), ?)",
                                [INSTANCE, SOURCE, run_id, s, s, stored[(run_id, s)], f"line {run_id}/{s}"])
                index.commit((INSTANCE, SOURCE, run_id), new, received_us, received_us + spread)
            bounds = index.tail_bounds(INSTANCE, SOURCE, n)
            newest = sorted(stored)[-n:]
            if bounds is None:
                assert not stored or len({r for r, _s in newest}) > 1
                continue
            inside = [(r, s) for r, s in sorted(stored) if r == bounds.run_id and bounds.first_seq <= s <= bounds.last_seq]
            assert inside == newest and bounds.lines == len(newest)
            assert all(bounds.since_us <= stored[key] <= bounds.until_us for key in inside)  # the window holds them
            rows, complete = reads.load_tail(con, 10, INSTANCE, SOURCE, n, bounds)
            assert [(r, s, line) for r, s, _ts, line in rows] == [(r, s, f"line {r}/{s}") for r, s in newest]
            assert complete == (len(stored) <= n)


def test_a_window_that_misses_lines_is_not_trusted(caplog):
    """Were the index ever wrong, the load reads without the window rather than answer short."""
    con = _table()
    for s in range(10):
        con.execute("INSERT INTO logs VALUES (?, ?, '0', ?, make_timestamp(0), make_timestamp(?), ?)",
                    [INSTANCE, SOURCE, s, 1000 + s, f"line {s}"])
    too_narrow = TailBounds("0", 5, 9, 5, False, since_us=1007, until_us=1009)
    with caplog.at_level(logging.WARNING, logger="ingest.db.reads"):
        rows, complete = reads.load_tail(con, 10, INSTANCE, SOURCE, 5, too_narrow)
    assert [r[1] for r in rows] == [5, 6, 7, 8, 9] and not complete
    assert "3 of 5 lines inside the commit window" in caplog.text


def test_one_load_tail_reads_by_the_floor_when_the_bounds_have_no_window():
    """The one load (``reads.load_tail``) takes the index's bounds whatever they hold: no window, the
    seq floor alone; no bounds, the newest lines by the plain read."""
    con = _table()
    for s in range(10):
        con.execute("INSERT INTO logs VALUES (?, ?, '0', ?, make_timestamp(0), make_timestamp(?), ?)",
                    [INSTANCE, SOURCE, s, 1000 + s, f"line {s}"])
    floor_only = TailBounds("0", 5, 9, 5, True, since_us=None, until_us=None)
    rows, complete = reads.load_tail(con, 10, INSTANCE, SOURCE, 5, floor_only)
    assert [r[1] for r in rows] == [5, 6, 7, 8, 9] and complete
    rows, complete = reads.load_tail(con, 10, INSTANCE, SOURCE, 4, None)
    assert [r[1] for r in rows] == [6, 7, 8, 9] and not complete


def test_marks_stay_bounded_and_the_window_tight_for_a_stream_of_many_small_commits():
    index = StreamIndex()
    for i in range(50_000):
        index.commit(("C.1", "s", "0"), [i], 1_000 + i)  # one line a commit, one microsecond apart
    ranges = index._streams[("C.1", "s", "0")]
    assert len(ranges.buckets) <= streams.MARK_SPAN_SEQS // streams.MARK_BUCKET_SEQS + 1
    bounds = index.tail_bounds("C.1", "s", 1000)
    assert bounds.first_seq == 49_000 and bounds.until_us == 50_999
    assert 50_000 - streams.MARK_BUCKET_SEQS <= bounds.since_us <= 50_000  # at most a bucket wider than needed


@pytest.mark.parametrize("restart", [False, True])
async def test_tail_loads_racing_commits_never_miss_a_line(make_client, restart):
    """Two streams share a one-stream cache, so every tail reloads from the database (through the
    window) while the writer commits lines of both: each tail must be a gapless run ending at a stored
    seq, as long as what was stored, and at the end equal to the table. With ``restart`` the lines
    before the race were stored by a previous process, and start-up's narrowing pass runs during it."""
    client = await make_client(tail_cache_lines=50, tail_cache_max_streams=1)
    for source in ("a", "b"):
        for start in range(0, 60, 20):  # several commits: several commit times
            await push_lines(client, 20, source=source, start=start)
    if restart:
        await client.close()
        client = await make_client(tail_cache_lines=50, tail_cache_max_streams=1)
    done = asyncio.Event()

    async def writes() -> None:
        for i in range(40):
            for source in ("a", "b"):
                await push_lines(client, 7, source=source, start=60 + 7 * i)
        done.set()

    async def tails() -> int:
        checked = 0
        while not done.is_set():
            for source in ("a", "b"):
                body = await get_json(client, f"/api/v1/instances/C.32733029/logs?source={source}&tail=50")
                seqs = [line["seq"] for line in body["lines"]]
                assert seqs == list(range(seqs[-1] - 49, seqs[-1] + 1)), seqs
                checked += 1
        return checked

    _, checked = await asyncio.gather(writes(), tails())
    assert checked > 10
    for source in ("a", "b"):
        cached = await get_json(client, f"/api/v1/instances/C.32733029/logs?source={source}&tail=50")
        from_db = await get_json(client, f"/api/v1/instances/C.32733029/logs?source={source}&tail=50&q=line")
        assert cached == from_db and cached["lines"][-1]["seq"] == 60 + 7 * 40 - 1


def test_folded_marks_still_cover_a_tail_longer_than_the_span():
    """Marks below MARK_SPAN_SEQS are folded into one; a cache bigger than the span still gets a window
    that holds its oldest lines."""
    with mock.patch.object(streams, "MARK_BUCKET_SEQS", 2), mock.patch.object(streams, "MARK_SPAN_SEQS", 5):
        index = StreamIndex()
        for s in range(21):
            index.commit(("C.1", "s", "0"), [s], 100 + s)
        for n in range(1, 22):
            bounds = index.tail_bounds("C.1", "s", n)
            assert bounds.since_us <= 100 + bounds.first_seq and bounds.until_us == 120, (n, bounds)



async def test_first_tail_after_a_restart_loads_the_lines_asked_for_not_the_whole_cache(make_client):
    """A first tail of 200 lines loads 200 (the row groups of 200 lines: at 2 M interleaved lines 200,000
    rows scanned against 674,000 for the cache's 1,000, ~5 ms against ~26 ms); a longer tail later loads
    again, and every answer is the newest lines."""
    from ingest.web import keys

    client = await make_client(tail_cache_lines=1000)
    for start in range(0, 3000, 500):
        await push_lines(client, 500, source=SOURCE, start=start)
    await client.close()
    client = await make_client(tail_cache_lines=1000)
    cache = client.server.app[keys.TAIL]
    body = await get_json(client, f"/api/v1/instances/{INSTANCE}/logs?source={SOURCE}&tail=200")
    assert [line["seq"] for line in body["lines"]] == list(range(2800, 3000))
    assert len(cache._entries[(INSTANCE, SOURCE)].rows) == 200
    await push_lines(client, 10, source=SOURCE, start=3000)
    for n in (1000, 1000, 150):
        body = await get_json(client, f"/api/v1/instances/{INSTANCE}/logs?source={SOURCE}&tail={n}")
        assert [line["seq"] for line in body["lines"]] == list(range(3010 - n, 3010)), n
    assert len(cache._entries[(INSTANCE, SOURCE)].rows) == 1000 and cache.hits >= 2


async def test_a_commit_of_several_blocks_keeps_its_tail_inside_the_window(make_client, caplog):
    """The token filter stamps each block's slice of a commit apart (received_us, +1, +2 ...): the index's window
    must end at the commit's last stamp, or a tail of those lines is read short and then again without it."""
    from ingest.web import keys

    client = await make_client(tail_cache_lines=50, tail_cache_max_streams=1)
    await push_lines(client, 2000, source="a", start=0)
    await push_lines(client, 2000, source="a", start=2000)  # continues the open block, then a new one: two stamps
    await push_lines(client, 5, source="b", start=0)  # the one-stream cache drops "a": its next tail reads the file
    cur = client.server.app[keys.DB].cursor()
    try:
        (stamps,) = cur.execute("SELECT count(DISTINCT received_at) FROM logs WHERE source = 'a'").fetchone()
    finally:
        cur.close()
    assert stamps >= 3, stamps
    with caplog.at_level(logging.WARNING, logger="ingest.db.reads"):
        body = await get_json(client, f"/api/v1/instances/{INSTANCE}/logs?source=a&tail=50")
    assert [line["seq"] for line in body["lines"]] == list(range(3950, 4000))
    assert "inside the commit window" not in caplog.text
