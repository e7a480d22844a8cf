"""The application factory: routes, typed keys, and the writer's lifetime. No business logic."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from ingest import store
from ingest.config import Settings
from ingest.handlers import health, push, query, read
from ingest.handlers.http import build_error_middleware
from ingest.keys import DB, INDEX, METRICS, SETTINGS, TAIL, WRITER
from ingest.observe import IngestMetrics, LiveStateCollector
from ingest.streams import StreamIndex
from ingest.tailcache import TailCache
from ingest.writer import Writer

logger = logging.getLogger(__name__)


async def _database_and_writer(app: web.Application) -> None:
    settings = app[SETTINGS]
    con = store.open_database(settings.db)
    index = StreamIndex()
    index.load(con.cursor())
    tail = TailCache(settings.tail_cache_lines, settings.tail_cache_max_streams)
    writer = Writer(
        con, index, tail, app[METRICS],
        batch_max_rows=settings.batch_max_rows,
        batch_max_delay_s=settings.batch_max_delay_s,
        queue_max_rows=settings.queue_max_rows,
        retry_after_s=settings.retry_after_s,
    )
    app[DB], app[INDEX], app[TAIL], app[WRITER] = con, index, tail, writer
    app[METRICS].registry.register(
        LiveStateCollector(
            {
                "fleetlog_ingest_queue_rows": ("Rows waiting for the writer", lambda: writer.pending_rows),
                "fleetlog_ingest_queue_requests": ("Requests waiting for their commit", lambda: writer.pending_requests),
                "fleetlog_ingest_streams": ("Log streams (instance, source, run_id) stored", index.stream_count),
                "fleetlog_tailcache_streams": ("Streams held in the tail cache", tail.stream_count),
                "fleetlog_tailcache_hits": ("Tail reads answered from memory", lambda: tail.hits),
                "fleetlog_tailcache_misses": ("Tail reads that went to the database", lambda: tail.misses),
            }
        )
    )
    writer.start()
    logger.info("database %s open, %d log streams indexed", settings.db, index.stream_count())
    yield
    await writer.stop()
    con.close()
    logger.info("writer drained, database closed")


def create_app(settings: Settings) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    ingest_metrics = IngestMetrics(registry)
    app = web.Application(
        middlewares=[build_error_middleware(lambda reason: ingest_metrics.rejected.labels(reason=reason).inc())],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[METRICS] = ingest_metrics
    app.cleanup_ctx.append(_database_and_writer)
    app.router.add_post("/api/v1/logs", push.post_logs)
    app.router.add_post("/api/v1/events", push.post_events)
    app.router.add_post("/api/v1/metrics", push.post_metrics)
    app.router.add_post("/api/log-push", push.post_log_push)
    app.router.add_get("/api/v1/instances", read.get_instances)
    app.router.add_get("/api/v1/instances/{instance_id}", read.get_instance)
    app.router.add_get("/api/v1/instances/{instance_id}/logs", read.get_logs)
    app.router.add_post("/api/v1/query", query.post_query)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics)
    return app
