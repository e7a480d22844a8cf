"""The jobs of a lake shared by several nodes, kept apart through PostgreSQL advisory locks: the
delete window that lets retention commit beside ingest, and maintenance on one node at a time.

Why a window: DuckLake checks conflicts per table, so a DELETE on ``logs`` fails to commit whenever
any other transaction inserted into ``logs`` after it began, whatever rows either touched (0 of 20
committed beside one writer here; tests/test_lake_retention.py shows it through the nodes).

- Every lake commit of every node (``lake.write_batch``) holds ``WINDOW_LOCK_KEY`` *shared* from
  before its BEGIN to after its COMMIT: commits never wait for each other.
- A retention delete (a ``lake.LakeAction`` through the writer of the node running the policies)
  holds it *exclusive*: PostgreSQL queues it behind the commits in flight and queues the commits
  asked for later behind it, so the delete's transaction begins after every earlier insert committed
  and commits before any later one begins. Ingest waits for one DELETE instead of conflicting.
- A merge or flush of inlined rows conflicts with a DELETE too ("attempting to delete ... but
  another transaction has compacted it"), so a retention delete first takes
  ``MAINTENANCE_LOCK_KEY``, which every maintenance pass holds; it waits for it on a thread of its
  own, not on the writer's (this node's ingest goes on meanwhile).

Maintenance: every node runs a ``Maintenance`` thread; a pass runs only on the node that takes
``MAINTENANCE_LOCK_KEY`` (``pg_try_advisory_lock``: nobody waits) and finds the lake's last pass
(table ``fleetlog_maintenance``, one row per pass, created by ingest/db/lake/slots.py) at least ``interval_s`` old, so the lake is
maintained every ``interval_s`` by one node at a time, whichever nodes are alive. Appends do not
conflict with a merge, a snapshot expiry or a file clean-up; the sort order that the merge follows is
set once, when the lake is created (``lake._create_schema``: an ALTER conflicts with appends).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import duckdb
import psycopg

from ingest.db import writes
from ingest.db.lake import storage as lake
from ingest.errors import Overloaded, StoreError

logger = logging.getLogger(__name__)

WINDOW_LOCK_KEY = 0x666C6F70  # every lake commit shared, a retention delete exclusive
MAINTENANCE_LOCK_KEY = 0x666C6F71  # a maintenance pass, or a retention delete


class PgSession:
    """One PostgreSQL connection for advisory locks (session locks go with it when it breaks; the
    next call connects again). ``lock_timeout_s`` bounds every lock wait."""

    def __init__(self, pg_dsn: str, lock_timeout_s: float) -> None:
        self.pg_dsn = pg_dsn
        self.lock_timeout_ms = max(1, int(lock_timeout_s * 1000))
        self._conn: psycopg.Connection | None = None

    def execute(self, sql: str, params: list[Any] = ()) -> psycopg.Cursor:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.pg_dsn, autocommit=True, options=f"-c lock_timeout={self.lock_timeout_ms}")
        try:
            return self._conn.execute(sql, params)
        except psycopg.OperationalError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class DeleteWindow:
    """The writer's side of the window (used only on the writer thread): ``commit()`` around each
    lake commit, ``exclusive()`` around a retention delete."""

    def __init__(self, pg_dsn: str, wait_s: float = 30.0) -> None:
        self._session = PgSession(pg_dsn, wait_s)

    @contextmanager
    def commit(self) -> Iterator[None]:
        with self._held("pg_advisory_lock_shared", "pg_advisory_unlock_shared"):
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._held("pg_advisory_lock", "pg_advisory_unlock"):
            yield

    @contextmanager
    def _held(self, lock: str, unlock: str) -> Iterator[None]:
        try:
            self._session.execute(f"SELECT {lock}(%s)", [WINDOW_LOCK_KEY])
        except psycopg.errors.LockNotAvailable as e:
            raise Overloaded("the lake is busy with a retention delete; retry", retry_after_s=1) from e
        except psycopg.Error as e:
            raise StoreError(f"lake: PostgreSQL unreachable for the delete window: {e}") from e
        try:
            yield
        finally:
            try:
                self._session.execute(f"SELECT {unlock}(%s)", [WINDOW_LOCK_KEY])
            except psycopg.Error:  # the connection is gone, and its lock with it
                self._session.close()

    def close(self) -> None:
        self._session.close()


class RetentionWindow:
    """Lake mode: the retention rule carried out as the same DELETE as file mode's
    (``writes.delete_logs``), as a ``lake.LakeAction``: after any maintenance pass in progress, in
    the delete window."""

    def __init__(self, pg_dsn: str, wait_s: float = 600.0) -> None:
        self._session = PgSession(pg_dsn, wait_s)
        self._lock = threading.Lock()  # the session is used by one delete at a time

    def _take(self) -> None:
        self._lock.acquire()
        try:
            self._session.execute("SELECT pg_advisory_lock(%s)", [MAINTENANCE_LOCK_KEY])
        except psycopg.Error as e:
            self._lock.release()
            raise StoreError(f"lake: retention waits for maintenance, which did not finish: {e}") from e

    def _give(self) -> None:
        try:
            self._session.execute("SELECT pg_advisory_unlock(%s)", [MAINTENANCE_LOCK_KEY])
        except psycopg.Error:
            self._session.close()
        finally:
            self._lock.release()

    async def delete_logs(self, writer, instance_id: str, after_commit: Callable[[], None]) -> None:
        await asyncio.to_thread(self._take)
        try:
            action = lake.LakeAction(functools.partial(writes.delete_logs, instance_id=instance_id, stream_lines=False))
            await writer.execute(action, kind="policy", after_commit=after_commit)
        finally:
            await asyncio.to_thread(self._give)


def forget_retired(index, tail, reader, instance_ids: set[str]) -> None:
    """Another node deleted these instances' lines (retention): what this node cached of them goes.
    The seq index takes what the lake holds of them now (usually nothing), so a line pushed after the
    delete is still known; the tail cache reloads on the next read."""
    from ingest.db.seqindex import StreamIndex

    cursor = reader.cursor()
    try:
        left = cursor.execute("SELECT count(*) FROM logs WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))",
                              [sorted(instance_ids)]).fetchone()[0]
        fresh = StreamIndex()
        if left:
            fresh.load(cursor)
    finally:
        cursor.close()
    index.adopt(fresh, instance_ids)
    for instance_id in instance_ids:
        tail.forget(instance_id)


class Maintenance:
    """The maintenance job of one node: every ``interval_s / 4`` (at most 30 s) it checks whether the
    lake is due and, holding the lock, runs ``lake.maintain`` on ``connect()`` (closed after the pass).
    The node gives it a DuckDB instance of its own: DuckLake once failed a merge here with an internal
    error ("Compaction error - row id limit is larger than the row count of the file"), which
    invalidates the whole instance, and that must not be the writer's."""

    def __init__(self, connect: Callable[[], duckdb.DuckDBPyConnection], pg_dsn: str, node_id: str, interval_s: float,
                 snapshot_keep_s: float) -> None:
        self.connect, self.node_id = connect, node_id
        self.interval_s, self.snapshot_keep_s = interval_s, snapshot_keep_s
        self._session = PgSession(pg_dsn, 10.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0  # run by this node

    def start(self) -> None:  # after Slots.start, which creates fleetlog_maintenance
        self._thread = threading.Thread(target=self._run, name="fleetlog-lake-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self._session.close()

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval_s / 4, 30.0)):
            try:
                self.run_once()
            except Exception:
                logger.exception("lake maintenance check failed; next check in %.0f s", min(self.interval_s / 4, 30.0))
                self._session.close()

    def run_once(self) -> dict[str, int] | None:
        """One pass if this node gets the lock and the lake is due; what it did, or None."""
        if not self._session.execute("SELECT pg_try_advisory_lock(%s)", [MAINTENANCE_LOCK_KEY]).fetchone()[0]:
            return None
        try:
            due = self._session.execute(
                "SELECT coalesce(max(started_at) <= now() - make_interval(secs => %s), true) FROM fleetlog_maintenance",
                [self.interval_s]).fetchone()[0]
            if not due:
                return None
            this_pass = "WHERE node_id = %s AND started_at = %s"
            con = self.connect()
            try:
                started = self._session.execute(
                    "INSERT INTO fleetlog_maintenance (node_id, started_at) VALUES (%s, clock_timestamp()) RETURNING started_at",
                    [self.node_id]).fetchone()[0]
                try:
                    counts = lake.maintain(con, self.snapshot_keep_s)
                except duckdb.Error as e:
                    self._session.execute("UPDATE fleetlog_maintenance SET finished_at = clock_timestamp(), error = %s "
                                          + this_pass, [str(e).splitlines()[0], self.node_id, started])
                    logger.warning("lake maintenance failed: %s", e)
                    return None
            finally:
                con.close()
            self._session.execute(
                "UPDATE fleetlog_maintenance SET finished_at = clock_timestamp(), files_before = %s, files_after = %s "
                + this_pass, [counts["files_before"], counts["files_after"], self.node_id, started])
            self._session.execute("DELETE FROM fleetlog_maintenance WHERE started_at < now() - interval '7 days'")
            self.passes += 1
            logger.info("lake maintenance: %s", counts)
            return counts
        finally:
            try:
                self._session.execute("SELECT pg_advisory_unlock(%s)", [MAINTENANCE_LOCK_KEY])
            except psycopg.Error:  # the connection is gone, and its lock with it
                self._session.close()
