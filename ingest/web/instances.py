"""An operator's repairs, admin token only: see an instance's stored events and remove a bad one
without opening the database (an event that, stored by an older server, broke a read or a rule)."""

from __future__ import annotations

import functools
import logging

from aiohttp import web

from ingest.db import store
from ingest.auth import ADMIN, requires
from ingest.errors import BadRequest, NotFound
from ingest.web.http import int_param, json_response
from ingest.web.keys import CORE, DB, SETTINGS

logger = logging.getLogger(__name__)

MAX_EVENTS = 10_000


def _required(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if not value:
        raise BadRequest(f"{name}: required")
    return value


@requires(ADMIN)
async def get_events(request: web.Request) -> web.Response:
    """``?instance_id=&kind=&limit=200``: the instance's events, oldest first, bodies as stored text."""
    instance_id = _required(request, "instance_id")
    kind = request.query.get("kind") or None
    limit = int_param(request, "limit", 200, minimum=1, maximum=MAX_EVENTS)
    return json_response({"events": await request.app[DB].events(instance_id, kind, limit)})


@requires(ADMIN)
async def delete_event(request: web.Request) -> web.Response:
    """``?instance_id=&kind=&ts_us=``: remove that one event (the key ``GET`` shows); 404 when none."""
    instance_id, kind = _required(request, "instance_id"), _required(request, "kind")
    ts_us = int_param(request, "ts_us", None, minimum=-(2**63), maximum=2**63 - 1)
    if ts_us is None:
        raise BadRequest("ts_us: required")
    deleted = await request.app[CORE].writer.execute(
        functools.partial(store.delete_event, instance_id=instance_id, kind=kind, ts_us=ts_us,
                          declarations=not request.app[SETTINGS].lake), kind="delete_event")  # the lake's are a view
    if not deleted:
        raise NotFound(f"no {kind!r} event of instance {instance_id!r} at ts_us {ts_us}"[:300])
    logger.warning("admin deleted the %s event of %s at ts_us %d", kind, instance_id, ts_us)
    return json_response({"ok": True, "deleted": deleted})
