"""Enrollment with tokens on: whoever holds the image (the shared enrollment token) cannot get another
instance destroyed or its machine excluded, cannot flood registrations, an instance cannot move
itself onto a peer's machine, and an agent that resends its registration gets the same answer."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import orjson
import pytest

from ingest.app import create_app
from tests.fleet import OOM_DAEMON_LOG, iso, rows, run_policies, utcnow

ENROLL, READ, ADMIN = "enroll-5e1f", "read-77aa", "admin-0c9d"
XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus."


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


@pytest.fixture
async def secured(aiohttp_client, settings):
    return await aiohttp_client(create_app(replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN,
                                                   policy_interval_s=0)))


async def _events(client, events, token: str, **headers: str):
    return await client.post("/api/v1/events", data=orjson.dumps(events), headers=bearer(token, **headers))


async def _enroll(client, instance_id: str, machine_id: int, ts: float = 1795951000.0, **headers: str) -> str:
    r = await _events(client, {"instance_id": instance_id, "kind": "registered", "ts": ts, "machine_id": machine_id,
                               "host_id": machine_id * 10, "gpu_model": "RTX 4090", "gpu_count": 1}, ENROLL, **headers)
    doc = await r.json()
    assert r.status == 200, doc
    return doc["tokens"][instance_id]


async def _run(client, instance_id: str, token: str, *, done: dt.datetime, exit_code: int, rate: float | None,
               excerpt: str | None = None) -> None:
    """bench_started, bench_done and logs_complete, pushed with ``token``."""
    started = done - dt.timedelta(minutes=10)
    r = await _events(client, [
        {"instance_id": instance_id, "kind": "bench_started", "ts": iso(started), "proofs": 12},
        {"instance_id": instance_id, "kind": "bench_done", "ts": iso(done), "exit_code": exit_code,
         "rate_per_hour": rate, "duration_s": 600.0, "failure_excerpt": excerpt},
        {"instance_id": instance_id, "kind": "logs_complete", "ts": iso(done + dt.timedelta(seconds=1)), "sources": {"benchout": -1}},
    ], token)
    assert r.status == 200, await r.text()


def _decisions(client, subject: str) -> list[tuple[str, str]]:
    return rows(client, "SELECT action, state FROM decisions WHERE subject = ? ORDER BY id", [subject])


async def _host(client, machine_id: int) -> dict:
    r = await client.get(f"/api/v1/hosts/{machine_id}", headers=bearer(READ))
    assert r.status == 200, await r.text()
    return await r.json()


# -- 20.7: the shared enrollment token ----------------------------------------------------------------
async def test_forged_future_instance_gets_no_destroy_and_no_exclusion_when_the_operator_did_not_declare_it(secured):
    """The attack: the image's enrollment token registers a predictable, not-yet-seen id, and with the
    minted token forges a failed OOM run. Nothing the operator stood behind says this instance exists."""
    done = utcnow() - dt.timedelta(minutes=30)
    token = await _enroll(secured, "C.40000001", 55891)
    await _run(secured, "C.40000001", token, done=done, exit_code=1, rate=None, excerpt=OOM_DAEMON_LOG[3])
    await run_policies(secured, execute=True)
    assert _decisions(secured, "C.40000001") == []
    assert _decisions(secured, "55891") == []
    assert (await _host(secured, 55891))["eligible"] is True


async def test_declared_instance_that_fails_gets_its_destroy_and_excludes_its_machine(secured):
    """The deployer declares the id it created (admin token) before the container enrolls: its
    failures are acted on as before."""
    r = await secured.post("/api/v1/admin/instances", data=orjson.dumps({"instance_ids": ["C.40000002"]}),
                           headers=bearer(ADMIN))
    assert r.status == 200, await r.text()
    for token in (ENROLL, READ):
        r = await secured.post("/api/v1/admin/instances", data=orjson.dumps({"instance_ids": ["C.x"]}), headers=bearer(token))
        assert r.status == 403
    done = utcnow() - dt.timedelta(minutes=30)
    token = await _enroll(secured, "C.40000002", 55892)
    await _run(secured, "C.40000002", token, done=done, exit_code=1, rate=None, excerpt=OOM_DAEMON_LOG[3])
    await run_policies(secured)
    assert ("destroy", "proposed") in _decisions(secured, "C.40000002")
    assert "exclude_host" in [action for action, _state in _decisions(secured, "55892")]
    assert (await _host(secured, 55892))["eligible"] is False


async def test_declaring_an_id_the_shared_token_already_enrolled_is_409(secured):
    """Enrolled before the deployer said it exists: nobody can tell whose agent that was."""
    await _enroll(secured, "C.40000003", 55893)
    r = await secured.post("/api/v1/admin/instances", data=orjson.dumps({"instance_ids": ["C.40000003"]}),
                           headers=bearer(ADMIN))
    doc = await r.json()
    assert r.status == 409 and "C.40000003" in doc["error"], doc


async def test_declared_only_mode_refuses_an_undeclared_id_with_403(aiohttp_client, settings):
    client = await aiohttp_client(create_app(replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN,
                                                     policy_interval_s=0, enroll_declared_only=True)))
    event = {"instance_id": "C.40000004", "kind": "registered", "ts": 1795951000.0, "machine_id": 1}
    r = await _events(client, event, ENROLL)
    doc = await r.json()
    assert r.status == 403 and "C.40000004" in doc["error"] and "declare" in doc["error"], doc
    assert rows(client, "SELECT count(*) FROM instances") == [(0,)]
    r = await client.post("/api/v1/admin/instances", data=orjson.dumps({"instance_ids": ["C.40000004"]}), headers=bearer(ADMIN))
    assert r.status == 200
    assert (await _events(client, event, ENROLL)).status == 200


async def test_registration_flood_with_the_enrollment_token_gets_429_with_retry_after(secured):
    statuses = []
    for i in range(100):
        r = await _events(secured, {"instance_id": f"C.5{i:07d}", "kind": "registered", "ts": 1795951000.0}, ENROLL)
        statuses.append(r.status)
        if r.status == 429:
            assert int(r.headers["Retry-After"]) >= 1
            assert "registrations" in (await r.json())["error"]
            break
    assert statuses[-1] == 429, statuses
    assert set(statuses[:-1]) == {200}
    registered = rows(secured, "SELECT count(*) FROM instances")[0][0]
    assert registered == len(statuses) - 1 and registered <= 40


async def test_registering_many_ids_in_one_request_with_the_enrollment_token_is_413(secured):
    events = [{"instance_id": f"C.6{i:07d}", "kind": "registered", "ts": 1795951000.0} for i in range(1000)]
    r = await _events(secured, events, ENROLL)
    doc = await r.json()
    assert r.status == 413 and "enroll_max_ids_per_request" in doc["error"], doc
    assert rows(secured, "SELECT count(*) FROM instances") == [(0,)]


# -- 20.8: identity is fixed at registration ----------------------------------------------------------
async def test_instance_token_cannot_move_its_instance_onto_a_peer_machine(secured):
    """The attack: an instance re-registers with a healthy peer's machine_id, then fails with Xid 79."""
    for instance_id in ("C.peer", "C.evil"):
        await secured.post("/api/v1/admin/instances", data=orjson.dumps({"instance_ids": [instance_id]}), headers=bearer(ADMIN))
    done = utcnow() - dt.timedelta(minutes=30)
    peer = await _enroll(secured, "C.peer", 777)
    await _run(secured, "C.peer", peer, done=done - dt.timedelta(hours=1), exit_code=0, rate=50.0)
    evil = await _enroll(secured, "C.evil", 888)
    for field, value in (("machine_id", 777), ("host_id", 7770)):
        r = await _events(secured, {"instance_id": "C.evil", "kind": "registered", "ts": 1795952000.0 + value,
                                    field: value}, evil)
        doc = await r.json()
        assert r.status == 409 and field in doc["error"], doc
    await _run(secured, "C.evil", evil, done=done, exit_code=1, rate=None, excerpt=XID_79)
    await run_policies(secured)
    assert rows(secured, "SELECT machine_id, host_id FROM instances WHERE instance_id = 'C.evil'") == [(888, 8880)]
    assert _decisions(secured, "777") == []
    host = await _host(secured, 777)
    assert host["eligible"] is True and host["bad"] is False, host
    # the same values again change nothing and are fine; an admin may move it
    r = await _events(secured, {"instance_id": "C.evil", "kind": "registered", "ts": 1795953000.0, "machine_id": 888}, evil)
    assert r.status == 200, await r.text()
    r = await _events(secured, {"instance_id": "C.evil", "kind": "registered", "ts": 1795954000.0, "machine_id": 999}, ADMIN)
    assert r.status == 200, await r.text()
    assert rows(secured, "SELECT machine_id FROM instances WHERE instance_id = 'C.evil'") == [(999,)]


