"""Write endpoints: parse and validate, check who may push it, then hand rows to the writer.
200 only after commit."""

from __future__ import annotations

from aiohttp import web

from ingest import codec
from ingest.auth import OPEN, PRINCIPAL, PUSH, Principal, check_instances, requires
from ingest.handlers.http import json_response, read_body
from ingest.keys import LIMITER, SETTINGS, TOKENS, WRITER


def admit(request: web.Request, rows_by_instance: dict[str, int], kinds: set[str] | None = None) -> Principal:
    """The token may push for these instances, and they are within their rate."""
    principal = request.get(PRINCIPAL, OPEN)
    check_instances(principal, set(rows_by_instance), kinds)
    limiter = request.app[LIMITER]
    for instance_id, rows in rows_by_instance.items():
        limiter.take(instance_id, rows)
    return principal


async def _write(request: web.Request, kind: str, **rows) -> web.Response:
    result = await request.app[WRITER].submit(kind=kind, **rows)
    return json_response({"ok": True, "accepted": result.accepted, "duplicates": result.duplicates})


def _log_rows(chunks: list[codec.LogChunk]) -> dict[str, int]:
    out: dict[str, int] = {}
    for chunk in chunks:
        out[chunk.instance_id] = out.get(chunk.instance_id, 0) + len(chunk.lines)
    return out


@requires(PUSH)
async def post_logs(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    chunks = codec.parse_logs(codec.decode_json(body), settings.max_line_bytes, codec.now_us())
    admit(request, _log_rows(chunks))
    return await _write(request, "logs", logs=chunks)


@requires(PUSH)
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
    admit(request, _log_rows([chunk]))
    return await _write(request, "logs", logs=[chunk])


@requires(PUSH)
async def post_events(request: web.Request) -> web.Response:
    """Lifecycle events. With tokens on, registering with the enrollment (or admin) token returns
    each registered instance's own push token: ``{"tokens": {instance_id: token}}``."""
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    events = codec.parse_events(codec.decode_json(body), codec.now_us())
    rows: dict[str, int] = {}
    for event in events:
        rows[event.instance_id] = rows.get(event.instance_id, 0) + 1
    principal = admit(request, rows, {e.kind for e in events})
    book = request.app[TOKENS]
    issue = book.enabled and principal.kind in ("enroll", "admin")
    registering = sorted({e.instance_id for e in events if e.kind == "registered"}) if issue else []
    issued = {instance_id: book.new_token() for instance_id in registering}
    now = codec.now_us()

    def store_tokens(con) -> None:
        for instance_id, (_token, token_sha) in issued.items():
            con.execute("INSERT INTO instance_tokens VALUES (?, ?, make_timestamp(?))", [instance_id, token_sha, now])

    result = await request.app[WRITER].submit(events=events, actions=[store_tokens] if issued else None, kind="events")
    for instance_id, (_token, token_sha) in issued.items():
        book.remember(instance_id, token_sha)
    reply = {"ok": True, "accepted": result.accepted, "duplicates": result.duplicates}
    if issued:
        reply["tokens"] = {instance_id: token for instance_id, (token, _sha) in issued.items()}
    return json_response(reply)


@requires(PUSH)
async def post_metrics(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    rows = codec.parse_metrics(codec.decode_json(body), codec.now_us())
    admit(request, {rows.instance_id[0]: len(rows)})
    return await _write(request, "metrics", metrics=rows)
