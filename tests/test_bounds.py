"""Bounded work and stored-range timestamps: every request's work is capped before it is done (413
naming the cap), events are written as one batch, the rate limit charges every row, and every
accepted timestamp reads back; enrollment cannot be replayed and an admin re-issues tokens."""

from __future__ import annotations

import asyncio
import gzip
import io
import time
from dataclasses import replace

import grpc
import orjson
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ingest.app import create_app
from ingest.config import Settings
from ingest.errors import ConfigError
from ingest.db.tailcache import TailCache
from ingest.web.keys import BUDGET, OTLP_GRPC_PORT
from tests.conftest import free_port
from tests.fleet import rows

ENROLL, READ, ADMIN = "enroll-7f3a", "read-91bc", "admin-c2d4"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def counts(client) -> tuple:
    return tuple(rows(client, f"SELECT count(*) FROM {t}")[0][0] for t in ("logs", "events", "metrics", "instances", "instance_tokens"))


def _lines(n: int, start: int = 0) -> list[dict]:
    return [{"seq": start + i, "line": "x"} for i in range(n)]


async def _too_large(client, path: str, body: bytes, cap: str, headers=None) -> None:
    r = await client.post(path, data=body, headers=headers or {"Content-Type": "application/json"})
    doc = await r.json()
    assert r.status == 413, (path, r.status, doc)
    assert cap in doc["error"], (cap, doc["error"])


async def test_caps_refuse_big_requests_with_413_naming_the_cap_and_write_nothing(make_client):
    client = await make_client(max_lines_per_request=100, max_streams_per_request=3, max_events_per_request=5)
    stream = {"instance_id": "C.1", "source": "s", "lines": _lines(101)}
    await _too_large(client, "/api/v1/logs", orjson.dumps(stream), "max_lines_per_request")
    streams = [{"instance_id": "C.1", "source": f"s{i}", "lines": _lines(30)} for i in range(4)]
    await _too_large(client, "/api/v1/logs", orjson.dumps({"streams": streams}), "max_streams_per_request")
    streams = [{"instance_id": "C.1", "source": f"s{i}", "lines": _lines(34)} for i in range(3)]  # 102 lines
    await _too_large(client, "/api/v1/logs", orjson.dumps({"streams": streams}), "max_lines_per_request")
    events = [{"instance_id": "C.1", "kind": "running", "ts": i} for i in range(6)]
    await _too_large(client, "/api/v1/events", orjson.dumps(events), "max_events_per_request")
    samples = [{"name": "m", "value": 1, "ts": i} for i in range(101)]
    await _too_large(client, "/api/v1/metrics", orjson.dumps({"instance_id": "C.1", "samples": samples}), "max_lines_per_request")
    await _too_large(client, "/api/log-push", b"x\n" * 101, "max_lines_per_request",
                     {"X-Instance-Id": "C.1", "X-Log-Source": "setup"})
    records = [{"body": {"stringValue": "x"}} for _ in range(101)]
    otlp = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.instance.id", "value": {"stringValue": "C.1"}},
                                                          {"key": "service.name", "value": {"stringValue": "d"}}]},
                              "scopeLogs": [{"logRecords": records}]}]}
    await _too_large(client, "/v1/logs", orjson.dumps(otlp), "max_lines_per_request")
    sources = [{"body": {"stringValue": "x"}, "attributes": [{"key": "log.source", "value": {"stringValue": f"s{i}"}}]}
               for i in range(4)]
    otlp["resourceLogs"][0]["scopeLogs"][0]["logRecords"] = sources
    await _too_large(client, "/v1/logs", orjson.dumps(otlp), "max_streams_per_request")
    assert counts(client) == (0, 0, 0, 0, 0)
    # at the caps, all is well
    assert (await client.post("/api/v1/logs", data=orjson.dumps({"instance_id": "C.1", "source": "s", "lines": _lines(100)}))).status == 200
    assert (await client.post("/api/log-push", data=b"x\n" * 100, headers={"X-Instance-Id": "C.1", "X-Log-Source": "t"})).status == 200
    assert (await client.post("/api/log-push", data=b"x\n" * 99 + b"no newline at the end",
                              headers={"X-Instance-Id": "C.1", "X-Log-Source": "t"})).status == 200


