"""Write endpoints against the real app and a real DuckDB file."""

from __future__ import annotations

import asyncio
import gzip

import orjson

from tests.fleet import rows


def lines(n: int, start: int = 0, text: str = "line") -> list[dict]:
    return [{"seq": s, "ts": 1764415248.0 + s, "line": f"{text} {s}"} for s in range(start, start + n)]


db_rows = rows  # the name these tests use


def count_logs(client) -> int:
    return db_rows(client, "SELECT count(*) FROM logs")[0][0]


async def post(client, path: str, doc, **kw):
    return await client.post(path, data=orjson.dumps(doc), headers={"Content-Type": "application/json"}, **kw)


async def test_logs_push_is_stored_after_ack(client):
    r = await post(client, "/api/v1/logs", {"instance_id": "C.32733029", "source": "benchdaemon", "lines": lines(3)})
    assert r.status == 200
    assert await r.json() == {"ok": True, "accepted": 3, "duplicates": 0}
    rows = db_rows(client, "SELECT instance_id, source, run_id, seq, line, truncated FROM logs ORDER BY seq")
    assert rows == [("C.32733029", "benchdaemon", "0", s, f"line {s}", False) for s in range(3)]


async def test_logs_resend_is_counted_not_doubled(client):
    doc = {"instance_id": "C.1", "source": "benchout", "run_id": "r1", "lines": lines(5)}
    assert (await (await post(client, "/api/v1/logs", doc)).json())["accepted"] == 5
    doc["lines"] = lines(8)  # 0..4 again, plus 5..7
    assert await (await post(client, "/api/v1/logs", doc)).json() == {"ok": True, "accepted": 3, "duplicates": 5}
    assert db_rows(client, "SELECT count(*), count(DISTINCT seq) FROM logs") == [(8, 8)]


async def test_concurrent_resends_of_same_lines_store_each_once(client):
    doc = {"instance_id": "C.1", "source": "cuzk", "lines": lines(200)}
    responses = await asyncio.gather(*(post(client, "/api/v1/logs", doc) for _ in range(6)))
    bodies = [await r.json() for r in responses]
    assert sum(b["accepted"] for b in bodies) == 200
    assert sum(b["duplicates"] for b in bodies) == 1000
    assert count_logs(client) == 200


async def test_same_seq_in_another_run_or_source_is_not_a_duplicate(client):
    for source, run_id in (("benchout", "0"), ("benchout", "1"), ("setup", "0")):
        r = await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": source, "run_id": run_id, "lines": lines(2)})
        assert (await r.json())["accepted"] == 2
    assert count_logs(client) == 6


async def test_streams_body_writes_every_stream(client):
    doc = {"streams": [
        {"instance_id": "C.1", "source": "benchout", "lines": lines(2)},
        {"instance_id": "C.2", "source": "benchdaemon", "lines": lines(3)},
    ]}
    assert (await (await post(client, "/api/v1/logs", doc)).json())["accepted"] == 5
    assert db_rows(client, "SELECT instance_id, count(*) FROM logs GROUP BY 1 ORDER BY 1") == [("C.1", 2), ("C.2", 3)]


async def test_one_bad_line_rejects_the_whole_request(client):
    bad = lines(10)
    bad[7]["seq"] = "7"
    r = await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": "benchout", "lines": bad})
    assert r.status == 400
    body = await r.json()
    assert body["ok"] is False and body["status"] == 400 and "lines[7].seq" in body["error"]
    assert count_logs(client) == 0


async def test_bad_stream_in_streams_body_rejects_all_streams(client):
    doc = {"streams": [
        {"instance_id": "C.1", "source": "benchout", "lines": lines(2)},
        {"instance_id": "", "source": "benchdaemon", "lines": lines(3)},
    ]}
    r = await post(client, "/api/v1/logs", doc)
    assert r.status == 400 and "streams[1].instance_id" in (await r.json())["error"]
    assert count_logs(client) == 0


async def test_unparseable_ts_is_refused_naming_the_field(client):
    doc = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": 0, "ts": "yesterday", "line": "x"}]}
    r = await post(client, "/api/v1/logs", doc)
    assert r.status == 400 and "lines[0].ts" in (await r.json())["error"]
    assert count_logs(client) == 0


async def test_iso_and_epoch_ts_are_stored_as_utc(client):
    doc = {"instance_id": "C.1", "source": "setup", "lines": [
        {"seq": 0, "ts": "2026-11-29T11:20:48Z", "line": "[entrypoint] Starting benchmark"},
        {"seq": 1, "ts": 1795951868.5, "line": "epoch"},
    ]}
    assert (await post(client, "/api/v1/logs", doc)).status == 200
    rows = db_rows(client, "SELECT seq, strftime(ts, '%Y-%m-%dT%H:%M:%S.%f') FROM logs ORDER BY seq")
    assert rows == [(0, "2026-11-29T11:20:48.000000"), (1, "2026-11-29T11:31:08.500000")]


