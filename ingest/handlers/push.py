"""Write endpoints: parse and validate, check who may push it, then hand rows to the writer.
200 only after commit.

Every request's work is capped before it is done (``codec.Caps``: lines, streams, events; 413 naming
the cap), and the body is read under its share of the memory budget (``handlers/http.read_body``).
The body is dropped as soon as it is parsed, so a request waiting for its commit holds rows, not both.

Enrollment: the fleet's enrollment token registers only instances that do not exist yet (409 naming
the instance otherwise; nothing is written); an admin re-issues an instance's token with
``POST /api/v1/instances/{id}/token``, which revokes every earlier one.
"""

from __future__ import annotations

from aiohttp import web

from ingest import codec
from ingest.auth import ADMIN, OPEN, PRINCIPAL, PUSH, Principal, check_instances, known_instances, requires, write_instance_token
from ingest.errors import Conflict, NotFound
from ingest.handlers.http import json_response, read_body
from ingest.keys import DB, LIMITER, SETTINGS, TOKENS, WRITER


def caps_of(settings) -> codec.Caps:
    return codec.Caps(settings.max_lines_per_request, settings.max_streams_per_request, settings.max_events_per_request)


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


async def _json(request: web.Request):
    return codec.decode_json(await read_body(request, request.app[SETTINGS].max_body_bytes))


@requires(PUSH)
async def post_logs(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes)
    chunks = codec.parse_logs_body(body, settings.max_line_bytes, codec.now_us(), caps_of(settings))
    del body
    admit(request, _log_rows(chunks))
    return await _write(request, "logs", logs=chunks)


@requires(PUSH)
async def post_log_push(request: web.Request) -> web.Response:
    """The old manager's plain-text push; any source name; the server numbers the lines."""
    settings = request.app[SETTINGS]
    chunk = codec.parse_plain_lines(
        await read_body(request, settings.max_body_bytes),
        request.headers.get("X-Instance-Id"),
        request.headers.get("X-Log-Source"),
        settings.max_line_bytes,
        codec.now_us(),
        caps_of(settings),
    )
    admit(request, _log_rows([chunk]))
    return await _write(request, "logs", logs=[chunk])


@requires(PUSH)
async def post_events(request: web.Request) -> web.Response:
    """Lifecycle events. With tokens on, registering with the enrollment (or admin) token returns
    each registered instance's own push token: ``{"tokens": {instance_id: token}}``."""
    settings = request.app[SETTINGS]
    events = codec.parse_events(await _json(request), codec.now_us(), caps_of(settings))
    rows: dict[str, int] = {}
    for event in events:
        rows[event.instance_id] = rows.get(event.instance_id, 0) + 1
    principal = admit(request, rows, {e.kind for e in events})
    book = request.app[TOKENS]
    if not (book.enabled and principal.kind in ("enroll", "admin")):
        return await _write(request, "events", events=events)
    registering = sorted({e.instance_id for e in events if e.kind == "registered"})
    async with book.enrolling:  # check and write as one step against every other enrollment
        if principal.kind == "enroll":
            await refuse_known(request, registering)
        issued = {instance_id: book.new_token() for instance_id in registering}
        now = codec.now_us()

        def store_tokens(con) -> None:
            for instance_id, (_token, token_sha) in issued.items():
                write_instance_token(con, instance_id, token_sha, now, revoke_old=False)

        result = await request.app[WRITER].submit(events=events, actions=[store_tokens] if issued else None, kind="events")
        for instance_id, (_token, token_sha) in issued.items():
            book.remember(instance_id, token_sha)
    reply = {"ok": True, "accepted": result.accepted, "duplicates": result.duplicates}
    if issued:
        reply["tokens"] = {instance_id: token for instance_id, (token, _sha) in issued.items()}
    return json_response(reply)


async def _existing(request: web.Request, instance_ids: list[str]) -> set[str]:
    book = request.app[TOKENS]
    found = {i for i in instance_ids if book.has_token(i)}

    reader = request.app[DB]

    def read() -> set[str]:
        cursor = reader.open_cursor()
        try:
            return known_instances(cursor, instance_ids)
        finally:
            reader.close_cursor(cursor)

    return found | await reader.call(read)


async def refuse_known(request: web.Request, instance_ids: list[str]) -> None:
    """The enrollment token may not register an instance that exists (a replay would mint a token)."""
    known = sorted(await _existing(request, instance_ids))
    if known:
        raise Conflict(
            f"instance_id: {known[0]!r} is already registered; the enrollment token registers new instances only "
            "(an admin re-issues its token: POST /api/v1/instances/{id}/token)"
        )


@requires(ADMIN)
async def post_instance_token(request: web.Request) -> web.Response:
    """Issue a new token for an existing instance; every earlier token of it stops working."""
    instance_id = codec.parse_id(request.match_info["instance_id"], "instance_id")
    book = request.app[TOKENS]
    async with book.enrolling:
        if instance_id not in await _existing(request, [instance_id]):
            raise NotFound(f"instance_id: no instance {instance_id!r}")
        token, token_sha = book.new_token()
        now = codec.now_us()
        await request.app[WRITER].execute(
            lambda con: write_instance_token(con, instance_id, token_sha, now, revoke_old=True), kind="token"
        )
        book.replace(instance_id, token_sha)
    return json_response({"ok": True, "instance_id": instance_id, "token": token})


@requires(PUSH)
async def post_metrics(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    rows = codec.parse_metrics(await _json(request), codec.now_us(), caps_of(settings))
    admit(request, {rows.instance_id[0]: len(rows)})
    return await _write(request, "metrics", metrics=rows)
