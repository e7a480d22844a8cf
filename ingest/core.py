"""The server's stateful parts, opened and closed together: the database (ingest/db/database.py: the
storage, seq index, tail cache, writer, reader, and in lake mode the slots), the policy engine that
calls it, and the /metrics collectors that read it. The HTTP app and ``fleetlog policy run`` both
use it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import Info

from ingest.config import Settings
from ingest.db.database import Database
from ingest.db.gauges import FleetCollector, GpuCollector
from ingest.db.sqlfiles import compose, load_rules
from ingest.metrics import IngestMetrics, LiveStateCollector
from ingest.policy.actuator import build_actuator
from ingest.policy.engine import PolicyEngine, PolicyParams

logger = logging.getLogger(__name__)


@dataclass
class Core:
    db: Database
    policy: PolicyEngine
    hosts_sql: str  # queries/hosts.sql with host_performance in front
    settings: Settings

    # the database's parts, as the handlers and the commands name them
    con = property(lambda self: self.db.con)  # the writer's; nobody else touches it
    reader = property(lambda self: self.db.reader)  # every read
    index = property(lambda self: self.db.index)
    tail = property(lambda self: self.db.tail)
    writer = property(lambda self: self.db.writer)
    slots = property(lambda self: self.db.slots)  # lake mode: which instances this node owns
    maintenance = property(lambda self: self.db.maintenance)  # lake mode: when its interval is set

    @classmethod
    def open(cls, settings: Settings, metrics: IngestMetrics) -> "Core":
        rules = load_rules(settings.queries_path)  # a broken rule stops start-up before the database opens
        hosts_sql = compose(settings.queries_path / "hosts.sql", settings.queries_path)
        db = Database(settings, metrics)
        params = PolicyParams(
            min_rate=settings.min_rate,
            destroy_grace_s=settings.destroy_grace_s,
            bad_host_ttl_s=settings.bad_host_ttl_s,
            stale_ttl_s=settings.stale_ttl_s,
            retention_s=settings.retention_s,
            exclude_repeats=settings.exclude_repeat_failures,
            bench_timeout_s=settings.bench_timeout_s,
            public_url=settings.page_url,
            degrade_action=settings.degrade_action,
        )
        policy = PolicyEngine(
            db.reader, db.writer, db.index, db.tail, rules, params,
            build_actuator(settings.actuator_webhook_url, settings.actuator_command, settings.actuator_timeout_s),
            metrics,
            destroy_cap_per_cycle=settings.destroy_cap_per_cycle,
            actuator_retries=settings.actuator_retries,
            query_timeout_s=settings.query_timeout_s,
            notify_webhook_url=settings.notify_webhook_url,
            notify_timeout_s=settings.actuator_timeout_s,
            may_run=db.may_run_policy if db.slots is not None else None,
            delete_logs=db.delete_logs,
            full_interval_s=settings.policy_full_interval_s,
        )
        # what the views compare against; the writer has not started yet
        db.store_settings(min_rate=settings.min_rate, bench_timeout_s=settings.bench_timeout_s,
                          spike_failures=settings.spike_failures, spike_window_s=settings.spike_window_s,
                          degrade_recent_runs=settings.degrade_recent_runs, degrade_fraction=settings.degrade_fraction,
                          degrade_exclude=settings.degrade_action == "exclude")
        writer, index, tail = db.writer, db.index, db.tail
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
            FleetCollector(db.reader, hosts_sql, settings.min_rate, settings.query_timeout_s, settings.db)
        )
        metrics.registry.register(GpuCollector(db.reader, settings.gpu_gauge_window_s, settings.query_timeout_s,
                                               settings.gpu_gauge_max_series, settings.gpu_gauge_max_series_per_instance))
        # where the page is, for alert annotations (dashboards/alerts.yml reads it with a template query)
        Info("fleetlog_page", "The page's base URL (public_url)", registry=metrics.registry).info({"url": settings.page_url})
        db.start()
        logger.info("database %s open, %d log streams indexed, %d policy rules", settings.db, index.stream_count(), len(rules))
        return cls(db, policy, hosts_sql, settings)

    async def close(self) -> None:
        await self.policy.close()
        await self.db.close()
