"""Machines (the deploy gate and operator verdicts), decisions, and running the policies on demand."""

from __future__ import annotations

import functools

from aiohttp import web

from ingest.contract import codec
from ingest.db import writes
from ingest.auth import ADMIN, requires
from ingest.errors import BadRequest, NotFound
from ingest.web.http import int_param, json_response, read_body
from ingest.web.keys import CORE, DB, SETTINGS
from ingest.timestamps import utcnow

MAX_VERDICT_BODY_BYTES = 64 * 1024


def _machine_id(request: web.Request) -> int:
    raw = request.match_info["machine_id"]
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"machine_id: expected an integer, got {raw[:40]!r}") from None


async def _hosts(request: web.Request, machine_id: int | None) -> list[dict]:
    return await request.app[DB].hosts(request.app[CORE].hosts_sql, request.app[SETTINGS].min_rate, utcnow(), machine_id)


async def get_hosts(request: web.Request) -> web.Response:
    return json_response({"hosts": await _hosts(request, None)})


async def get_host(request: web.Request) -> web.Response:
    rows = await _hosts(request, _machine_id(request))
    if not rows:
        raise NotFound(f"machine {request.match_info['machine_id']} is not known")
    return json_response(rows[0])


async def _verdict(request: web.Request, verdict: str) -> web.Response:
    machine_id = _machine_id(request)
    body = await read_body(request, MAX_VERDICT_BODY_BYTES)
    doc = codec.decode_json(body) if body.strip() else {}
    if not isinstance(doc, dict):
        raise BadRequest("body: expected an object {\"reason\", \"expires_s\"?}")
    reason = doc.get("reason", "")
    if not isinstance(reason, str):
        raise BadRequest("reason: expected a string")
    expires_s = doc.get("expires_s")
    if expires_s is not None and (isinstance(expires_s, bool) or not isinstance(expires_s, (int, float)) or expires_s <= 0):
        raise BadRequest("expires_s: expected a positive number of seconds")
    now = utcnow()
    store = functools.partial(writes.store_verdict, machine_id=machine_id, verdict=verdict, reason=reason or "by operator",
                              now=now, expires_s=expires_s)
    await request.app[CORE].writer.execute(store, kind="verdict")
    rows = await _hosts(request, machine_id)
    return json_response(rows[0])


@requires(ADMIN)
async def post_exclude(request: web.Request) -> web.Response:
    return await _verdict(request, "exclude")


@requires(ADMIN)
async def post_include(request: web.Request) -> web.Response:
    return await _verdict(request, "include")


async def get_decisions(request: web.Request) -> web.Response:
    q = request.query
    rows = await request.app[DB].decisions(
        state=q.get("state") or None, action=q.get("action") or None, subject=q.get("subject") or None,
        limit=int_param(request, "limit", 200, minimum=1, maximum=10_000),
    )
    return json_response({"decisions": rows})


@requires(ADMIN)
async def post_policy_run(request: web.Request) -> web.Response:
    """Run the rules once now; ``?execute=1`` carries out what they decide (else the server's setting)."""
    raw = request.query.get("execute")
    if raw not in (None, "0", "1", "true", "false"):
        raise BadRequest("execute: expected 0 or 1")
    execute = request.app[SETTINGS].policy_execute if raw is None else raw in ("1", "true")
    report = await request.app[CORE].policy.run_cycle(execute)
    return json_response({"ok": True, **report.as_dict()})
