"""Who may push or read what: fleet tokens, per-instance tokens, and per-instance rate limits.

Tokens come as ``Authorization: Bearer <token>``. The enrollment token lets an agent register (a
``registered`` event), and registration returns a per-instance token; an instance token pushes
only for its own instance (another → 403); the read token reads (read and SQL APIs, the page's
data, /metrics); the admin token does everything (operator verdicts, executing decisions). No or
an unknown token → 401. Tokens are compared as SHA-256 digests in constant time and never logged.
With no token configured everything is open, and the server only binds to loopback.

In lake mode every node serves every instance's pushes (ingest/web/forward.py), so an instance token
issued or revoked on one node must hold on all of them: ``SharedTokens`` looks a token this node
has not seen up in PostgreSQL before refusing it, and polls PostgreSQL for re-issued tokens to drop
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
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

from ingest.errors import Forbidden, Overloaded, RateLimited, Unauthorized

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


class TokenBook:
    def __init__(self, enroll_token: str, read_token: str, admin_token: str) -> None:
        self._fleet = [(digest(t), kind) for t, kind in ((admin_token, "admin"), (read_token, "read"), (enroll_token, "enroll")) if t]
        self._instances: dict[str, str] = {}  # token digest -> instance_id
        self._lock = threading.Lock()
        self.enrolling = asyncio.Lock()  # an enrollment's existence check and its write, as one step
        self.shared: SharedTokens | None = None  # lake mode: the tokens of every node (PostgreSQL)
        self._dropped_at: dict[str, float] = {}  # instance -> when SharedTokens last dropped its cached tokens

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


class SharedTokens:
    """Lake mode: the instance tokens of every node, kept in step through PostgreSQL's
    ``instance_tokens`` (the rows the writers store tokens in; re-issuing deletes the old rows and
    inserts the new one in one transaction).

    - Issued anywhere, valid everywhere at once: a token the book does not know is looked up in
      PostgreSQL (by its digest, one indexed query) before it is refused, and cached. PostgreSQL
      unreachable or slow: 503 + Retry-After (the agent retries), never a 401 (it would not).
    - Revoked anywhere, refused everywhere within ``poll_s`` (plus one query): every ``poll_s`` the
      rows issued in the last ``window_s`` are read, and an instance with a token not seen before
      loses every other token cached for it; a lookup that started before that drop does not cache
      its answer. ``issued_at`` is the issuing node's clock, so the nodes' clocks and PostgreSQL's
      must agree within ``window_s``.
    - Polled tokens are cached too: a token issued on another node works here within ``poll_s``
      without any lookup, so a lookup refused (below) costs its agent one retry at most.
    - A client without a valid token cannot crowd out the lookups: only a token of
      ``INSTANCE_TOKEN``'s shape is looked up; one missed is answered 401 without asking again for
      ``miss_ttl_s`` (a token is in PostgreSQL before any agent holds it, so a miss is never a token
      about to be issued); one already being looked up waits for that answer; and at most
      ``max_lookups_in_flight`` distinct tokens are asked about at a time, the next ones answered 503 +
      Retry-After at once instead of queueing behind the one lookup connection.
    - Cost: one query per node per ``poll_s`` reading only recent rows, and one per token a node
      meets for the first time (or again after a re-issue), never more than ``max_lookups_in_flight``
      at once. The dictionary lookup of the hot path is unchanged.
    """

    MAX_MISSES = 10_000  # missed digests remembered at most (a flood of fresh ones is bounded by the cap)

    def __init__(self, book: TokenBook, dsn: str, *, poll_s: float = 1.0, window_s: float = 120.0,
                 lookup_timeout_s: float = 5.0, retry_after_s: int = 1, max_lookups_in_flight: int = 8,
                 miss_ttl_s: float = 1.0) -> None:
        self.book, self.dsn = book, dsn
        self.poll_s, self.window_s, self.lookup_timeout_s, self.retry_after_s = poll_s, window_s, lookup_timeout_s, retry_after_s
        self.max_lookups_in_flight, self.miss_ttl_s = max_lookups_in_flight, miss_ttl_s
        self._lookups = None  # psycopg.AsyncConnection, opened on first use, again after an error
        self._seen: dict[tuple[str, str], float] = {}  # (instance, digest) issued within the window -> when seen
        self._task: asyncio.Task | None = None
        self._connecting = asyncio.Lock()  # one lookup connection, however many lookups start together
        self._pending: dict[str, asyncio.Task] = {}  # digest -> its lookup in flight
        self._misses: OrderedDict[str, float] = OrderedDict()  # digest -> until when it is a 401 without asking
        self.queries = 0  # lookups sent to PostgreSQL
        self.refused = 0  # lookups refused (503) because max_lookups_in_flight were in flight
        self.most_in_flight = 0

    async def start(self) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for name, column in (("instance_tokens_sha", "token_sha256"), ("instance_tokens_issued", "issued_at")):
                try:  # nodes starting together race to create them: one wins
                    await conn.execute(f"CREATE INDEX IF NOT EXISTS fleetlog_{name} ON instance_tokens ({column})")
                except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                    pass
        self._task = asyncio.create_task(self._run(), name="fleetlog-shared-tokens")

    async def close(self) -> None:
        for task in [self._task, *self._pending.values()]:
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 (its waiters had its answer)
                    pass
        await self._drop_lookups()

    async def lookup(self, token_sha: str) -> str | None:
        """The instance ``token_sha`` belongs to in PostgreSQL (cached), or None."""
        now = time.monotonic()
        if self._misses.get(token_sha, -math.inf) > now:
            return None
        pending = self._pending.get(token_sha)
        if pending is None:
            if len(self._pending) >= self.max_lookups_in_flight:
                self.refused += 1
                raise Overloaded("too many unknown tokens are being looked up; retry", retry_after_s=self.retry_after_s)
            pending = self._pending[token_sha] = asyncio.create_task(self._ask(token_sha))
            pending.add_done_callback(lambda task: (self._pending.pop(token_sha, None),
                                                    task.cancelled() or task.exception()))
            self.most_in_flight = max(self.most_in_flight, len(self._pending))
        return await asyncio.shield(pending)  # a client gone does not cancel the query others wait for

    async def _ask(self, token_sha: str) -> str | None:
        import psycopg

        asked_at = time.monotonic()
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                async with self._connecting:
                    if self._lookups is None or self._lookups.closed:
                        self._lookups = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                    conn = self._lookups
                self.queries += 1
                row = await (await conn.execute(
                    "SELECT instance_id FROM instance_tokens WHERE token_sha256 = %s LIMIT 1", [token_sha])).fetchone()
        except (psycopg.Error, OSError, TimeoutError) as e:
            logger.warning("instance token lookup failed: %s", type(e).__name__)
            await self._drop_lookups()
            raise Overloaded("the token store (PostgreSQL) did not answer; retry", retry_after_s=self.retry_after_s) from None
        except asyncio.CancelledError:  # mid-query: the connection's state is unknown
            await self._drop_lookups()
            raise
        if row is None:
            self._remember_miss(token_sha, time.monotonic())
            return None
        self.book.remember_looked_up(row[0], token_sha, asked_at)
        return row[0]

    def _remember_miss(self, token_sha: str, now: float) -> None:
        """Oldest first (every entry lives ``miss_ttl_s``): the expired, and past ``MAX_MISSES`` the
        oldest, leave from the front, in constant time per miss however fast a flood makes them."""
        misses = self._misses
        misses.pop(token_sha, None)
        while misses and (len(misses) >= self.MAX_MISSES or next(iter(misses.values())) <= now):
            misses.popitem(last=False)
        misses[token_sha] = now + self.miss_ttl_s

    async def _drop_lookups(self) -> None:
        conn, self._lookups = self._lookups, None
        if conn is not None:
            await conn.close()

    async def poll(self, conn) -> None:
        """Cache the tokens issued in the window, and drop the cached tokens of every instance given
        a token not seen before."""
        asked_at = time.monotonic()
        rows = await (await conn.execute(
            "SELECT instance_id, token_sha256 FROM instance_tokens "
            "WHERE issued_at > (now() AT TIME ZONE 'UTC') - make_interval(secs => %s)", [self.window_s])).fetchall()
        self.take_rows(rows, asked_at)

    def take_rows(self, rows, asked_at: float) -> None:
        """``rows`` (instance, digest) were read from PostgreSQL at ``asked_at``."""
        now = time.monotonic()
        for instance_id, token_sha in rows:  # not if the instance's tokens were dropped since asked_at
            self.book.remember_looked_up(instance_id, token_sha, asked_at)
            self._misses.pop(token_sha, None)
        for instance_id, token_sha in rows:
            if (instance_id, token_sha) not in self._seen:
                self.book.drop_others(instance_id, token_sha)
            self._seen[(instance_id, token_sha)] = now
        horizon = now - 2 * self.window_s
        self._seen = {k: at for k, at in self._seen.items() if at >= horizon}
        self.book.forget_drops_before(now - max(60.0, 4 * self.lookup_timeout_s))  # no lookup is that old

    async def _run(self) -> None:
        import psycopg

        conn = None
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                    await self.poll(conn)
                except Exception:  # noqa: BLE001 (a background loop: log, and try again)
                    logger.warning("instance token poll failed; retrying", exc_info=True)
                    if conn is not None:
                        await conn.close()
                    conn = None
                await asyncio.sleep(self.poll_s)
        finally:
            if conn is not None:
                await conn.close()


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
