"""The shipper against a scripted fake server: what it resends, what it drops, how long it waits."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time

import orjson
import pytest
from aiohttp import web

from agent.credentials import Credentials
from agent.shipper import Backoff, Client, Shipper, parse_retry_after
from agent.spool import Record, Spool


class FakeServer:
    """Answers each request with the next scripted (status, headers), then 200; records everything."""

    def __init__(self, script=(), refuse_if=None) -> None:
        self.script = list(script)
        self.refuse_if = refuse_if
        self.requests: list[tuple[float, str, dict, object]] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()  # aiohttp inflates Content-Encoding: gzip
        body = orjson.loads(raw)
        self.requests.append((time.monotonic(), request.path, dict(request.headers), body))
        if self.refuse_if and self.refuse_if(body):
            return web.json_response({"ok": False, "error": "lines[0].line: expected a string", "status": 400}, status=400)
        if self.script:
            status, headers = self.script.pop(0)
            return web.json_response({"ok": False, "error": "scripted", "status": status}, status=status, headers=headers)
        return web.json_response({"ok": True, "accepted": 1, "duplicates": 0})



@pytest.fixture
async def fake(aiohttp_server):
    async def make(**kw):
        server = FakeServer(**kw)
        app = web.Application()
        app.router.add_post("/api/v1/{kind}", server.handle)
        server.http = await aiohttp_server(app)
        return server

    return make


@pytest.fixture
async def shipping(tmp_path):
    """A spool, a client and a running shipper against ``url``; stopped and closed afterwards."""
    made = []

    async def make(url, *, dropped=None, initial_s=0.01, max_s=0.05, batch_max_bytes=1 << 20):
        spool = Spool(str(tmp_path / "spool"), max_bytes=1 << 24)
        spool.open()
        client = Client(url, credentials=Credentials("C.1", token="t0ken", enroll_token=None, token_file=None), request_timeout_s=5)
        shipper = Shipper(
            spool, client, batch_max_bytes=batch_max_bytes, backoff=Backoff(initial_s, max_s), hold_delay_s=max_s,
            on_rejected=lambda entry, outcome: dropped.append((entry.record, outcome.status)) if dropped is not None else None,
        )
        task = asyncio.create_task(shipper.run())
        made.append((spool, client, shipper, task))
        return spool, shipper

    yield make
    for spool, client, shipper, task in made:
        shipper.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        spool.close()


def log_record(source: str, first: int, lines: list[str]) -> Record:
    payload = orjson.dumps({"instance_id": "C.1", "source": source, "run_id": "r1", "lines": [{"seq": first + i, "ts": 1.0, "line": l} for i, l in enumerate(lines)]})
    return Record("logs", {"source": source, "run_id": "r1", "first_seq": first, "n": len(lines), "files": {}}, payload)


def event_record(kind: str) -> Record:
    return Record("event", {"kind": kind}, orjson.dumps({"instance_id": "C.1", "kind": kind, "ts": 2.0}))


async def test_shipper_sends_logs_then_the_event_that_follows_them_gzipped(fake, shipping):
    server = await fake()
    spool, shipper = await shipping(str(server.http.make_url("")))
    spool.append([log_record("benchdaemon", 0, ["x" * 600, "y" * 600]), log_record("benchout", 0, ["Throughput: 42.5 proofs/hour"]), event_record("bench_done")])
    shipper.wake()
    assert await shipper.drain(time.monotonic() + 5)
    paths = [p for _t, p, _h, _b in server.requests]
    assert paths == ["/api/v1/logs", "/api/v1/events"]  # two records of logs share a request; the event waits for them
    _t, _p, headers, body = server.requests[0]
    assert headers["Content-Encoding"] == "gzip" and headers["Authorization"] == "Bearer t0ken"
    assert [s["source"] for s in body["streams"]] == ["benchdaemon", "benchout"]
    assert server.requests[1][3][0]["kind"] == "bench_done"


async def test_shipper_waits_for_retry_after_on_503(fake, shipping):
    server = await fake(script=[(503, {"Retry-After": "1"})])
    spool, shipper = await shipping(str(server.http.make_url("")))
    spool.append([log_record("benchout", 0, ["a"])])
    shipper.wake()
    assert await shipper.drain(time.monotonic() + 10)
    (t0, *_), (t1, *_) = server.requests
    assert t1 - t0 >= 0.95  # honoured, although the backoff alone would have waited ~10 ms


@pytest.mark.parametrize("status", [429, 502, 503, 504, 500])
async def test_shipper_resends_on_retryable_answers(fake, shipping, status):
    server = await fake(script=[(status, {}), (status, {})])
    spool, shipper = await shipping(str(server.http.make_url("")))
    spool.append([log_record("benchout", 0, ["a"])])
    shipper.wake()
    assert await shipper.drain(time.monotonic() + 5)
    assert len(server.requests) == 3
    assert shipper.failures == 2


async def test_shipper_drops_only_the_record_the_server_refuses(fake, shipping):
    server = await fake(refuse_if=lambda body: b"BAD" in orjson.dumps(body))
    dropped = []
    spool, shipper = await shipping(str(server.http.make_url("")), dropped=dropped)
    spool.append([log_record("benchout", 0, ["good 0"]), log_record("benchout", 1, ["BAD"]), log_record("benchout", 2, ["good 2"])])
    shipper.wake()
    assert await shipper.drain(time.monotonic() + 5)
    accepted = [line["line"] for t, p, h, body in server.requests if p == "/api/v1/logs" and b"BAD" not in orjson.dumps(body) for s in body["streams"] for line in s["lines"]]
    assert sorted(accepted) == ["good 0", "good 2"]
    assert [(r.meta["first_seq"], status) for r, status in dropped] == [(1, 400)]
    refused = [body for t, p, h, body in server.requests if b"BAD" in orjson.dumps(body)]
    assert len(refused) == 2  # the batch of three, then the bad record alone: never retried after that


async def test_shipper_keeps_trying_while_the_server_is_unreachable_until_stopped(shipping, unused_tcp_port_factory):
    spool, shipper = await shipping(f"http://127.0.0.1:{unused_tcp_port_factory()}")
    spool.append([log_record("benchout", 0, ["a"])])
    shipper.wake()
    assert not await shipper.drain(time.monotonic() + 0.5)
    assert shipper.failures >= 3 and not spool.empty
    assert "ClientConnectorError" in shipper.last_error or "Connect" in shipper.last_error


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert parse_retry_after("100000") == 300.0


def test_backoff_doubles_with_jitter_up_to_its_maximum():
    backoff = Backoff(0.5, 4.0)
    delays = [backoff.next_delay() for _ in range(8)]
    for n, d in enumerate(delays):
        ceiling = min(4.0, 0.5 * 2**n)
        assert ceiling / 2 <= d <= ceiling
    assert backoff.next_delay(retry_after_s=30) == 30
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_gzip_bodies_are_real_gzip():
    assert gzip.decompress(__import__("zlib").compress(b"{}" * 1000, 1, wbits=31)) == b"{}" * 1000


class EnrollingServer:
    """Tokens on: the enrollment token may only register, and registering returns the instance's token."""

    def __init__(self) -> None:
        self.issued = 0
        self.seen: list[tuple[str, str | None, object]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        token = request.headers.get("Authorization", "")[7:] or None
        self.seen.append((request.path, token, body))
        if token == "enroll-me":
            kinds = {e["kind"] for e in body} if isinstance(body, list) else set()
            if request.path != "/api/v1/events" or kinds != {"registered"}:
                return web.json_response({"ok": False, "error": "the enrollment token may only register", "status": 403}, status=403)
            self.issued += 1
            return web.json_response({"ok": True, "accepted": 1, "duplicates": 0, "tokens": {"C.1": f"fli_{self.issued}"}})
        if token != f"fli_{self.issued}":
            return web.json_response({"ok": False, "error": "unknown token", "status": 401}, status=401)
        return web.json_response({"ok": True, "accepted": 1, "duplicates": 0})


async def test_shipper_enrolls_once_and_then_pushes_with_the_instances_token(aiohttp_server, tmp_path):
    server = EnrollingServer()
    app = web.Application()
    app.router.add_post("/api/v1/{kind}", server.handle)
    http = await aiohttp_server(app)
    token_file = tmp_path / "token"
    spool = Spool(str(tmp_path / "spool"), max_bytes=1 << 24)
    spool.open()
    creds = Credentials("C.1", token=None, enroll_token="enroll-me", token_file=str(token_file), registration={"machine_id": 55891})
    client = Client(str(http.make_url("")), credentials=creds, request_timeout_s=5)
    shipper = Shipper(spool, client, batch_max_bytes=1 << 20, backoff=Backoff(0.01, 0.05), hold_delay_s=0.05)
    task = asyncio.create_task(shipper.run())
    try:
        spool.append([log_record("benchout", 0, ["before anything"]), event_record("running")])
        shipper.wake()
        assert await shipper.drain(time.monotonic() + 5)
        assert [(p, t) for p, t, _b in server.seen] == [("/api/v1/events", "enroll-me"), ("/api/v1/logs", "fli_1"), ("/api/v1/events", "fli_1")]
        assert server.seen[0][2][0]["machine_id"] == 55891  # the minimal registration says what it knows
        assert orjson.loads(token_file.read_bytes()) == {"instance_id": "C.1", "token": "fli_1"}
        assert token_file.stat().st_mode & 0o777 == 0o600
        # another agent of the container: the stored token, no second registration
        assert Credentials("C.1", token=None, enroll_token="enroll-me", token_file=str(token_file)).current() == "fli_1"
        server.issued = 5  # the server forgot fli_1 (its database was reset): enroll again
        spool.append([log_record("benchout", 1, ["after the reset"])])
        shipper.wake()
        assert await shipper.drain(time.monotonic() + 5)
        assert [(p, t) for p, t, _b in server.seen[3:]] == [("/api/v1/logs", "fli_1"), ("/api/v1/events", "enroll-me"), ("/api/v1/logs", "fli_6")]
    finally:
        shipper.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()
        spool.close()
