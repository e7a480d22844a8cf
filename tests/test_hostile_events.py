"""Nothing stored can break a read or a rule: hostile events are refused at the door (400 naming the
field), the views treat whatever is already stored as data, and an admin can see and remove a bad
event without opening the database."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import replace

import orjson
import psycopg
import pytest

from ingest.db import store, writes
from ingest.app import create_app
from tests.fleet import get, incident, iso, rows, run_policies, utcnow
from tests.lake_pg import postgres  # noqa: F401 (a fixture)

ENROLL, READ, ADMIN = "enroll-5e1f", "read-77ab", "admin-90cd"
OOM = "C.32733029"  # tests.fleet.incident: failed with an OOM, logs complete: its destroy is due
EVIL = "C.evil"
T0 = 1795951000  # epoch seconds of the hostile events


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def policy_settings(settings):
    return replace(settings, policy_interval_s=0)  # the tests run the cycles themselves


async def assert_rules_still_answer(client) -> None:
    """The instance list, a policy cycle (the OOM instance's destroy is proposed) and the fleet gauges."""
    r = await client.get("/api/v1/instances")
    assert r.status == 200, await r.text()
    assert OOM in {i["instance_id"] for i in (await r.json())["instances"]}
    await run_policies(client)
    destroys = (await get(client, "/api/v1/decisions?action=destroy"))["decisions"]
    assert [d["subject"] for d in destroys] == [OOM]
    metrics = await (await client.get("/metrics")).text()
    assert 'fleetlog_fleet_failed_bench_runs{failure_class="oom"} 1.0' in metrics
    assert "fleetlog_fleet_incomplete_log_instances" in metrics


HOSTILE_LOGS_COMPLETE = {
    "quote in a sources key": ({"sources": {'nvidia"smi': 3}}, 'sources'),
    "backslash in a sources key": ({"sources": {"c:\\logs\\": 3}}, "sources"),
    "last seq 2^63": ({"sources": {"benchout": 2**63}}, "sources.benchout"),
    "quote in a dropped key": ({"sources": {"benchout": 3}, "dropped": {'nvidia"smi': 1}}, "dropped"),
    "dropped count 2^63": ({"sources": {"benchout": 3}, "dropped": {"benchout": 2**63}}, "dropped.benchout"),
    "control character in a sources key": ({"sources": {"bench\nout": 3}}, "sources"),
    "dropped not an object": ({"sources": {"benchout": 3}, "dropped": [1]}, "dropped"),
}


@pytest.mark.parametrize("fields, field", HOSTILE_LOGS_COMPLETE.values(), ids=HOSTILE_LOGS_COMPLETE.keys())
async def test_hostile_logs_complete_is_refused_naming_the_field(aiohttp_client, policy_settings, fields, field):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=True)
    event = {"instance_id": EVIL, "kind": "logs_complete", "ts": T0, **fields}
    r = await client.post("/api/v1/events", data=orjson.dumps(event))
    body = await r.json()
    assert r.status == 400, body
    assert body["error"].startswith(field + ":") or body["error"].startswith(field + "."), body
    assert rows(client, "SELECT count(*) FROM events WHERE instance_id = ?", [EVIL]) == [(0,)]
    await assert_rules_still_answer(client)


@pytest.mark.parametrize("source", ['nvidia"smi', "c:\\logs\\"])
async def test_log_push_source_follows_the_sources_key_rule(client, source):
    """One rule for a source name, wherever it comes from: a stream that could never be declared
    complete is not stored either."""
    for body in (
        {"instance_id": EVIL, "source": source, "lines": [{"seq": 0, "line": "x"}]},
        {"streams": [{"instance_id": EVIL, "source": source, "lines": [{"seq": 0, "line": "x"}]}]},
    ):
        r = await client.post("/api/v1/logs", data=orjson.dumps(body))
        assert r.status == 400 and "source:" in (await r.json())["error"], await r.text()
    r = await client.post("/api/log-push", data=b"x\n", headers={"X-Instance-Id": EVIL, "X-Log-Source": source})
    assert r.status == 400 and (await r.json())["error"].startswith("X-Log-Source:")
    assert rows(client, "SELECT count(*) FROM logs") == [(0,)]


