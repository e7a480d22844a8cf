"""The server's stateful parts, opened and closed together: the database, the seq index, the tail
cache, the writer, the reader, and the policy engine. The HTTP app and ``fleetlog policy run`` both
use it. ``Writer`` and ``Reader`` are the only two doors to DuckDB.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import duckdb

import functools
from typing import TYPE_CHECKING, Any

from ingest.db import store, searchtokens as tokens
from ingest.policy.actuator import build_actuator
from ingest.config import Settings
from ingest.db.gauges import FleetCollector, GpuCollector
from ingest.metrics import IngestMetrics, LiveStateCollector
from ingest.policy.engine import CycleReport, PolicyEngine, PolicyParams, load_rules, store_settings
from ingest.db.sqlfiles import compose
from ingest.db.reader import Reader
from ingest.db.seqindex import StreamIndex
from ingest.db.tailcache import TailCache
from ingest.db.writer import Writer

if TYPE_CHECKING:  # lake mode only: its packages are the 'lake' extra, imported when it is on
    from ingest.db.lake.slots import Slots

logger = logging.getLogger(__name__)


def _open_storage(settings: Settings) -> duckdb.DuckDBPyConnection:
    """The single DuckDB file, or in lake mode the lake and its PostgreSQL (ingest/db/lake/storage.py)."""
    if settings.lake:
        from ingest.db.lake import storage as lake

        return lake.open_lake(settings.lake, settings.lake_data, settings.duckdb_memory_limit_mb)
    return store.open_database(settings.db, settings.duckdb_memory_limit_mb, settings.duckdb_threads)


def _slots(settings: Settings) -> Slots:
    from ingest.db.lake.slots import Slots

    node_id = settings.node_id or f"{settings.host}:{settings.port}"
    url = settings.advertise_url or f"http://{settings.host}:{settings.port}"
    return Slots(settings.lake.removeprefix("postgres:"), node_id, url, settings.lake_lease_s)


def _lake_write_batch(slots: Slots):
    from ingest.db.lake import storage as lake, jobs as lakejobs

    return functools.partial(lake.write_batch, fence=lake.slot_fence(slots), window=lakejobs.DeleteWindow(slots.dsn))


def _lake_jobs(core: "Core") -> None:
    """Lake mode: retention carried out in the delete window; maintenance on a timer, one node at a
    time, on a DuckDB instance of its own (a DuckLake error there cannot invalidate the node's)."""
    from ingest.db.lake import storage as lake, jobs as lakejobs

    settings, slots = core.settings, core.slots
    lakejobs.carry_out_retention_in_window(core.policy, slots.dsn)
    slots.on_retired = functools.partial(lakejobs.forget_retired, core.index, core.tail, core.reader)
    if settings.lake_maintenance_interval_s > 0:
        own_instance = functools.partial(lake.open_lake, settings.lake, settings.lake_data, settings.duckdb_memory_limit_mb,
                                         schema=False)
        core.maintenance = lakejobs.Maintenance(own_instance, slots.dsn, slots.node_id,
                                                settings.lake_maintenance_interval_s, settings.lake_snapshot_keep_s)
        core.maintenance.start()


def _one_policy_runner(policy: PolicyEngine, slots: Slots) -> None:
    """Lake mode: a policy cycle runs only on the node holding the PostgreSQL advisory lock."""
    run_cycle = policy.run_cycle

    async def gated(execute: bool, now=None):
        if await asyncio.to_thread(slots.try_policy_lock):
            return await run_cycle(execute, now)
        return CycleReport(execute)

    policy.run_cycle = gated


@dataclass
class Core:
    con: duckdb.DuckDBPyConnection  # the writer's; nobody else touches it
    reader: Reader  # every read
    index: StreamIndex
    tail: TailCache
    writer: Writer
    policy: PolicyEngine
    hosts_sql: str  # queries/hosts.sql with host_performance in front
    settings: Settings
    slots: Slots | None = None  # lake mode: which instances this node owns (ingest/db/lake/slots.py)
    maintenance: Any = None  # lake mode: an ingest.db.lake.jobs.Maintenance, when its interval is set

    @classmethod
    def open(cls, settings: Settings, metrics: IngestMetrics) -> "Core":
        rules = load_rules(settings.queries_path)  # a broken rule stops start-up before the database opens
        hosts_sql = compose(settings.queries_path / "hosts.sql", settings.queries_path)
        con = _open_storage(settings)
        slots = _slots(settings) if settings.lake else None
        index = StreamIndex()
        cursor = con.cursor()
        index.load(cursor)
        cursor.close()
        tail = TailCache(settings.tail_cache_lines, settings.tail_cache_max_streams, settings.tail_cache_bytes)
        writer = Writer(
            con, index, tail, metrics,
            batch_max_rows=settings.batch_max_rows,
            batch_max_delay_s=settings.batch_max_delay_s,
            queue_max_rows=settings.queue_max_rows,
            retry_after_s=settings.retry_after_s,
            db_path=None if settings.lake else settings.db,
            write_batch=_lake_write_batch(slots) if slots else None,
            max_streams_per_instance=settings.max_streams_per_instance,
            blocks=None if settings.lake else tokens.BlockWriter(),
        )
        reader = Reader(
            con, index, tail, metrics,
            timeout_s=settings.query_timeout_s,
            query_max_concurrent=settings.query_max_concurrent,
            search_max_concurrent=settings.search_max_concurrent,
            retry_after_s=settings.retry_after_s,
            token_filter=not settings.lake,
        )
        policy = PolicyEngine(
            reader, writer, index, tail, rules,
            PolicyParams(
                min_rate=settings.min_rate,
                destroy_grace_s=settings.destroy_grace_s,
                bad_host_ttl_s=settings.bad_host_ttl_s,
                stale_ttl_s=settings.stale_ttl_s,
                retention_s=settings.retention_s,
                exclude_repeats=settings.exclude_repeat_failures,
                bench_timeout_s=settings.bench_timeout_s,
            ),
            build_actuator(settings.actuator_webhook_url, settings.actuator_command, settings.actuator_timeout_s),
            metrics,
            destroy_cap_per_cycle=settings.destroy_cap_per_cycle,
            actuator_retries=settings.actuator_retries,
            query_timeout_s=settings.query_timeout_s,
            notify_webhook_url=settings.notify_webhook_url,
            notify_timeout_s=settings.actuator_timeout_s,
        )
        store_settings(con, policy.params)  # what the views compare against; the writer has not started yet
        metrics.registry.register(
            LiveStateCollector(
                {
                    "fleetlog_ingest_queue_rows": ("Rows waiting for the writer", lambda: writer.pending_rows),
                    "fleetlog_ingest_queue_requests": ("Requests waiting for their commit", lambda: writer.pending_requests),
                    "fleetlog_ingest_streams": ("Log streams (instance, source, run_id) stored", index.stream_count),
                    "fleetlog_tailcache_streams": ("Streams held in the tail cache", tail.stream_count),
                    "fleetlog_tailcache_bytes": ("Bytes held by the tail cache (tail_cache_max_bytes)", lambda: tail.nbytes),
                    "fleetlog_tailcache_hits_total": ("Tail reads answered from memory", lambda: tail.hits),
                    "fleetlog_tailcache_misses_total": ("Tail reads that went to the database", lambda: tail.misses),
                }
            )
        )
        metrics.registry.register(
            FleetCollector(reader, hosts_sql, settings.min_rate, settings.query_timeout_s, settings.db)
        )
        metrics.registry.register(GpuCollector(reader, settings.gpu_gauge_window_s, settings.query_timeout_s,
                                               settings.gpu_gauge_max_series, settings.gpu_gauge_max_series_per_instance))
        core = cls(con, reader, index, tail, writer, policy, hosts_sql, settings, slots)
        writer._reopen = core.reopen
        writer.start()
        reader.refine_tail_windows()
        if slots is not None:
            slots.on_acquire = core.adopt_slots
            _one_policy_runner(policy, slots)
            slots.start()
            _lake_jobs(core)
        logger.info("database %s open, %d log streams indexed, %d policy rules", settings.db, index.stream_count(), len(rules))
        return core

    def reopen(self) -> duckdb.DuckDBPyConnection:
        """Close and reopen the database after a storage failure (called on the writer thread, which
        then uses the connection returned); the seq index and tail cache are rebuilt from the file."""
        self.reader.suspend()
        try:
            self.con.close()
        except duckdb.Error:
            pass
        con = _open_storage(self.settings)
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

    async def close(self) -> None:
        if self.maintenance is not None:
            await asyncio.to_thread(self.maintenance.stop)
        await self.policy.close()
        await self.writer.stop()
        await self.reader.close()  # interrupts what still reads and waits for it
        if self.slots is not None:
            await asyncio.to_thread(self.slots.stop)  # after the writer: its last commits were fenced
        self.con.close()
        logger.info("writer drained, database closed")