async def test_log_push_of_a_gzip_of_newlines_is_refused_without_numbering_it(client):
    bomb = gzip.compress(b"\n" * (16 * 1024 * 1024 - 1), 9)  # ~16 KiB: 16.7 M empty lines once inflated
    assert len(bomb) < 40_000
    started = time.monotonic()
    r = await client.post("/api/log-push", data=bomb,
                          headers={"Content-Encoding": "gzip", "X-Instance-Id": "C.1", "X-Log-Source": "setup"})
    assert r.status == 413 and "max_lines_per_request" in (await r.json())["error"]
    assert time.monotonic() - started < 20
    assert counts(client) == (0, 0, 0, 0, 0)


async def test_otlp_grpc_is_under_the_same_caps(make_client):
    client = await make_client(otlp_grpc_port=free_port(), max_lines_per_request=10)
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    attr = resource_logs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.instance.id", "C.grpc"
    attr = resource_logs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "daemon"
    scope = resource_logs.scope_logs.add()
    for i in range(11):
        scope.log_records.add().body.string_value = f"line {i}"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{client.app[OTLP_GRPC_PORT]}") as channel:
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Export(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_lines_per_request" in refused.value.details()
        del scope.log_records[10]
        await stub.Export(request, timeout=30)
    assert rows(client, "SELECT count(*) FROM logs WHERE instance_id = 'C.grpc'") == [(10,)]


async def test_many_events_are_written_as_one_batch_with_their_side_effects(make_client):
    client = await make_client(max_events_per_request=50_000)
    n = 20_000
    events = [{"instance_id": f"C.{i % 500}", "kind": "gpu_state", "ts": 1795951000 + i, "gpu": i} for i in range(n)]
    started = time.monotonic()
    r = await client.post("/api/v1/events", data=io.BytesIO(orjson.dumps(events)))
    elapsed = time.monotonic() - started
    assert r.status == 200 and (await r.json())["accepted"] == n
    assert elapsed < 30, elapsed  # one statement per event took ~4 ms each: 80 s
    r = await client.post("/api/v1/events", data=orjson.dumps(events[:10] + [{"instance_id": "C.new", "kind": "running", "ts": 5}]))
    assert (await r.json()) == {"ok": True, "accepted": 1, "duplicates": 10}
    assert rows(client, "SELECT count(*) FROM events") == [(n + 1,)]


async def test_batched_events_keep_the_one_by_one_side_effects(client):
    batch = [
        {"instance_id": "C.a", "kind": "registered", "ts": 1, "machine_id": 1, "gpu_model": "A", "labels": {"v": "1"}},
        {"instance_id": "C.a", "kind": "registered", "ts": 2, "gpu_count": 2},  # later fields add, nulls keep
        {"instance_id": "C.a", "kind": "bench_started", "ts": 10, "proofs": 12},
        {"instance_id": "C.a", "kind": "bench_done", "ts": 20, "exit_code": 0, "rate_per_hour": 30.5},
        {"instance_id": "C.a", "kind": "bench_started", "ts": 30, "proofs": 6},
        {"instance_id": "C.b", "kind": "bench_done", "ts": 5, "exit_code": 1},  # no run: a run of its own
    ]
    assert (await client.post("/api/v1/events", data=orjson.dumps(batch))).status == 200
    # a later request closes the run opened by the earlier one; a resent event changes nothing
    later = [{"instance_id": "C.a", "kind": "bench_done", "ts": 40, "exit_code": 1, "failure_excerpt": "OOM"},
             {"instance_id": "C.a", "kind": "bench_started", "ts": 10, "proofs": 99}]
    assert (await (await client.post("/api/v1/events", data=orjson.dumps(later))).json())["duplicates"] == 1
    assert rows(client, "SELECT machine_id, gpu_model, gpu_count, labels::VARCHAR FROM instances WHERE instance_id = 'C.a'") == [
        (1, "A", 2, '{"v":"1"}')
    ]
    got = rows(client, """SELECT instance_id, epoch(started_at), proofs, epoch(done_at), exit_code, rate_per_hour, failure_excerpt
                          FROM bench_runs ORDER BY instance_id, started_at""")
    assert got == [("C.a", 10, 12, 20, 0, 30.5, None), ("C.a", 30, 6, 40, 1, None, "OOM"), ("C.b", None, None, 5, 1, None, None)]


async def test_rate_limit_charges_every_row_and_a_body_over_the_burst_empties_the_bucket(make_client):
    client = await make_client(instance_max_rows_per_s=100, max_lines_per_request=10_000)  # burst 200
    body = orjson.dumps({"instance_id": "C.big", "source": "s", "lines": _lines(1000)})
    assert (await client.post("/api/v1/logs", data=body)).status == 200  # a full bucket lets it through once
    r = await client.post("/api/v1/logs", data=orjson.dumps({"instance_id": "C.big", "source": "s", "lines": _lines(1, 1000)}))
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 8  # the 800 rows over the burst are owed first
    assert (await client.post("/api/v1/logs", data=orjson.dumps({"instance_id": "C.other", "source": "s", "lines": _lines(1)}))).status == 200


BAD_TS = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "10000-01-01T00:00:00Z", "0000-12-31T00:00:00Z",
          1e300, -1, 253402300800, float("nan"), float("inf"), "NaN", "2026-13-01T00:00:00Z"]
