"""Who may push or read what, with tokens on; per-instance rate limits."""

from __future__ import annotations

import logging
from dataclasses import replace

import orjson
import pytest

from ingest.app import create_app

ENROLL, READ, ADMIN = "enroll-7f3a", "read-91bc", "admin-c2d4"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def secured(aiohttp_client, settings):
    secured_settings = replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN, policy_interval_s=0)
    return await aiohttp_client(create_app(secured_settings))


async def register(client, instance_id: str) -> str:
    event = {"instance_id": instance_id, "kind": "registered", "ts": 1795951000, "machine_id": 55891}
    r = await client.post("/api/v1/events", data=orjson.dumps(event), headers=bearer(ENROLL))
    body = await r.json()
    assert r.status == 200, body
    return body["tokens"][instance_id]


def logs(instance_id: str, n: int = 3, start: int = 0) -> bytes:
    return orjson.dumps({"instance_id": instance_id, "source": "benchout",
                         "lines": [{"seq": s, "line": f"l{s}"} for s in range(start, start + n)]})


async def count_lines(client) -> int:
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT count(*) FROM logs"}), headers=bearer(READ))
    return (await r.json())["rows"][0][0]


async def test_no_token_is_401_everywhere_but_health(secured):
    for method, path in (("POST", "/api/v1/logs"), ("GET", "/api/v1/instances"), ("POST", "/api/v1/query"),
                         ("GET", "/metrics"), ("POST", "/api/v1/hosts/1/exclude"), ("POST", "/v1/logs")):
        r = await secured.request(method, path, data=b"{}")
        assert r.status == 401, path
        assert (await r.json()) == {"ok": False, "error": "a token is required: Authorization: Bearer <token>", "status": 401}
    r = await secured.get("/api/v1/instances", headers=bearer("guess"))
    assert r.status == 401 and (await r.json())["error"] == "unknown token"
    assert (await secured.get("/healthz")).status == 200


async def test_instance_token_pushes_only_for_its_own_instance(secured):
    token = await register(secured, "C.32733029")
    r = await secured.post("/api/v1/logs", data=logs("C.32733029"), headers=bearer(token))
    assert r.status == 200 and (await r.json())["accepted"] == 3
    r = await secured.post("/api/v1/logs", data=logs("C.other"), headers=bearer(token))
    assert r.status == 403 and "C.32733029" in (await r.json())["error"]
    r = await secured.post("/api/log-push", data=b"x\n", headers={**bearer(token), "X-Instance-Id": "C.other", "X-Log-Source": "setup"})
    assert r.status == 403
    r = await secured.post("/api/v1/logs", data=logs("C.32733029", start=3), headers=bearer(ENROLL))
    assert r.status == 403 and "only register" in (await r.json())["error"]
    r = await secured.get("/api/v1/instances", headers=bearer(token))
    assert r.status == 403  # an instance token cannot read the fleet
    assert await count_lines(secured) == 3


async def test_read_token_reads_but_cannot_push_or_judge(secured):
    assert (await secured.get("/api/v1/instances", headers=bearer(READ))).status == 200
    assert (await secured.get("/metrics", headers=bearer(READ))).status == 200
    assert (await secured.post("/api/v1/logs", data=logs("C.1"), headers=bearer(READ))).status == 403
    assert (await secured.post("/api/v1/hosts/55891/exclude", data=b"{}", headers=bearer(READ))).status == 403
    assert (await secured.post("/api/v1/policy/run?execute=1", headers=bearer(READ))).status == 403
    r = await secured.post("/api/v1/hosts/55891/exclude", data=orjson.dumps({"reason": "bad PSU"}), headers=bearer(ADMIN))
    assert r.status == 200 and (await r.json())["bad"] is True
    assert await count_lines(secured) == 0


async def test_instance_token_survives_restart(aiohttp_client, settings):
    secured_settings = replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN, policy_interval_s=0)
    first = await aiohttp_client(create_app(secured_settings))
    token = await register(first, "C.7")
    await first.close()
    second = await aiohttp_client(create_app(secured_settings))
    assert (await second.post("/api/v1/logs", data=logs("C.7"), headers=bearer(token))).status == 200


async def test_tokens_never_reach_the_log(aiohttp_client, settings, caplog):
    caplog.set_level(logging.DEBUG)
    secured_settings = replace(settings, enroll_token=ENROLL, read_token=READ, admin_token=ADMIN, policy_interval_s=0)
    client = await aiohttp_client(create_app(secured_settings))
    token = await register(client, "C.8")
    await client.post("/api/v1/logs", data=logs("C.8"), headers=bearer(token))
    await client.get("/api/v1/instances", headers=bearer("wrong-token-value"))
    await client.close()
    for secret in (ENROLL, READ, ADMIN, token, "wrong-token-value"):
        assert secret not in caplog.text


async def test_noisy_instance_gets_429_and_others_do_not(make_client):
    client = await make_client(instance_max_rows_per_s=100)
    assert (await client.post("/api/v1/logs", data=logs("C.noisy", 150))).status == 200  # within the burst of 200
    r = await client.post("/api/v1/logs", data=logs("C.noisy", 100, start=150))
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert (await r.json())["status"] == 429
    assert (await client.post("/api/v1/logs", data=logs("C.quiet", 150))).status == 200
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT instance_id, count(*) FROM logs GROUP BY 1 ORDER BY 1"}))
    assert (await r.json())["rows"] == [["C.noisy", 150], ["C.quiet", 150]]
