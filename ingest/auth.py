"""Who may push or read what: fleet tokens, per-instance tokens, and per-instance rate limits.

Tokens come as ``Authorization: Bearer <token>``. The enrollment token lets an agent register (a
``registered`` event), and registration returns a per-instance token; an instance token pushes
only for its own instance (another → 403); the read token reads (read and SQL APIs, the page's
data, /metrics); the admin token does everything (operator verdicts, executing decisions). No or
an unknown token → 401. Tokens are compared as SHA-256 digests in constant time and never logged.
With no token configured everything is open, and the server only binds to loopback.

In lake mode every node serves every instance's pushes (ingest/web/forward.py), so an instance token
issued or revoked on one node must hold on all of them: ``SharedTokens`` looks a token this node
has not seen up in PostgreSQL before refusing it (ingest/db/lake/tokens.py), and polls PostgreSQL for re-issued tokens to drop
the revoked ones it had cached. Single-file mode has no SharedTokens: a dictionary lookup, as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Protocol

from aiohttp import web

from ingest.errors import Forbidden, RateLimited, Unauthorized

logger = logging.getLogger(__name__)

PUBLIC, PUSH, READ, ADMIN = "public", "push", "read", "admin"
INSTANCE_TOKEN = re.compile(r"fli_[A-Za-z0-9_-]{43}")  # what TokenBook.new_token makes (32 random bytes)


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


class TokenLookup(Protocol):
    """Where a token this node does not know is looked up (lake mode: ingest/db/lake/tokens.py's
    SharedTokens, PostgreSQL)."""

    async def lookup(self, token_sha: str) -> str | None: ...


class TokenBook:
    def __init__(self, enroll_token: str, read_token: str, admin_token: str) -> None:
        self._fleet = [(digest(t), kind) for t, kind in ((admin_token, "admin"), (read_token, "read"), (enroll_token, "enroll")) if t]
        self._instances: dict[str, str] = {}  # token digest -> instance_id
        self._lock = threading.Lock()
        self.enrolling = asyncio.Lock()  # an enrollment's existence check and its write, as one step
        self.shared: TokenLookup | None = None  # lake mode: the tokens of every node (ingest/db/lake/tokens.py)
        self._dropped_at: dict[str, float] = {}  # instance -> when SharedTokens last dropped its cached tokens

    @property
    def enabled(self) -> bool:
        return bool(self._fleet)

    def load(self, rows: Iterable[tuple[str, str]]) -> None:
        """The stored (instance_id, token digest) rows (``Database.instance_tokens``), at start-up."""
        for instance_id, token_sha in rows:
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

    async def authenticate(self, authorization: str | None) -> Principal:
        """``identify``; in lake mode an instance token this node does not know yet is looked up in
        PostgreSQL before it is refused (it may have been issued by another node)."""
        try:
            return self.identify(authorization)
        except Unauthorized:
            shared = self.shared
            if shared is None or not authorization or not authorization.startswith("Bearer "):
                raise
        token = authorization[7:].strip()
        if not INSTANCE_TOKEN.fullmatch(token):  # not one new_token could have made: never asked about
            raise Unauthorized("unknown token")
        instance_id = await shared.lookup(digest(token))
        if instance_id is None:
            raise Unauthorized("unknown token")
        return Principal("instance", instance_id)

    def remember_looked_up(self, instance_id: str, token_sha: str, asked_at: float) -> None:
        """Cache a token read from PostgreSQL at ``asked_at`` (monotonic), unless the instance's tokens
        were dropped since (the answer may predate a re-issue)."""
        with self._lock:
            if self._dropped_at.get(instance_id, -math.inf) < asked_at:
                self._instances[token_sha] = instance_id

    def drop_others(self, instance_id: str, token_sha: str) -> None:
        """``token_sha`` was just issued for the instance, maybe revoking others: forget every other
        token of it cached here (one still valid is only looked up again)."""
        with self._lock:
            self._forget_tokens_of(instance_id, keep=token_sha)
            self._dropped_at[instance_id] = time.monotonic()

    def _forget_tokens_of(self, instance_id: str, keep: str | None = None) -> None:
        """Under ``_lock``: drop every cached token of the instance but ``keep``."""
        for known in [k for k, owner in self._instances.items() if owner == instance_id and k != keep]:
            del self._instances[known]

    def forget_drops_before(self, before: float) -> None:
        with self._lock:
            for instance_id in [i for i, at in self._dropped_at.items() if at < before]:
                del self._dropped_at[instance_id]

    @staticmethod
    def new_token() -> tuple[str, str]:
        token = "fli_" + secrets.token_urlsafe(32)  # INSTANCE_TOKEN's shape
        return token, digest(token)

    def remember(self, instance_id: str, token_sha: str) -> None:
        with self._lock:
            self._instances[token_sha] = instance_id

    def replace(self, instance_id: str, token_sha: str) -> None:
        """The instance's only token is now ``token_sha``: every earlier one stops working (and a
        SharedTokens poll whose rows were read before now does not bring one back)."""
        with self._lock:
            self._forget_tokens_of(instance_id)
            self._instances[token_sha] = instance_id
            if self.shared is not None:
                self._dropped_at[instance_id] = time.monotonic()

    async def instance_of(self, token_sha: str) -> str | None:
        """The instance a token digest belongs to (lake mode: also one another node issued), or None."""
        with self._lock:
            found = self._instances.get(token_sha)
        if found is None and self.shared is not None:
            found = await self.shared.lookup(token_sha)
        return found

    def has_token(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._instances.values()


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
    """A token bucket of rows per instance: ``rate_rows_per_s`` sustained, twice that in a burst
    (or ``burst``; the enrollment token's registrations are limited by one too, keyed by the token).

    Every row is charged. A body bigger than the burst is admitted only when the bucket is full and
    then takes it negative by its excess, so the next push waits until the whole cost is earned
    back: the sustained rate holds whatever the body size, and no body waits forever.
    """

    def __init__(self, rate_rows_per_s: float, burst: float | None = None, what: str = "instance {key!r} is over {rate:g} rows/s") -> None:
        self.rate = rate_rows_per_s
        self.burst = 2 * rate_rows_per_s if burst is None else burst
        self.what = what  # the 429's message
        self._buckets: dict[str, tuple[float, float]] = {}  # instance (or token) -> (tokens, at)

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
                f"{self.what.format(key=instance_id, rate=self.rate)}; retry later", headers={"Retry-After": str(retry)}
            )
        self._buckets[instance_id] = (tokens - rows, now)


def build_auth_middleware(book: TokenBook):
    @web.middleware
    async def auth_middleware(request: web.Request, handler):
        role = getattr(handler, "fleetlog_role", READ)
        if role == PUBLIC and not book.enabled:
            return await handler(request)
        principal = await book.authenticate(request.headers.get("Authorization")) if role != PUBLIC else OPEN
        check_role(principal, role)
        request[PRINCIPAL] = principal
        return await handler(request)

    return auth_middleware
