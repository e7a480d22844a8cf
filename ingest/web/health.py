"""Liveness, readiness and Prometheus exposition."""

from __future__ import annotations

import shutil
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ingest.auth import PUBLIC, requires
from ingest.web.http import json_response
from ingest.web.keys import CORE, DB, METRICS, SETTINGS, WRITER
from ingest.db.writer import RECOVER_MIN_FREE_BYTES


@requires(PUBLIC)
async def healthz(request: web.Request) -> web.Response:
    return json_response({"ok": True})


@requires(PUBLIC)
async def readyz(request: web.Request) -> web.Response:
    writer = request.app[WRITER]
    if not writer.running:
        return json_response({"ok": False, "error": "writer not running", "status": 503}, 503)
    if writer.storage_error is not None:
        return json_response({"ok": False, "error": f"storage unavailable: {writer.storage_error}", "status": 503}, 503,
                             {"Retry-After": str(writer.retry_after_s)})
    free = shutil.disk_usage(Path(request.app[SETTINGS].db).resolve().parent).free
    if free < RECOVER_MIN_FREE_BYTES:
        return json_response({"ok": False, "error": f"storage unavailable: {free} bytes free on the database's disk",
                              "status": 503}, 503, {"Retry-After": str(writer.retry_after_s)})
    # a failing policy rule does not make the server unready (pushes must go on): it is shown here and
    # by fleetlog_policy_rule_failing, which alerts
    return json_response({"ok": True, "pending_rows": writer.pending_rows,
                          "policy": {"failing_rules": request.app[CORE].policy.failing_rules()}})


async def metrics(request: web.Request) -> web.Response:
    body = await request.app[DB].call(generate_latest, request.app[METRICS].registry)  # fleet gauges query the database
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
