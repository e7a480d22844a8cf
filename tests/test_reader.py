"""The Reader and the writer's own state: retention racing a push, the SQL pool's admission, the
page's reads never waiting behind slow SQL, DuckDB's memory cap, and a quick SIGTERM with a follower."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from dataclasses import replace

import orjson

from ingest.contract import codec
from ingest.app import create_app
from ingest.web.keys import CORE, DB
from ingest.policy.engine import CycleReport
from ingest.timestamps import now_us, utcnow


def _chunks(instance_id: str, seqs) -> list[codec.LogChunk]:
    doc = {"instance_id": instance_id, "source": "benchout",
           "lines": [{"seq": s, "ts": 1795951000 + s, "line": f"line {s}"} for s in seqs]}
    return codec.parse_logs(doc, 1024, now_us())


def _stored(client, instance_id: str) -> list[int]:
    cur = client.app[DB].cursor()
    try:
        return [s for (s,) in cur.execute("SELECT seq FROM logs WHERE instance_id = ? ORDER BY seq", [instance_id]).fetchall()]
    finally:
        cur.close()


async def test_retention_delete_and_a_push_racing_it_agree(aiohttp_client, settings):
    """A push queued while retention deletes an instance's logs is stored after the delete, and the
    dedupe index and tail cache agree with the table afterwards (the index changes on the writer
    thread, in the delete's own commit)."""
    client = await aiohttp_client(create_app(replace(settings, policy_interval_s=0)))
    core = client.app[CORE]
    # the decisions below are written by hand: the rule's own re-check (tests/test_policies.py) would
    # supersede them; here it is the writer's ordering that is under test, so they stay selected
    core.policy._recheck = lambda decision, now: (decision["reason"], decision["evidence"])
    for round_ in range(5):
        instance_id = f"C.{round_}"
        await core.writer.submit(logs=_chunks(instance_id, range(10)))
        await core.writer.execute(lambda con, i=instance_id: con.execute(
            "INSERT INTO decisions (rule, rule_sha, subject, action, reason, evidence, episode, decided_at, state) "
            "VALUES ('retention', 'x', ?, 'delete_logs', 'test', '{}', 'e', now(), 'proposed')", [i]))
        carry = asyncio.create_task(core.policy._carry_out(CycleReport(True), utcnow()))
        deadline = time.monotonic() + 30
        while core.writer.pending_requests == 0 and not carry.done():  # the delete is queued
            assert time.monotonic() < deadline
            await asyncio.sleep(0)
        pushed = await core.writer.submit(logs=_chunks(instance_id, range(10, 20)))
        await carry
        assert pushed.accepted == 10
        assert _stored(client, instance_id) == list(range(10, 20))  # pushed after the delete: kept
        again = await core.writer.submit(logs=_chunks(instance_id, range(20)))
        assert (again.accepted, again.duplicates) == (10, 10)  # 0..9 were deleted, 10..19 are stored
        assert _stored(client, instance_id) == list(range(20))
        r = await client.get(f"/api/v1/instances/{instance_id}/logs?source=benchout&tail=20")
        assert [line["seq"] for line in (await r.json())["lines"]] == list(range(20))


async def test_sql_beyond_the_pool_is_429_and_page_reads_do_not_wait(make_client):
    client = await make_client(query_max_concurrent=2, query_timeout_s=30)
    slow = "SELECT count(*) FROM range(3000000000) a"  # interrupted at the end of the test
    tasks = [asyncio.create_task(client.post("/api/v1/query", data=orjson.dumps({"sql": slow}))) for _ in range(2)]
    deadline = time.monotonic() + 30
    while client.app[DB]._sql.running < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT 1"}))
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert "query_max_concurrent" in (await r.json())["error"]
    for _ in range(6):
        started = time.monotonic()
        r = await client.get("/api/v1/instances")
        assert r.status == 200
        assert time.monotonic() - started < 5  # answered while both SQL threads are busy
    client.app[DB].suspend(wait_s=0)  # interrupt the slow queries
    for task in tasks:
        r = await task
        assert r.status in (408, 503)


def test_sql_distinct_over_generated_rows_stays_under_the_memory_limit(server_process):
    """DuckDB's memory_limit holds user SQL: with 64 MB the query fails cleanly (400 naming memory) or
    spills; the server's peak RSS stays far below the ~1.5 GB the same query takes unlimited."""
    import urllib.error
    import urllib.request

    server = server_process("--duckdb-memory-limit-mb", "64", "--query-timeout-s", "120").start()
    sql = "SELECT count(*) FROM (SELECT DISTINCT i FROM range(30000000) t(i))"
    request = urllib.request.Request(server.url + "/api/v1/query", data=orjson.dumps({"sql": sql}), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=180) as r:
            status, body = r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        status, body = e.code, orjson.loads(e.read())
    if status == 200:
        assert body["rows"] == [[30000000]]  # spilled to the temp directory
    else:
        assert status == 400 and "memory" in body["error"], body
    with open(f"/proc/{server.proc.pid}/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    assert peak_kb < 600 * 1024, peak_kb
    assert urllib.request.urlopen(server.url + "/readyz", timeout=10).status == 200


def test_sigterm_with_follow_clients_exits_within_two_seconds(server_process):
    server = server_process().start()
    push = json.dumps({"instance_id": "C.1", "source": "benchout", "lines": [{"seq": 0, "ts": 1795951000, "line": "x"}]})
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(server.url + "/api/v1/logs", data=push.encode(), method="POST"), timeout=10)
    request = ("GET /api/v1/instances/C.1/logs?source=benchout&follow=1 HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    gone = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # a follower that goes away
    gone.sendall(request)
    assert b"200" in gone.recv(4096)
    gone.close()
    staying = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    staying.sendall(request)
    assert b"200" in staying.recv(4096)
    time.sleep(1.0)  # both streams are in their poll loop
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=15)
    took = time.monotonic() - started
    staying.close()
    assert took < 2.0, took
    assert server.proc.returncode == 0
