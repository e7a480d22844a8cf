"""Promises of the fast write path: what it skips must not show (the instances row, the tail cache,
server-numbered lines)."""

from __future__ import annotations

import asyncio
import random
import time

import duckdb

from tests.test_push_api import db_rows, post


async def _tail(client, instance, source, n, *, from_db=False):
    q = "&q=line" if from_db else ""
    r = await client.get(f"/api/v1/instances/{instance}/logs?source={source}&tail={n}{q}")
    assert r.status == 200, await r.text()
    return (await r.json())["lines"]


async def test_instance_row_exists_at_the_first_ack_and_last_seen_follows_within_seconds(client):
    doc = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": 0, "line": "line 0"}]}
    assert (await post(client, "/api/v1/logs", doc)).status == 200
    [(first_seen, last_seen)] = db_rows(client, "SELECT first_seen, last_seen FROM instances WHERE instance_id = 'C.1'")
    deadline = time.monotonic() + 30
    seq = 1
    while True:  # pushes keep coming: last_seen must move (once a second at most, so within a few)
        doc["lines"] = [{"seq": seq, "line": f"line {seq}"}]
        assert (await post(client, "/api/v1/logs", doc)).status == 200
        seq += 1
        [(now_first, now_last)] = db_rows(client, "SELECT first_seen, last_seen FROM instances WHERE instance_id = 'C.1'")
        if now_last > last_seen:
            break
        assert time.monotonic() < deadline, "last_seen never moved"
        await asyncio.sleep(0.05)
    assert now_first == first_seen


async def test_tail_of_a_body_bigger_than_the_cache_matches_the_table(make_client):
    """The writer hands the cache only the newest lines of a big body; ascending or shuffled, the
    cached tail is the table's."""
    client = await make_client(tail_cache_lines=100)
    ascending = [{"seq": i, "line": f"line a{i}"} for i in range(2500)]
    shuffled = [{"seq": i, "line": f"line b{i}"} for i in range(2500)]
    random.Random(3).shuffle(shuffled)
    for source, body in (("asc", ascending), ("shuf", shuffled)):
        assert (await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": source, "lines": body})).status == 200
        more = [{"seq": 2500 + i, "line": f"line c{i}"} for i in range(30)]
        assert (await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": source, "lines": more})).status == 200
        cached = await _tail(client, "C.1", source, 100)
        assert cached == await _tail(client, "C.1", source, 100, from_db=True)
        assert [line["seq"] for line in cached] == list(range(2430, 2530))


async def test_server_numbered_lines_get_their_seqs_in_the_table(client):
    for _ in range(2):
        r = await client.post("/api/log-push", data=b"line one\nline two\nline three\n",
                              headers={"X-Instance-Id": "C.1", "X-Log-Source": "old"})
        assert r.status == 200, await r.text()
    rows = db_rows(client, "SELECT seq, line FROM logs WHERE source = 'old' ORDER BY seq")
    assert rows == [(i, t) for i, t in enumerate(["line one", "line two", "line three"] * 2)]


async def test_received_at_is_the_commit_time_and_ts_the_pushed_one(client):
    before = time.time()
    doc = {"instance_id": "C.1", "source": "benchout",
           "lines": [{"seq": 0, "ts": 1764415248.123456, "line": "a"}, {"seq": 1, "ts": "2026-11-29T11:20:00Z", "line": "b"}]}
    assert (await post(client, "/api/v1/logs", doc)).status == 200
    rows = db_rows(client, "SELECT epoch_us(ts), epoch_us(received_at) FROM logs ORDER BY seq")
    assert [ts for ts, _ in rows] == [int(1764415248.123456 * 1_000_000), 1795951200_000000]
    assert all(before - 1 <= received / 1e6 <= time.time() + 1 for _, received in rows)


async def test_duckdb_threads_are_one_on_a_small_host_and_one_per_core_on_a_big_one(make_client, tmp_path, monkeypatch):
    """With more than one DuckDB thread the statement's own thread spins while a worker works: on a
    small host that costs more than parallel scans gain, on a big one queries scan on every core."""
    import os

    from ingest.db import store

    cores = len(os.sched_getaffinity(0))
    client = await make_client()
    expected = 1 if cores <= store.SMALL_HOST_CORES else cores
    assert db_rows(client, "SELECT current_setting('threads')") == [(expected,)]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert store.auto_threads() == 16
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert store.auto_threads() == 1
    monkeypatch.undo()
    other = await make_client(duckdb_threads=3, db=str(tmp_path / "other.duckdb"))
    assert db_rows(other, "SELECT current_setting('threads')") == [(3,)]


async def test_groups_with_and_without_the_instances_upsert_both_store_every_line(client):
    """Groups of pushes from known instances (no instances upsert) and groups that must write an
    instance's row both commit every line once, pushed together and apart."""
    pushes = [post(client, "/api/v1/logs", {"instance_id": f"C.{i % 3}", "source": "s",
                                            "lines": [{"seq": i * 10 + k, "line": f"l{i} {k}"} for k in range(10)]})
              for i in range(30)]
    for r in await asyncio.gather(*pushes):
        assert r.status == 200, await r.text()
    again = await post(client, "/api/v1/logs", {"instance_id": "C.0", "source": "s", "lines": [{"seq": 0, "line": "l0 0"}]})
    assert (await again.json())["duplicates"] == 1
    assert db_rows(client, "SELECT count(*), count(DISTINCT (instance_id, seq)) FROM logs") == [(300, 300)]
    assert db_rows(client, "SELECT count(*) FROM instances WHERE instance_id IN ('C.0', 'C.1', 'C.2')") == [(3,)]


def test_log_text_is_stored_with_zstd(tmp_path):
    """Migration 009 puts the line column in zstd (0.38x the raw text against 0.65x for DuckDB's
    default strings, bench/storage_bytes.py). DuckDB 1.5.5 applies zstd to strings only in files of
    storage version v1.2.0 or later; a file created with its default version silently keeps the
    column uncompressed (1.09x the raw text)."""
    from ingest.db import store

    con = store.open_database(tmp_path / "z.duckdb")
    try:
        con.execute("INSERT INTO logs SELECT 'C.1', 's', 'r', i, now(), now(), "
                    "'worker ' || i || ' proof ' || md5(i::VARCHAR) || ' done', false FROM range(200000) t(i)")
        con.execute("CHECKPOINT")
        compressions = {c for (c,) in con.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('logs') WHERE column_name = 'line' AND segment_type = 'VARCHAR'"
        ).fetchall()}
    finally:
        con.close()
    assert compressions == {"ZSTD"}