def store_hostile_rows(path: str) -> None:
    """Rows the door refuses now, written straight into the file as an older server stored them."""
    con = store.open_database(path)
    try:
        def event(kind: str, ts: int, body: str) -> None:
            con.execute("INSERT INTO events VALUES (?, ?, make_timestamp(?), make_timestamp(?), ?)",
                        [EVIL, kind, ts * 1_000_000, ts * 1_000_000, body])

        con.execute("INSERT INTO instances (instance_id, first_seen, last_seen) VALUES (?, now(), now())", [EVIL])
        event("logs_complete", T0, r'{"kind": "logs_complete", "sources": {"nvidia\"smi": 1, "c:\\logs\\": 2, "benchout": 0}}')
        event("logs_complete", T0 + 1, '{"kind": "logs_complete", "sources": {"big": 9223372036854775808, '
                                       '"max": 9223372036854775807, "float": 1.8e19, "text": "x", "none": null}}')
        event("logs_complete", T0 + 2, r'{"kind": "logs_complete", "sources": {"benchout": 0}, "dropped": {"nvidia\"smi": 1, "benchout": 9223372036854775808}}')
        event("logs_complete", T0 + 3, '{"kind": "logs_complete", "sources": [5, 6], "dropped": "all"}')
        event("logs_complete", T0 + 4, '{"kind": "logs_complete", "sources": "benchout", "run_id": 7}')
        event("params_done", T0 + 5, '{"kind": "params_done", "exit_code": "not a number"}')
        event("params_done", T0 + 6, '{"kind": "params_done", "exit_code": 9223372036854775808}')
        con.execute("INSERT INTO logs VALUES (?, 'nvidia\"smi', '0', 0, now(), now(), 'x', false), "
                    "(?, 'nvidia\"smi', '0', 1, now(), now(), 'y', false)", [EVIL, EVIL])
        writes.recount_stream_lines(con, [EVIL])
        store.recount_stream_declarations(con, [EVIL])  # what an older server's rows left, as migration 022 counts them
    finally:
        con.close()


async def test_hostile_rows_already_stored_do_not_break_views_or_rules(aiohttp_client, policy_settings):
    store_hostile_rows(policy_settings.db)
    client = await aiohttp_client(create_app(policy_settings))
    await incident(client, utcnow() - dt.timedelta(seconds=30), logs_complete=True)
    for view in ("log_streams", "instance_logs", "bench_outcomes", "params_failures", "instance_phase", "failures"):
        rows(client, f"SELECT * FROM {view}")  # each answers
    streams = {s: (declared, complete) for s, declared, complete in rows(
        client, "SELECT source, declared_last_seq, complete FROM log_streams WHERE instance_id = ?", [EVIL])}
    assert streams['nvidia"smi'] == (1, False)  # declared and stored as data; dropped by the agent
    assert streams["c:\\logs\\"] == (2, False)
    assert streams["max"] == (2**63 - 1, False)
    assert streams["big"][0] is None and streams["float"][0] is None  # out of BIGINT: no declaration
    detail = await get(client, f"/api/v1/instances/{EVIL}")
    assert detail["logs"]['nvidia"smi']["lines"] == 2 and detail["logs_complete"] is False
    await assert_rules_still_answer(client)


