"""Read endpoints: instances, completeness, tails (from memory and from the database), SQL API."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ingest.app import create_app
from tests.test_push_api import lines, post


async def push_lines(client, n, *, source="benchdaemon", start=0, run_id="0", instance="C.32733029", text="line"):
    doc = {"instance_id": instance, "source": source, "run_id": run_id, "lines": lines(n, start, text)}
    r = await post(client, "/api/v1/logs", doc)
    assert r.status == 200, await r.text()


async def get_json(client, path, status=200):
    r = await client.get(path)
    assert r.status == status, await r.text()
    return await r.json()


async def test_instances_list_and_detail_show_state_and_bench(client):
    await post(client, "/api/v1/events", [
        {"instance_id": "C.32733029", "kind": "registered", "ts": 1, "machine_id": 55891, "gpu_model": "RTX PRO 4000"},
        {"instance_id": "C.32733029", "kind": "bench_started", "ts": 2, "proofs": 12},
        {"instance_id": "C.32733029", "kind": "bench_done", "ts": 3, "exit_code": 1, "rate_per_hour": 0},
        {"instance_id": "C.32733029", "kind": "killed", "ts": 4},
        {"instance_id": "C.5", "kind": "registered", "ts": 1, "machine_id": 777},
    ])
    listed = await get_json(client, "/api/v1/instances")
    states = {i["instance_id"]: i["state"] for i in listed["instances"]}
    assert states == {"C.32733029": "killed", "C.5": "registered"}
    only_killed = await get_json(client, "/api/v1/instances?state=killed")
    assert [i["instance_id"] for i in only_killed["instances"]] == ["C.32733029"]
    detail = await get_json(client, "/api/v1/instances/C.32733029")
    assert detail["machine_id"] == 55891 and detail["gpu_model"] == "RTX PRO 4000"
    assert [e["kind"] for e in detail["events"]] == ["registered", "bench_started", "bench_done", "killed"]
    assert detail["bench"]["exit_code"] == 1 and detail["bench"]["proofs"] == 12


async def test_unknown_instance_is_404_json(client):
    body = await get_json(client, "/api/v1/instances/C.nope", status=404)
    assert body == {"ok": False, "error": "instance 'C.nope' is not known", "status": 404}


async def test_logs_completeness_needs_logs_complete_and_no_gap(client):
    await push_lines(client, 10, source="benchout")
    await push_lines(client, 5, source="benchdaemon")
    await push_lines(client, 3, source="benchdaemon", start=7)  # 5 and 6 missing
    logs = (await get_json(client, "/api/v1/instances/C.32733029"))["logs"]
    assert logs["benchout"] == {"run_id": "0", "lines": 10, "last_seq": 9, "gaps": [], "declared_last_seq": None, "dropped": 0, "complete": False}
    assert logs["benchdaemon"]["gaps"] == [[5, 6]] and logs["benchdaemon"]["complete"] is False
    await post(client, "/api/v1/events", {"instance_id": "C.32733029", "kind": "logs_complete", "ts": 9,
                                          "sources": {"benchout": 9, "benchdaemon": 9, "setup": 2}})
    logs = (await get_json(client, "/api/v1/instances/C.32733029"))["logs"]
    assert logs["benchout"]["complete"] is True
    assert logs["benchdaemon"]["complete"] is False  # still a gap
    assert logs["setup"]["complete"] is False and logs["setup"]["gaps"] == [[0, 2]]  # declared, none arrived
    await push_lines(client, 2, source="benchdaemon", start=5)
    logs = (await get_json(client, "/api/v1/instances/C.32733029"))["logs"]
    assert logs["benchdaemon"]["complete"] is True


async def test_tail_returns_last_lines_oldest_first(client):
    await push_lines(client, 300)
    body = await get_json(client, "/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=5")
    assert [l["seq"] for l in body["lines"]] == [295, 296, 297, 298, 299]
    assert body["lines"][0] == {"source": "benchdaemon", "run_id": "0", "seq": 295, "ts": "2025-11-29T11:25:43.000000Z", "line": "line 295"}


async def test_tail_after_seq_follows_and_before_seq_pages_back(client):
    await push_lines(client, 50)
    after = await get_json(client, "/api/v1/instances/C.32733029/logs?source=benchdaemon&after_seq=45&tail=100")
    assert [l["seq"] for l in after["lines"]] == [46, 47, 48, 49]
    before = await get_json(client, "/api/v1/instances/C.32733029/logs?source=benchdaemon&before_seq=10&tail=3")
    assert [l["seq"] for l in before["lines"]] == [7, 8, 9]


async def test_tail_search_is_case_insensitive(client):
    await push_lines(client, 20)
    await push_lines(client, 1, start=20, text="CUDA error: out of memory during PCE extraction")
    body = await get_json(client, "/api/v1/instances/C.32733029/logs?q=cuda%20ERROR")
    assert [l["seq"] for l in body["lines"]] == [20]


async def test_tail_across_sources_orders_by_time(client):
    await push_lines(client, 3, source="benchout")
    await push_lines(client, 3, source="benchdaemon")
    body = await get_json(client, "/api/v1/instances/C.32733029/logs?tail=10")
    assert [(l["source"], l["seq"]) for l in body["lines"]] == [
        ("benchdaemon", 0), ("benchout", 0), ("benchdaemon", 1), ("benchout", 1), ("benchdaemon", 2), ("benchout", 2)
    ]


async def test_bad_tail_parameter_is_400(client):
    body = await get_json(client, "/api/v1/instances/C.1/logs?tail=lots", status=400)
    assert "tail" in body["error"]


async def test_tail_from_cache_matches_database_after_out_of_order_resends(make_client):
    client = await make_client(tail_cache_lines=50)
    await push_lines(client, 40, start=60)
    await push_lines(client, 60, start=0)  # older lines arrive late
    await push_lines(client, 5, start=100, run_id="1")  # a later run
    cached = await get_json(client, "/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=50")
    from_db = await get_json(client, "/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=50&q=line")
    assert cached == from_db
    assert [(l["run_id"], l["seq"]) for l in cached["lines"]][-6:] == [("0", 99), ("1", 100), ("1", 101), ("1", 102), ("1", 103), ("1", 104)]


async def test_tail_after_restart_loads_from_database_then_serves_from_memory(aiohttp_client, settings):
    first = await aiohttp_client(create_app(settings))
    await push_lines(first, 120)
    await first.close()
    second = await aiohttp_client(create_app(replace(settings, tail_cache_lines=100)))
    body = await get_json(second, "/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=10")
    assert [l["seq"] for l in body["lines"]] == list(range(110, 120))
    await push_lines(second, 3, start=120)
    body = await get_json(second, "/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=4")
    assert [l["seq"] for l in body["lines"]] == [119, 120, 121, 122]
    metrics = await (await second.get("/metrics")).text()
    assert "fleetlog_tailcache_hits_total 1.0" in metrics and "fleetlog_tailcache_misses_total 1.0" in metrics


@pytest.mark.parametrize("capacity", [20, 50, 200])
async def test_tail_loaded_after_restart_matches_the_table_with_holes_and_runs(aiohttp_client, settings, capacity):
    """The load after a restart reads only the rows from the index's floor on (or everything when the
    newest lines span runs): whatever the capacity, the tail is the table's."""
    first = await aiohttp_client(create_app(settings))
    await push_lines(first, 100)
    await push_lines(first, 40, start=110)  # a hole: 100..109
    await push_lines(first, 30, run_id="1")
    await push_lines(first, 5, source="other")
    await first.close()
    second = await aiohttp_client(create_app(replace(settings, tail_cache_lines=capacity)))
    n = min(capacity, 60)
    cached = await get_json(second, f"/api/v1/instances/C.32733029/logs?source=benchdaemon&tail={n}")
    from_db = await get_json(second, f"/api/v1/instances/C.32733029/logs?source=benchdaemon&tail={n}&q=line")
    assert cached == from_db and len(cached["lines"]) == n
    metrics = await (await second.get("/metrics")).text()
    assert "fleetlog_tailcache_misses_total 1.0" in metrics


