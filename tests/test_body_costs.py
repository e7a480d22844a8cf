"""What a request body costs the real server: the memory budget is charged for the bytes that
arrived, not for the ``Content-Length`` promised, so idle connections that declare large bodies
cannot lock everyone else out."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import orjson

from ingest.budget import EXPANSION
from ingest.config import Settings

ENROLL, READ, ADMIN = "enroll-5b1e", "read-0d7c", "admin-93fa"
TOKENS = ("--enroll-token", ENROLL, "--read-token", READ, "--admin-token", ADMIN)


def _metric(url: str, name: str) -> float:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {READ}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def _hold(port: int, path: str, token: str, declared: int) -> socket.socket:
    """A connection that declares ``declared`` body bytes, sends one, and waits."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {declared}\r\n\r\n{{".encode())
    return s


def _post(url: str, body: bytes, token: str) -> int:
    request = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {token}",
                                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_idle_connections_declaring_large_bodies_do_not_lock_out_pushes_or_queries(server_process):
    # the default 512 MB budget leaves 128 MiB for requests: at 6x the declared length, 80 connections that
    # declare 1/480 of it each (and one byte) held it all, to the last few bytes
    limit = Settings().memory_split()["requests"]
    declared = [limit // EXPANSION // 80] * 79
    declared.append((limit - EXPANSION * sum(declared)) // EXPANSION)
    server = server_process(*TOKENS).start()
    held = [_hold(server.port, "/api/v1/logs", ENROLL, n) for n in declared[:60]]
    held += [_hold(server.port, "/api/v1/query", READ, n) for n in declared[60:]]
    try:
        deadline = time.monotonic() + 30
        while (held_bytes := _metric(server.url, "fleetlog_memory_requests_bytes")) < len(held):
            assert time.monotonic() < deadline, held_bytes  # until every held body's first byte was read
            time.sleep(0.1)
        pushes = [_post(server.url + "/api/v1/logs", orjson.dumps({"instance_id": f"C.{i}", "source": "s",
                                                                  "lines": [{"seq": 0, "line": "x"}]}), ADMIN)
                  for i in range(10)]
        queries = [_post(server.url + "/api/v1/query", b'{"sql": "SELECT 1 AS one"}', READ) for _ in range(10)]
        assert pushes == [200] * 10 and queries == [200] * 10, (pushes, queries, held_bytes)
        assert held_bytes < 2**20, held_bytes  # 80 bytes arrived; they hold what arrived, not what they promised
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while (left := _metric(server.url, "fleetlog_memory_requests_bytes")) != 0:
        assert time.monotonic() < deadline, f"{left} budget bytes still held after the idle connections closed"
        time.sleep(0.1)
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]
