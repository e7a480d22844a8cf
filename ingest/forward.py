"""Lake mode: a push for an instance this node does not own goes to the node that does.

Agents may point at any node (a plain load balancer in front): the JSON push endpoints
(``/api/v1/logs``, ``/api/v1/events``, ``/api/v1/metrics``) are split by owner (ingest/slots.py):
the part this node owns is handled here, each other part is POSTed to its owner's advertise URL
with the client's own Authorization header, and the answers are summed into one. A request that was
already forwarded is never forwarded again (a slot that moved meanwhile answers 503, and the client
retries). While a slot has no live owner (a node died and its lease has not expired), the push is
answered 503 with Retry-After; the client's retry is safe because every line and event is stored at
most once by its owner.

Not routed (handled by whichever node receives them): the plain-text ``/api/log-push`` and OTLP.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ingest.errors import Overloaded
from ingest.handlers.http import PRELOADED_BODY, json_response, read_body

logger = logging.getLogger(__name__)

PATHS = frozenset({"/api/v1/logs", "/api/v1/events", "/api/v1/metrics"})
FORWARDED = "X-Fleetlog-Forwarded"
SESSION = web.AppKey("forward_session", aiohttp.ClientSession)


async def session_ctx(app: web.Application):
    """The one HTTP client session forwards use (lake mode only)."""
    app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    yield
    await app[SESSION].close()


def _items(path: str, doc: Any) -> tuple[list[Any], Any] | None:
    """(the instance-owned items of a push body, a function rebuilding a body from some of them)."""
    if path == "/api/v1/logs" and isinstance(doc, dict) and isinstance(doc.get("streams"), list):
        return doc["streams"], lambda items: {"streams": items}
    if path == "/api/v1/events" and isinstance(doc, list):
        return doc, lambda items: items
    if isinstance(doc, dict):
        return [doc], lambda items: items[0]
    return None


def build_forward_middleware(slots_of, max_body_bytes: int, retry_after_s: int):
    """``slots_of(app)``: the node's ingest.slots.Slots, or None outside lake mode."""

    @web.middleware
    async def forward_middleware(request: web.Request, handler):
        slots = slots_of(request.app) if request.path in PATHS and request.method == "POST" else None
        if slots is None:
            return await handler(request)
        body = await read_body(request, max_body_bytes)
        request[PRELOADED_BODY] = body
        try:
            split = _items(request.path, orjson.loads(body))
        except orjson.JSONDecodeError:
            split = None
        if split is None or not all(isinstance(i, dict) and isinstance(i.get("instance_id"), str) for i in split[0]):
            return await handler(request)  # malformed: the handler names what is wrong
        items, rebuild = split
        groups: dict[str | None, list[Any]] = {}  # None: this node
        for item in items:
            where, url = slots.route(item["instance_id"])
            if where == "wait" or (where == "node" and FORWARDED in request.headers):
                raise Overloaded(f"instance {item['instance_id']!r}: its slot is changing owner; retry", retry_after_s=retry_after_s)
            groups.setdefault(url if where == "node" else None, []).append(item)
        if list(groups) == [None]:
            return await handler(request)
        answers: list[tuple[int, dict[str, str], bytes]] = []
        for url, part in groups.items():
            sub = orjson.dumps(rebuild(part))
            if url is None:
                request[PRELOADED_BODY] = sub
                response = await handler(request)
                answers.append((response.status, dict(response.headers), response.body))
            else:
                answers.append(await _post(request, url, sub, slots.node_id, retry_after_s))
        return _merge(answers)

    return forward_middleware


async def _post(request: web.Request, url: str, body: bytes, node_id: str, retry_after_s: int) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", FORWARDED: node_id}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    try:
        async with request.app[SESSION].post(url.rstrip("/") + request.path, data=body, headers=headers) as r:
            return r.status, dict(r.headers), await r.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        logger.warning("forward to %s failed: %s", url, e)
        raise Overloaded(f"the node owning this instance did not answer ({type(e).__name__}); retry",
                         retry_after_s=retry_after_s) from None


def _merge(answers: list[tuple[int, dict[str, str], bytes]]) -> web.Response:
    """One answer: the first failure as it came, else the counts summed (and tokens joined)."""
    for status, headers, body in answers:
        if status != 200:
            keep = {k: v for k, v in headers.items() if k in ("Retry-After",)}
            return web.Response(body=body, status=status, content_type="application/json", headers=keep)
    merged: dict[str, Any] = {"ok": True}
    for _status, _headers, body in answers:
        doc = orjson.loads(body)
        for key, value in doc.items():
            if isinstance(value, int) and not isinstance(value, bool):
                merged[key] = merged.get(key, 0) + value
            elif isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
    return json_response(merged)