async def test_resend_after_restart_is_still_deduplicated(aiohttp_client, settings):
    first = await aiohttp_client(create_app(settings))
    await push_lines(first, 30)
    await first.close()
    second = await aiohttp_client(create_app(settings))
    r = await post(second, "/api/v1/logs", {"instance_id": "C.32733029", "source": "benchdaemon", "lines": lines(35)})
    assert await r.json() == {"ok": True, "accepted": 5, "duplicates": 30}


@pytest.mark.parametrize(
    "sql, fragment",
    [
        ("COPY logs TO '/tmp/stolen.csv'", "only SELECT"),
        ("SELECT * FROM read_text('/etc/passwd')", "not allowed"),
        ("ATTACH '/tmp/other.duckdb' AS other", "only SELECT"),
        ("SELECT 1; SELECT 2", "exactly one statement"),
        ("DELETE FROM logs", "only SELECT"),
        ("SET enable_external_access = true", "only SELECT"),
        ("SELECT * FROM read_csv('http://example.com/x.csv')", "not allowed"),
        ("SELEC nonsense", "does not parse"),
    ],
)
async def test_query_api_refuses_writes_files_and_two_statements(client, sql, fragment):
    await push_lines(client, 3)
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": sql}))
    assert r.status == 400
    body = await r.json()
    assert body["ok"] is False and fragment in body["error"]
    check = await client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT count(*) FROM logs"}))
    assert (await check.json())["rows"] == [[3]]


async def test_query_api_returns_columns_rows_and_csv(client):
    await push_lines(client, 3)
    sql = "SELECT seq, line FROM logs ORDER BY seq"
    body = await (await client.post("/api/v1/query", data=orjson.dumps({"sql": sql}))).json()
    assert body == {"columns": ["seq", "line"], "rows": [[0, "line 0"], [1, "line 1"], [2, "line 2"]], "truncated": False}
    text = await (await client.post("/api/v1/query?format=csv", data=orjson.dumps({"sql": sql}))).text()
    assert text.splitlines() == ["seq,line", "0,line 0", "1,line 1", "2,line 2"]


