"""Send the spool to the server, in order, one request at a time, until each record is acknowledged.

Consecutive log records go together in one ``POST /api/v1/logs`` (``{"streams": [...]}``, up to
``batch_max_bytes``), consecutive events in one ``POST /api/v1/events``; a metrics record is one
``POST /api/v1/metrics``. Bodies over 1 KiB are gzipped. A record is acknowledged (and the spool's
``acked`` moves past it) only on a 2xx, which the server sends after its commit; so a record that
follows another (``bench_done`` after the last log line) is never sent before it is stored.

What an answer does (OpenTelemetry's OTLP/HTTP exporter is the model):

- 2xx: acknowledged.
- connection error, timeout, 429, 502, 503, 504: sent again after a jittered exponential backoff
  (``retry_initial_delay_s`` doubling up to ``retry_max_delay_s``), never sooner than the server's
  ``Retry-After``.
- 401, 403 and other 5xx: kept and sent again, but only every ``retry_max_delay_s``: the records are
  evidence, and a token fixed or a server repaired must still get them. (A 401 to an enrolled token
  is retried at once: the token is forgotten and the agent enrolls again; see ``credentials.py``.)
  A 409 to an enrollment is held the same way (a resent enrollment carries the same Idempotency-Key and
  gets the same token, so a 409 means another agent enrolled it): the instance was enrolled before and its token is
  lost; the records wait until an admin re-issues the token into the token file or ``--token``.
- other 4xx (400, 413, ...): the server will never take these bytes. A batch of several records is
  split and sent record by record; a single record refused is dropped, counted, and logged with the
  server's error message.

Every wait can be interrupted (``stop()``); ``drain(deadline_s)`` waits until the spool is empty.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
import zlib
from dataclasses import dataclass
from typing import Callable

import aiohttp

from agent.credentials import Credentials
from agent.spool import Entry, Ptr, Spool

logger = logging.getLogger(__name__)

USER_AGENT = "fleetlog-agent/0.1"
GZIP_MIN_BYTES = 1024
MAX_RETRY_AFTER_S = 300.0
PATHS = {"logs": "/api/v1/logs", "event": "/api/v1/events", "metrics": "/api/v1/metrics"}


@dataclass(frozen=True)
class Outcome:
    verdict: str  # ok | retry | hold | reject
    status: int | None  # None: no HTTP answer
    detail: str = ""
    retry_after_s: float | None = None


def classify(status: int) -> str:
    if 200 <= status < 300:
        return "ok"
    if status in (429, 502, 503, 504):
        return "retry"
    if status in (401, 403) or status >= 500:
        return "hold"
    return "reject"


def parse_retry_after(value: str | None) -> float | None:
    """Seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, when.timestamp() - time.time()))


class Client:
    """POSTs JSON bodies to the server with the right token and says what the answer means."""

    def __init__(self, server_url: str, *, credentials: Credentials, request_timeout_s: float) -> None:
        self.server_url = server_url.rstrip("/")
        self.credentials = credentials
        self._session = aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=request_timeout_s, connect=min(5.0, request_timeout_s)),
        )

    @property
    def needs_enrollment(self) -> bool:
        return self.credentials.needs_enrollment

    async def post(self, path: str, body: bytes, kinds: set[str] | None = None) -> Outcome:
        creds = self.credentials
        if creds.needs_enrollment:
            registering = path == PATHS["event"] and kinds == {"registered"}
            outcome, reply = await self._send(PATHS["event"], body if registering else creds.enrollment_body(), creds.enroll_token,
                                              {"Idempotency-Key": creds.enroll_key})
            if outcome.status == 409:  # enrolled before, token lost: the records wait for a re-issued one
                logger.error(
                    "the server already knows instance %s and will not enroll it again; keeping every record. "
                    "An admin must re-issue its token (POST /api/v1/instances/%s/token) and put it in the "
                    "token file (%s) or pass --token", creds.instance_id, creds.instance_id, creds.token_file or "none set",
                )
                return Outcome("hold", 409, outcome.detail, outcome.retry_after_s)
            if outcome.verdict != "ok":
                return outcome
            creds.accept(reply)
            if registering:
                return outcome
        outcome, _reply = await self._send(path, body, creds.current())
        if outcome.status == 401 and creds.rejected():
            return Outcome("retry", 401, outcome.detail, outcome.retry_after_s)
        return outcome

    async def _send(self, path: str, body: bytes, token: str | None, extra: dict[str, str] | None = None) -> tuple[Outcome, bytes]:
        headers = ({"Authorization": f"Bearer {token}"} if token else {}) | (extra or {})
        if len(body) >= GZIP_MIN_BYTES:
            body = zlib.compress(body, 1, wbits=31)  # wbits=31: a gzip stream
            headers["Content-Encoding"] = "gzip"
        try:
            async with self._session.post(self.server_url + path, data=body, headers=headers) as resp:
                reply = await resp.read()
                verdict = classify(resp.status)
                detail = "" if verdict == "ok" else reply[:500].decode(errors="replace")
                return Outcome(verdict, resp.status, detail, parse_retry_after(resp.headers.get("Retry-After"))), reply
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return Outcome("retry", None, f"{type(e).__name__}: {e}"[:500]), b""

    async def close(self) -> None:
        await self._session.close()


