"""The application factory: routes, typed keys, and the writer's lifetime. No business logic."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from ingest.web import forward, otlp_grpc as otlpgrpc
from ingest.auth import InstanceRateLimiter, TokenBook, build_auth_middleware
from ingest.budget import MemoryBudget
from ingest.config import Settings
from ingest.core import Core
from ingest.db.lake.tokens import SharedTokens
from ingest.web import instances as admin, health, hosts, otlp, page, push, query, logs as read
from ingest.web import queries as query_files, search as search_handlers
from ingest.web.http import build_body_middleware, build_error_middleware, close_after_unread_body
from ingest.web.keys import BUDGET, CORE, DB, ENROLL_LIMITER, INDEX, LIMITER, METRICS, OTLP_GRPC_PORT, SETTINGS, TAIL, TOKENS, WRITER
from ingest.metrics import IngestMetrics, LiveStateCollector

logger = logging.getLogger(__name__)


async def _core(app: web.Application) -> None:
    core = Core.open(app[SETTINGS], app[METRICS])
    app[TOKENS].load(core.db.instance_tokens())
    app[CORE] = core
    app[DB], app[INDEX], app[TAIL], app[WRITER] = core.reader, core.index, core.tail, core.writer
    yield
    await core.close()


async def _policy_timer(app: web.Application) -> None:
    settings = app[SETTINGS]
    stop = asyncio.Event()
    task = None
    if settings.policy_interval_s > 0:
        task = asyncio.create_task(app[CORE].policy.run_forever(settings.policy_interval_s, settings.policy_execute, stop))
    yield
    if task is not None:
        stop.set()  # a running cycle completes: its reads and writes finish before the database closes
        await task


async def _otlp_grpc(app: web.Application) -> None:
    settings = app[SETTINGS]
    server = None
    if settings.otlp_grpc_port:
        server, app[OTLP_GRPC_PORT] = await otlpgrpc.start(
            settings.host, settings.otlp_grpc_port, app[WRITER], app[TOKENS], app[LIMITER],
            settings.max_body_bytes, settings.max_line_bytes, push.caps_of(settings), app[BUDGET],
            app.get(forward.FORWARDER),
        )
    yield
    if server is not None:
        await server.stop(grace=5)  # in-flight exports finish (their commits) before the writer stops


async def _shared_tokens(app: web.Application) -> None:
    """Lake mode: instance tokens issued or revoked on any node hold on this one (ingest/db/lake/tokens.py)."""
    book = app[TOKENS]
    book.shared = SharedTokens(book, app[SETTINGS].lake.removeprefix("postgres:"), retry_after_s=app[SETTINGS].retry_after_s)
    await book.shared.start()
    yield
    await book.shared.close()


def create_app(settings: Settings) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    ingest_metrics = IngestMetrics(registry)
    tokens = TokenBook(settings.enroll_token, settings.read_token, settings.admin_token)
    budget = MemoryBudget(settings.memory_split()["requests"], settings.retry_after_s)
    app = web.Application(
        middlewares=[
            build_error_middleware(lambda reason: ingest_metrics.rejected.labels(reason=reason).inc(),
                                   ingest_metrics.client_disconnects.inc),
            build_body_middleware(budget, settings.http_body_timeout_s),
            build_auth_middleware(tokens),
            *([forward.build_forward_middleware(settings.max_body_bytes, push.caps_of(settings))] if settings.lake else []),
        ],
        client_max_size=settings.max_body_bytes,
    )
    app[BUDGET] = budget
    registry.register(LiveStateCollector({
        "fleetlog_memory_budget_bytes": ("memory_budget_mb, in bytes", lambda: settings.memory_budget_mb * 2**20),
        "fleetlog_memory_requests_bytes": ("Bytes held by requests in flight (bodies, parsed rows, the writer queue)",
                                           lambda: budget.used),
        "fleetlog_memory_refused_total": ("Requests refused with 503: the memory budget was spent", lambda: budget.refused),
    }))
    app[SETTINGS] = settings
    app[TOKENS] = tokens
    app[LIMITER] = InstanceRateLimiter(settings.instance_max_rows_per_s)
    app[ENROLL_LIMITER] = InstanceRateLimiter(settings.enroll_max_per_s, settings.enroll_burst,
                                              "{key} is over {rate:g} registrations/s")
    app[METRICS] = ingest_metrics
    app.cleanup_ctx.append(_core)
    if settings.lake:
        app.cleanup_ctx.append(_shared_tokens)
        app.cleanup_ctx.append(forward.session_ctx(lambda a: a[CORE].slots, settings.retry_after_s))
    app.cleanup_ctx.append(_policy_timer)
    app.cleanup_ctx.append(_otlp_grpc)
    app.router.add_post("/api/v1/logs", push.post_logs)
    app.router.add_post("/api/v1/events", push.post_events)
    app.router.add_post("/api/v1/admin/instances", push.post_admin_instances)
    app.router.add_post("/api/v1/metrics", push.post_metrics)
    app.router.add_post("/api/log-push", push.post_log_push)
    app.router.add_post("/v1/logs", otlp.post_logs)
    app.router.add_post("/v1/metrics", otlp.post_metrics)
    app.router.add_get("/api/v1/instances", read.get_instances)
    app.router.add_get("/api/v1/instances/{instance_id}", read.get_instance)
    app.router.add_get("/api/v1/instances/{instance_id}/logs", read.get_logs)
    app.router.add_post("/api/v1/query", query.post_query)
    app.router.add_get("/api/v1/hosts", hosts.get_hosts)
    app.router.add_get("/api/v1/hosts/{machine_id}", hosts.get_host)
    app.router.add_post("/api/v1/hosts/{machine_id}/exclude", hosts.post_exclude)
    app.router.add_post("/api/v1/hosts/{machine_id}/include", hosts.post_include)
    app.router.add_get("/api/v1/decisions", hosts.get_decisions)
    app.router.add_post("/api/v1/policy/run", hosts.post_policy_run)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_post("/api/v1/instances/{instance_id}/token", push.post_instance_token)
    app.router.add_get("/api/v1/search", search_handlers.get_search)
    app.router.add_get("/api/v1/queries", query_files.get_queries)
    app.router.add_get("/api/v1/admin/events", admin.get_events)
    app.router.add_delete("/api/v1/admin/events", admin.delete_event)
    page.setup(app)
    app.on_response_prepare.append(close_after_unread_body)
    app.on_shutdown.append(read.on_shutdown)
    return app