async def test_query_api_row_limit_truncates(make_client):
    client = await make_client(query_max_rows=5)
    await push_lines(client, 20)
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT seq FROM logs ORDER BY seq"}))
    body = await r.json()
    assert len(body["rows"]) == 5 and body["truncated"] is True and r.headers["X-Fleetlog-Truncated"] == "1"


async def test_query_api_time_limit_interrupts(make_client):
    client = await make_client(query_timeout_s=0.2)
    sql = "SELECT count(*) FROM range(1000000000) a, range(1000) b WHERE a.range * b.range % 7 = 3"
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": sql}))
    assert r.status == 408
    assert "interrupted" in (await r.json())["error"]


async def test_health_ready_and_metrics(client):
    assert await get_json(client, "/healthz") == {"ok": True}
    assert (await get_json(client, "/readyz"))["ok"] is True
    await push_lines(client, 7)
    await post(client, "/api/v1/logs", {"instance_id": "C.1", "source": "x", "lines": [{"seq": -1, "line": "x"}]})
    text = await (await client.get("/metrics")).text()
    assert 'fleetlog_ingest_accepted_rows_total{kind="logs"} 7.0' in text
    assert 'fleetlog_ingest_rejected_requests_total{reason="bad_request"} 1.0' in text
    assert "fleetlog_ingest_queue_rows 0.0" in text
    assert "fleetlog_ingest_commit_seconds_count" in text


async def test_instance_list_carries_failure_class_and_log_completeness(client):
    await post(client, "/api/v1/events", [
        {"instance_id": "C.1", "kind": "bench_started", "ts": 1, "proofs": 12},
        {"instance_id": "C.1", "kind": "bench_done", "ts": 2, "exit_code": 1, "rate_per_hour": 0},
        {"instance_id": "C.1", "kind": "bench_started", "ts": 3, "proofs": 12},  # a newer run, still going
    ])
    await push_lines(client, 3, source="benchout", instance="C.1")
    await push_lines(client, 2, source="benchdaemon", instance="C.1")
    await post(client, "/api/v1/events", {"instance_id": "C.1", "kind": "logs_complete", "ts": 4,
                                          "sources": {"benchout": 2, "benchdaemon": 5}})
    [row] = (await get_json(client, "/api/v1/instances"))["instances"]
    assert row["exit_code"] is None and row["rate_per_hour"] is None  # the latest run, not the last finished one
    assert row["logs"] == {"sources": 2, "incomplete": ["benchdaemon"], "complete": False}


async def test_follow_streams_new_lines_as_they_are_stored(client):
    import asyncio

    await push_lines(client, 3)
    response = await client.get("/api/v1/instances/C.32733029/logs?source=benchdaemon&tail=2&follow=1")
    assert response.status == 200 and response.headers["Content-Type"] == "application/x-ndjson"
    first = [orjson.loads(await response.content.readline()) for _ in range(2)]
    assert [l["seq"] for l in first] == [1, 2]
    await push_lines(client, 2, start=3, text="new")
    later = [orjson.loads(await asyncio.wait_for(response.content.readline(), 10)) for _ in range(2)]
    assert [(l["seq"], l["line"]) for l in later] == [(3, "new 3"), (4, "new 4")]
    response.close()


async def test_follow_after_the_last_seq_sends_only_lines_stored_later(client):
    """A follower that reconnects with after_seq=N when nothing newer exists yet gets only what comes
    after N: never the stream again from seq 0."""
    import asyncio

    await push_lines(client, 3)
    response = await client.get("/api/v1/instances/C.32733029/logs?source=benchdaemon&after_seq=2&follow=1")
    assert response.status == 200
    await push_lines(client, 1, start=3, text="new")
    first = orjson.loads(await asyncio.wait_for(response.content.readline(), 10))
    assert (first["seq"], first["line"]) == (3, "new 3")
    response.close()


async def test_follow_without_source_is_400(client):
    body = await get_json(client, "/api/v1/instances/C.1/logs?follow=1", status=400)
    assert "follow" in body["error"]


async def test_query_api_answers_arrow_ipc(make_client):
    import pyarrow as pa

    client = await make_client(query_max_rows=5)
    await push_lines(client, 20)
    r = await client.post("/api/v1/query?format=arrow", data=orjson.dumps({"sql": "SELECT seq, line FROM logs ORDER BY seq"}))
    assert r.status == 200 and r.headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(await r.read()).read_all()
    assert table.column_names == ["seq", "line"] and table.column("seq").to_pylist() == [0, 1, 2, 3, 4]
    assert r.headers["X-Fleetlog-Truncated"] == "1"
    r = await client.post("/api/v1/query?format=arrow", data=orjson.dumps({"sql": "COPY logs TO 'x.csv'"}))
    assert r.status == 400
