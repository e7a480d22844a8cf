"""The database, opened and closed as one: the storage (one DuckDB file, or in lake mode the lake and
its PostgreSQL; the choice is made here, once), its migrations, the seq index, the tail cache, the
writer and the reader, and in lake mode the slot leases and the lake's jobs. ``Writer`` and
``Reader`` are the only two doors to DuckDB; everything else is handed what it needs in its
constructor (the writer its ``reopen``, the slots their ``on_acquire`` and ``on_retired``, the
policy engine ``may_run_policy`` and ``delete_logs``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import duckdb

from ingest.config import Settings
from ingest.errors import StoreError
from ingest.db import reads, searchtokens as tokens, store, usersql, writes
from ingest.metrics import IngestMetrics
from ingest.db.reader import Reader
from ingest.db.seqindex import StreamIndex
from ingest.db.tailcache import TailCache
from ingest.db.writer import Writer

if TYPE_CHECKING:  # lake mode only: its packages are the 'lake' extra, imported when it is on
    from ingest.db.lake.slots import Slots

logger = logging.getLogger(__name__)


def _storage(settings: Settings) -> Callable[[], duckdb.DuckDBPyConnection]:
    """How the storage opens (and opens again after a failure): the single DuckDB file, or in lake
    mode the lake and its PostgreSQL (ingest/db/lake/storage.py), handed the migrations to apply."""
    if settings.lake:
        from ingest.db.lake import storage as lake

        return functools.partial(lake.open_lake, settings.lake, settings.lake_data, settings.duckdb_memory_limit_mb,
                                 migrations=store.migrations())
    return functools.partial(store.open_database, settings.db, settings.duckdb_memory_limit_mb, settings.duckdb_threads,
                             settings.duckdb_checkpoint_mb)


def _lake_write_batch(slots: Slots):
    from ingest.db.lake import jobs as lakejobs, storage as lake

    return functools.partial(lake.write_batch, fence=lake.slot_fence(slots), window=lakejobs.DeleteWindow(slots.dsn))


class Database:
    """Opened by its constructor (the writer not started yet: ``store_settings`` may still use the
    write connection), started by ``start``, closed by ``close``."""

    def __init__(self, settings: Settings, metrics: IngestMetrics) -> None:
        self.settings = settings
        self._open = _storage(settings)
        self.con = self._open()  # the writer's; nobody else touches it
        self.slots: Slots | None = self._slots(settings) if settings.lake else None
        self.maintenance: Any = None  # lake mode: an ingest.db.lake.jobs.Maintenance, when its interval is set
        self._retention = None  # lake mode: an ingest.db.lake.jobs.RetentionWindow
        self.index = index = StreamIndex()
        cursor = self.con.cursor()
        index.load(cursor)
        cursor.close()
        self.tail = tail = TailCache(settings.tail_cache_lines, settings.tail_cache_max_streams, settings.tail_cache_bytes)
        blocks = None if settings.lake else tokens.BlockWriter()  # the search's token filter (the lake keeps none)
        self.writer = Writer(
            self.con, index, tail, metrics,
            batch_max_rows=settings.batch_max_rows,
            batch_max_delay_s=settings.batch_max_delay_s,
            queue_max_rows=settings.queue_max_rows,
            retry_after_s=settings.retry_after_s,
            reopen=self.reopen,
            db_path=None if settings.lake else settings.db,
            write_batch=_lake_write_batch(self.slots) if self.slots else None,
            max_streams_per_instance=settings.max_streams_per_instance,
            blocks=blocks,
            stream_parts=None if settings.lake else store.StreamParts(),
        )
        self.reader = Reader(
            self.con, index, tail, metrics,
            timeout_s=settings.query_timeout_s,
            query_max_concurrent=settings.query_max_concurrent,
            search_max_concurrent=settings.search_max_concurrent,
            retry_after_s=settings.retry_after_s,
            open_block=blocks.open_block if blocks is not None else None,
            runs_written=blocks.runs_written if blocks is not None else None,
        )

    def _slots(self, settings: Settings) -> Slots:
        from ingest.db.lake.slots import Slots

        node_id = settings.node_id or f"{settings.host}:{settings.port}"
        url = settings.advertise_url or f"http://{settings.host}:{settings.port}"
        return Slots(settings.lake.removeprefix("postgres:"), node_id, url, settings.lake_lease_s,
                     on_acquire=self.adopt_slots, on_retired=self.forget_retired)

    def store_settings(self, **values: float) -> None:
        """What the views compare against (writes.store_settings), on the write connection: before
        ``start`` only."""
        writes.store_settings(self.con, **values)

    def start(self) -> None:
        self.writer.start()
        self.reader.refine_tail_windows()
        if self.slots is not None:
            self.slots.start()
            self._lake_jobs()

    def _lake_jobs(self) -> None:
        """Lake mode: retention carried out in the delete window; maintenance on a timer, one node at a
        time, on a DuckDB instance of its own (a DuckLake error there cannot invalidate the node's)."""
        from ingest.db.lake import jobs as lakejobs, storage as lake

        settings, slots = self.settings, self.slots
        self._retention = lakejobs.RetentionWindow(slots.dsn)
        if settings.lake_maintenance_interval_s > 0:
            own_instance = functools.partial(lake.open_lake, settings.lake, settings.lake_data, settings.duckdb_memory_limit_mb,
                                             schema=False)
            self.maintenance = lakejobs.Maintenance(own_instance, slots.dsn, slots.node_id,
                                                    settings.lake_maintenance_interval_s, settings.lake_snapshot_keep_s)
            self.maintenance.start()

    def instance_tokens(self) -> list[tuple[str, str]]:
        """Every stored (instance_id, token digest), for the token book at start-up."""
        cursor = self.reader.cursor()
        try:
            return reads.instance_tokens(cursor)
        finally:
            cursor.close()

    # -- what the policy engine is handed ----------------------------------------------------------
    def may_run_policy(self) -> bool:
        """(Blocking.) Whether this node runs the policies: always with one file; in lake mode only the
        node holding the PostgreSQL advisory lock."""
        return self.slots is None or self.slots.try_policy_lock()

    async def delete_logs(self, instance_id: str, after_commit: Callable[[], None]) -> None:
        """The retention rule carried out: the instance's logs and metrics deleted through the writer
        (lake mode: in the delete window, after any maintenance pass in progress)."""
        if self._retention is not None:
            await self._retention.delete_logs(self.writer, instance_id, after_commit)
            return
        await self.writer.execute(functools.partial(writes.delete_logs, instance_id=instance_id), kind="policy",
                                  after_commit=after_commit)

    # -- called by the writer and the slots, on their threads --------------------------------------
    def reopen(self) -> duckdb.DuckDBPyConnection:
        """Close and reopen the database after a storage failure (called on the writer thread, which
        then uses the connection returned); the seq index and tail cache are rebuilt from the file."""
        self.reader.suspend()
        try:
            self.con.close()
        except duckdb.Error:
            pass
        con = self._open()
        known = self.index.instances()
        for instance_id in known:
            self.index.forget(instance_id)
            self.tail.forget(instance_id)
        cursor = con.cursor()
        try:
            self.index.load(cursor)
        finally:
            cursor.close()
        self.con = con
        self.reader.resume(con)
        return con

    def adopt_slots(self, taken: set[int]) -> None:
        """Lake mode, on the lease thread, before a slot taken over is served: its instances' seq
        ranges are read again from the lake (the previous owner's last commits included)."""
        from ingest.db.lake.slots import slot_of

        fresh = StreamIndex()
        cursor = self.reader.cursor()
        try:
            fresh.load(cursor)
        finally:
            cursor.close()
        affected = {i for i in set(self.index.instances()) | set(fresh.instances()) if slot_of(i) in taken}
        self.index.adopt(fresh, affected)
        for instance_id in affected:
            self.tail.forget(instance_id)

    def forget_retired(self, instance_ids: set[str]) -> None:
        """Lake mode, on the lease thread: another node's retention deleted these instances' lines."""
        from ingest.db.lake import jobs as lakejobs

        lakejobs.forget_retired(self.index, self.tail, self.reader, instance_ids)

    async def close(self) -> None:
        if self.maintenance is not None:
            await asyncio.to_thread(self.maintenance.stop)
        await self.writer.stop()
        await self.reader.close()  # interrupts what still reads and waits for it
        if self.slots is not None:
            await asyncio.to_thread(self.slots.stop)  # after the writer: its last commits were fenced
        self.con.close()
        logger.info("writer drained, database closed")


def query_file(path: str, sql: str, timeout_s: float, max_rows: int, params: dict[str, Any]) -> tuple[list[str], list]:
    """``fleetlog query --db``: a checked SELECT on a database file opened read-only (no server
    holding it), as (columns, rows)."""
    if not Path(path).exists():
        raise StoreError(f"no database at {path}")
    try:
        con = duckdb.connect(path, read_only=True)
    except duckdb.Error as e:
        raise StoreError(f"{e}\n(is a server holding the database? then leave out --db: the server answers)") from e
    try:
        columns, rows, _ = usersql.run_select(con, sql, timeout_s, max_rows, params)
    finally:
        con.close()
    return columns, rows