async def test_instance_token_names_its_machine_once_when_enrollment_named_none(secured):
    r = await _events(secured, {"instance_id": "C.late", "kind": "registered", "ts": 1795951000.0}, ENROLL)
    token = (await r.json())["tokens"]["C.late"]
    r = await _events(secured, {"instance_id": "C.late", "kind": "registered", "ts": 1795952000.0, "machine_id": 5,
                                "gpu_model": "H100"}, token)
    assert r.status == 200, await r.text()
    r = await _events(secured, {"instance_id": "C.late", "kind": "registered", "ts": 1795953000.0, "machine_id": 6}, token)
    assert r.status == 409 and "machine_id" in (await r.json())["error"]
    r = await _events(secured, {"instance_id": "C.late", "kind": "registered", "ts": 1795954000.0, "gpu_model": "H200"}, token)
    assert r.status == 200  # fields other than the identity still follow the latest registration
    assert rows(secured, "SELECT machine_id, gpu_model FROM instances WHERE instance_id = 'C.late'") == [(5, "H200")]


# -- 21.5: a resent enrollment gets the same answer ---------------------------------------------------
async def test_resent_enrollment_with_the_same_idempotency_key_gets_the_same_token(secured):
    key = "k" * 43
    first = await _enroll(secured, "C.70000001", 4, **{"Idempotency-Key": key})
    again = await _enroll(secured, "C.70000001", 4, **{"Idempotency-Key": key})  # the reply was lost: resent
    later = await _enroll(secured, "C.70000001", 4, ts=1795951500.0, **{"Idempotency-Key": key})  # a restarted agent
    assert first == again == later
    assert rows(secured, "SELECT count(*) FROM events WHERE instance_id = 'C.70000001'") == [(1,)]
    r = await secured.post("/api/v1/logs", headers=bearer(first), data=orjson.dumps(
        {"instance_id": "C.70000001", "source": "s", "lines": [{"seq": 0, "line": "x"}]}))
    assert r.status == 200
    for other in ({"Idempotency-Key": "o" * 43}, {}):  # another agent, or none: a clear 409
        r = await _events(secured, {"instance_id": "C.70000001", "kind": "registered", "ts": 1795951000.0}, ENROLL, **other)
        doc = await r.json()
        assert r.status == 409 and "another agent" in doc["error"] and "tokens" not in doc, doc
    # an admin re-issued the token: the key no longer brings the old one back
    assert (await secured.post("/api/v1/instances/C.70000001/token", headers=bearer(ADMIN))).status == 200
    r = await _events(secured, {"instance_id": "C.70000001", "kind": "registered", "ts": 1795951000.0}, ENROLL,
                      **{"Idempotency-Key": key})
    assert r.status == 409


async def test_a_weak_idempotency_key_is_400(secured):
    r = await _events(secured, {"instance_id": "C.70000002", "kind": "registered", "ts": 1795951000.0}, ENROLL,
                      **{"Idempotency-Key": "short"})
    doc = await r.json()
    assert r.status == 400 and "Idempotency-Key" in doc["error"], doc
