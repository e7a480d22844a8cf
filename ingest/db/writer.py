"""The one writer: owns the DuckDB write connection, group-commits, acknowledges after commit.

Handlers ``await writer.submit(...)``; the request goes on a queue that one thread drains. The
thread takes everything pending (up to ``batch_max_rows``, waiting at most ``batch_max_delay_s``
for more), drops lines whose (instance, source, run_id, seq) is already stored or already in the
batch, writes the rest in one transaction, and only then updates the in-memory indexes and resolves
each request's future with its own accepted/duplicate counts (datasette's ``_execute_writes``
pattern, with group commit). A failed group is retried request by request, so one request that the
database refuses fails alone. A sentinel drains the queue on shutdown.

When the database cannot write (disk full, database invalidated) the writer answers every request
503 with Retry-After (``storage_error`` is set, ``/readyz`` says not ready) and, on its own thread,
asks ``reopen`` to close and reopen the database every ``retry_after_s`` until it works; nothing
acknowledged is lost, since only committed rows were ever acknowledged and the in-memory indexes are
rebuilt from the reopened file. Actions with ``after_commit`` commit alone, and their
``after_commit`` runs on this thread right after, before any other request is staged.

Staging costs a few dict lookups per stream whatever the instance holds already (ingest/db/seqindex.py).
A request that would take an instance past ``max_streams_per_instance`` streams, counting those
stored and those opened by the requests staged before it in the group, is refused whole (413) and
stages nothing: here, where the commits are serial, so concurrent pushes cannot overshoot the cap.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from itertools import repeat
from typing import Any, Callable
from dataclasses import dataclass, field

import shutil
from pathlib import Path

import duckdb

from ingest.db import store
from ingest.contract.codec import Event, LogChunk, MetricRows
from ingest.errors import Overloaded, PayloadTooLarge, StorageUnavailable, StoreError
from ingest.metrics import IngestMetrics
from ingest.db.seqindex import StreamIndex, StreamKey
from ingest.db.tailcache import TailCache, TailKey, TailRow
from ingest.timestamps import now_us

logger = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class WriteResult:
    accepted: int
    duplicates: int
    results: tuple = ()  # what each action returned, in order


Action = Callable[[duckdb.DuckDBPyConnection], Any]


@dataclass
class _Request:
    logs: list[LogChunk]
    events: list[Event]
    metrics: MetricRows
    rows: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    kind: str
    actions: list[Action] = field(default_factory=list)
    after_commit: Callable[[], None] | None = None  # set: commits alone, then this runs on the writer thread
    touches: tuple[str, ...] | None = None  # its actions change only these instances' rows (None: any row)


@dataclass
class _Staged:
    """What one attempt at a group commit would write, and what each request would be told."""

    logs: store.LogColumns = field(default_factory=store.LogColumns.empty)
    events: list[Event] = field(default_factory=list)
    metrics: MetricRows = field(default_factory=MetricRows)
    instances: dict[str, int] = field(default_factory=dict)
    new_seqs: dict[StreamKey, list[int]] = field(default_factory=dict)
    tail_rows: dict[TailKey, list[TailRow]] = field(default_factory=dict)
    tail_trimmed: set[TailKey] = field(default_factory=set)  # keys whose tail_rows hold only their newest lines
    counts: list[list[int]] = field(default_factory=list)  # per request: [accepted, duplicates]
    actions: list[Action] = field(default_factory=list)
    action_owner: list[int] = field(default_factory=list)  # per action: index of its request
    event_owner: list[int] = field(default_factory=list)  # per staged event: index of its request
    new_streams: dict[str, set[StreamKey]] = field(default_factory=dict)  # per instance: streams this batch opens
    refused: dict[int, PayloadTooLarge] = field(default_factory=dict)  # requests refused whole (nothing staged)
    touched: set[str] = field(default_factory=set)  # instances the actions change (_Request.touches)
    touched_all: bool = False  # an action may change any row


class Writer:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        index: StreamIndex,
        tail: TailCache,
        metrics: IngestMetrics,
        *,
        batch_max_rows: int,
        batch_max_delay_s: float,
        queue_max_rows: int,
        retry_after_s: int,
        reopen: Callable[[], duckdb.DuckDBPyConnection] | None = None,
        db_path: str | None = None,
        write_batch: Callable[..., tuple[list[bool], list[Any]]] | None = None,  # lake mode: ingest.db.lake.storage's
        max_streams_per_instance: int | None = None,  # None: no cap
        blocks: Any = None,  # an ingest.db.searchtokens.BlockWriter: the search's token filter, in each commit (file mode)
        stream_parts: store.StreamParts | None = None,  # log_stream_lines' mark and parts (file mode)
    ) -> None:
        self._blocks = blocks
        self._stream_parts = stream_parts
        self._told = [helper for helper in (blocks, stream_parts) if helper is not None]  # told how each commit went
        self._max_streams_per_instance = max_streams_per_instance
        self._con = con
        self._write_batch = write_batch
        self._reopen = reopen
        self._db_dir = Path(db_path).resolve().parent if db_path else None
        self.storage_error: str | None = None  # set while the database cannot write; the thread reopens it
        self._index = index
        self._tail = tail
        self._metrics = metrics
        self._batch_max_rows = batch_max_rows
        self._batch_max_delay_s = batch_max_delay_s
        self._queue_max_rows = queue_max_rows
        self._retry_after_s = retry_after_s
        self.retry_after_s = max(1, retry_after_s)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.pending_rows = 0  # touched only on the event loop
        self.pending_requests = 0
        self._known: set[str] = set()  # instances whose row this thread has committed
        self._due: set[str] = set()  # instances with rows committed since their last_seen was last written
        self._touched_us = 0  # when last_seen was last written for every due instance
        self._watchers: list[tuple[frozenset[str], Callable[[], None]]] = []  # see watch_events
        # see unchanged_since: time.monotonic() after the last commit that changed each instance's rows, and
        # after the last that may have changed any
        self._changed: dict[str, float] = {}
        self._changed_all = float("-inf")
        self._sole = write_batch is None  # the one writer of its database (lake mode: other nodes write too)

    def watch_events(self, kinds: frozenset[str], callback: Callable[[], None]) -> None:
        """Call ``callback()`` right after each commit that stored a new event of one of ``kinds``
        (on the writer thread, before the pushers are acknowledged: it must be quick and thread-safe;
        the policy engine's wake-up, which a logs_complete stored brings forward)."""
        self._watchers.append((frozenset(kinds), callback))

    def unchanged_since(self, instance_id: str, since: float) -> bool:
        """Whether no commit since ``since`` (time.monotonic()) changed the instance's rows: its logs,
        events and metrics, and what actions said they change (execute's ``touches``; an action that
        does not say may change anything). The decisions table is not followed: the policy's writes of
        its decisions say they touch no instance. A commit is noted right after it returns, so a read
        begun at ``since`` saw every commit that this says came before. Any thread (the policy's
        re-check asks: an evaluation whose subject did not change since it began is still its answer).
        False in lake mode, where other nodes write too."""
        return self._sole and self._changed_all < since and self._changed.get(instance_id, float("-inf")) < since

    # -- event loop side -----------------------------------------------------------------------
    def start(self) -> None:
        if self._blocks is not None:
            # where the last writer left the token filter (its open block, the newest stamp), before any search
            # can ask for the open block: read on the thread start()s the server, not the writer's (a search
            # right after a restart missed the block's lines while the thread was still importing pyarrow)
            try:
                self._blocks.load(self._con)
            except duckdb.Error:
                logger.exception("the token filter's state could not be read; the first commit reads it")
        self._thread = threading.Thread(target=self._run, name="fleetlog-writer", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Commit everything queued, then stop the thread."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def submit(
        self,
        *,
        logs: list[LogChunk] | None = None,
        events: list[Event] | None = None,
        metrics: MetricRows | None = None,
        actions: list[Action] | None = None,
        kind: str = "logs",
        after_commit: Callable[[], None] | None = None,
        touches: tuple[str, ...] | None = None,
    ) -> WriteResult:
        """Queue rows and wait for the commit that holds them. Raises Overloaded when full, and
        StorageUnavailable while the database cannot write."""
        logs = logs or []
        events = events or []
        metrics = metrics if metrics is not None else MetricRows()
        rows = sum(len(c.lines) for c in logs) + len(events) + len(metrics)
        if not self.running:
            raise Overloaded("the writer is not running", retry_after_s=self._retry_after_s)
        if self.storage_error is not None:
            raise StorageUnavailable(f"the database cannot write ({self.storage_error}); retry later",
                                     retry_after_s=self.retry_after_s)
        if self.pending_rows and self.pending_rows + rows > self._queue_max_rows:
            raise Overloaded(
                f"writer queue full ({self.pending_rows} rows pending); retry later",
                retry_after_s=self._retry_after_s,
            )
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending_rows += rows
        self.pending_requests += 1
        self._queue.put(_Request(logs, events, metrics, rows, loop, future, kind, actions or [], after_commit, touches))
        try:
            return await asyncio.shield(future)
        finally:
            if future.done():
                self.pending_rows -= rows
                self.pending_requests -= 1
            else:  # the client went away: the rows still commit; account when they do
                future.add_done_callback(lambda _f: self._settle(rows))

    def _settle(self, rows: int) -> None:
        self.pending_rows -= rows
        self.pending_requests -= 1

    async def execute(self, action: Action, kind: str = "action", after_commit: Callable[[], None] | None = None,
                      touches: tuple[str, ...] | None = None) -> Any:
        """Run ``action(connection)`` in the writer's next transaction; return what it returned.
        ``touches``: the instances whose rows it may change, if only those (unchanged_since; rows of the
        decisions table are nobody's).

        For the few writes that are not pushes (decisions, verdicts, retention): they go through
        the one writer like everything else, and are committed when this returns. ``after_commit``
        (e.g. forgetting deleted streams in the dedupe index) runs on the writer thread right after
        that commit, which then holds no other request, so no push is staged against stale state.
        """
        result = await self.submit(actions=[action], kind=kind, after_commit=after_commit, touches=touches)
        return result.results[0]

    async def flush(self) -> None:
        """Return once everything submitted before this call is committed."""
        await self.submit(kind="flush")

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        store.warm_up()  # on this thread, before the first push waits on it
        stopping = False
        held = None  # a request that must commit alone, taken while gathering the previous batch
        while not stopping:
            if self.storage_error is not None:
                stopping = self._recover()
                continue
            item = held if held is not None else self._queue.get()
            held = None
            if item is _STOP:
                break
            batch = [item]
            rows = item.rows
            deadline = time.monotonic() + self._batch_max_delay_s
            while rows < self._batch_max_rows and item.after_commit is None:
                try:
                    wait = deadline - time.monotonic()
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                if nxt.after_commit is not None:
                    held = nxt
                    break
                batch.append(nxt)
                rows += nxt.rows
            try:
                self._commit_group(batch)
            except Exception as e:  # never let the thread die with requests waiting
                logger.exception("writer failed a batch of %d requests", len(batch))
                for request in batch:
                    _resolve(request, error=StoreError(f"write failed: {e}"))
        if held is not None and held is not _STOP:
            self._commit_group([held])

    def _recover(self) -> bool:
        """While the database cannot write: refuse what is queued (503), and every
        ``retry_after_s`` try to reopen it once the disk has room. Returns True on the stop sentinel."""
        deadline = time.monotonic() + self.retry_after_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _STOP:
                return True
            _resolve(item, error=StorageUnavailable(f"the database cannot write ({self.storage_error}); retry later",
                                                    retry_after_s=self.retry_after_s))
        if self._db_dir is not None and shutil.disk_usage(self._db_dir).free < RECOVER_MIN_FREE_BYTES:
            return False
        if self._reopen is None:
            return False
        try:
            self._con = self._reopen()
        except Exception as e:
            logger.warning("database still unavailable (%s); retrying in %d s", e, self.retry_after_s)
            return False
        logger.warning("database reopened after: %s", self.storage_error)
        self.storage_error = None
        return False

    def _commit_group(self, batch: list[_Request]) -> None:
        staged = self._stage(batch)
        for r, error in staged.refused.items():
            _resolve(batch[r], error=error)
        started = time.perf_counter()
        received_us = now_us() if self._blocks is None else self._blocks.stamp(now_us())  # never before the last
        instances = self._instances_to_touch(staged.instances, received_us)
        try:
            if self._write_batch is not None:
                fresh, action_results = self._write_batch(
                    self._con, staged.logs, staged.events, staged.metrics, instances, received_us, staged.actions)
            else:
                fresh, action_results = store.write_batch(
                    self._con, staged.logs, staged.events, staged.metrics, instances, received_us, staged.actions,
                    blocks=self._blocks, stream_parts=self._stream_parts)
        except StoreError as e:
            self._changed_all = time.monotonic()  # what a failed commit, a reopen, a retry left: not told, so any
            for helper in self._told:
                helper.rolled_back()
            self._metrics.commit_errors.inc()
            if is_storage_failure(e):
                logger.error("the database cannot write (%s); refusing writes until it is reopened", e)
                self.storage_error = _first_line(str(e))
                for request in batch:
                    _resolve(request, error=StorageUnavailable(
                        f"the database cannot write ({self.storage_error}); retry later", retry_after_s=self.retry_after_s))
                return
            if _out_of_memory(e):
                for request in batch:
                    _resolve(request, error=Overloaded(f"the database is out of memory ({e}); retry later",
                                                       retry_after_s=self.retry_after_s))
                return
            if isinstance(e.__cause__, Overloaded):  # lake mode: a slot moved to another node (ingest/db/lake/slots.py)
                for request in batch:
                    _resolve(request, error=e.__cause__)
                return
            if len(batch) > 1:
                logger.warning("group commit of %d requests failed (%s); retrying one by one", len(batch), e)
                for r, request in enumerate(batch):
                    if r not in staged.refused:
                        self._commit_group([request])
                return
            logger.error("commit failed: %s", e)
            _resolve(batch[0], error=e)
            return
        self._note_changes(staged)
        for helper in self._told:
            helper.committed()
        self._touched(staged.instances, instances, received_us)
        self._metrics.commit_seconds.observe(time.perf_counter() - started)
        self._metrics.batch_rows.observe(len(staged.logs) + len(staged.events) + len(staged.metrics))
        self._publish(staged, received_us, received_us + (self._blocks.spread if self._blocks is not None else 0))
        if self._watchers and staged.events:
            stored = {event.kind for event, is_new in zip(staged.events, fresh) if is_new}
            for kinds, callback in self._watchers:
                if kinds & stored:
                    try:
                        callback()
                    except Exception:
                        logger.exception("a watcher of %s events failed", sorted(kinds))
        for request in batch:
            if request.after_commit is not None:
                try:
                    request.after_commit()
                except Exception:
                    logger.exception("after_commit of a %s failed", request.kind)
        for i, is_new in enumerate(fresh):
            staged.counts[staged.event_owner[i]][0 if is_new else 1] += 1
        results: list[list[Any]] = [[] for _ in batch]
        for owner, value in zip(staged.action_owner, action_results):
            results[owner].append(value)
        for r, (request, (accepted, duplicates), own) in enumerate(zip(batch, staged.counts, results)):
            if r in staged.refused:
                continue
            self._metrics.accepted.labels(kind=request.kind).inc(accepted)
            if duplicates:
                self._metrics.duplicates.labels(kind=request.kind).inc(duplicates)
            _resolve(request, result=WriteResult(accepted, duplicates, tuple(own)))

    def _stage(self, batch: list[_Request]) -> _Staged:
        staged = _Staged()
        batch_ranges: dict[StreamKey, list[tuple[int, int]]] = {}  # seq spans staged per stream
        next_seq: dict[StreamKey, int] = {}
        event_keys: set[tuple[str, str, int]] = set()
        cols = staged.logs
        tail_capacity = max(1, self._tail.capacity)
        for r, request in enumerate(batch):
            counts = [0, 0]
            staged.counts.append(counts)
            refusal = self._over_stream_cap(request, staged.new_streams)
            if refusal is not None:
                staged.refused[r] = refusal
                continue
            for chunk in request.logs:
                n = len(chunk.lines)
                if n == 0:
                    continue
                key = (chunk.instance_id, chunk.source, chunk.run_id)
                if chunk.seqs is None:  # the server numbers these lines
                    first = next_seq.get(key, self._index.next_seq(key))
                    seqs: list[int] = list(range(first, first + n))
                    lo, hi = first, first + n - 1
                    keep = None
                else:
                    seqs = chunk.seqs
                    lo, hi = (seqs[0], seqs[-1]) if chunk.ascending else (min(seqs), max(seqs))
                    earlier = batch_ranges.get(key, ())
                    clash = any(l <= hi and lo <= h for l, h in earlier)
                    if not clash and not self._index.overlaps(key, lo, hi):
                        keep = None  # the common case: nothing to filter
                    else:
                        in_batch = set(staged.new_seqs.get(key, ())) if clash else set()
                        keep = [i for i, s in enumerate(seqs) if s not in in_batch and not self._index.is_stored(key, s)]
                next_seq[key] = max(next_seq.get(key, 0), self._index.next_seq(key), hi + 1)
                batch_ranges.setdefault(key, []).append((lo, hi))
                if keep is None:
                    ts_us, texts, truncated = chunk.ts_us, chunk.lines, chunk.truncated
                else:
                    seqs = [seqs[i] for i in keep]
                    ts_us = [chunk.ts_us[i] for i in keep]
                    texts = [chunk.lines[i] for i in keep]
                    truncated = [chunk.truncated[i] for i in keep]
                m = len(seqs)
                counts[0] += m
                counts[1] += n - m
                if not m:
                    continue
                cols.add(chunk.instance_id, chunk.source, chunk.run_id, seqs, ts_us, texts, truncated)
                staged.new_seqs.setdefault(key, []).extend(seqs)
                tail_key = (chunk.instance_id, chunk.source)
                if m > tail_capacity and (chunk.ascending or chunk.seqs is None):  # seqs sorted
                    # only the newest lines can reach the tail cache; the entry learns it is not whole
                    seqs, ts_us, texts = seqs[-tail_capacity:], ts_us[-tail_capacity:], texts[-tail_capacity:]
                    staged.tail_trimmed.add(tail_key)
                staged.tail_rows.setdefault(tail_key, []).extend(zip(repeat(chunk.run_id), seqs, ts_us, texts))
                newest = max(ts_us)
                staged.instances[chunk.instance_id] = max(staged.instances.get(chunk.instance_id, 0), newest)
            for event in request.events:
                ek = (event.instance_id, event.kind, event.ts_us)
                staged.instances.setdefault(event.instance_id, event.ts_us)
                if ek in event_keys:
                    counts[1] += 1
                    continue
                event_keys.add(ek)
                staged.events.append(event)
                staged.event_owner.append(r)
            for action in request.actions:
                staged.actions.append(action)
                staged.action_owner.append(r)
            if request.actions:
                if request.touches is None:
                    staged.touched_all = True
                else:
                    staged.touched.update(request.touches)
            if len(request.metrics):
                m = request.metrics
                for name in ("instance_id", "name", "ts_us", "value", "labels"):
                    getattr(staged.metrics, name).extend(getattr(m, name))
                for instance_id in set(m.instance_id):
                    staged.instances.setdefault(instance_id, 0)
                counts[0] += len(m)
        return staged

    def _over_stream_cap(self, request: _Request, opened: dict[str, set[StreamKey]]) -> PayloadTooLarge | None:
        """The refusal of a request that would take an instance past ``max_streams_per_instance``
        streams (those stored, those this batch opens so far, and its own new ones); else None, and
        its new streams join ``opened``. One dict lookup per chunk."""
        cap = self._max_streams_per_instance
        if cap is None:
            return None
        mine: dict[str, set[StreamKey]] = {}
        for chunk in request.logs:
            key = (chunk.instance_id, chunk.source, chunk.run_id)
            if chunk.lines and not self._index.has_stream(key) and key not in opened.get(chunk.instance_id, ()):
                mine.setdefault(chunk.instance_id, set()).add(key)
        for instance_id, keys in mine.items():
            held = self._index.streams_of(instance_id) + len(opened.get(instance_id, ()))
            if held + len(keys) > cap:
                return PayloadTooLarge(
                    f"instance {instance_id}: {held} log streams (source, run_id) held and {len(keys)} new in this request "
                    f"is over the cap of {cap} streams per instance (max_streams_per_instance)")
        for instance_id, keys in mine.items():
            opened.setdefault(instance_id, set()).update(keys)
        return None

    def _instances_to_touch(self, seen: dict[str, int], received_us: int) -> dict[str, int]:
        """The instances whose row this commit inserts or whose last_seen it moves: those this thread
        has not committed yet, and, once every LAST_SEEN_STEP_US, every instance seen since the last
        time. An upsert of the instances table costs 2-6 ms whatever its size (its primary-key index),
        a third of a small group commit: last_seen is kept to that resolution, in one statement."""
        if received_us - self._touched_us >= LAST_SEEN_STEP_US:
            return dict.fromkeys(self._due.union(seen), received_us)
        return {i: received_us for i in seen if i not in self._known}

    def _touched(self, seen: dict[str, int], written: dict[str, int], received_us: int) -> None:
        """After a commit: what it wrote is known; the rest of what it saw is due."""
        if received_us - self._touched_us >= LAST_SEEN_STEP_US:
            self._due.clear()
            self._touched_us = received_us
        else:
            self._due.update(i for i in seen if i not in written)
        self._known.update(written)

    def _note_changes(self, staged: _Staged) -> None:
        """After a commit: the instances whose rows it changed (see unchanged_since)."""
        at = time.monotonic()
        if staged.touched_all:
            self._changed_all = at
        for instance_id in staged.touched.union(staged.instances):
            self._changed[instance_id] = at

    def _publish(self, staged: _Staged, received_us: int | None = None, last_us: int | None = None) -> None:
        """After a commit: the dedupe index and the tail cache learn what is now stored (stamped from
        ``received_us`` to ``last_us``: the token filter stamps a commit's blocks apart)."""
        new_sources = {
            (instance_id, source)
            for (instance_id, source) in staged.tail_rows
            if not self._index.has_source(instance_id, source)
        }
        for key, seqs in staged.new_seqs.items():
            seqs.sort()
            self._index.commit(key, seqs, received_us, last_us)
        for tail_key, rows in staged.tail_rows.items():
            rows.sort()
            self._tail.on_commit(tail_key, rows, tail_key in new_sources, trimmed=tail_key in staged.tail_trimmed)


LAST_SEEN_STEP_US = 1_000_000  # instances.last_seen lags the newest commit by less than this
RECOVER_MIN_FREE_BYTES = 1024 * 1024  # reopen once the database's disk has this much room


def is_storage_failure(e: BaseException) -> bool:
    """Whether a write failed because of the disk or a database DuckDB invalidated (not the data)."""
    cause = e.__cause__ or e
    text = str(e)
    return isinstance(cause, (duckdb.FatalException, duckdb.IOException)) or any(
        marker in text for marker in ("No space left", "invalidated", "Could not write file")
    )


def _out_of_memory(e: StoreError) -> bool:
    """DuckDB out of its memory_limit: an OutOfMemoryException, or a COMMIT that could not pin a block
    (a TransactionException: 'Failed to commit: failed to pin block of size ...'), seen with long lines."""
    cause = e.__cause__
    return isinstance(cause, duckdb.OutOfMemoryException) or (
        isinstance(cause, duckdb.TransactionException) and "failed to pin block" in str(cause))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "unknown error"


def _resolve(request: _Request, *, result: WriteResult | None = None, error: Exception | None = None) -> None:
    def settle() -> None:
        if request.future.done():
            return
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    try:
        request.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass
