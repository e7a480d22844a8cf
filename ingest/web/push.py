"""Write endpoints: parse and validate, check who may push it, then hand rows to the writer.
200 only after commit.

Every request's work is capped before it is done (``codec.Caps``: lines, streams, events; 413 naming
the cap), and the body is read under its share of the memory budget (``handlers/http.read_body``).
The body is dropped as soon as it is parsed, so a request waiting for its commit holds rows, not both.

Enrollment: the fleet's enrollment token registers only instances that do not exist yet (409 naming
the instance otherwise; nothing is written), at most ``enroll_max_ids_per_request`` at once (413) and
``enroll_max_per_s`` per node (429), except that the same ``Idempotency-Key`` gets the same answer
again; an admin declares the ids it creates (``POST /api/v1/admin/instances``) and re-issues an
instance's token with ``POST /api/v1/instances/{id}/token``, which revokes every earlier one. What
an enrollment vouches for, and why, is ingest/db/enrollment.py's docstring.
"""

from __future__ import annotations

import functools

from aiohttp import web

from ingest.contract import codec
from ingest.db import enrollment
from ingest.auth import ADMIN, OPEN, PRINCIPAL, PUSH, Principal, check_instances, requires
from ingest.db import writes
from ingest.db.reads import known_instances
from ingest.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge
from ingest.web.http import json_response, read_body
from ingest.web.keys import DB, ENROLL_LIMITER, LIMITER, SETTINGS, TOKENS, WRITER
from ingest.timestamps import now_us


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
    chunks = codec.parse_logs_body(body, settings.max_line_bytes, now_us(), caps_of(settings))
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
        now_us(),
        caps_of(settings),
    )
    admit(request, _log_rows([chunk]))
    return await _write(request, "logs", logs=[chunk])


@requires(PUSH)
async def post_events(request: web.Request) -> web.Response:
    """Lifecycle events. With tokens on, registering with the enrollment (or admin) token returns
    each registered instance's own push token: ``{"tokens": {instance_id: token}}``."""
    settings = request.app[SETTINGS]
    events = codec.parse_events(await _json(request), now_us(), caps_of(settings))
    rows: dict[str, int] = {}
    for event in events:
        rows[event.instance_id] = rows.get(event.instance_id, 0) + 1
    principal = admit(request, rows, {e.kind for e in events})
    book = request.app[TOKENS]
    if principal.kind == "instance" and any(e.kind == "registered" for e in events):
        async with book.enrolling:  # the identity check and its write, as one step
            await refuse_identity_change(request, principal.instance_id, events)
            return await _write(request, "events", events=events)
    if not (book.enabled and principal.kind in ("enroll", "admin")):
        return await _write(request, "events", events=events)
    registering = sorted({e.instance_id for e in events if e.kind == "registered"})
    key = None
    if principal.kind == "enroll":
        key = enrollment.parse_key(request.headers.get("Idempotency-Key"))
        if len(registering) > settings.enroll_max_ids_per_request:
            raise PayloadTooLarge(f"registered: {len(registering)} instances in one request; the enrollment token "
                                  f"registers at most enroll_max_ids_per_request={settings.enroll_max_ids_per_request}")
        request.app[ENROLL_LIMITER].take("the enrollment token", len(registering))
    async with book.enrolling:  # check and write as one step against every other enrollment
        replays = await refuse_known(request, registering) if principal.kind == "enroll" else set()
        issued = {i: enrollment.derive_token(key, i) if key else book.new_token() for i in registering if i not in replays}
        fresh = [e for e in events if e.instance_id not in replays]  # a replay's events are stored already
        now = now_us()
        enrolled = sorted(issued) if principal.kind == "enroll" else []
        store_tokens = functools.partial(writes.store_issued, issued={i: sha for i, (_token, sha) in issued.items()},
                                         enrolled=enrolled, now_us=now)

        accepted, duplicates = 0, len(events) - len(fresh)
        if fresh:
            result = await request.app[WRITER].submit(events=fresh, actions=[store_tokens] if issued else None, kind="events")
            accepted, duplicates = result.accepted, duplicates + result.duplicates
        for instance_id, (_token, token_sha) in issued.items():
            book.remember(instance_id, token_sha)
    reply = {"ok": True, "accepted": accepted, "duplicates": duplicates}
    tokens = {instance_id: token for instance_id, (token, _sha) in issued.items()}
    tokens.update({instance_id: enrollment.derive_token(key, instance_id)[0] for instance_id in replays})
    if tokens:
        reply["tokens"] = tokens
    return json_response(reply)


def _read(request: web.Request, read):
    """``read(cursor)`` on a reader's cursor, off the event loop."""
    reader = request.app[DB]

    def run():
        cursor = reader.open_cursor()
        try:
            return read(cursor)
        finally:
            reader.close_cursor(cursor)

    return reader.call(run)


