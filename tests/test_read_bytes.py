"""An instance's log lines are read in bytes, not only lines: ``tail=10000`` of 256 KiB lines (each
pushed by the instance's own token) was a 2.5 GB answer on the page's read threads, and DuckDB running
out of its memory_limit under such reads was a 500.

Attacked on a server with tokens on: 400 lines of 256 KiB pushed with an instance's token, then 4
concurrent ``GET .../logs?source=fat&tail=400`` with the read token: 3 answered 500 (DuckDB's Out of
Memory Error, untranslated), peak RSS 518 -> 1,292 MiB (the memory budget is 512 MiB).
"""

from __future__ import annotations

import asyncio
import io
import random
import string

import duckdb
import orjson
import pytest

from ingest.db import reads
from ingest.errors import StorageUnavailable

LINE_BYTES = 100_000


def fat(seq: int) -> str:
    rng = random.Random(seq)
    return f"{seq} " + "".join(rng.choices(string.ascii_letters, k=LINE_BYTES))


async def push_fat(client, n: int, per_push: int = 50) -> None:
    for start in range(0, n, per_push):
        body = {"instance_id": "C.fat", "source": "fat",
                "lines": [{"seq": i, "ts": 1795951000 + i, "line": fat(i)} for i in range(start, min(n, start + per_push))]}
        r = await client.post("/api/v1/logs", data=io.BytesIO(orjson.dumps(body)))
        assert r.status == 200, await r.text()


async def lines(client, expect: int = 200, **params) -> list[dict]:
    r = await client.get("/api/v1/instances/C.fat/logs", params={"source": "fat", **params})
    doc = await r.json()
    assert r.status == expect, doc
    return doc.get("lines", doc)


async def test_a_tail_of_fat_lines_stops_at_the_answer_byte_cap_newest_kept(client, monkeypatch):
    monkeypatch.setattr(reads, "MAX_LINES_ANSWER_BYTES", 10 * LINE_BYTES + 500, raising=False)
    await push_fat(client, 20)
    tail = await lines(client, tail="20", before_seq="1000")  # past the tail cache
    assert [line["seq"] for line in tail] == list(range(10, 20))
    forward = await lines(client, tail="20", after_seq="-1")  # following: the next poll goes on from seq 9
    assert [line["seq"] for line in forward] == list(range(0, 10))
    thin = await lines(client, tail="1", before_seq="1000")
    assert [line["seq"] for line in thin] == [19]


async def test_a_line_over_the_cap_alone_is_still_sent(client, monkeypatch):
    monkeypatch.setattr(reads, "MAX_LINES_ANSWER_BYTES", LINE_BYTES // 2, raising=False)
    await push_fat(client, 3)
    assert [line["seq"] for line in await lines(client, tail="3", before_seq="1000")] == [2]


def test_a_read_past_duckdb_memory_limit_is_503_with_retry_after_not_500(tmp_path):
    """DuckDB's Out of Memory Error under a read (here one that cannot fit 16 MiB, on a real file) was
    left untranslated: 500. It is the server out of memory for now: 503 with Retry-After."""
    con = duckdb.connect(str(tmp_path / "oom.duckdb"), config={"memory_limit": "16MB", "temp_directory": ""})
    try:
        with pytest.raises(StorageUnavailable) as refused:
            with reads.deadline_cursor(con, 30) as cur:
                cur.execute("SELECT list(repeat('x', 1000000)) FROM range(200)").fetchall()
        assert refused.value.status == 503 and refused.value.headers["Retry-After"]
        assert "duckdb_memory_limit_mb" in refused.value.message
    finally:
        con.close()


async def test_fat_pushes_past_duckdb_memory_limit_are_503_never_500(make_client):
    """An instance's own token pushing 100 KB lines at a small duckdb_memory_limit_mb: DuckDB's commit
    failed with 'failed to pin block' (a TransactionException, not an OutOfMemoryException), answered
    500. Out of DuckDB's memory is 503 with Retry-After, and the server takes pushes again after."""
    client = await make_client(duckdb_memory_limit_mb=16)
    statuses = []
    for start in range(0, 400, 20):
        body = {"instance_id": "C.fat", "source": "fat",
                "lines": [{"seq": i, "ts": 1795951000 + i, "line": fat(i)} for i in range(start, start + 20)]}
        r = await client.post("/api/v1/logs", data=io.BytesIO(orjson.dumps(body)))
        statuses.append(r.status)
        assert r.status in (200, 503), (r.status, await r.text())
        if r.status == 503:
            assert r.headers["Retry-After"]
    small = {"instance_id": "C.thin", "source": "s", "lines": [{"seq": 0, "line": "x"}]}
    deadline = asyncio.get_running_loop().time() + 60
    while (r := await client.post("/api/v1/logs", data=orjson.dumps(small))).status != 200:
        assert r.status == 503 and asyncio.get_running_loop().time() < deadline, (r.status, await r.text())
        await asyncio.sleep(0.5)
