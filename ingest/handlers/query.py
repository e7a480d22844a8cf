"""``POST /api/v1/query``: one read-only SELECT → columns and rows (JSON, CSV or an Arrow IPC stream).

The Reader checks the SQL and runs it read-only, always rolled back (``ingest/reads.py``)."""

from __future__ import annotations

import csv
import io

from aiohttp import web

from ingest import codec
from ingest.errors import BadRequest
from ingest.handlers.http import json_response, read_body
from ingest.keys import DB, SETTINGS
from ingest import queryfiles
from ingest.policy import utcnow

MAX_QUERY_BODY_BYTES = 1024 * 1024


async def post_query(request: web.Request) -> web.Response:
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
    if fmt == "arrow":
        body, truncated = await request.app[DB].sql(sql, params, settings.query_max_rows, arrow=True)
        headers = {"X-Fleetlog-Truncated": "1"} if truncated else None
        return web.Response(body=body, content_type="application/vnd.apache.arrow.stream", headers=headers)
    columns, rows, truncated = await request.app[DB].sql(sql, params, settings.query_max_rows)
    headers = {"X-Fleetlog-Truncated": "1"} if truncated else None
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([["true" if v is True else "false" if v is False else v for v in row] for row in rows])
        return web.Response(text=out.getvalue(), content_type="text/csv", headers=headers)
    return json_response({"columns": columns, "rows": rows, "truncated": truncated}, headers=headers)
