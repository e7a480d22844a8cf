"""Connections on the real server: slow heads are closed by the header timeout while /readyz stays
fast, the open-connection cap refuses cleanly, a slow body gets 408, a client that drops mid-body is
a counted metric (no traceback), and repeated log records are rate-limited."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request

from ingest.web.listener import QuietLogs


def _get(url: str, timeout: float = 5) -> tuple[int, bytes, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read(), time.monotonic() - started


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    return s


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _metric(url: str, name: str) -> float:
    _status, body, _t = _get(url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_slow_loris_is_closed_by_the_header_timeout_and_readyz_stays_fast(server_process):
    server = server_process("--http-header-timeout-s", "1", "--http-idle-timeout-s", "30").start()
    slow = [_connect(server.port) for _ in range(200)]
    for s in slow:
        s.send(b"POST /api/v1/logs HTTP/1.1\r\nHost: x\r\n")
    worst = 0.0
    deadline = time.monotonic() + 60
    open_ones = list(slow)
    while open_ones and time.monotonic() < deadline:
        for s in open_ones:
            try:
                s.send(b"X-Trickle: 1\r\n")
            except OSError:
                pass
        status, _body, took = _get(server.url + "/readyz")
        assert status == 200
        worst = max(worst, took)
        open_ones = [s for s in open_ones if not _closed(s)]
        time.sleep(0.2)
    assert not open_ones, f"{len(open_ones)} slow connections still open"
    assert worst < 1.0, worst
    assert _metric(server.url, "fleetlog_http_header_timeouts_total") >= 200
    for s in slow:
        s.close()
    assert "Traceback" not in server.log.read_text()


def test_connections_over_the_cap_are_refused_cleanly(server_process):
    server = server_process("--http-max-connections", "20").start()
    held = [_connect(server.port) for _ in range(20)]
    deadline = time.monotonic() + 30
    refused = b""
    while time.monotonic() < deadline and not refused.startswith(b"HTTP/1.1 503"):
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        refused = extra.recv(1024)
        extra.close()
    assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused
    for s in held:
        s.close()
    deadline = time.monotonic() + 30
    while True:  # the server notices the closes, and takes new connections again
        try:
            assert _get(server.url + "/readyz")[0] == 200
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert _metric(server.url, "fleetlog_http_connections_refused_total") >= 1
    assert "Traceback" not in server.log.read_text()


def test_slow_body_is_408_and_dropped_body_is_a_counted_disconnect(server_process):
    server = server_process("--http-body-timeout-s", "1").start()
    head = b"POST /api/v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    slow.sendall(head + b'{"instance_id": "C.1", ')
    reply = slow.recv(4096)
    slow.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"http_body_timeout_s" in reply
    for _ in range(3):
        gone = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        gone.sendall(head + b"x" * 5000)
        gone.close()
    deadline = time.monotonic() + 30
    while _metric(server.url, "fleetlog_http_client_disconnects_total") < 3:
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.1)
    log = server.log.read_text()
    assert "Traceback" not in log and "unhandled" not in log, log[-3000:]


def test_repeated_log_records_are_rate_limited():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    suppressed = []
    quiet = QuietLogs(burst=5, window_s=0.5, on_suppressed=lambda: suppressed.append(1))
    handler = Keep()
    handler.addFilter(quiet)
    log = logging.getLogger("fleetlog.test.quiet")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(100):
            log.error("commit failed: %s", i)
        log.error("another message")
        assert len(records) == 6 and len(suppressed) == 95
        time.sleep(0.6)
        log.error("commit failed: %s", 100)
        assert "95 like it held back" in records[-1].getMessage()
    finally:
        log.removeHandler(handler)
