"""``GET /api/v1/search?q=&regex=0|1&since=&until=&source=&instance=&limit=``: log lines across the fleet.

Answers ``{"hits": [{"instance_id", "source", "run_id", "seq", "ts", "line"}], "truncated", "scanned"}``,
newest first; ``scanned`` is the plan (``ingest.db.searchplan.Plan``: whether the token filter pruned, how many
blocks the window holds and how many were admitted). ``since`` and ``until`` are a duration back from now (``90s``, ``30m``, ``24h``, ``7d``), epoch
seconds or ISO-8601; ``since`` defaults to 24 hours ago, ``until`` to now. ``limit`` (default 100) is
capped at 1000. The read token suffices.
"""

from __future__ import annotations

import re

from aiohttp import web

from ingest.db import search
from ingest.contract.codec import MIN_TS_US, parse_ts
from ingest.errors import BadRequest
from ingest.web.http import int_param, json_response
from ingest.web.keys import DB
from ingest.timestamps import now_us, ts_to_iso

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(raw: str | None, name: str, now: int, default_us: int) -> int:
    """Epoch microseconds from a duration back from ``now``, epoch seconds or ISO-8601."""
    if raw is None or raw == "":
        return default_us
    match = _DURATION.fullmatch(raw.strip())
    if match:  # further back than 0001-01-01 (or past a float) is all of it, not an overflow in SQL
        back_us = float(match.group(1)) * _UNIT_S[match.group(2)] * 1_000_000
        return now - int(min(back_us, now - MIN_TS_US))
    try:
        value: float | str = float(raw)
    except ValueError:
        value = raw
    try:
        return parse_ts(value, name, now)
    except BadRequest:
        raise BadRequest(f"{name}: expected a duration (24h, 30m, 7d), epoch seconds or ISO-8601, got {raw[:40]!r}") from None


async def get_search(request: web.Request) -> web.Response:
    q = request.query.get("q", "")
    if not q:
        raise BadRequest("q: expected the text to search for")
    regex = request.query.get("regex", "0")
    if regex not in ("0", "1"):
        raise BadRequest(f"regex: expected 0 or 1, got {regex[:10]!r}")
    now = now_us()
    since = parse_when(request.query.get("since"), "since", now, now - int(search.DEFAULT_WINDOW_S * 1_000_000))
    until = parse_when(request.query.get("until"), "until", now, now + 1)
    if since >= until:
        raise BadRequest("since: must be before until")
    query = search.SearchQuery(
        text=q, regex=regex == "1", since_us=since, until_us=until,
        source=request.query.get("source") or None, instance_id=request.query.get("instance") or None,
        limit=min(int_param(request, "limit", search.DEFAULT_LIMIT, minimum=1), search.MAX_LIMIT),  # capped
    )
    hits, truncated, plan = await request.app[DB].search(query)  # on the search threads, not the page's
    for hit in hits:
        hit["ts"] = ts_to_iso(hit["ts"])
    return json_response({"hits": hits, "truncated": truncated, "scanned": plan.as_dict()})