class Backoff:
    """Full-jitter exponential backoff: the n-th wait is uniform in [d/2, d], d = initial * 2^n <= max."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempt = 0
        self.rng = rng or random.Random()

    def next_delay(self, retry_after_s: float | None = None) -> float:
        ceiling = min(self.max_s, self.initial_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        delay = ceiling * self.rng.uniform(0.5, 1.0)
        return max(delay, retry_after_s or 0.0)

    def reset(self) -> None:
        self.attempt = 0


def build_body(entries: list[Entry]) -> tuple[str, bytes]:
    kind = entries[0].record.kind
    payloads = [e.record.payload for e in entries]
    if kind == "logs":
        return PATHS[kind], b'{"streams":[' + b",".join(payloads) + b"]}"
    if kind == "event":
        return PATHS[kind], b"[" + b",".join(payloads) + b"]"
    assert len(payloads) == 1
    return PATHS[kind], payloads[0]


def next_batch(entries: list[Entry], single: bool) -> list[Entry]:
    """The longest run of records that can share one request, from the front."""
    first = entries[0].record.kind
    if single or first == "metrics":
        return entries[:1]
    batch = []
    for e in entries:
        if e.record.kind != first:
            break
        batch.append(e)
    return batch


class Shipper:
    def __init__(
        self,
        spool: Spool,
        client: Client,
        *,
        batch_max_bytes: int,
        backoff: Backoff,
        hold_delay_s: float,
        on_acked: Callable[[], None] = lambda: None,
        on_rejected: Callable[[Entry, Outcome], None] = lambda entry, outcome: None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.batch_max_bytes = batch_max_bytes
        self.backoff = backoff
        self.hold_delay_s = hold_delay_s
        self.on_acked = on_acked
        self.on_rejected = on_rejected
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._progress = asyncio.Event()
        self._single_until: Ptr | None = None  # after a 4xx on a batch: one record per request
        self.requests = 0
        self.failures = 0
        self.last_error = ""

    def wake(self) -> None:
        """Records were appended."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        """Wait, unless stopped."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def run(self) -> None:
        read_at = self.spool.acked
        while not self._stop.is_set():
            try:
                read_at = max(read_at, self.spool.acked)
                entries = self.spool.read(read_at, self.batch_max_bytes)
                if not entries:
                    self._progress.set()
                    self._wake.clear()
                    if self.spool.read(max(read_at, self.spool.acked), 1):
                        continue  # appended between the read and the clear
                    await self._wake.wait()
                    continue
                single = self._single_until is not None and entries[0].start < self._single_until
                if entries[0].record.meta.get("kind") == "registered" and self.client.needs_enrollment:
                    single = True  # our own registration is the enrollment: alone, with the enrollment token
                batch = next_batch(entries, single)
                read_at = await self._deliver(batch)
            except Exception:  # a bug or a disk error must not end shipping for good
                logger.exception("shipping failed; trying again")
                self.failures += 1
                read_at = self.spool.acked
                await self._sleep(self.backoff.next_delay())

    async def _deliver(self, batch: list[Entry]) -> Ptr:
        """Send one batch until it is acknowledged, refused, or the shipper is stopped."""
        sendable = [e for e in batch if not (e.record.kind == "logs" and e.record.meta.get("n") == 0)]
        end = batch[-1].end
        if not sendable:  # records that only move file positions: nothing to send
            self._acked(end)
            return end
        path, body = build_body(sendable)
        kinds = {e.record.meta.get("kind") for e in sendable} if path == PATHS["event"] else None
        while not self._stop.is_set():
            self.requests += 1
            outcome = await self.client.post(path, body, kinds)
            if outcome.verdict == "ok":
                self._acked(end)
                return end
            self.failures += 1
            self.last_error = f"{outcome.status or 'no answer'}: {outcome.detail}"
            if outcome.verdict == "reject":
                if len(sendable) > 1:
                    self._single_until = end
                    return batch[0].start  # read again, one record per request
                logger.error("server refused a %s record for good (%s); dropping it: %s", batch[0].record.kind, outcome.status, outcome.detail)
                for e in batch:
                    self.on_rejected(e, outcome)
                self._acked(end)
                return end
            if outcome.verdict == "hold":
                logger.error("server answered %s to %s; keeping the records, trying again in %.0f s: %s", outcome.status, path, self.hold_delay_s, outcome.detail)
                delay = max(self.hold_delay_s, outcome.retry_after_s or 0.0)
            else:
                delay = self.backoff.next_delay(outcome.retry_after_s)
                logger.info("sending to %s failed (%s); again in %.2f s", path, self.last_error[:200], delay)
            await self._sleep(delay)
        return batch[0].start

    def _acked(self, end: Ptr) -> None:
        self.spool.ack(end)
        self.backoff.reset()
        if self._single_until is not None and end >= self._single_until:
            self._single_until = None
        self.on_acked()
        self._progress.set()

    async def drain(self, deadline_s: float) -> bool:
        """Wait until every record is acknowledged (True) or ``deadline_s`` (monotonic) passes (False)."""
        while not self.spool.empty:
            left = deadline_s - time.monotonic()
            if left <= 0:
                return False
            self._progress.clear()
            self.wake()
            try:
                await asyncio.wait_for(self._progress.wait(), left)
            except asyncio.TimeoutError:
                return self.spool.empty
        return True