async def test_admin_sees_and_removes_a_bad_event(aiohttp_client, policy_settings):
    store_hostile_rows(policy_settings.db)
    client = await aiohttp_client(create_app(replace(policy_settings, enroll_token=ENROLL, read_token=READ,
                                                     admin_token=ADMIN)))
    r = await client.post("/api/v1/events", headers=bearer(ENROLL), data=orjson.dumps(
        {"instance_id": "C.other", "kind": "registered", "ts": T0, "machine_id": 1}))
    instance_token = (await r.json())["tokens"]["C.other"]
    path = f"/api/v1/admin/events?instance_id={EVIL}&kind=logs_complete"
    assert (await client.get(path)).status == 401
    for token in (READ, instance_token, ENROLL):
        assert (await client.get(path, headers=bearer(token))).status == 403
    r = await client.get(path, headers=bearer(ADMIN))
    assert r.status == 200, await r.text()
    events = (await r.json())["events"]
    assert len(events) == 5 and all(e["instance_id"] == EVIL and e["kind"] == "logs_complete" for e in events)
    bad = events[0]
    assert 'nvidia\\"smi' in bad["body"]  # the stored JSON text, as stored
    target = f"/api/v1/admin/events?instance_id={EVIL}&kind=logs_complete&ts_us={bad['ts_us']}"
    assert (await client.delete(target)).status == 401
    for token in (READ, instance_token, ENROLL):
        assert (await client.delete(target, headers=bearer(token))).status == 403
    assert rows(client, "SELECT count(*) FROM events WHERE instance_id = ? AND kind = 'logs_complete'", [EVIL]) == [(5,)]
    r = await client.delete(target, headers=bearer(ADMIN))
    assert r.status == 200 and (await r.json()) == {"ok": True, "deleted": 1}, await r.text()
    r = await client.delete(target, headers=bearer(ADMIN))
    assert r.status == 404
    left = (await (await client.get(path, headers=bearer(ADMIN))).json())["events"]
    assert bad["ts_us"] not in {e["ts_us"] for e in left} and len(left) == 4
    r = await client.get("/api/v1/admin/events", headers=bearer(ADMIN))
    assert r.status == 400 and "instance_id" in (await r.json())["error"]
    r = await client.delete(f"/api/v1/admin/events?instance_id={EVIL}&kind=logs_complete&ts_us=x", headers=bearer(ADMIN))
    assert r.status == 400 and "ts_us" in (await r.json())["error"]


def nested_object(depth: int) -> bytes:
    """``{"a": {"a": ... "bottom"}}``, ``depth`` objects deep (built as text: orjson itself refuses to
    write more than 254 levels)."""
    return b'{"a": ' * depth + b'"bottom"' + b"}" * depth


@pytest.mark.parametrize("depth", [300, 1000])
async def test_deeply_nested_event_field_is_400_naming_it(client, depth):
    body = b'{"instance_id": "C.evil", "kind": "running", "ts": 1795951000, "extra": ' + nested_object(depth) + b"}"
    r = await client.post("/api/v1/events", data=body)
    assert r.status == 400, await r.text()
    error = (await r.json())["error"]
    assert error.startswith("extra:") and "deep" in error, error
    assert rows(client, "SELECT count(*) FROM events") == [(0,)]


async def test_deeply_nested_otlp_log_body_is_400(client):
    """OTLP/JSON: a log body of kvlists 1,000 deep is refused before anything is converted."""
    value = b'{"stringValue": "bottom"}'
    for _ in range(999):
        value = b'{"kvlistValue": {"values": [{"key": "a", "value": ' + value + b"}]}}"
    export = (b'{"resourceLogs": [{"resource": {"attributes": ['
              b'{"key": "service.instance.id", "value": {"stringValue": "C.evil"}},'
              b'{"key": "service.name", "value": {"stringValue": "benchout"}}]},'
              b'"scopeLogs": [{"logRecords": [{"body": ' + value + b"}]}]}]}")
    r = await client.post("/v1/logs", data=export, headers={"Content-Type": "application/json"})
    assert r.status == 400, await r.text()
    assert rows(client, "SELECT count(*) FROM logs") == [(0,)]


async def test_hostile_event_is_refused_with_an_instance_token(aiohttp_client, policy_settings):
    """The least powerful token of the issue: an instance's own."""
    client = await aiohttp_client(create_app(replace(policy_settings, enroll_token=ENROLL, read_token=READ,
                                                     admin_token=ADMIN)))
    r = await client.post("/api/v1/events", headers=bearer(ENROLL), data=orjson.dumps(
        {"instance_id": EVIL, "kind": "registered", "ts": T0, "machine_id": 1}))
    token = (await r.json())["tokens"][EVIL]
    r = await client.post("/api/v1/events", headers=bearer(token), data=orjson.dumps(
        {"instance_id": EVIL, "kind": "logs_complete", "ts": iso(utcnow()), "sources": {'nvidia"smi': 2**63}}))
    assert r.status == 400, await r.text()
    r = await client.get("/api/v1/instances", headers=bearer(READ))
    assert r.status == 200, await r.text()


