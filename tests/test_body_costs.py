"""What a request body costs the real server: a body refused before it is read (401, 413, 503, ...)
is not read or inflated further, so gzip bombs with no token leave the event loop free; and the
memory budget is charged for the bytes that arrived, not for the ``Content-Length`` promised, so
idle connections that declare large bodies cannot lock everyone else out."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib

import orjson
import pytest

from ingest.budget import EXPANSION
from ingest.config import Settings
from tests.test_connections import _get

ENROLL, READ, ADMIN = "enroll-5b1e", "read-0d7c", "admin-93fa"
TOKENS = ("--enroll-token", ENROLL, "--read-token", READ, "--admin-token", ADMIN)


@pytest.fixture(scope="session")
def gzip_bomb(tmp_path_factory) -> bytes:
    """A gzip stream of 1 GiB of zeros (about 1 MB), made once per session."""
    path = tmp_path_factory.getbasetemp() / "zeros-1gib.gz"
    if not path.exists():
        deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = bytes(2**20)
        with path.open("wb") as out:
            for _ in range(1024):
                out.write(deflate.compress(block))
            out.write(deflate.flush())
    return path.read_bytes()


def _cpu_s(pid: int) -> float:
    """utime + stime of the process, in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _send_bomb(port: int, bomb: bytes, replies: list[bytes], token: str = "") -> None:
    """POST the bomb (with no token by default); keep what the server answered."""
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    head = (b"POST /api/v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"%sContent-Length: %d\r\n\r\n" % (auth, len(bomb)))
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        try:
            s.sendall(head + bomb)
        except OSError:  # the server stopped reading and closed: what a refused body should get
            pass
        reply = b""
        try:
            while b"\r\n\r\n" not in reply:
                got = s.recv(4096)
                if not got:
                    break
                reply += got
        except OSError:
            pass
        replies.append(reply)
    finally:
        s.close()


def test_gzip_bombs_refused_401_or_413_cost_no_cpu_and_readyz_stays_prompt(server_process, gzip_bomb):
    server = server_process(*TOKENS).start()
    pid = server.proc.pid
    _get(server.url + "/readyz")
    cpu_before = _cpu_s(pid)
    replies: list[bytes] = []
    bombs = [threading.Thread(target=_send_bomb, args=(server.port, gzip_bomb, replies)) for _ in range(3)]
    # a token's bomb is read, inflated to max_body_bytes (16 MiB) and refused 413: no further
    bombs.append(threading.Thread(target=_send_bomb, args=(server.port, gzip_bomb, replies, ENROLL)))
    probes: list[float] = []
    for bomb in bombs:
        bomb.start()
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            status, _body, took = _get(server.url + "/readyz", timeout=30)
            assert status == 200
            probes.append(took)
            time.sleep(0.05)
    for bomb in bombs:
        bomb.join(timeout=60)
    for _ in range(20):  # and after them, while anything the server kept of them would still be inflated
        probes.append(_get(server.url + "/readyz", timeout=30)[2])
        time.sleep(0.05)
    cpu_spent = _cpu_s(pid) - cpu_before
    assert max(probes) < 2.0, (sorted(probes)[-5:], f"{cpu_spent:.2f} s of server CPU")
    assert cpu_spent < 1.5, f"{cpu_spent:.2f} s of server CPU for 4 refused bombs (inflating 4 GiB)"
    assert sorted(r[:12] for r in replies) == [b"HTTP/1.1 401"] * 3 + [b"HTTP/1.1 413"], replies
    assert all(b"connection: close" in r.lower() for r in replies), replies
    log = server.log.read_text()
    assert "Traceback" not in log and "Unhandled" not in log, log[-3000:]


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
