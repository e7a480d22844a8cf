"""``POST /api/v1/query``: one read-only SELECT → columns and rows (JSON, CSV or an Arrow IPC stream).

The Reader checks the SQL and runs it read-only, always rolled back (``ingest/db/reads.py``), and renders
its answer on its own thread, at most ``query_max_rows`` rows and ``query_max_result_bytes`` bytes
(413 beyond, ``ingest/db/answers.py``). The answer is held against the memory budget until it is sent."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ingest.contract import codec
from ingest.budget import ResultCharge
from ingest.errors import BadRequest
from ingest.web.http import read_body
from ingest.web.keys import BUDGET, DB, METRICS, SETTINGS
from ingest.db import sqlfiles as queryfiles
from ingest.timestamps import utcnow

MAX_QUERY_BODY_BYTES = 1024 * 1024


async def post_query(request: web.Request) -> web.StreamResponse:
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "csv", "arrow"):
        raise BadRequest(f"format: expected json, csv or arrow, got {fmt[:20]!r}")
    doc = codec.decode_json(await read_body(request, MAX_QUERY_BODY_BYTES))
    sql = doc.get("sql") if isinstance(doc, dict) else None
    if not isinstance(sql, str) or not sql.strip():
        raise BadRequest("sql: expected a non-empty string")
    given = doc.get("params") or {}
    if not isinstance(given, dict) or not all(isinstance(v, (str, int, float, bool)) for v in given.values()):
        raise BadRequest("params: expected an object of names to strings or numbers")
    settings = request.app[SETTINGS]
    params = queryfiles.bind(sql, given, {"now": utcnow(), "min_rate": settings.min_rate})
    charge = ResultCharge(request.app[BUDGET], asyncio.get_running_loop())
    try:
        answer = await request.app[DB].sql(sql, params, fmt=fmt, max_rows=settings.query_max_rows,
                                           max_bytes=settings.query_max_result_bytes, cover=charge.cover)
        response = web.StreamResponse(headers={"X-Fleetlog-Truncated": "1"} if answer.truncated else None)
        response.content_type = answer.content_type
        if fmt == "csv":
            response.charset = "utf-8"
        response.content_length = answer.size
        await response.prepare(request)
        try:
            for part in answer.parts:
                await response.write(part)
            await response.write_eof()
        except ConnectionResetError:  # the client left mid-answer: nobody to tell, nothing to log
            request.app[METRICS].client_disconnects.inc()
        return response
    finally:
        charge.close()
