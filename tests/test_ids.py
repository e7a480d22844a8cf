"""One id rule on every path: instance ids, sources and run ids that would read as options, or hide
control, tab or bidi-override characters, are refused with a 400 naming the field, and nothing is
written; the command actuator refuses to substitute them."""

from __future__ import annotations

import asyncio
import sys

import orjson
import pytest

from ingest.policy.actuator import ActuationError, CommandActuator
from ingest.web.keys import DB

BAD_IDS = ["--help", "-rf", "C.1\x1b[31m", "C.1\tx", "C.\u202e1", "C.\u200b1", "x" * 129, "", "  "]
GOOD_IDS = ["C.32733029", "a-b_c.d:e/f", "gpu 0", "Ünïcode-ok", "x" * 128]


def _count(client) -> int:
    cursor = client.app[DB].cursor()
    try:
        return sum(cursor.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("logs", "events", "metrics", "instances"))
    finally:
        cursor.close()


async def _refused(client, path: str, body: bytes, field: str, headers=None) -> None:
    r = await client.post(path, data=body, headers=headers or {"Content-Type": "application/json"})
    doc = await r.json()
    assert r.status == 400, (path, body[:120], r.status, doc)
    assert field in doc["error"], (field, doc["error"])


def _logs(instance_id="C.1", source="benchout", run_id="0") -> bytes:
    return orjson.dumps({"instance_id": instance_id, "source": source, "run_id": run_id,
                         "lines": [{"seq": 0, "ts": 1795951248.0, "line": "x"}]})


def _otlp_logs(instance_id="C.1", source="benchout", run_id="0") -> bytes:
    return orjson.dumps({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.instance.id", "value": {"stringValue": instance_id}}]},
        "scopeLogs": [{"logRecords": [{"body": {"stringValue": "x"}, "attributes": [
            {"key": "log.source", "value": {"stringValue": source}},
            {"key": "log.run_id", "value": {"stringValue": run_id}}]}]}]}]})


def _otlp_metrics(instance_id: str) -> bytes:
    return orjson.dumps({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.instance.id", "value": {"stringValue": instance_id}}]},
        "scopeMetrics": [{"metrics": [{"name": "gpu_util", "gauge": {"dataPoints": [{"asDouble": 1.0}]}}]}]}]})


async def test_bad_ids_are_refused_on_every_push_path_and_write_nothing(client):
    for bad in BAD_IDS:
        await _refused(client, "/api/v1/logs", _logs(instance_id=bad), "instance_id")
        await _refused(client, "/api/v1/logs", _logs(source=bad), "source")
        await _refused(client, "/api/v1/logs", _logs(run_id=bad), "run_id")
        await _refused(client, "/api/v1/logs", orjson.dumps({"streams": [orjson.loads(_logs(instance_id=bad))]}),
                       "streams[0].instance_id")
        await _refused(client, "/api/v1/events", orjson.dumps({"instance_id": bad, "kind": "running"}), "instance_id")
        await _refused(client, "/api/v1/events", orjson.dumps({"instance_id": "C.1", "kind": "logs_complete",
                                                               "sources": {"benchout": 3}, "run_id": bad}), "run_id")
        await _refused(client, "/api/v1/metrics", orjson.dumps({"instance_id": bad, "samples": [{"name": "m", "value": 1}]}),
                       "instance_id")
        if bad.strip():  # an empty attribute is a record that cannot be mapped (partial success), not a bad one
            await _refused(client, "/v1/logs", _otlp_logs(instance_id=bad), "service.instance.id")
            await _refused(client, "/v1/logs", _otlp_logs(source=bad), "log.source")
            await _refused(client, "/v1/logs", _otlp_logs(run_id=bad), "log.run_id")
            await _refused(client, "/v1/metrics", _otlp_metrics(bad), "service.instance.id")
    assert _count(client) == 0


async def test_bad_ids_in_log_push_headers_are_refused(client):
    port = client.server.port
    for bad in BAD_IDS:
        for header in ("X-Instance-Id", "X-Log-Source"):
            other = "X-Log-Source" if header == "X-Instance-Id" else "X-Instance-Id"
            raw = (f"POST /api/log-push HTTP/1.1\r\nHost: x\r\n{header}: ".encode() + bad.encode() +
                   f"\r\n{other}: ok\r\nContent-Length: 3\r\nConnection: close\r\n\r\nab\n".encode())
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            assert reply.split(b" ", 2)[1] == b"400", (bad, reply[:200])  # aiohttp's parser refuses ESC itself
            assert header.encode() in reply, (bad, reply)
    assert _count(client) == 0


async def test_good_ids_are_accepted_everywhere(client):
    for good in GOOD_IDS:
        r = await client.post("/api/v1/logs", data=_logs(instance_id=good, source=good, run_id=good))
        assert r.status == 200, (good, await r.text())
        r = await client.post("/api/v1/events", data=orjson.dumps({"instance_id": good, "kind": "running"}))
        assert r.status == 200
        r = await client.post("/v1/logs", data=_otlp_logs(instance_id=good, source=good), headers={"Content-Type": "application/json"})
        assert r.status == 200, await r.text()


@pytest.mark.parametrize("bad", ["--help", "-rf", "C.1\x1b[2J", "C.1\tx", "C.\u202e1"])
async def test_command_actuator_refuses_values_that_read_as_options(tmp_path, bad):
    marker = tmp_path / "ran"
    script = tmp_path / "fake_vastai.py"
    script.write_text(f"import sys\nopen({str(marker)!r}, 'w').write(repr(sys.argv[1:]))\n")
    actuator = CommandActuator(f"{sys.executable} {script} destroy instance {{instance_id}}", 10)
    with pytest.raises(ActuationError, match="instance_id"):
        await actuator.carry_out({"subject": bad, "action": "destroy", "id": 1, "evidence": {}})
    assert not marker.exists()
    assert await actuator.carry_out({"subject": "C.32733029", "action": "destroy", "id": 1, "evidence": {}})
    assert marker.read_text() == "['destroy', 'instance', 'C.32733029']"