async def test_long_line_is_truncated_and_flagged_not_dropped(make_client):
    client = await make_client(max_line_bytes=1024)
    long = "é" * 2000  # 4000 bytes of UTF-8
    doc = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": 0, "line": long}, {"seq": 1, "line": "short"}]}
    assert (await (await post(client, "/api/v1/logs", doc)).json())["accepted"] == 2
    rows = db_rows(client, "SELECT seq, octet_length(encode(line)), truncated FROM logs ORDER BY seq")
    assert rows == [(0, 1024, True), (1, 5, False)]


async def test_a_resend_keeps_each_line_s_truncated_flag_with_its_line(make_client):
    """The writer drops the lines a resend repeats and gathers the rest column by column: each stored line keeps
    its own flag and seq, in the same commit as other streams' lines (the group commit's rows are one table)."""
    client = await make_client(max_line_bytes=1024)

    def doc(seqs):
        return {"instance_id": "C.1", "source": "benchout",
                "lines": [{"seq": s, "line": (f"long {s} " + "é" * 2000) if s % 3 == 1 else f"short {s}"} for s in seqs]}

    assert (await (await post(client, "/api/v1/logs", doc(range(0, 5)))).json())["accepted"] == 5
    other = {"instance_id": "C.2", "source": "setup", "lines": [{"seq": 0, "line": "other " + "x" * 2000}]}
    replies = await asyncio.gather(post(client, "/api/v1/logs", doc([7, 3, 5, 0, 6, 1])), post(client, "/api/v1/logs", other))
    assert [await r.json() for r in replies] == [{"ok": True, "accepted": 3, "duplicates": 3},
                                                 {"ok": True, "accepted": 1, "duplicates": 0}]
    got = db_rows(client, "SELECT instance_id, seq, split_part(line, ' ', 1), split_part(line, ' ', 2), truncated "
                          "FROM logs ORDER BY instance_id, seq")
    assert got == [("C.1", s, "long" if s % 3 == 1 else "short", str(s), s % 3 == 1) for s in (0, 1, 2, 3, 4, 5, 6, 7)] + [
        ("C.2", 0, "other", "x" * (1024 - len("other ")), True)]
    plain = await client.post("/api/log-push", data=("y" * 3000 + "\nshort\n").encode(),
                              headers={"X-Instance-Id": "C.3", "X-Log-Source": "entrypoint"})
    assert plain.status == 200
    assert db_rows(client, "SELECT seq, octet_length(encode(line)), truncated FROM logs WHERE instance_id = 'C.3' ORDER BY seq") == [
        (0, 1024, True), (1, 5, False)]


