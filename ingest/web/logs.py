"""Read endpoints: instances, one instance with its log completeness, and log lines (all through
the Reader)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from ingest.errors import BadRequest, NotFound
from ingest.web.http import dumps, int_param, json_response
from ingest.web.keys import CORE, DB
from ingest.timestamps import ts_to_iso

MAX_TAIL = 10_000
FOLLOW_POLL_S = 0.5  # how often a follow=1 stream looks for new lines
FOLLOW_MAX_S = 600.0  # a follow=1 stream ends after this long; the client reconnects with after_seq


async def on_shutdown(app: web.Application) -> None:
    """Open ``follow=1`` streams end now, so shutdown does not wait for them."""
    if CORE in app:
        app[CORE].reader.stopping.set()


async def get_instances(request: web.Request) -> web.Response:
    """Instances, each with ``logs``: how many sources, and which of them are incomplete."""
    return json_response({"instances": await request.app[DB].instances(request.query.get("state") or None)})


async def get_instance(request: web.Request) -> web.Response:
    instance_id = request.match_info["instance_id"]
    detail = await request.app[DB].instance(instance_id)
    if detail is None:
        raise NotFound(f"instance {instance_id!r} is not known")
    return json_response(detail)


async def get_logs(request: web.Request) -> web.Response:
    """``?source=&tail=200&after_seq=&before_seq=&run_id=&q=``: lines oldest first."""
    instance_id = request.match_info["instance_id"]
    source = request.query.get("source") or None
    run_id = request.query.get("run_id") or None
    q = request.query.get("q") or None
    tail = int_param(request, "tail", 200, maximum=MAX_TAIL)
    after_seq = int_param(request, "after_seq", None, minimum=-1)
    before_seq = int_param(request, "before_seq", None)
    follow = request.query.get("follow") == "1"
    if follow and source is None:
        raise BadRequest("follow: needs source=")
    end: list[tuple] = []
    if follow and q is not None and after_seq is None:  # where the stream ends now: polls start there
        end = await request.app[DB].logs(instance_id, source=source, run_id=run_id, q=None, tail=1, after_seq=None,
                                         before_seq=None)
    rows = await request.app[DB].logs(
        instance_id, source=source, run_id=run_id, q=q, tail=tail, after_seq=after_seq, before_seq=before_seq
    )
    if follow:
        return await _follow(request, instance_id, source, run_id, q, rows, after_seq, end)
    return json_response({"lines": render_lines(rows)})


def render_lines(rows: list[tuple]) -> list[dict]:
    """Rows (source, run_id, seq, ts_us, line) as the API's line objects.

    A tail of 200 lines spans a few seconds, so each second's "YYYY-MM-DDTHH:MM:SS" is formatted once
    and the microseconds appended: the same text as ``ts_to_iso`` (tests/test_tail_render.py), at a
    quarter of the cost. ``ts_to_iso`` was 85% of a cached tail's time on the event loop."""
    seconds: dict[int, str] = {}
    out = []
    for s, r, seq, ts, line in rows:
        second, us = divmod(ts, 1_000_000)
        prefix = seconds.get(second)
        if prefix is None:
            prefix = seconds[second] = ts_to_iso(second * 1_000_000)[:-_FRACTION]
        out.append({"source": s, "run_id": r, "seq": seq, "ts": f"{prefix}.{us:06d}Z", "line": line})
    return out


_FRACTION = len(".000000Z")


async def _follow(request: web.Request, instance_id: str, source: str, run_id: str | None, q: str | None,
                  rows: list[tuple], after_seq: int | None = None, end: list[tuple] = ()) -> web.StreamResponse:
    """``follow=1``: the lines asked for, then every new one as it is stored, one JSON object a line
    (NDJSON), for at most FOLLOW_MAX_S, until the client goes away or the server shuts down; new
    lines are those after the last (run_id, seq) read.

    With ``q``, a poll reads the lines stored since the last one read, whether they matched or not,
    and sends those that match (``q`` lowered, as the SQL's ``contains(lower(line), lower(q))``): a
    poll costs the new lines, not a scan of the whole stream twice a second. ``end`` (the stream's
    newest line when the first answer was read) is where polls start when nothing matched yet."""
    reader = request.app[DB]
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
    await response.prepare(request)
    # where the client is: the last line read, else the after_seq it asked from (never back to seq 0)
    marks = [r[-1][1:3] for r in (rows, end) if r]
    last = max(marks) if marks else (run_id, after_seq) if after_seq is not None else None
    needle = q.lower() if q is not None else None
    await response.write(b"".join(dumps(line) + b"\n" for line in render_lines(rows)))
    deadline = time.monotonic() + FOLLOW_MAX_S
    while time.monotonic() < deadline and not reader.stopping.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reader.stopping.wait(), FOLLOW_POLL_S)
        if reader.stopping.is_set() or request.transport is None or request.transport.is_closing():
            break  # shutting down, or the client went away
        new = await reader.logs(
            instance_id, source=source, run_id=run_id or (last[0] if last else None), q=None,
            tail=MAX_TAIL, after_seq=last[1] if last else -1, before_seq=None,
        )
        if new:
            last = new[-1][1:3]
            if needle is not None:
                new = [row for row in new if needle in row[4].lower()]
        if new:
            await response.write(b"".join(dumps(line) + b"\n" for line in render_lines(new)))
    if request.transport is not None and not request.transport.is_closing():
        await response.write_eof()
    return response
