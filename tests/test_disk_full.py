"""A full disk under the database: pushes are refused 503 with Retry-After, /readyz says not ready,
and once space returns the server reopens the database by itself; every acknowledged line is kept
exactly once. The database lives on a small tmpfs (we are root in CI)."""

from __future__ import annotations

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