GOOD_TS = ["9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z", "9999-12-31T09:59:59+14:00",
           "0001-01-01T14:00:00+14:00", 0, 253402300799, 253402300799.5]


async def test_timestamps_outside_the_stored_range_are_400_on_every_path(client):
    for ts in BAD_TS:
        line = orjson.dumps({"instance_id": "C.1", "source": "s", "lines": [{"seq": 0, "ts": ts, "line": "x"}]},
                            option=orjson.OPT_SERIALIZE_NUMPY) if ts == ts and ts not in (float("inf"),) else None
        if line is None:  # NaN and infinity are not JSON: send them as Python's json writes them
            line = b'{"instance_id": "C.1", "source": "s", "lines": [{"seq": 0, "ts": %s, "line": "x"}]}' % str(ts).encode()
            r = await client.post("/api/v1/logs", data=line)
            assert r.status == 400, (ts, await r.text())
            continue
        for path, body, field in (
            ("/api/v1/logs", line, "lines[0].ts"),
            ("/api/v1/events", orjson.dumps({"instance_id": "C.1", "kind": "running", "ts": ts}), "ts"),
            ("/api/v1/metrics", orjson.dumps({"instance_id": "C.1", "samples": [{"name": "m", "value": 1, "ts": ts}]}), "samples[0].ts"),
        ):
            r = await client.post(path, data=body)
            doc = await r.json()
            assert r.status == 400 and field in doc["error"], (ts, path, doc)
    assert counts(client) == (0, 0, 0, 0, 0)


