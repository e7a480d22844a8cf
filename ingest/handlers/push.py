"""Write endpoints: parse and validate, then hand rows to the writer. 200 only after commit."""

from __future__ import annotations

from aiohttp import web

from ingest import codec
from ingest.handlers.http import json_response, read_body
from ingest.keys import SETTINGS, WRITER


async def _write(request: web.Request, kind: str, **rows) -> web.Response:
    result = await request.app[WRITER].submit(kind=kind, **rows)
    return json_response({"ok": True, "accepted": result.accepted, "duplicates": result.duplicates})


async def post_logs(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    chunks = codec.parse_logs(codec.decode_json(body), settings.max_line_bytes, codec.now_us())
    return await _write(request, "logs", logs=chunks)


async def post_log_push(request: web.Request) -> web.Response:
    """The old manager's plain-text push; any source name; the server numbers the lines."""
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    chunk = codec.parse_plain_lines(
        body,
        request.headers.get("X-Instance-Id"),
        request.headers.get("X-Log-Source"),
        settings.max_line_bytes,
        codec.now_us(),
    )
    return await _write(request, "logs", logs=[chunk])


async def post_events(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    events = codec.parse_events(codec.decode_json(body), codec.now_us())
    return await _write(request, "events", events=events)


async def post_metrics(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    rows = codec.parse_metrics(codec.decode_json(body), codec.now_us())
    return await _write(request, "metrics", metrics=rows)
