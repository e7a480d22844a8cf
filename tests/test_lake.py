"""The lake storage mode (ingest/db/lake/storage.py) against a real PostgreSQL and a real DuckLake: the same
push, read and SQL APIs, the same exactly-once, the same SQL guard."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest

from ingest.web.keys import CORE, DB
from ingest.db.lake.slots import SLOTS
from tests.lake_pg import postgres  # noqa: F401 (a fixture)
from tests.fleet import rows

pytestmark = pytest.mark.lake


@pytest.fixture
async def lake_client(make_client, postgres, tmp_path):
    dsn = postgres.createdb("t" + uuid.uuid4().hex[:12])
    client = await make_client(lake=dsn, lake_data=str(tmp_path / "lake"), lake_lease_s=3.0, policy_interval_s=0)
    slots = client.app[CORE].slots
    deadline = time.monotonic() + 60
    while len(slots.held()) < SLOTS:  # alone, the node takes every slot after one settling pass
        assert time.monotonic() < deadline, slots.held()
        await asyncio.sleep(0.05)
    return client


def lines(n: int, start: int = 0) -> list[dict]:
    return [{"seq": s, "ts": 1764415248.0 + s, "line": f"line {s}"} for s in range(start, start + n)]


async def post(client, path: str, doc, **kw):
    return await client.post(path, data=orjson.dumps(doc), headers={"Content-Type": "application/json"}, **kw)


async def test_lake_logs_land_in_the_lake_and_keyed_tables_in_postgres(lake_client):
    r = await post(lake_client, "/api/v1/logs", {"instance_id": "C.1", "source": "benchout", "lines": lines(3)})
    assert await r.json() == {"ok": True, "accepted": 3, "duplicates": 0}
    assert rows(lake_client, "SELECT seq, line FROM lake.main.logs ORDER BY seq") == [(s, f"line {s}") for s in range(3)]
    assert rows(lake_client, "SELECT instance_id FROM pg.public.instances") == [("C.1",)]
    assert rows(lake_client, "SELECT count(*) FROM logs") == [(3,)]  # the same unqualified name


async def test_lake_resend_is_counted_not_doubled(lake_client):
    doc = {"instance_id": "C.1", "source": "benchout", "run_id": "r1", "lines": lines(5)}
    assert (await (await post(lake_client, "/api/v1/logs", doc)).json())["accepted"] == 5
    doc["lines"] = lines(8)
    assert await (await post(lake_client, "/api/v1/logs", doc)).json() == {"ok": True, "accepted": 3, "duplicates": 5}
    assert rows(lake_client, "SELECT count(*), count(DISTINCT seq) FROM logs") == [(8, 8)]


async def test_lake_events_dedupe_and_bench_runs_match(lake_client):
    events = [
        {"instance_id": "C.1", "kind": "registered", "ts": 1795951000, "machine_id": 7, "gpu_model": "RTX 4090"},
        {"instance_id": "C.1", "kind": "bench_started", "ts": 1795951010, "proofs": 4},
        {"instance_id": "C.1", "kind": "bench_done", "ts": 1795951100, "exit_code": 0, "rate_per_hour": 31.5},
    ]
    for event in events:
        assert (await post(lake_client, "/api/v1/events", event)).status == 200
    again = await (await post(lake_client, "/api/v1/events", events[1])).json()
    assert again.get("duplicates") == 1, again
    assert rows(lake_client, "SELECT count(*) FROM events") == [(3,)]
    assert rows(lake_client, "SELECT machine_id, gpu_model FROM instances") == [(7, "RTX 4090")]
    assert rows(lake_client, "SELECT proofs, exit_code, rate_per_hour FROM bench_runs") == [(4, 0, 31.5)]
    detail = await (await lake_client.get("/api/v1/instances/C.1")).json()
    assert detail["state"] == "bench_done" and detail["rate_per_hour"] == 31.5, detail


async def test_lake_tail_and_metrics_read_back(lake_client):
    await post(lake_client, "/api/v1/logs", {"instance_id": "C.2", "source": "cuzk", "lines": lines(50)})
    r = await lake_client.get("/api/v1/instances/C.2/logs?source=cuzk&tail=3")
    assert [line["seq"] for line in (await r.json())["lines"]] == [47, 48, 49]
    r = await post(lake_client, "/api/v1/metrics", {"instance_id": "C.2", "samples": [
        {"name": "gpu_util", "ts": 1795951000, "value": 97.0, "labels": {"gpu": "0"}}]})
    assert r.status == 200, await r.text()
    assert rows(lake_client, "SELECT name, value FROM lake.main.metrics") == [("gpu_util", 97.0)]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM instance_tokens",
    "SELECT * FROM pg.public.instance_tokens",
    "SELECT * FROM ducklake_snapshot",
    "SELECT * FROM ducklake_data_file",
    "SELECT * FROM postgres_query('pg', 'SELECT * FROM instance_tokens')",
    "SELECT * FROM read_parquet('/etc/passwd')",
    "SELECT * FROM lake.main.logs",
    "SELECT * FROM ducklake_snapshots('lake')",
    "WITH x AS (DELETE FROM logs RETURNING *) SELECT * FROM x",
])
async def test_lake_sql_guard_refuses_secrets_files_and_the_catalog(lake_client, sql):
    await post(lake_client, "/api/v1/logs", {"instance_id": "C.1", "source": "s", "lines": lines(2)})
    r = await post(lake_client, "/api/v1/query", {"sql": sql})
    assert r.status == 400, (sql, await r.text())
    assert rows(lake_client, "SELECT count(*) FROM logs") == [(2,)]


async def test_lake_sql_api_reads_lake_and_postgres_tables_in_one_statement(lake_client):
    await post(lake_client, "/api/v1/events", {"instance_id": "C.1", "kind": "registered", "ts": 1795951000, "machine_id": 7})
    await post(lake_client, "/api/v1/logs", {"instance_id": "C.1", "source": "s", "lines": lines(4)})
    r = await post(lake_client, "/api/v1/query", {"sql": "SELECT i.machine_id, count(*) FROM logs l JOIN instances i USING (instance_id) GROUP BY 1"})
    assert r.status == 200, await r.text()
    assert (await r.json())["rows"] == [[7, 4]]


async def test_lake_maintenance_merges_commit_files_and_keeps_every_line(lake_client):
    for batch in range(12):  # one commit each: one Parquet file each
        doc = {"instance_id": "C.1", "source": "s", "lines": lines(200, start=batch * 200)}
        assert (await (await post(lake_client, "/api/v1/logs", doc)).json())["accepted"] == 200
    from ingest.db.lake import storage as lake

    counts = lake.maintain(lake_client.app[DB], snapshot_keep_s=0)
    assert counts["files_after"] < counts["files_before"], counts
    assert rows(lake_client, "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM logs") == [(2400, 2400, 0, 2399)]
    more = await (await post(lake_client, "/api/v1/logs", {"instance_id": "C.1", "source": "s", "lines": lines(5, start=2398)})).json()
    assert more == {"ok": True, "accepted": 3, "duplicates": 2}
    r = await lake_client.get("/api/v1/instances/C.1/logs?source=s&tail=2")
    assert [line["seq"] for line in (await r.json())["lines"]] == [2401, 2402]


def _pg(client):
    import psycopg

    return psycopg.connect(client.app[CORE].settings.lake.removeprefix("postgres:"), autocommit=True)


async def test_lake_commit_is_fenced_when_another_node_took_the_slot(lake_client):
    assert (await (await post(lake_client, "/api/v1/logs", {"instance_id": "C.9", "source": "s", "lines": lines(2)})).json())["accepted"] == 2
    with _pg(lake_client) as conn:  # another node takes every slot; this one has not noticed yet
        conn.execute("UPDATE fleetlog_slots SET owner = 'thief', url = 'http://127.0.0.1:9', token = token + 1, "
                     "expires_at = now() + interval '1 hour'")
    r = await post(lake_client, "/api/v1/logs", {"instance_id": "C.9", "source": "s", "lines": lines(3, start=2)})
    assert r.status == 503 and r.headers["Retry-After"] == "1", await r.text()
    r = await post(lake_client, "/api/v1/events", {"instance_id": "C.9", "kind": "registered", "ts": 1795951000})
    assert r.status == 503, await r.text()
    assert rows(lake_client, "SELECT count(*) FROM logs") == [(2,)]
    assert rows(lake_client, "SELECT count(*) FROM events") == [(0,)]


def test_lake_one_policy_runner_at_a_time(postgres):  # noqa: F811
    from ingest.db.lake.slots import Slots

    dsn = postgres.createdb("p" + uuid.uuid4().hex[:12]).removeprefix("postgres:")
    a, b = Slots(dsn, "a", "http://a", 3.0), Slots(dsn, "b", "http://b", 3.0)
    a.start()
    b.start()
    try:
        assert a.try_policy_lock() is True
        assert b.try_policy_lock() is False
        assert a.try_policy_lock() is True  # kept between cycles
        a.stop()  # the node goes away: its session, and the lock with it (once PostgreSQL notices)
        deadline = time.monotonic() + 30
        while not b.try_policy_lock():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        a.stop()
        b.stop()


async def _fleet_decisions(client) -> dict:
    """tests/fleet.py's incident with a healthy, a slow, a fast and a degraded machine; two policy cycles (before
    and after logs_complete); what was decided, classified and gated."""
    import datetime as dt

    from tests.fleet import bench_instance, complete_logs, degraded_machine, incident, utcnow

    policy = client.app[CORE].policy
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=False)
    healthy = utcnow() - dt.timedelta(hours=2)
    await bench_instance(client, "C.40", 777, done=healthy, exit_code=0, rate=40.0, dph=0.8)
    await bench_instance(client, "C.31", 777, done=healthy + dt.timedelta(hours=1), exit_code=0, rate=31.0, dph=0.8)
    await bench_instance(client, "C.slow", 900, done=done, exit_code=0, rate=12.5)
    await complete_logs(client, "C.slow", done, {"benchout": -1})
    await degraded_machine(client, done)  # machine 782: 60, then 30 (migration 016's view, rule 35)
    first = await policy.run_cycle(False)
    await complete_logs(client, "C.32733029", done, {"benchdaemon": 4, "benchout": 3})
    second = await policy.run_cycle(False)
    decisions = await (await client.get("/api/v1/decisions")).json()
    hosts = await (await client.get("/api/v1/hosts")).json()
    return {
        "cycles": [(r.classified, len(r.new_decisions)) for r in (first, second)],
        "decisions": sorted((d["rule"], d["subject"], d["action"], d["reason"], d["state"]) for d in decisions["decisions"]),
        "classes": rows(client, "SELECT instance_id, failure_class, failure_line FROM bench_runs ORDER BY 1"),
        "hosts": sorted((h["machine_id"], h["bad"], h["eligible"], h["best_rate"], h["runs"], h["recent_rate"], h["degraded"],
                         h["degradation"]) for h in hosts["hosts"]),
    }


async def test_lake_policies_decide_as_the_single_file_does(make_client, lake_client):
    single = await make_client(policy_interval_s=0)
    expected = await _fleet_decisions(single)
    assert any(d[2] == "destroy" for d in expected["decisions"]), expected  # the scenario decides something
    assert any(d[:3] == ("degraded_hosts", "782", "flag_degraded") for d in expected["decisions"]), expected
    assert await _fleet_decisions(lake_client) == expected


async def test_lake_node_keeps_committing_after_a_slot_it_wrote_moves_away(lake_client):
    from ingest.db.lake.slots import slot_of

    gone, kept = "C.9", next(f"C.{k}" for k in range(100, 1000) if slot_of(f"C.{k}") != slot_of("C.9"))
    for start in (0, 2):  # the second push leaves C.9's last_seen due for the next touch (once a second)
        doc = {"instance_id": gone, "source": "s", "lines": lines(2, start=start)}
        assert (await (await post(lake_client, "/api/v1/logs", doc)).json())["accepted"] == 2
    with _pg(lake_client) as conn:  # another node takes C.9's slot only
        conn.execute("UPDATE fleetlog_slots SET owner = 'thief', url = 'http://127.0.0.1:9', token = token + 1, "
                     "expires_at = now() + interval '1 hour' WHERE slot = %s", [slot_of(gone)])
    deadline = time.monotonic() + 60
    while slot_of(gone) in lake_client.app[CORE].slots.held():  # its next renewal finds the slot taken
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    started = time.monotonic()
    for start in range(0, 12, 2):  # past the last_seen step: the touch of C.9 must not fence these out
        r = await post(lake_client, "/api/v1/logs", {"instance_id": kept, "source": "s", "lines": lines(2, start=start)})
        assert r.status == 200, await r.text()
        await asyncio.sleep(0.3)
    assert time.monotonic() - started > 1.0
    assert rows(lake_client, "SELECT count(*) FROM logs WHERE instance_id = ?", [kept]) == [(12,)]
