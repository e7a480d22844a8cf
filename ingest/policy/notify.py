"""Telling someone: a decision proposed, superseded, executed or failed is POSTed as JSON to
``notify_webhook_url`` with its evidence.

A notification never blocks a policy cycle: ``send`` schedules the POST and returns. At most
``max_pending`` are in flight; beyond that, and for every POST that fails (unreachable, timeout,
non-2xx), ``fleetlog_policy_notifications_dropped_total{reason}`` is incremented and a warning
logged. ``close`` waits (bounded) for those in flight at shutdown.

``post_json`` is the one webhook client: the notifier and the webhook actuator (``ingest/policy/actuator.py``)
both POST through it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter

logger = logging.getLogger(__name__)


class WebhookUnreachable(Exception):
    """The webhook gave no answer: refused, reset, unresolvable or past its timeout."""


async def post_json(url: str, body: Any, timeout_s: float) -> tuple[int, str]:
    """POST ``body`` as JSON (datetimes as ISO-8601, naive ones UTC) to ``url`` within ``timeout_s``;
    return the answer's status and its first 200 characters, or raise WebhookUnreachable."""
    data = orjson.dumps(body, default=str, option=orjson.OPT_NAIVE_UTC)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
                return r.status, (await r.text(errors="replace"))[:200]
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise WebhookUnreachable(f"{type(e).__name__}: {e}") from e


class Notifier:
    def __init__(self, url: str, timeout_s: float, registry: CollectorRegistry, *, max_pending: int = 100) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._pending: set[asyncio.Task] = set()
        self.sent = Counter("fleetlog_policy_notifications_total", "Decision notifications delivered, by event",
                            ["event"], registry=registry)
        self.dropped = Counter("fleetlog_policy_notifications_dropped_total",
                               "Decision notifications not delivered, by reason", ["reason"], registry=registry)

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def send(self, event: str, decision: dict[str, Any]) -> None:
        """Schedule one notification (``event``: proposed, superseded, executed, failed)."""
        if not self.url:
            return
        if len(self._pending) >= self.max_pending:
            self.dropped.labels(reason="backlog").inc()
            logger.warning("notification of decision %s (%s) dropped: %d already in flight",
                           decision.get("id"), event, len(self._pending))
            return
        body = {"event": event, "decision": decision}
        task = asyncio.get_running_loop().create_task(self._post(event, body))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, event: str, body: dict[str, Any]) -> None:
        try:
            status, _text = await post_json(self.url, body, self.timeout_s)
        except WebhookUnreachable as e:
            self.dropped.labels(reason="unreachable").inc()
            logger.warning("notify webhook unreachable for decision %s (%s): %s", body["decision"].get("id"), event, e)
            return
        if status // 100 != 2:
            self.dropped.labels(reason="status").inc()
            logger.warning("notify webhook answered %d for decision %s (%s)", status, body["decision"].get("id"), event)
            return
        self.sent.labels(event=event).inc()

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the notifications in flight; cancel the rest."""
        if not self._pending:
            return
        pending = list(self._pending)
        _done, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
            self.dropped.labels(reason="shutdown").inc()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
