"""The one door for reads: every query the server runs for a reader goes through ``Reader``.

It owns the read cursors (each query takes its own from one idle connection and gives it back),
their deadlines (``cursor.interrupt`` after ``query_timeout_s``), the tail-cache protocol, and
admission: each kind of read has its own threads. The page's and agents' reads run on theirs; user
SQL (the SQL API) on a small pool of its own (``query_max_concurrent``) and searches (fleet-wide, and
an instance's lines filtered by ``q``) on another (``search_max_concurrent``); beyond either, 429 with
Retry-After, so slow SQL queries or searches never starve the instance list. User SQL is checked and runs read-only, always rolled back
(``ingest/db/reads.py``); its answer is rendered on its thread, bounded in bytes (``ingest/db/answers.py``).
``close`` interrupts what still runs, waits for it, then closes; ``suspend`` and ``resume`` do the
same around a reopen of the database (see ``Database.reopen``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import duckdb

from ingest.db import answers, reads, search
from ingest.errors import StorageUnavailable, TooManyQueries
from ingest.metrics import IngestMetrics
from ingest.db.seqindex import StreamIndex
from ingest.db.tailcache import TailCache

logger = logging.getLogger(__name__)

READ_THREADS = 8  # the page's and agents' reads: small indexed queries
FOLLOW_MAX_TAIL = 10_000
REFINE_TIMEOUT_S = 120.0  # the start-up narrowing of the tail windows (one aggregate over the table)
# A tail-cache miss loads the lines asked for, at least this many, not the cache's capacity: the load
# scans the row groups its lines lie in, so at 2 M interleaved lines a first tail of 200 read 200,000
# rows (~5 ms) where loading 1,000 read 674,000 (~26 ms). A longer tail later loads again.
FIRST_LOAD_LINES = 200


class _Lane:
    """A kind of read's own threads and admission: at most ``size`` at once, beyond it TooManyQueries.
    ``running`` is touched only on the event loop."""

    def __init__(self, size: int, setting: str, what: str, retry_after_s: int) -> None:
        self.pool = ThreadPoolExecutor(size, thread_name_prefix=f"fleetlog-{what}")
        self.size, self.setting, self.what, self.retry_after_s = size, setting, what, retry_after_s
        self.running = 0

    def admit(self) -> None:
        if self.running >= self.size:
            raise TooManyQueries(f"{self.running} {self.what} queries are running ({self.setting}); retry later",
                                 retry_after_s=self.retry_after_s)
        self.running += 1

    def leave(self) -> None:
        self.running -= 1


class Reader:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        index: StreamIndex,
        tail: TailCache,
        metrics: IngestMetrics,
        *,
        timeout_s: float,
        query_max_concurrent: int,
        search_max_concurrent: int,
        retry_after_s: int,
        open_block: Callable[[], Any] | None = None,  # the writer's BlockWriter.open_block: the token filter (file mode)
        runs_written: Callable[[], int | None] | None = None,  # and its BlockWriter.runs_written
    ) -> None:
        self.open_block = open_block
        self.runs_written = runs_written
        # DuckDB refuses ``con.cursor()`` while ``con`` is executing, so cursors come from an idle one
        self._root: duckdb.DuckDBPyConnection | None = con.cursor()
        self.index = index
        self.tail = tail
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.query_max_concurrent = query_max_concurrent
        self.retry_after_s = max(1, retry_after_s)
        self._cond = threading.Condition()
        self._active: set[duckdb.DuckDBPyConnection] = set()
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fleetlog-read")
        self._sql = _Lane(query_max_concurrent, "query_max_concurrent", "sql", self.retry_after_s)
        self._search = _Lane(search_max_concurrent, "search_max_concurrent", "search", self.retry_after_s)
        self.stopping = asyncio.Event()  # set at shutdown: follow=1 streams end

    # -- cursors ---------------------------------------------------------------------------------
    def open_cursor(self) -> duckdb.DuckDBPyConnection:
        """A tracked cursor (interrupted by ``suspend``); give it back with close_cursor."""
        with self._cond:
            if self._root is None:
                raise StorageUnavailable("the database is being reopened; retry later", retry_after_s=self.retry_after_s)
            cursor = self._root.cursor()
            self._active.add(cursor)
            return cursor

    def close_cursor(self, cursor: duckdb.DuckDBPyConnection) -> None:
        try:
            cursor.close()
        finally:
            with self._cond:
                self._active.discard(cursor)
                self._cond.notify_all()

    @contextmanager
    def deadline_cursor(self, timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
        """A tracked cursor of its own, interrupted after ``timeout_s`` (``reads.deadline_cursor``)."""
        cursor = self.open_cursor()
        try:
            with reads.deadline_cursor(cursor, timeout_s) as cur:
                yield cur
        finally:
            self.close_cursor(cursor)

    def read(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """(Blocking.) ``fn(cursor, timeout_s, *args, **kwargs)`` (a function of ingest/db/reads.py) on a
        tracked cursor of its own, closed after."""
        cursor = self.open_cursor()
        try:
            return fn(cursor, self.timeout_s, *args, **kwargs)
        finally:
            self.close_cursor(cursor)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """An untracked cursor for start-up and tests; the caller closes it."""
        if self._root is None:
            raise StorageUnavailable("the database is being reopened; retry later", retry_after_s=self.retry_after_s)
        return self._root.cursor()

    def suspend(self, wait_s: float = 10.0) -> None:
        """Refuse new reads, interrupt running ones, wait for them, and close the connection."""
        with self._cond:
            root, self._root = self._root, None
            for cursor in list(self._active):
                try:
                    cursor.interrupt()
                except duckdb.Error:
                    pass
            self._cond.wait_for(lambda: not self._active, timeout=wait_s)
        if root is not None:
            try:
                root.close()
            except duckdb.Error:
                pass

    def resume(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._cond:
            self._root = con.cursor()

    async def close(self) -> None:
        await asyncio.to_thread(self.suspend)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for lane in (self._sql, self._search):
            lane.pool.shutdown(wait=False, cancel_futures=True)

    def refine_tail_windows(self) -> threading.Thread:
        """Narrow the start-up windows (``StreamIndex.refine``) on a thread of its own, through a tracked
        cursor (interrupted when the reader closes). Until it finishes, tail loads use the wide windows,
        which are just as correct."""

        def run() -> None:
            try:
                with self.deadline_cursor(REFINE_TIMEOUT_S) as cur:
                    narrowed = self.index.refine(cur, self.tail.capacity)
                logger.info("tail windows narrowed for %d streams", narrowed)
            except Exception as e:  # the wide windows stay: slower first tails, never wrong ones
                logger.warning("tail windows not narrowed: %s", e)

        thread = threading.Thread(target=run, name="fleetlog-tail-refine", daemon=True)
        thread.start()
        return thread

    # -- running ---------------------------------------------------------------------------------
    async def _run(self, api: str, fn: Callable, *args: Any, pool: ThreadPoolExecutor | None = None, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            call = functools.partial(self.read, fn, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(pool or self._pool, call)
        finally:
            self.metrics.query_seconds.labels(api=api).observe(time.perf_counter() - started)

    async def call(self, fn: Callable, *args: Any) -> Any:
        """Run a blocking ``fn(*args)`` that reads (e.g. a /metrics scrape) on the read threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    async def sql(self, sql: str, params: dict[str, Any], *, fmt: str, max_rows: int, max_bytes: int,
                  cover: Callable[[int], None] = lambda n: None) -> answers.Answer:
        """User SQL's answer in ``fmt`` (json, csv or arrow), at most ``max_rows`` rows and ``max_bytes``
        bytes (413 beyond), ``cover`` paying for it as it grows (see ``answers.answer``)."""
        self._sql.admit()
        try:
            return await self._run("sql", lambda con, timeout_s: answers.answer(
                con, sql, timeout_s, params=params, fmt=fmt, max_rows=max_rows, max_bytes=max_bytes, cover=cover,
            ), pool=self._sql.pool)
        finally:
            self._sql.leave()

    async def search(self, query: search.SearchQuery) -> tuple[list[dict[str, Any]], bool, Any]:
        """Fleet-wide search (``search.search``) on the search threads: hits, truncated, plan."""
        self._search.admit()
        try:
            run = functools.partial(search.search, use_filter=self.open_block is not None, open_block=self.open_block,
                                    runs_written=self.runs_written)
            return await self._run("search", lambda con, timeout_s: run(con, timeout_s, query), pool=self._search.pool)
        finally:
            self._search.leave()

    # -- the API's reads -------------------------------------------------------------------------
    async def instances(self, state: str | None) -> list[dict[str, Any]]:
        """Instances, each with ``logs``: how many sources, which of them are incomplete, and whether the
        instance's logs are complete (the log_streams and instance_logs views, migration 005)."""
        rows = await self._run("instances", reads.list_instances, state)
        completeness = await self._run("instances", reads.log_streams)
        for row in rows:
            own = completeness.get(row["instance_id"], {"complete": False, "streams": []})
            summary = self.log_summary(row["instance_id"], own["streams"])
            row["logs"] = {"sources": len(summary), "incomplete": sorted(s for s, e in summary.items() if not e["complete"]),
                           "complete": own["complete"]}
        return rows

    async def instance(self, instance_id: str) -> dict[str, Any] | None:
        detail = await self._run("instance", reads.instance_detail, instance_id)
        if detail is None:
            return None
        own = (await self._run("instance", reads.log_streams, instance_id)).get(instance_id, {"complete": False, "streams": []})
        runs = detail.pop("bench_runs")
        detail["bench"] = runs[-1] if runs else None
        detail["bench_runs"] = runs
        detail["logs"] = self.log_summary(instance_id, own["streams"])
        detail["logs_complete"] = own["complete"]
        return detail

    def log_summary(self, instance_id: str, streams: list[dict]) -> dict:
        """Per source, the latest run's lines, last seq, gaps, declared last seq and dropped count; the
        source is complete when every run of it is (the ``log_streams`` view decides, see migration 005)."""
        gaps = {(s.source, s.run_id): [list(g) for g in s.gaps] for s in self.index.summaries(instance_id)}
        latest: dict[str, dict] = {}
        for s in streams:  # sorted by (source, run_id)
            stored_last = -1 if s["last_seq"] is None else s["last_seq"]
            declared = s["declared_last_seq"]
            missing_tail = [[stored_last + 1, declared]] if declared is not None and stored_last < declared else []
            complete = s["complete"] and latest.get(s["source"], {}).get("complete", True)
            latest[s["source"]] = {"run_id": s["run_id"], "lines": s["lines"], "last_seq": s["last_seq"],
                                   "gaps": gaps.get((s["source"], s["run_id"]), []) + missing_tail,
                                   "declared_last_seq": declared, "dropped": s["dropped"], "complete": complete}
        return latest

    async def logs(self, instance_id: str, *, source: str | None, run_id: str | None, q: str | None, tail: int,
                   after_seq: int | None, before_seq: int | None) -> list[tuple[str, str, int, int, str]]:
        """Lines as (source, run_id, seq, ts_us, line), oldest first (see ``reads.read_logs``); a plain
        tail of one source comes from the tail cache, which this fills on a miss."""
        cache = self.tail
        plain_tail = source is not None and run_id is None and q is None and after_seq is None and before_seq is None
        if plain_tail and tail <= cache.capacity:
            key = (instance_id, source)
            cached = cache.tail(key, tail)
            load = min(cache.capacity, max(tail, FIRST_LOAD_LINES))
            if cached is None and cache.begin_load(key, load):
                try:
                    bounds = self.index.tail_bounds(instance_id, source, load)
                    loaded, complete = await self._run("logs", reads.load_tail, instance_id, source, load, bounds)
                except BaseException:
                    cache.abort_load(key)
                    raise
                cache.finish_load(key, loaded, complete)
                cached = cache.tail(key, tail, count=False)
            if cached is not None:
                return [(source, r, seq, ts, line) for r, seq, ts, line in cached]
        if q is None:
            return await self._run(
                "logs", reads.read_logs, instance_id,
                source=source, run_id=run_id, tail=tail, after_seq=after_seq, before_seq=before_seq, q=None,
            )
        self._search.admit()  # a substring over the instance's lines is a search: on the search threads
        try:
            return await self._run(
                "logs", reads.read_logs, instance_id, pool=self._search.pool,
                source=source, run_id=run_id, tail=tail, after_seq=after_seq, before_seq=before_seq, q=q,
            )
        finally:
            self._search.leave()

    async def events(self, instance_id: str, kind: str | None, limit: int) -> list[dict[str, Any]]:
        """An instance's stored events for the admin (``reads.list_events``)."""
        return await self._run("events", reads.list_events, instance_id, kind, limit)

    async def hosts(self, hosts_sql: str, min_rate: float, now, machine_id: int | None = None) -> list[dict[str, Any]]:
        return await self._run("hosts", reads.hosts, hosts_sql, min_rate, now, machine_id)

    async def decisions(self, *, state: str | None, action: str | None, subject: str | None, limit: int) -> list[dict]:
        return await self._run("decisions", reads.decisions, state=state, action=action, subject=subject, limit=limit)
