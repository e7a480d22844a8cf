"""Who may push or read what: fleet tokens, per-instance tokens, and per-instance rate limits.

Tokens come as ``Authorization: Bearer <token>``. The enrollment token lets an agent register (a
``registered`` event), and registration returns a per-instance token; an instance token pushes
only for its own instance (another → 403); the read token reads (read and SQL APIs, the page's
data, /metrics); the admin token does everything (operator verdicts, executing decisions). No or
an unknown token → 401. Tokens are compared as SHA-256 digests in constant time and never logged.
With no token configured everything is open, and the server only binds to loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass

from aiohttp import web

from ingest.errors import Forbidden, RateLimited, Unauthorized

PUBLIC, PUSH, READ, ADMIN = "public", "push", "read", "admin"


def requires(role: str):
    """Mark a handler with the role it needs (read when unmarked)."""

    def mark(handler):
        handler.fleetlog_role = role
        return handler

    return mark


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    kind: str  # open, admin, read, enroll, instance
    instance_id: str | None = None


OPEN = Principal("open")
PRINCIPAL = web.RequestKey("principal", Principal)  # who the request's token says it is


class TokenBook:
    def __init__(self, enroll_token: str, read_token: str, admin_token: str) -> None:
        self._fleet = [(digest(t), kind) for t, kind in ((admin_token, "admin"), (read_token, "read"), (enroll_token, "enroll")) if t]
        self._instances: dict[str, str] = {}  # token digest -> instance_id
        self._lock = threading.Lock()
        self.enrolling = asyncio.Lock()  # an enrollment's existence check and its write, as one step

    @property
    def enabled(self) -> bool:
        return bool(self._fleet)

    def load(self, cursor) -> None:
        for instance_id, token_sha in cursor.execute("SELECT instance_id, token_sha256 FROM instance_tokens").fetchall():
            self._instances[token_sha] = instance_id

    def identify(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return OPEN
        if not authorization or not authorization.startswith("Bearer "):
            raise Unauthorized("a token is required: Authorization: Bearer <token>")
        presented = digest(authorization[7:].strip())
        found = None
        for known, kind in self._fleet:  # every comparison is made, whatever matches
            if hmac.compare_digest(presented, known):
                found = Principal(kind)
        if found is None:
            instance_id = self._instances.get(presented)
            if instance_id is not None:
                found = Principal("instance", instance_id)
        if found is None:
            raise Unauthorized("unknown token")
        return found

    @staticmethod
    def new_token() -> tuple[str, str]:
        token = "fli_" + secrets.token_urlsafe(32)
        return token, digest(token)

    def remember(self, instance_id: str, token_sha: str) -> None:
        with self._lock:
            self._instances[token_sha] = instance_id

    def replace(self, instance_id: str, token_sha: str) -> None:
        """The instance's only token is now ``token_sha``: every earlier one stops working."""
        with self._lock:
            for known in [k for k, owner in self._instances.items() if owner == instance_id]:
                del self._instances[known]
            self._instances[token_sha] = instance_id

    def has_token(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._instances.values()


def write_instance_token(con, instance_id: str, token_sha: str, issued_us: int, *, revoke_old: bool) -> None:
    """Store an instance token's digest (the one place that writes token rows; the writer's
    transaction). ``revoke_old``: the instance's earlier tokens are deleted in the same transaction."""
    if revoke_old:
        con.execute("DELETE FROM instance_tokens WHERE instance_id = ?", [instance_id])
    con.execute("INSERT INTO instance_tokens VALUES (?, ?, make_timestamp(?))", [instance_id, token_sha, issued_us])


def known_instances(cursor, instance_ids: list[str]) -> set[str]:
    """Which of ``instance_ids`` the database already holds (a reader's cursor)."""
    rows = cursor.execute("SELECT instance_id FROM instances WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))",
                          [instance_ids]).fetchall()
    return {instance_id for (instance_id,) in rows}


def check_role(principal: Principal, role: str) -> None:
    if role == PUBLIC or principal.kind in ("open", "admin"):
        return
    if role == READ and principal.kind == "read":
        return
    if role == PUSH and principal.kind in ("instance", "enroll"):
        return
    raise Forbidden(f"this token may not {'push' if role == PUSH else role} here")


def check_instances(principal: Principal, instance_ids: set[str], kinds: set[str] | None = None) -> None:
    """A push names only the instances its token may push for (``kinds``: the event kinds, if events)."""
    if principal.kind in ("open", "admin"):
        return
    if principal.kind == "enroll":
        if kinds == {"registered"}:
            return
        raise Forbidden("the enrollment token may only register (a 'registered' event); use the instance's token")
    others = instance_ids - {principal.instance_id}
    if others:
        raise Forbidden(f"this token belongs to {principal.instance_id!r}, not to {sorted(others)[0]!r}")


class InstanceRateLimiter:
    """A token bucket of rows per instance: ``rate_rows_per_s`` sustained, twice that in a burst.

    Every row is charged. A body bigger than the burst is admitted only when the bucket is full and
    then takes it negative by its excess, so the next push waits until the whole cost is earned
    back: the sustained rate holds whatever the body size, and no body waits forever.
    """

    def __init__(self, rate_rows_per_s: float) -> None:
        self.rate = rate_rows_per_s
        self.burst = 2 * rate_rows_per_s
        self._buckets: dict[str, tuple[float, float]] = {}  # instance -> (tokens, at)

    def take(self, instance_id: str, rows: int) -> None:
        if self.rate <= 0 or rows <= 0:
            return
        now = time.monotonic()
        tokens, at = self._buckets.get(instance_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        needed = min(rows, self.burst)  # what must be in the bucket; the full ``rows`` is taken
        if tokens < needed:
            self._buckets[instance_id] = (tokens, now)
            retry = max(1, math.ceil((needed - tokens) / self.rate))
            raise RateLimited(
                f"instance {instance_id!r} is over {self.rate:g} rows/s; retry later", headers={"Retry-After": str(retry)}
            )
        self._buckets[instance_id] = (tokens - rows, now)


def build_auth_middleware(book: TokenBook):
    @web.middleware
    async def auth_middleware(request: web.Request, handler):
        role = getattr(handler, "fleetlog_role", READ)
        if role == PUBLIC and not book.enabled:
            return await handler(request)
        principal = book.identify(request.headers.get("Authorization")) if role != PUBLIC else OPEN
        check_role(principal, role)
        request[PRINCIPAL] = principal
        return await handler(request)

    return auth_middleware
