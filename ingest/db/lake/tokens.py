"""Lake mode's instance tokens, shared by every node through PostgreSQL (ingest/auth.py's
TokenBook asks it about a token it does not know)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from ingest.errors import Overloaded

if TYPE_CHECKING:
    from ingest.auth import TokenBook

logger = logging.getLogger(__name__)


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
