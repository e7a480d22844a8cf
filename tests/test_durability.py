"""Nothing acknowledged is lost: SIGKILL the real server mid-ingest, restart it, find every acked line."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from ingest.db import store
from tests.conftest import read_db


async def test_every_acknowledged_line_survives_sigkill(server_process):
    server = server_process().start()
    acked: set[tuple[str, int]] = set()
    stop = asyncio.Event()

    async def pusher(session: aiohttp.ClientSession, source: str) -> None:
        seq = 0
        while not stop.is_set():
            doc = {"instance_id": "C.32733029", "source": source,
                   "lines": [{"seq": s, "ts": 1764415248.0, "line": f"{source} {s}"} for s in range(seq, seq + 200)]}
            try:
                async with session.post(server.url + "/api/v1/logs", data=orjson.dumps(doc)) as r:
                    if r.status == 200:
                        acked.update((source, s) for s in range(seq, seq + 200))
                        seq += 200
            except aiohttp.ClientError:
                return  # the server is gone; unacknowledged lines make no promise

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.ensure_future(pusher(session, src)) for src in ("benchout", "benchdaemon", "setup")]
        while len(acked) < 6000:
            await asyncio.sleep(0.01)  # let pushes happen; we kill mid-stream, not after a flush
        server.kill()
        stop.set()
        await asyncio.gather(*tasks)

    stored = set(read_db(str(server.db), "SELECT source, seq FROM logs"))
    assert acked <= stored
    assert len(acked) >= 6000

    server.start()  # restart on the same file: it opens, replays the WAL, and dedupes resends
    async with aiohttp.ClientSession() as session:
        doc = {"instance_id": "C.32733029", "source": "benchout",
               "lines": [{"seq": s, "line": f"benchout {s}"} for s in range(0, 400)]}
        async with session.post(server.url + "/api/v1/logs", data=orjson.dumps(doc)) as r:
            body = await r.json()
    assert body["duplicates"] == 400 and body["accepted"] == 0
    server.stop()
    assert read_db(str(server.db), "SELECT count(*) - count(DISTINCT (source, seq)) FROM logs") == [(0,)]


def test_server_restarts_after_sigkill_right_after_its_migrations(server_process):
    """A fresh database's migrations live in the WAL until a checkpoint; DuckDB 1.5.5 cannot replay an
    ALTER TABLE of the decisions table (its id defaults to a sequence: "GetDefaultDatabase with no
    default database set"), so a SIGKILL before the first checkpoint left a database no server could
    open. The migrations are checkpointed as they are applied."""
    server = server_process().start()
    server.kill()
    server.start()  # raises with the server's log if it cannot open its database
    server.stop()
    assert read_db(str(server.db), "SELECT count(*) FROM schema_migrations")[0][0] == len(store.migrations())