async def test_gzip_body_is_accepted(client):
    body = gzip.compress(orjson.dumps({"instance_id": "C.1", "source": "benchout", "lines": lines(50)}))
    r = await client.post("/api/v1/logs", data=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status == 200 and (await r.json())["accepted"] == 50
    assert count_logs(client) == 50


async def test_broken_gzip_is_400_and_writes_nothing(client):
    r = await client.post("/api/v1/logs", data=b"\x1f\x8b\x08\x00garbage-not-deflate", headers={"Content-Encoding": "gzip"})
    assert r.status == 400 and (await r.json())["ok"] is False
    assert count_logs(client) == 0


async def test_body_over_limit_is_413(make_client):
    client = await make_client(max_body_bytes=10_000)
    doc = {"instance_id": "C.1", "source": "benchout", "lines": lines(500)}
    r = await post(client, "/api/v1/logs", doc)
    assert r.status == 413
    assert (await r.json())["status"] == 413
    assert count_logs(client) == 0


async def test_gzip_body_inflating_over_limit_is_413(make_client):
    client = await make_client(max_body_bytes=100_000)
    doc = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": 0, "line": "A" * 1_000_000}]}
    body = gzip.compress(orjson.dumps(doc))
    assert len(body) < 100_000
    r = await client.post("/api/v1/logs", data=body, headers={"Content-Encoding": "gzip"})
    assert r.status == 413
    assert count_logs(client) == 0


async def test_full_writer_queue_answers_503_with_retry_after(make_client):
    client = await make_client(queue_max_rows=150, batch_max_delay_s=0.5, retry_after_s=3)
    first = asyncio.ensure_future(post(client, "/api/v1/logs", {"instance_id": "C.1", "source": "a", "lines": lines(100)}))
    while client.writer.pending_rows == 0:  # the first request is queued (the writer lingers 0.5 s)
        await asyncio.sleep(0.001)
    r = await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": "b", "lines": lines(100)})
    assert r.status == 503
    assert r.headers["Retry-After"] == "3"
    assert (await r.json())["status"] == 503
    assert (await (await first).json())["accepted"] == 100
    assert db_rows(client, "SELECT DISTINCT source FROM logs") == [("a",)]


async def test_log_push_compat_numbers_lines_and_accepts_any_source(client):
    headers = {"X-Instance-Id": "C.32733029", "X-Log-Source": "my-new-source"}
    r = await client.post("/api/log-push", data="[entrypoint] one\n[entrypoint] two\r\n", headers=headers)
    assert await r.json() == {"ok": True, "accepted": 2, "duplicates": 0}
    r = await client.post("/api/log-push", data="three", headers=headers)
    assert (await r.json())["accepted"] == 1
    rows = db_rows(client, "SELECT source, seq, line FROM logs ORDER BY seq")
    assert rows == [("my-new-source", 0, "[entrypoint] one"), ("my-new-source", 1, "[entrypoint] two"), ("my-new-source", 2, "three")]


async def test_log_push_without_instance_header_is_400(client):
    r = await client.post("/api/log-push", data="x\n", headers={"X-Log-Source": "setup"})
    assert r.status == 400 and "X-Instance-Id" in (await r.json())["error"]
    assert count_logs(client) == 0


async def test_events_set_state_and_bench_run(client):
    events = [
        {"instance_id": "C.32733029", "kind": "registered", "ts": "2026-11-29T11:16:00Z", "machine_id": 55891,
         "host_id": 9001, "gpu_model": "RTX PRO 4000", "gpu_count": 1, "dph": 0.35, "location": "Norway"},
        {"instance_id": "C.32733029", "kind": "params_done", "ts": "2026-11-29T11:20:00Z"},
        {"instance_id": "C.32733029", "kind": "bench_started", "ts": "2026-11-29T11:20:48Z", "proofs": 12,
         "concurrency": 3, "partition_workers": 16},
        {"instance_id": "C.32733029", "kind": "bench_done", "ts": "2026-11-29T11:31:08Z", "exit_code": 1,
         "rate_per_hour": 0, "duration_s": 620.0, "proofs_ok": 0, "failure_excerpt": "CUDA error: out of memory"},
    ]
    r = await post(client, "/api/v1/events", events)
    assert await r.json() == {"ok": True, "accepted": 4, "duplicates": 0}
    r = await post(client, "/api/v1/events", events[-1])  # an agent's resend
    assert await r.json() == {"ok": True, "accepted": 0, "duplicates": 1}
    assert db_rows(client, "SELECT state FROM instance_state") == [("bench_done",)]
    assert db_rows(client, "SELECT machine_id, gpu_model, dph FROM instances") == [(55891, "RTX PRO 4000", 0.35)]
    assert db_rows(client, "SELECT proofs, concurrency, exit_code, rate_per_hour, failure_excerpt FROM bench_runs") == [
        (12, 3, 1, 0.0, "CUDA error: out of memory")
    ]


async def test_event_of_unknown_kind_is_400(client):
    r = await post(client, "/api/v1/events", {"instance_id": "C.1", "kind": "exploded", "ts": 1})
    assert r.status == 400 and "kind" in (await r.json())["error"]
    assert db_rows(client, "SELECT count(*) FROM events") == [(0,)]


async def test_metrics_push_is_stored(client):
    doc = {"instance_id": "C.1", "samples": [
        {"name": "gpu_utilization_percent", "ts": 1764415248, "value": 97, "labels": {"gpu": "0"}},
        {"name": "gpu_memory_used_bytes", "ts": 1764415248, "value": 2.1e10, "labels": {"gpu": "0"}},
    ]}
    assert (await (await post(client, "/api/v1/metrics", doc)).json())["accepted"] == 2
    rows = db_rows(client, "SELECT name, value, labels->>'gpu' FROM metrics ORDER BY name")
    assert rows == [("gpu_memory_used_bytes", 2.1e10, "0"), ("gpu_utilization_percent", 97.0, "0")]


async def test_metrics_with_string_value_is_400(client):
    doc = {"instance_id": "C.1", "samples": [{"name": "x", "ts": 1, "value": 1}, {"name": "y", "ts": 1, "value": "hot"}]}
    r = await post(client, "/api/v1/metrics", doc)
    assert r.status == 400 and "samples[1].value" in (await r.json())["error"]
    assert db_rows(client, "SELECT count(*) FROM metrics") == [(0,)]


async def test_flush_waits_for_commit(client):
    task = asyncio.ensure_future(post(client, "/api/v1/logs", {"instance_id": "C.1", "source": "a", "lines": lines(10)}))
    while client.writer.pending_rows == 0 and not task.done():
        await asyncio.sleep(0.001)
    await client.writer.flush()
    assert count_logs(client) == 10
    await task