async def test_every_accepted_timestamp_reads_back(client):
    lines = [{"seq": i, "ts": ts, "line": f"l{i}"} for i, ts in enumerate(GOOD_TS)]
    r = await client.post("/api/v1/logs", data=orjson.dumps({"instance_id": "C.edge", "source": "s", "lines": lines}))
    assert r.status == 200, await r.text()
    events = [{"instance_id": "C.edge", "kind": "running", "ts": ts} for ts in GOOD_TS if ts != 253402300799.5]
    assert (await client.post("/api/v1/events", data=orjson.dumps(events))).status == 200
    samples = [{"name": "m", "value": 1, "ts": ts} for ts in GOOD_TS]
    assert (await client.post("/api/v1/metrics", data=orjson.dumps({"instance_id": "C.edge", "samples": samples}))).status == 200
    r = await client.get("/api/v1/instances/C.edge/logs?source=s&tail=100")
    assert r.status == 200, await r.text()
    got = {line["seq"]: line["ts"] for line in (await r.json())["lines"]}
    assert got[0] == "9999-12-31T23:59:59.999999Z" and got[1] == "0001-01-01T00:00:00.000000Z"
    assert got[2] == "9999-12-30T19:59:59.000000Z" and got[3] == "0001-01-01T00:00:00.000000Z"
    assert got[4] == "1970-01-01T00:00:00.000000Z" and got[5] == "9999-12-31T23:59:59.000000Z"
    r = await client.get("/api/v1/instances/C.edge")
    assert r.status == 200, await r.text()
    assert len((await r.json())["events"]) == len(events) - 1  # 0001-01-01T14:00:00+14:00 is 0001-01-01T00:00:00Z
    assert (await client.get("/api/v1/instances")).status == 200
    r = await client.get("/api/v1/instances/C.edge/logs?source=s&tail=100&q=l1")  # the database path, not the cache
    assert r.status == 200, await r.text()


@pytest.fixture
async def secured(aiohttp_client, settings):
    return await aiohttp_client(create_app(replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN,
                                                   policy_interval_s=0)))


async def _register(client, instance_id: str, ts=1795951000):
    event = {"instance_id": instance_id, "kind": "registered", "ts": ts, "machine_id": 55891}
    return await client.post("/api/v1/events", data=orjson.dumps(event), headers=bearer(ENROLL))


def _push(instance_id: str, seq: int = 0) -> bytes:
    return orjson.dumps({"instance_id": instance_id, "source": "s", "lines": _lines(1, seq)})


async def test_enrollment_replay_for_an_existing_instance_is_409_and_mints_nothing(secured):
    r = await _register(secured, "C.7")
    token = (await r.json())["tokens"]["C.7"]
    before = counts(secured)
    for ts in (1795951000, 1795951999):  # the very same event, and a fresh one
        r = await _register(secured, "C.7", ts)
        doc = await r.json()
        assert r.status == 409 and "C.7" in doc["error"] and "tokens" not in doc, doc
    assert counts(secured) == before
    # an instance created by a push (not by enrollment) cannot be claimed either
    assert (await secured.post("/api/v1/logs", data=_push("C.8"), headers=bearer(ADMIN))).status == 200
    assert (await _register(secured, "C.8")).status == 409
    assert (await secured.post("/api/v1/logs", data=_push("C.7"), headers=bearer(token))).status == 200


async def test_admin_reissues_a_token_and_the_old_one_stops_working(aiohttp_client, settings):
    secured_settings = replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN, policy_interval_s=0)
    client = await aiohttp_client(create_app(secured_settings))
    old = (await (await _register(client, "C.9")).json())["tokens"]["C.9"]
    for token in (ENROLL, READ, old):
        assert (await client.post("/api/v1/instances/C.9/token", headers=bearer(token))).status == 403
    assert (await client.post("/api/v1/instances/C.nobody/token", headers=bearer(ADMIN))).status == 404
    r = await client.post("/api/v1/instances/C.9/token", headers=bearer(ADMIN))
    assert r.status == 200
    new = (await r.json())["token"]
    assert new != old
    assert (await client.post("/api/v1/logs", data=_push("C.9"), headers=bearer(old))).status == 401
    assert (await client.post("/api/v1/logs", data=_push("C.9", 1), headers=bearer(new))).status == 200
    assert rows(client, "SELECT count(*) FROM instance_tokens WHERE instance_id = 'C.9'") == [(1,)]
    await client.close()
    again = await aiohttp_client(create_app(secured_settings))
    assert (await again.post("/api/v1/logs", data=_push("C.9", 2), headers=bearer(old))).status == 401
    assert (await again.post("/api/v1/logs", data=_push("C.9", 2), headers=bearer(new))).status == 200