async def _existing(request: web.Request, instance_ids: list[str]) -> set[str]:
    book = request.app[TOKENS]
    found = {i for i in instance_ids if book.has_token(i)}
    return found | await _read(request, lambda cursor: known_instances(cursor, instance_ids))


async def refuse_known(request: web.Request, instance_ids: list[str]) -> set[str]:
    """The enrollment token may not register an instance that exists (a replay would mint a token),
    unless the request's ``Idempotency-Key`` enrolled it: those are returned (the same answer again).
    With ``enroll_declared_only``, an id no admin declared is refused (403)."""
    book = request.app[TOKENS]
    key = enrollment.parse_key(request.headers.get("Idempotency-Key"))
    replays = set()
    for instance_id in sorted(await _existing(request, instance_ids)):
        if key is not None and await book.instance_of(enrollment.derive_token(key, instance_id)[1]) == instance_id:
            replays.add(instance_id)
            continue
        raise Conflict(
            f"instance_id: {instance_id!r} is already registered by another agent; the enrollment token registers new "
            "instances only, and the same Idempotency-Key gets the same answer "
            "(an admin re-issues its token: POST /api/v1/instances/{id}/token)"
        )
    if request.app[SETTINGS].enroll_declared_only:
        new = [i for i in instance_ids if i not in replays]
        states = await _read(request, lambda cursor: enrollment.states(cursor, new))
        undeclared = [i for i in new if not states.get(i, (False, False))[0]]
        if undeclared:
            raise Forbidden(f"instance_id: {undeclared[0]!r} was not declared; the enrollment token registers only the ids "
                            "an admin declared (POST /api/v1/admin/instances)")
    return replays


async def refuse_identity_change(request: web.Request, instance_id: str, events: list[codec.Event]) -> None:
    """An instance's own token may not move it to another machine or host: identity is fixed at
    registration (409 naming the field; an admin may change it)."""
    named = [(n, e) for n, e in enumerate(events) if e.kind == "registered" and any(e.body.get(f) is not None for f in enrollment.IDENTITY)]
    if not named:
        return
    current = await _read(request, lambda cursor: enrollment.identity(cursor, instance_id))
    for n, event in named:
        for field in enrollment.IDENTITY:
            value = event.body.get(field)
            if value is None:
                continue
            if current.get(field) is None:
                current[field] = value
            elif current[field] != value:
                raise Conflict(f"[{n}].{field}: instance {instance_id!r} is registered with {field} {current[field]}, not "
                               f"{value}; identity is fixed at registration (an admin may change it)")


@requires(ADMIN)
async def post_admin_instances(request: web.Request) -> web.Response:
    """The deployer declares the ids it created: ``{"instance_ids": [...]}``. Their enrollment by the
    shared token is then vouched for (see ingest/db/enrollment.py)."""
    settings = request.app[SETTINGS]
    doc = await _json(request)
    ids = doc.get("instance_ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not ids:
        raise BadRequest("instance_ids: expected a non-empty array of instance ids")
    if len(ids) > settings.max_events_per_request:
        raise PayloadTooLarge(f"instance_ids: {len(ids)} ids; at most max_events_per_request={settings.max_events_per_request}")
    ids = sorted({codec.parse_id(v, f"instance_ids[{n}]") for n, v in enumerate(ids)})
    book = request.app[TOKENS]
    async with book.enrolling:
        states = await _read(request, lambda cursor: enrollment.states(cursor, ids))
        unvouched = [i for i in ids if i in states and not states[i][1]]
        if unvouched:
            raise Conflict(f"instance_ids: {unvouched[0]!r} was enrolled by the shared enrollment token before it was declared; "
                           "whose agent that was cannot be told, so it is not vouched for (destroy it and create another)")
        now = now_us()
        await request.app[WRITER].execute(functools.partial(enrollment.declare, instance_ids=ids, now_us=now), kind="declare")
    return json_response({"ok": True, "declared": ids})


@requires(ADMIN)
async def post_instance_token(request: web.Request) -> web.Response:
    """Issue a new token for an existing instance; every earlier token of it stops working."""
    instance_id = codec.parse_id(request.match_info["instance_id"], "instance_id")
    book = request.app[TOKENS]
    async with book.enrolling:
        if instance_id not in await _existing(request, [instance_id]):
            raise NotFound(f"instance_id: no instance {instance_id!r}")
        token, token_sha = book.new_token()
        now = now_us()
        await request.app[WRITER].execute(
            functools.partial(writes.write_instance_token, instance_id=instance_id, token_sha=token_sha, issued_us=now,
                              revoke_old=True), kind="token"
        )
        book.replace(instance_id, token_sha)
    return json_response({"ok": True, "instance_id": instance_id, "token": token})


@requires(PUSH)
async def post_metrics(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    rows = codec.parse_metrics(await _json(request), now_us(), caps_of(settings))
    admit(request, {rows.instance_id[0]: len(rows)})
    return await _write(request, "metrics", metrics=rows)
