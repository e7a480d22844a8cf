"""Lake mode's split of a JSON push by owner (ingest/web/forward.py ``split_json``), on its own: what it
keeps of the body, and what it holds while it works. The node that splits a body is charged
``EXPANSION`` bytes per body byte (ingest/budget.py), for the split, its own part's parse and the
wait for the owners together: the split itself must take a small share of that."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from ingest.budget import EXPANSION
from ingest.web.forward import split_json


def logs_body(instances: list[str], lines: int, line: str = "x" * 10) -> bytes:
    return orjson.dumps({"streams": [{"instance_id": i, "source": "s", "run_id": "r",
                                      "lines": [{"seq": j, "ts": 1.7e9 + j, "line": line} for j in range(lines)]}
                                     for i in instances]})


def test_splitting_short_lines_holds_little_beyond_the_body():
    body = logs_body(["C.1", "C.2", "C.3"], 20_000)
    tracemalloc.start()
    try:
        split = split_json("/api/v1/logs", body)
        parts = split.parts(["a", None, "b"])
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the whole body parsed into Python objects held 17.9x it (short lines); the charge is EXPANSION (6)x
    assert peak < 2 * len(body), (peak / len(body), EXPANSION)
    assert split.instance_ids == ["C.1", "C.2", "C.3"] and split.lines == 60_000
    assert sum(len(p) for p in parts.values()) < len(body) + 100


def test_each_part_is_its_items_bytes_as_sent():
    streams = [{"instance_id": i, "source": "s", "lines": [{"seq": 0, "ts": 1e9, "line": "é \\u00e9"}]}
               for i in ("C.1", "C.2", "C.3")]
    body = b'{ "streams" : [ ' + b" , ".join(orjson.dumps(s).replace(b"1000000000.0", b"1e9") for s in streams) + b" ] }"
    split = split_json("/api/v1/logs", body)
    parts = split.parts([None, "b", None])
    assert orjson.loads(parts[None]) == {"streams": [streams[0], streams[2]]}
    assert orjson.loads(parts["b"]) == {"streams": [streams[1]]}
    assert b"1e9" in parts["b"]  # not re-encoded: it cannot grow on the way to its owner
    assert split_json("/api/v1/logs", body).parts(["b", "b", "b"]) == {"b": body}  # one owner: the body as sent

    events = [{"instance_id": "C.1", "kind": "registered", "ts": 1}, {"instance_id": "C.2", "kind": "running", "ts": 2}]
    split = split_json("/api/v1/events", orjson.dumps(events))
    assert split.instance_ids == ["C.1", "C.2"] and split.kinds == ["registered", "running"]
    assert [orjson.loads(p) for p in split.parts(["a", "b"]).values()] == [[events[0]], [events[1]]]
    one = orjson.dumps({"instance_id": "C.9", "samples": []})
    assert split_json("/api/v1/metrics", one).parts(["a"]) == {"a": one}


@pytest.mark.parametrize("path, body", [
    ("/api/v1/logs", b"not json"),
    ("/api/v1/logs", b'{"streams": [1, 2]}'),
    ("/api/v1/logs", b'{"streams": "no"}'),
    ("/api/v1/logs", b'{"streams": [{"instance_id": "C.1", "lines": "no"}]}'),
    ("/api/v1/events", b"[]"),
    ("/api/v1/events", b'[{"instance_id": 7, "kind": "running"}]'),
    ("/api/v1/metrics", b"[1]"),
    ("/api/v1/logs", b'{"streams": []} trailing'),
])
def test_a_body_it_cannot_route_is_left_to_the_handler(path, body):
    assert split_json(path, body) is None  # the handler refuses it with the message one node gives


async def test_a_hung_owner_does_not_hold_the_forwards_to_a_healthy_one(aiohttp_server):
    """Pushes waiting on an owner that hangs (its lease still live) must not take every connection
    of the forwarding client: a push for an instance of a healthy owner goes through at once."""
    import asyncio

    from aiohttp import web

    from ingest.web.forward import Forwarder, forward_session

    release = asyncio.Event()
    arrived = 0

    async def hung(request: web.Request) -> web.Response:
        nonlocal arrived
        arrived += 1
        await release.wait()
        return web.json_response({"ok": True})

    async def healthy(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    apps = []
    for handler in (hung, healthy):
        app = web.Application()
        app.router.add_post("/api/v1/logs", handler)
        apps.append(await aiohttp_server(app))
    hung_url, healthy_url = (str(s.make_url("/")) for s in apps)

    class Slots:  # this node owns nothing; the route is not what this test is about
        node_id = "n1"

    async with forward_session(timeout_s=120) as session:
        forwarder = Forwarder(Slots(), session, retry_after_s=1)
        stuck = [asyncio.create_task(forwarder.post(hung_url, "/api/v1/logs", b"{}", {})) for _ in range(150)]
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while arrived < 20:  # the hung owner holds many of them
                assert asyncio.get_running_loop().time() < deadline, arrived
                await asyncio.sleep(0.05)
            status, _headers, _body = await asyncio.wait_for(
                forwarder.post(healthy_url, "/api/v1/logs", b"{}", {}), timeout=30)
            assert status == 200
        finally:
            release.set()
            await asyncio.gather(*stuck, return_exceptions=True)