async def test_deep_event_stored_by_an_older_server_still_renders(make_client, settings):
    """An older server stored bodies up to 254 levels deep (what orjson writes); the instance's page
    data gives such a body as its stored text rather than failing to render (500)."""
    con = store.open_database(settings.db)
    try:
        con.execute("INSERT INTO instances (instance_id, first_seen, last_seen) VALUES (?, now(), now())", [EVIL])
        con.execute("INSERT INTO events VALUES (?, 'running', now(), now(), ?)",
                    [EVIL, '{"kind": "running", "extra": ' + nested_object(252).decode() + "}"])
    finally:
        con.close()
    client = await make_client()
    detail = await get(client, f"/api/v1/instances/{EVIL}")
    assert detail["events"][0]["body"].startswith('{"kind": "running", "extra": {"a": {"a": ')
    assert (await client.get("/api/v1/instances")).status == 200


@pytest.mark.lake
async def test_lake_views_read_hostile_rows_and_admin_deletes_one(make_client, postgres, tmp_path):
    """Lake mode re-creates the views from the migrations at each start (010 included), and the
    admin's delete goes to PostgreSQL's events table."""
    dsn = postgres.createdb("t" + uuid.uuid4().hex[:12])
    client = await make_client(lake=dsn, lake_data=str(tmp_path / "lake"), lake_lease_s=3.0, policy_interval_s=0)
    with psycopg.connect(dsn.removeprefix("postgres:"), autocommit=True) as pg:
        pg.execute("INSERT INTO events VALUES (%s, 'logs_complete', '2026-11-29 11:00:00', now(), %s)",
                   [EVIL, r'{"sources": {"nvidia\"smi": 1, "big": 9223372036854775808}, "dropped": {"c:\\logs\\": 1}}'])
    streams = dict(rows(client, "SELECT source, declared_last_seq FROM log_streams WHERE instance_id = ?", [EVIL]))
    assert streams == {'nvidia"smi': 1, "big": None, "c:\\logs\\": None}
    assert (await client.get("/api/v1/instances")).status == 200
    events = (await get(client, f"/api/v1/admin/events?instance_id={EVIL}"))["events"]
    assert [e["kind"] for e in events] == ["logs_complete"]
    r = await client.delete(f"/api/v1/admin/events?instance_id={EVIL}&kind=logs_complete&ts_us={events[0]['ts_us']}")
    assert r.status == 200 and (await r.json())["deleted"] == 1, await r.text()
    assert rows(client, "SELECT count(*) FROM log_streams WHERE instance_id = ?", [EVIL]) == [(0,)]


NEGATIVE_NUMBERS = {
    "registered gpu_count": ("registered", "gpu_count", -1),
    "registered dph": ("registered", "dph", -5.0),
    "bench_done rate_per_hour": ("bench_done", "rate_per_hour", -45.7),
    "bench_done duration_s": ("bench_done", "duration_s", -1.0),
    "bench_done proofs_ok": ("bench_done", "proofs_ok", -3),
    "bench_started proofs": ("bench_started", "proofs", -12),
}


@pytest.mark.parametrize("kind, field, value", NEGATIVE_NUMBERS.values(), ids=NEGATIVE_NUMBERS.keys())
async def test_a_count_price_or_rate_below_zero_is_400_naming_it(client, kind, field, value):
    """A negative $/hour or GPU count made money figures negative (a machine that pays to be rented),
    a negative rate or proof count turns the rules' comparisons upside down: refused, nothing stored."""
    r = await client.post("/api/v1/events", data=orjson.dumps(
        {"instance_id": EVIL, "kind": kind, "ts": T0, field: value}))
    assert r.status == 400, await r.text()
    assert (await r.json())["error"].startswith(field), await r.text()
    assert rows(client, "SELECT count(*) FROM events") == [(0,)]