async def test_spent_memory_budget_is_503_with_retry_after_before_the_body_is_parsed(make_client):
    # 64 MB budget: 8 tail cache + 16 DuckDB + 8 transients leave 32 MB for requests. A body holds the bytes
    # that arrived (1.3 MB each for 20 bodies held just short of their end), then 6x (7.8 MB) to be parsed.
    client = await make_client(memory_budget_mb=64, duckdb_memory_limit_mb=16, max_body_bytes=1_400_000)
    release = asyncio.Event()
    full = b'{"instance_id": "C.slow", "source": "s", "lines": [{"seq": 0, "line": "x"}]}'.ljust(1_300_000)

    async def held_body():
        yield full[:-40]
        await release.wait()
        yield full[-40:]

    held = [asyncio.create_task(client.post("/api/v1/logs", data=held_body(), headers={"Content-Length": str(len(full))}))
            for _ in range(20)]
    budget = client.app[BUDGET]
    deadline = time.monotonic() + 30
    while budget.used < 20 * (len(full) - 40):
        assert time.monotonic() < deadline, budget.used
        await asyncio.sleep(0.01)
    assert budget.used == 20 * (len(full) - 40)  # what arrived, not 6x the declared length
    r = await client.post("/api/v1/logs", data=io.BytesIO(full))
    assert r.status == 503 and r.headers["Retry-After"] == "1" and "memory budget" in (await r.json())["error"]
    release.set()
    statuses = sorted([(await task).status for task in held])
    assert statuses[0] == 200 and set(statuses) <= {200, 503}, statuses  # those that fit are parsed, the rest retry
    assert budget.used == 0
    assert (await client.post("/api/v1/logs", data=io.BytesIO(full))).status == 200


def test_tail_cache_stays_under_its_bytes():
    cache = TailCache(capacity_lines=1000, max_streams=100, max_bytes=200_000)
    for s in range(10):
        cache.on_commit(("C.1", f"s{s}"), [("0", i, i, "x" * 500) for i in range(100)], True)
        assert cache.nbytes <= 200_000
    assert cache.stream_count() < 10 and cache.tail(("C.1", "s9"), 10) is not None  # the oldest streams left first
    cache.on_commit(("C.1", "huge"), [("0", i, i, "y" * 5000) for i in range(100)], True)
    assert 0 < cache.nbytes <= 200_000 and cache.tail(("C.1", "huge"), 200) is None  # trimmed: incomplete
    assert cache.nbytes == sum(e.nbytes for e in cache._entries.values())


def test_tail_cache_counts_at_least_what_its_rows_hold():
    """Its share of the budget is what its rows really hold: rows built as the writer builds them (decoded
    from a push, zipped with the run id), measured by tracemalloc. The count per row once undercounted by
    ~30 bytes (160 against 189), so a 64 MiB share held ~70 MiB."""
    import random
    import tracemalloc
    from itertools import repeat

    import msgspec

    from bench.storage_bytes import make_line
    from ingest.db.tailcache import rows_bytes

    rng = random.Random(7)
    body = msgspec.json.encode({"lines": [{"seq": 5_000 + i, "ts": 1_764_000_000.5 + i, "line": make_line(rng, 1_764_000_000 + i)}
                                          for i in range(20_000)]})
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        items = msgspec.json.decode(body)["lines"]
        seqs, stamps, texts = [x["seq"] for x in items], [int(x["ts"] * 1e6) for x in items], [x["line"] for x in items]
        del items
        rows = list(zip(repeat("0"), seqs, stamps, texts))
        del seqs, stamps, texts
        held = tracemalloc.get_traced_memory()[0] - start  # the list, the tuples, their ints and text
    finally:
        tracemalloc.stop()
    assert rows_bytes(rows) >= held, (rows_bytes(rows) / len(rows), held / len(rows))


def test_memory_budget_split_is_validated():
    with pytest.raises(ConfigError, match="memory_budget_mb"):
        Settings(memory_budget_mb=64, max_body_bytes=16 * 2**20)
    split = Settings().memory_split()
    assert sum(split.values()) == Settings().memory_budget_mb * 2**20
