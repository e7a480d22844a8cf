"""A full disk under the database: pushes are refused 503 with Retry-After, /readyz says not ready,
and once space returns the server reopens the database by itself; every acknowledged line is kept
exactly once. The database lives on a small tmpfs (we are root in CI)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import read_db


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def call(url: str, body: dict | None = None) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def fill(path) -> None:
    """Write zeros until the disk refuses even 512 bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 65536, 512):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_disk_full_refuses_503_then_recovers_without_restart(small_disk, server_process):
    db = small_disk / "fleetlog.duckdb"
    server = server_process("--policy-interval-s", "0", "--retry-after-s", "1", db=db).start()
    acked: list[int] = []
    seq = 0

    def push(n: int = 200) -> tuple[int, dict, dict]:
        nonlocal seq
        lines = [{"seq": s, "ts": 1795951000 + s, "line": f"line {s} " + "x" * 100} for s in range(seq, seq + n)]
        status, headers, body = call(server.url + "/api/v1/logs", {"instance_id": "C.1", "source": "benchout", "lines": lines})
        if status == 200:
            assert body["accepted"] == n
            acked.extend(range(seq, seq + n))
        seq += n
        return status, headers, body

    for _ in range(5):
        assert push()[0] == 200
    filler = small_disk / "filler"
    fill(filler)
    assert call(server.url + "/readyz")[0] == 503  # no room: not ready, before any push fails
    refused = None
    for _ in range(200):
        status, headers, body = push()
        if status != 200:
            refused = (status, headers, body)
            break
    assert refused is not None, "the full disk never refused a push"
    status, headers, body = refused
    assert status in (503, 507), body
    assert int(headers["Retry-After"]) >= 1 and "internal" not in body["error"]
    status, headers, body = call(server.url + "/readyz")
    assert status == 503 and "storage" in body["error"]
    assert call(server.url + "/api/v1/instances")[0] == 200  # reads still answer

    os.remove(filler)
    deadline = time.monotonic() + 60
    while call(server.url + "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "not ready again after space came back"
        time.sleep(0.2)
    for _ in range(3):
        assert push()[0] == 200
    status, _, body = call(server.url + "/api/v1/logs", {"instance_id": "C.1", "source": "benchout",
                                                          "lines": [{"seq": s, "ts": 1795951000 + s, "line": "again"} for s in acked[:50]]})
    assert status == 200 and body["duplicates"] == 50  # the dedupe index was rebuilt
    server.stop()
    rows = read_db(str(db), "SELECT seq, count(*) FROM logs WHERE instance_id = 'C.1' GROUP BY seq")
    stored = dict(rows)
    assert all(stored.get(s) == 1 for s in acked), "an acknowledged line is missing or stored twice"
    assert max(stored.values()) == 1
    # what the writer keeps of the stream (log_stream_lines, 019: the completeness the destroy rule waits
    # for) is what is stored, though a commit failed on the full disk in the middle
    kept = read_db(str(db), "SELECT lines, first_seq, last_seq FROM log_stream_lines WHERE instance_id = 'C.1'")
    assert kept == [(len(stored), min(stored), max(stored))], (kept, len(stored))


async def test_invalidated_database_is_reopened_and_keeps_every_acknowledged_line(make_client, monkeypatch):
    """DuckDB invalidates a database after some fatal write errors; the writer treats that like a full
    disk: 503 with Retry-After, not ready, then a reopen by itself (the fault injected at the store)."""
    import duckdb

    from ingest.db import store
    from ingest.errors import StoreError

    client = await make_client(retry_after_s=1)

    async def push(seqs) -> tuple[int, dict, dict]:
        doc = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": s, "ts": 1795951000 + s, "line": "x"} for s in seqs]}
        r = await client.post("/api/v1/logs", data=json.dumps(doc))
        return r.status, dict(r.headers), await r.json()

    assert (await push(range(10)))[0] == 200
    real = store.write_batch
    failures = []

    def invalidated(*args, **kwargs):
        if not failures:
            failures.append(1)
            try:
                raise duckdb.FatalException("FATAL Error: database has been invalidated because of a previous fatal error")
            except duckdb.Error as e:
                raise StoreError(str(e)) from e
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "write_batch", invalidated)
    status, headers, body = await push(range(10, 20))
    assert status == 503 and int(headers["Retry-After"]) >= 1 and "invalidated" in body["error"]
    assert (await client.get("/readyz")).status == 503  # the reopen waits retry_after_s first
    deadline = time.monotonic() + 30
    while (await client.get("/readyz")).status != 200:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    status, _, body = await push(range(20))
    assert status == 200 and (body["accepted"], body["duplicates"]) == (10, 10)
    r = await client.post("/api/v1/query", data=json.dumps({"sql": "SELECT count(*), count(DISTINCT seq) FROM logs"}))
    assert (await r.json())["rows"] == [[20, 20]]
