"""``GET /api/v1/queries``: the canned questions of queries/ for the page's Query view.

Each is ``{"name", "description", "params", "sql"}``: the SQL with what it needs in front, ready for
``POST /api/v1/query`` with its ``params`` (``now`` and ``min_rate`` are filled in when not given).
The files are read on each request (a few kilobytes), so an edited question shows at once.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ingest.db import sqlfiles as queryfiles
from ingest.web.http import json_response
from ingest.web.keys import SETTINGS


async def get_queries(request: web.Request) -> web.Response:
    found = await asyncio.to_thread(queryfiles.catalogue, request.app[SETTINGS].queries_path)
    return json_response({"queries": found})
