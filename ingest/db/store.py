"""The DuckDB file: opening it, numbered migrations, and the statements the writer commits.

Only the writer thread calls ``write_batch`` (on the one write connection). Every read goes through
``ingest/db/reader.py`` (a cursor per call).
"""

from __future__ import annotations

import array
import importlib.util
import logging
import os
import sys
import time
from dataclasses import dataclass
from importlib import resources
from itertools import repeat
from pathlib import Path
from typing import Any, Callable

import duckdb
import orjson
import pyarrow as pa

from ingest.contract.codec import Event, MetricRows
from ingest.errors import StoreError

logger = logging.getLogger(__name__)

LOG_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("source", pa.string()),
        ("run_id", pa.string()),
        ("seq", pa.int64()),
        ("ts", pa.timestamp("us")),
        ("received_at", pa.timestamp("us")),
        ("line", pa.string()),
        ("truncated", pa.bool_()),
    ]
)
METRIC_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us")),
        ("value", pa.float64()),
        ("labels", pa.string()),
        ("received_at", pa.timestamp("us")),
    ]
)


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every file ``ingest/db/migrations/NNN_name.sql``, in order."""
    out = []
    for entry in resources.files("ingest.db").joinpath("migrations").iterdir():
        if entry.name.endswith(".sql"):
            number, _, name = entry.name.removesuffix(".sql").partition("_")
            out.append((int(number), name, entry.read_text()))
    return sorted(out)


TEMP_DIR_FACTOR = 8  # spilled query state may take this many times the memory limit on disk

# DuckDB checkpoints once its WAL holds this much (its own default: 16 MB, ~80,000 lines). Each
# checkpoint rewrites the row group the writer is still filling and frees the blocks it held; the next
# checkpoint reuses them only as far as it writes new data, so at 16 MB a file kept ~70-80 blocks
# (18-20 MiB) free: a quarter of a 1 M-line file. At 64 MB, 2-4 (tests/test_file_space.py); fewer
# rewrites also cost less CPU (4 M lines in group commits: 111 -> 97 s). The price: a restart after a
# crash replays up to this much WAL (~0.5 s more at 60 MiB), and the rows not yet checkpointed are held
# in DuckDB's memory (within memory_limit). A checkpoint needs memory of its own: at a 16 MB
# memory_limit, 64 MB of WAL failed one ("failed to allocate", and DuckDB invalidated the database), so
# the threshold is at most a quarter of the memory limit, but not below DuckDB's own default (16 MB,
# which checkpointed under a 16 MB limit). Megabytes, as memory_limit's.
CHECKPOINT_MB = 64


def checkpoint_threshold_mb(checkpoint_mb: int, memory_limit_mb: int) -> int:
    return min(int(checkpoint_mb), max(16, int(memory_limit_mb) // 4))


# The storage version a new database file is created with. DuckDB 1.5.5 creates v1.0.0 files by
# default, in which it silently ignores `USING COMPRESSION zstd` (migration 009): the log text was
# stored uncompressed, 1.09x the raw text instead of 0.38x. A file already created keeps its version
# (docs/scale-out.md: the copy command). Files of this version open in DuckDB 1.5.0 and later.
STORAGE_VERSION = "v1.5.0"
SMALL_HOST_CORES = 4
# DuckDB's allocator (jemalloc) hands freed pages back from a background thread, not only when a task of its own
# ends past ``allocator_flush_threshold`` (128 MiB): without it a query's 220 MiB hash table stayed resident after
# the query (310 MiB RSS for a 91 MiB base, 3 s later; with it, 94), and so did a checkpoint's buffers, until the
# next one of the same size reused them (tests/test_freed_memory.py). A lower flush threshold alone did nothing
# with one DuckDB thread. Set for the whole instance (file and lake mode).
ALLOCATOR_SQL = "SET allocator_background_threads = true"


def auto_threads() -> int:
    """DuckDB threads when none are set: one on a host of at most SMALL_HOST_CORES usable cores (the
    spinning costs more than parallel scans gain there), else one per core (DuckDB's own default)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores <= SMALL_HOST_CORES else cores


def no_pandas_search() -> None:
    """Marks pandas absent in ``sys.modules`` when it is not installed, so that importing it fails at once.

    DuckDB's Python client tries ``import pandas`` for each parameter it binds (1.5.5); a failed import
    is not cached, so each one walked sys.path again: ~0.2-0.5 ms of CPU a parameter, ~36 ms of a
    rare-phrase search at 2 M lines and several ms of every group commit (bench/vs_victorialogs.py,
    cProfile). ``import pandas`` still raises ImportError, as it did; with pandas installed nothing
    changes."""
    if "pandas" not in sys.modules and importlib.util.find_spec("pandas") is None:
        sys.modules["pandas"] = None  # the import system's own "known absent" (the language reference, 5.3.1)


def open_database(path: str | Path, memory_limit_mb: int = 256, threads: int = 0,
                  checkpoint_mb: int = CHECKPOINT_MB) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) and migrate the database, then lock it down for readers.

    DuckDB's memory is capped at ``memory_limit_mb``, beyond which queries spill to
    ``<db>.tmp/`` (itself capped); file and network access are switched off and the configuration
    locked for the whole database instance, so no cursor handed to the SQL API can read files or
    change that.

    ``checkpoint_mb`` is the WAL size at which DuckDB checkpoints (``CHECKPOINT_MB``; at most a quarter of
    ``memory_limit_mb``, not below 16). Replaying the WAL on open, read-only opens too, holds as much.

    ``threads`` is DuckDB's worker threads for the whole instance; 0 is ``auto_threads()``.
    With more than one, the Python thread that runs a statement polls DuckDB's task queue (mutex and
    sched_yield) while a worker does the work: measured on the writer's group commits on 2 cores,
    that spinning was over a third of the writer thread's CPU, and one thread appends the same rows
    in half the CPU and less time (bench/ingest_throughput.py). Each cursor still runs its own
    statement on its own thread, so reads stay concurrent; one statement uses one core. On a small
    host one thread also made a first tail's query faster under ingest (p99 6 ms against 12-43 ms on
    2 cores, bench/tail_latency.py); on a host with many cores a search or a SQL query over millions
    of rows scans in parallel, and the spinning costs cores that are idle.
    """
    no_pandas_search()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path), config={"storage_compatibility_version": STORAGE_VERSION})
    except duckdb.Error as e:
        hint = " (written by a newer DuckDB: see docs/scale-out.md)" if "version number" in str(e) else ""
        raise StoreError(f"cannot open database {path}: {e}{hint}") from e
    try:
        migrate(con)
        con.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
        con.execute(f"SET threads = {int(threads or auto_threads())}")
        con.execute(f"SET checkpoint_threshold = '{checkpoint_threshold_mb(checkpoint_mb, memory_limit_mb)}MB'")
        con.execute("SET temp_directory = '{}'".format((str(path) + ".tmp").replace("'", "''")))
        con.execute(f"SET max_temp_directory_size = '{int(memory_limit_mb) * TEMP_DIR_FACTOR}MB'")
        con.execute(ALLOCATOR_SQL)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except Exception:
        con.close()
        raise
    return con


def migrate(con: duckdb.DuckDBPyConnection, files: list[tuple[int, str, str]] | None = None) -> int:
    """Apply the migrations not applied yet (``files``: ``migrations()`` unless given)."""
    con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP DEFAULT now())")
    applied = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    known = migrations() if files is None else files
    if files is None and applied and max(applied) > known[-1][0]:
        # an older fleetlog on a newer file would write what the newer views read otherwise (024 counts the
        # lines after its mark itself: 023's writer adding a part a commit would count them twice)
        raise StoreError(f"the database was migrated by a newer fleetlog (migration {max(applied):03d}; this one knows "
                         f"{known[-1][0]:03d}): run that version, or a copy of the file made before")
    done = 0
    for version, name, sql in known:
        if version in applied:
            continue
        logger.info("applying migration %03d_%s", version, name)
        con.execute("BEGIN")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
            con.execute("COMMIT")
        except duckdb.Error as e:
            con.execute("ROLLBACK")
            raise StoreError(f"migration {version:03d}_{name} failed: {e}") from e
        done += 1
    if done:
        # Out of the WAL at once: DuckDB 1.5.5 cannot replay some of them (an ALTER TABLE of decisions,
        # whose id defaults to a sequence), so a SIGKILL before the first checkpoint left a database
        # that no server could open (tests/test_durability.py).
        con.execute("CHECKPOINT")
    return done


# --- the log rows of a group commit (the writer's staging) -------------------------------------------
LOG_CHUNK_SCHEMA = pa.schema([f for f in LOG_SCHEMA if f.name != "received_at"])  # received_at is the commit's
# The columns of ``logs`` in its order: a commit's batches with their received_at put in (``_insert_logs``)
LOG_COLUMNS_SQL = "instance_id, source, run_id, seq, ts, received_at, line, truncated"
LOG_RECEIVED_AT = LOG_COLUMNS_SQL.split(", ").index("received_at")
_NOT_TRUNCATED = pa.scalar(False, pa.bool_())
TS_TYPE = pa.timestamp("us")


def _int64s(values: list[int], kind: pa.DataType) -> pa.Array:
    """Python ints (in range: the codec checked) to Arrow through a C array: ~3x faster than pa.array."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(array.array("q", values))])


@dataclass
class LogColumns:
    """The log rows of one group commit, column by column as the requests' Python lists (``add``); ``table`` makes
    them one Arrow table for the whole commit. Built per request on the event loop instead (a record batch of
    each body, then the commit's batches combined into one chunk), the same rows cost 0.62 against 0.33 ms for an
    8-body commit and 3.9 against 1.8 ms for a 64-body one (in-process, best of 7): the per-call costs of Arrow's
    conversions (a scalar and a repeat of each id, two int columns, the text) paid by each body, and the copy of
    every line when the bodies' chunks were combined."""

    instance_ids: list[str]
    sources: list[str]
    run_ids: list[str]
    seqs: list[int]
    ts_us: list[int]
    lines: list[str]
    truncated: list[bool]

    @classmethod
    def empty(cls) -> "LogColumns":
        return cls([], [], [], [], [], [], [])

    def add(self, instance_id: str, source: str, run_id: str, seqs: list[int], ts_us: list[int], lines: list[str],
            truncated: list[bool]) -> None:
        """One stream's lines (ints in range: the codec checked them); the ids are repeated in C."""
        n = len(lines)
        self.instance_ids.extend(repeat(instance_id, n))
        self.sources.extend(repeat(source, n))
        self.run_ids.extend(repeat(run_id, n))
        self.seqs.extend(seqs)
        self.ts_us.extend(ts_us)
        self.lines.extend(lines)
        self.truncated.extend(truncated)

    def __len__(self) -> int:
        return len(self.lines)

    def instances(self) -> set[str]:
        return set(self.instance_ids)

    def table(self) -> pa.Table:
        """The rows as one table of one chunk a column (LOG_CHUNK_SCHEMA): the token filter reads a commit's lines
        block by block, and DuckDB appends one chunk rather than one per body (an 8-body commit's logs insert
        1.43 -> 1.05 ms, alternating A/B)."""
        n = len(self.lines)
        return pa.Table.from_arrays(
            [
                pa.array(self.instance_ids, pa.string()),
                pa.array(self.sources, pa.string()),
                pa.array(self.run_ids, pa.string()),
                _int64s(self.seqs, pa.int64()),
                _int64s(self.ts_us, TS_TYPE),
                pa.array(self.lines, pa.string()),
                pa.array(self.truncated, pa.bool_()) if any(self.truncated) else pa.repeat(_NOT_TRUNCATED, n),
            ],
            schema=LOG_CHUNK_SCHEMA,
        )


def write_batch(
    con: duckdb.DuckDBPyConnection,
    logs: LogColumns,
    events: list[Event],
    metrics: MetricRows,
    instances: dict[str, int],
    received_us: int,
    actions: list[Callable[[duckdb.DuckDBPyConnection], Any]] = (),
    blocks: Any = None,
    stream_parts: "StreamParts | None" = None,
) -> tuple[list[bool], list[Any]]:
    """Write one group commit; returns, per event, whether it was new (not a duplicate), and
    what each action returned (actions run last, inside the same transaction).

    ``instances`` maps every instance seen in the batch to its newest timestamp (for last_seen).
    ``blocks`` (an ``ingest.db.searchtokens.BlockWriter``, file mode) writes the token filter of the log rows in
    the same transaction; the caller tells it whether the commit held. ``stream_parts`` (the writer's, file
    mode) keeps log_stream_lines' parts (migrations 023, 024) in the same transaction, and is told the same.
    Everything happens in one transaction: on error it is rolled back and StoreError raised.
    """
    fresh: list[bool] = []
    # Always BEGIN ... COMMIT, even for one INSERT: the relation API's INSERT left to autocommit returned
    # without error on a full disk and the rows were gone after the reopen (tests/test_disk_full.py).
    try:
        con.execute("BEGIN")
        if blocks is not None:  # never before the newest stored stamp (the writer's is already: callers' may not be)
            received_us = blocks.stamp(received_us, con)
        _upsert_instances(con, instances, received_us)
        if len(logs):
            rows = logs.table()
            stamps = blocks.add(con, rows, received_us) if blocks is not None else None
            _insert_logs(con, rows, received_us, stream_parts, stamps)
        if len(metrics):
            received = pa.scalar(received_us, TS_TYPE)  # ~10 us: only when there are metrics
            table = pa.Table.from_arrays(
                [
                    pa.array(metrics.instance_id, pa.string()),
                    pa.array(metrics.name, pa.string()),
                    pa.array(metrics.ts_us, pa.timestamp("us")),
                    pa.array(metrics.value, pa.float64()),
                    pa.array(metrics.labels, pa.string()),
                    pa.repeat(received, len(metrics)),
                ],
                schema=METRIC_SCHEMA,
            )
            con.from_arrow(table.__arrow_c_stream__()).insert_into("metrics")
        if events:
            fresh = _write_events(con, events, received_us)
        results = [action(con) for action in actions]
        con.execute("COMMIT")
    except Exception as e:  # a database error or a failing action: nothing of the group stays
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            logger.exception("rollback failed")
        raise StoreError(str(e)) from e
    return fresh, results


def warm_up() -> None:
    """Import what DuckDB's first scan of an Arrow table imports (pyarrow.dataset and pyarrow.compute:
    ~0.3 s holding the GIL), so that the first group commit does not pay for it."""
    import pyarrow.dataset  # noqa: F401


# A stream's figures in log_stream_lines (migration 019) from its log rows, grouped by stream: the tail's rows
# when the writer moves the mark (024), a commit's rows stamped at or before the mark (StreamParts), every stored
# row up to the mark (recount_stream_parts), the lake's rows (its view)
STREAM_FIGURES_SQL = """instance_id, source, run_id, count(*) AS lines, min(seq) AS first_seq, max(seq) AS last_seq,
       count(*) FILTER (WHERE truncated) AS truncated, min(ts) AS first_ts, max(ts) AS last_ts"""
# A commit's rows stamped at or before the mark (a clock stepped back): log_stream_tail would not count them (a
# commit's blocks are stamped apart, so some of its rows may be after the mark: those are the tail's)
_ADD_STREAM_PARTS_SQL = f"""
INSERT INTO log_stream_parts
SELECT {STREAM_FIGURES_SQL}, max(received_at)
FROM _log_batch WHERE received_at <= make_timestamp({{mark_us}}::BIGINT) GROUP BY ALL
"""
# The tail (every row after the mark) into the parts; returns each new part's newest stamp
_ADD_STREAM_TAIL_SQL = "INSERT INTO log_stream_parts SELECT * FROM log_stream_tail RETURNING epoch_us(last_received_at)"
STREAM_PARTS_SLACK = 4096
STREAM_MARK_INTERVAL_S = 1.0
STREAM_MARK_LINES = 100_000


class StreamParts:
    """The writer's side of log_stream_lines (migrations 023, 024): it moves the mark (the tail's figures into
    log_stream_parts, in a commit) once STREAM_MARK_INTERVAL_S or STREAM_MARK_LINES have passed since it last did,
    so that a read of log_stream_lines scans at most about that much of the newest lines; and it folds the parts
    into one row per stream once they are more than twice what the last fold left plus ``slack``, so that such a
    read folds at most about twice the streams (the fold's cost, a few ms per thousand streams, comes once per
    that many parts). A commit whose stamp is not after the mark (the clock stepped back) adds its own figures.

    On the writer thread only; ``add`` runs inside the commit's transaction, after its logs insert (given its
    rows, registered as ``_log_batch`` when they must be read), ``committed`` / ``rolled_back`` as the commit went (after a rollback all is
    read again at the next commit, which moves the mark)."""

    def __init__(self, slack: int = STREAM_PARTS_SLACK, interval_s: float = STREAM_MARK_INTERVAL_S,
                 lines: int = STREAM_MARK_LINES) -> None:
        self.slack = slack
        self.interval_s = interval_s
        self.lines = lines
        self.rows: int | None = None  # rows of log_stream_parts, as of the last commit (None: read them again)
        self.floor = 0  # rows the last fold left (the streams, when counted afresh)
        self.mark_us = 0  # log_stream_mark's received_at
        self.since = 0  # lines committed after the mark
        self.marked_at = 0.0  # time.monotonic() of the last move
        self._pending: tuple | None = None

    def add(self, con: duckdb.DuckDBPyConnection, received_us: int, lines: int, batch: pa.Table) -> None:
        """``batch``: the commit's log rows (LOG_COLUMNS_SQL), read only when stamped at or before the mark."""
        if self.rows is None:  # counted: the floor is the streams (what a fold would leave), not the parts
            restored = restore_stream_mark(con)  # (this commit's rows counted with the rest)
            rows, floor, mark_us = con.execute(
                "SELECT (SELECT count(*) FROM log_stream_parts), (SELECT count(*) FROM log_stream_lines), "
                "(SELECT epoch_us(max(received_at)) FROM log_stream_mark)").fetchone()
            since, marked_at = self.lines, 0.0  # how much lies after the mark is not known: move it now
        else:
            restored = False
            rows, floor, mark_us, since, marked_at = self.rows, self.floor, self.mark_us, self.since, self.marked_at
        if restored:
            pass
        elif received_us <= mark_us:
            con.register("_log_batch", batch)
            try:
                (added,) = con.execute(_ADD_STREAM_PARTS_SQL.format(mark_us=int(mark_us))).fetchone()
            finally:
                con.unregister("_log_batch")
            rows += added
        else:
            since += lines
        now = time.monotonic()
        if since >= self.lines or now - marked_at >= self.interval_s:
            newest = [us for (us,) in con.execute(_ADD_STREAM_TAIL_SQL).fetchall()]
            rows += len(newest)
            mark_us = max([mark_us, *newest])
            con.execute("UPDATE log_stream_mark SET received_at = make_timestamp($m)", {"m": mark_us})
            since, marked_at = 0, now
            if rows > 2 * floor + self.slack:
                rows = floor = fold_stream_parts(con)
        self._pending = (rows, floor, mark_us, since, marked_at)

    def committed(self) -> None:
        if self._pending is not None:
            self.rows, self.floor, self.mark_us, self.since, self.marked_at = self._pending
            self._pending = None

    def rolled_back(self) -> None:
        self._pending = None
        self.rows = None


def recount_stream_parts(con: duckdb.DuckDBPyConnection, instance_ids: list[str] | None = None) -> None:
    """The parts of ``instance_ids`` (every instance when None) counted again from ``logs``: their lines up to
    the mark (log_stream_tail counts the rest, 024)."""
    where = "instance_id IN (SELECT unnest(?::VARCHAR[]))" if instance_ids is not None else "true"
    params = [instance_ids] if instance_ids is not None else []
    con.execute(f"DELETE FROM log_stream_parts WHERE {where}", params)
    con.execute(f"INSERT INTO log_stream_parts SELECT {STREAM_FIGURES_SQL}, max(received_at) FROM logs WHERE {where} "
                "AND received_at <= (SELECT max(received_at) FROM log_stream_mark) GROUP BY ALL", params)


def restore_stream_mark(con: duckdb.DuckDBPyConnection) -> bool:
    """If log_stream_mark lost its row (a hand edit, a partial restore: log_stream_tail then counts nothing),
    put it back at the newest stored stamp and count every stream's parts afresh; whether it had to."""
    if con.execute("SELECT count(*) FROM log_stream_mark").fetchone()[0]:
        return False
    logger.warning("log_stream_mark had no row: log_stream_lines counted again from the stored lines")
    con.execute("INSERT INTO log_stream_mark SELECT coalesce(max(received_at), TIMESTAMP '1970-01-01') FROM logs")
    recount_stream_parts(con)
    return True


def fold_stream_parts(con: duckdb.DuckDBPyConnection) -> int:
    """log_stream_parts folded into one row per stream; the rows left. Right after the mark moved (the tail is
    empty), so log_stream_lines is the parts folded and reads the same after.
    In the caller's transaction: if a statement fails, the rollback takes the temporary table too (no
    cleanup statement here, which in an aborted transaction would fail and hide the error)."""
    con.execute("CREATE OR REPLACE TEMP TABLE _stream_fold AS SELECT * FROM log_stream_lines")
    con.execute("DELETE FROM log_stream_parts")
    (rows,) = con.execute("INSERT INTO log_stream_parts SELECT * FROM _stream_fold").fetchone()
    con.execute("DROP TABLE temp._stream_fold")
    return rows


# What logs_complete events declared of each stream (log_stream_declared, migration 022), from the events
# of ``{events}`` (instance_id, kind, body): the highest last seq declared (a value that is not a BIGINT
# declares nothing) and the highest count of lines dropped (one that is not a BIGINT counts as 1). Read
# by the writer (a commit's new events), by an admin's delete of an event (the instance's stored
# events again) and by the lake's view (every stored event).
STREAM_DECLARATIONS_SQL = """
WITH declarations AS (
    SELECT instance_id, coalesce(json_extract_string(body, '$.run_id'), '0') AS run_id, body
    FROM {events} WHERE kind = 'logs_complete'
),
declared AS (
    SELECT d.instance_id, d.run_id, j.key AS source, max(TRY_CAST(j.value AS BIGINT)) AS declared_last_seq
    FROM declarations d, json_each(d.body, '$.sources') AS j
    WHERE json_type(d.body, '$.sources') = 'OBJECT'
    GROUP BY ALL
),
dropped AS (
    SELECT d.instance_id, d.run_id, j.key AS source,
           max(coalesce(TRY_CAST(json_extract_string(j.value, '$') AS BIGINT), 1)) AS dropped
    FROM declarations d, json_each(d.body, '$.dropped') AS j
    WHERE json_type(d.body, '$.dropped') = 'OBJECT'
    GROUP BY ALL
)
SELECT instance_id, run_id, source, declared.declared_last_seq, dropped.dropped
FROM declared FULL JOIN dropped USING (instance_id, run_id, source)"""
# A commit's declarations added to what is kept: each figure is the highest declared (greatest skips NULL)
_ADD_STREAM_DECLARATIONS_SQL = f"""
INSERT INTO log_stream_declared {STREAM_DECLARATIONS_SQL.format(events="_declared_batch")}
ON CONFLICT (instance_id, run_id, source) DO UPDATE SET
    declared_last_seq = greatest(declared_last_seq, excluded.declared_last_seq),
    dropped = greatest(dropped, excluded.dropped)
"""


def _add_stream_declarations(con: duckdb.DuckDBPyConnection, events: pa.Table) -> None:
    """The new logs_complete events (rows of the batch's events table) into log_stream_declared (022)."""
    if not len(events):
        return
    con.register("_declared_batch", events)
    try:
        con.execute(_ADD_STREAM_DECLARATIONS_SQL)
    finally:
        con.unregister("_declared_batch")


def _insert_logs(con: duckdb.DuckDBPyConnection, rows: pa.Table, received_us: int,
                 stream_parts: "StreamParts | None" = None, stamps: pa.Array | None = None) -> None:
    """The commit's log rows (``LogColumns.table()``) into ``logs``, in the table's column order (LOG_COLUMNS_SQL),
    each stamped ``received_us`` or, with the token filter, its block's stamp (``stamps``, the rows' in order:
    ingest/db/searchtokens.py BlockWriter.add). Appended through DuckDB's relation API: registering the table
    as a view (and dropping it) for an ``INSERT ... SELECT`` cost ~0.5 ms of an 8-body commit's ~7 (7%,
    alternating A/B). The table goes in as a bare Arrow stream (its PyCapsule), which DuckDB reads without
    building a pyarrow dataset and scanner around it: an 800-row insert 1.05 -> 0.75 ms of CPU, 100 rows
    0.79 -> 0.52 (alternating, in-process). Their figures are log_stream_lines' at once (log_stream_tail, 024); ``stream_parts``
    (the writer's, file mode) moves the mark when due."""
    received = stamps if stamps is not None else pa.repeat(pa.scalar(received_us, TS_TYPE), rows.num_rows)
    table = rows.add_column(LOG_RECEIVED_AT, "received_at", received)
    con.from_arrow(table.__arrow_c_stream__()).insert_into("logs")
    if stream_parts is not None:
        stream_parts.add(con, received_us, rows.num_rows, table)


def _upsert_instances(con: duckdb.DuckDBPyConnection, instances: dict[str, int], received_us: int) -> None:
    if not instances:
        return
    ids = list(instances)
    con.execute(
        """
        INSERT INTO instances (instance_id, first_seen, last_seen)
        SELECT id, make_timestamp(?), make_timestamp(?) FROM unnest(?::VARCHAR[]) AS t(id)
        ON CONFLICT (instance_id) DO UPDATE SET last_seen = excluded.last_seen
        """,
        [received_us, received_us, ids],
    )


EVENT_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("kind", pa.string()),
        ("ts", pa.timestamp("us")),
        ("received_at", pa.timestamp("us")),
        ("body", pa.string()),
    ]
)
_REGISTERED_COLUMNS = (("machine_id", pa.int64()), ("host_id", pa.int64()), ("gpu_model", pa.string()),
                       ("gpu_count", pa.int32()), ("dph", pa.float64()), ("location", pa.string()), ("labels", pa.string()))
_RUN_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()), ("started_at", pa.timestamp("us")), ("proofs", pa.int32()),
        ("concurrency", pa.int32()), ("partition_workers", pa.int32()), ("done_at", pa.timestamp("us")),
        ("exit_code", pa.int32()), ("rate_per_hour", pa.float64()), ("duration_s", pa.float64()),
        ("proofs_ok", pa.int32()), ("failure_excerpt", pa.string()), ("run_id", pa.string()),
        ("started_received_at", pa.timestamp("us")), ("done_received_at", pa.timestamp("us")),
    ]
)
_DONE_FIELDS = ("exit_code", "rate_per_hour", "duration_s", "proofs_ok", "failure_excerpt")


def _write_events(con: duckdb.DuckDBPyConnection, events: list[Event], received_us: int) -> list[bool]:
    """Write a batch of events (unique by (instance_id, kind, ts) within the batch) in a fixed number of
    statements, whatever their count; returns, per event, whether it was new.

    The side effects are those of applying the new events one by one in batch order: a
    ``registered`` event sets the instance's non-null fields; ``bench_started`` opens a run;
    ``bench_done`` closes the newest open run of its instance started at or before it (one opened
    earlier in the batch included), else stores a run of its own. The matching is done here, in
    memory, over the open runs read in one query; the rows are then written in one statement each.
    """
    n = len(events)
    table = pa.Table.from_arrays(
        [
            pa.array([e.instance_id for e in events], pa.string()),
            pa.array([e.kind for e in events], pa.string()),
            pa.array([e.ts_us for e in events], pa.timestamp("us")),
            pa.repeat(pa.scalar(received_us, pa.timestamp("us")), n),
            pa.array([orjson.dumps(e.body).decode() for e in events], pa.string()),
        ],
        schema=EVENT_SCHEMA,
    )
    con.register("_event_batch", table)
    try:
        inserted = con.execute(
            "INSERT INTO events SELECT * FROM _event_batch ON CONFLICT DO NOTHING RETURNING instance_id, kind, epoch_us(ts)"
        ).fetchall()
    finally:
        con.unregister("_event_batch")
    new_keys = set(inserted)
    fresh = [(e.instance_id, e.kind, e.ts_us) in new_keys for e in events]
    new_events = [e for e, is_new in zip(events, fresh) if is_new]
    _apply_registered(con, [e for e in new_events if e.kind == "registered"])
    _apply_bench(con, [e for e in new_events if e.kind in ("bench_started", "bench_done")], received_us)
    completes = [i for i, (e, is_new) in enumerate(zip(events, fresh)) if is_new and e.kind == "logs_complete"]
    _add_stream_declarations(con, table.take(pa.array(completes, pa.int64())))  # the bodies serialized once, for events and this
    return fresh


def _apply_registered(con: duckdb.DuckDBPyConnection, events: list[Event]) -> None:
    """Per instance, each field takes the last non-null value its new ``registered`` events carry."""
    if not events:
        return
    merged: dict[str, dict[str, Any]] = {}
    for event in events:
        fields = merged.setdefault(event.instance_id, {})
        for name, _type in _REGISTERED_COLUMNS:
            value = event.body.get(name)
            if value is not None:
                fields[name] = orjson.dumps(value).decode() if name == "labels" else value
    ids = list(merged)
    arrays = [pa.array(ids, pa.string())] + [
        pa.array([merged[i].get(name) for i in ids], kind) for name, kind in _REGISTERED_COLUMNS
    ]
    names = ["instance_id"] + [name for name, _ in _REGISTERED_COLUMNS]
    con.register("_registered", pa.Table.from_arrays(arrays, names=names))
    try:
        sets = ", ".join(f"{name} = coalesce(r.{name}, instances.{name})" for name, _ in _REGISTERED_COLUMNS)
        con.execute(f"UPDATE instances SET {sets} FROM _registered r WHERE instances.instance_id = r.instance_id")
    finally:
        con.unregister("_registered")


def _run_id(body: dict) -> str | None:
    run_id = body.get("run_id")
    return run_id if isinstance(run_id, str) else None


def _apply_bench(con: duckdb.DuckDBPyConnection, events: list[Event], received_us: int) -> None:
    """Open and close bench runs. A run keeps the agent's times (started_at, done_at: for display)
    and the server's (started_received_at, done_received_at: what every wait is measured by)."""
    if not events:
        return
    ids = sorted({e.instance_id for e in events if e.kind == "bench_done"})
    # open runs: instance -> [(started_us, rowid or None, new run dict or None)], in insertion order
    open_runs: dict[str, list[list]] = {}
    if ids:
        for rowid, instance_id, started_us in con.execute(
            """SELECT rowid, instance_id, epoch_us(started_at) FROM bench_runs
               WHERE done_at IS NULL AND started_at IS NOT NULL AND instance_id IN (SELECT unnest(?::VARCHAR[]))
               ORDER BY rowid""",
            [ids],
        ).fetchall():
            open_runs.setdefault(instance_id, []).append([started_us, rowid, None])
    new_runs: list[dict[str, Any]] = []
    closed: list[tuple[int, dict[str, Any]]] = []  # (rowid, done fields) of stored runs
    for event in events:
        body = event.body
        if event.kind == "bench_started":
            run = {"instance_id": event.instance_id, "started_at": event.ts_us, "proofs": body.get("proofs"),
                   "concurrency": body.get("concurrency"), "partition_workers": body.get("partition_workers"),
                   "run_id": _run_id(body), "started_received_at": received_us}
            new_runs.append(run)
            open_runs.setdefault(event.instance_id, []).append([event.ts_us, None, run])
            continue
        done = {"done_at": event.ts_us, "done_received_at": received_us, **{name: body.get(name) for name in _DONE_FIELDS}}
        if _run_id(body):
            done["run_id"] = _run_id(body)
        candidates = [r for r in open_runs.get(event.instance_id, ()) if r[0] <= event.ts_us]
        if not candidates:
            new_runs.append({"instance_id": event.instance_id, **done})
            continue
        best = max(candidates, key=lambda r: r[0])  # the newest; among equals the last inserted
        best = [r for r in candidates if r[0] == best[0]][-1]
        open_runs[event.instance_id].remove(best)
        if best[2] is not None:
            best[2].update(done)
        else:
            closed.append((best[1], done))
    if new_runs:
        con.register("_new_runs", pa.Table.from_pylist(
            [{f.name: run.get(f.name) for f in _RUN_SCHEMA} for run in new_runs], schema=_RUN_SCHEMA))
        try:
            columns = ", ".join(f.name for f in _RUN_SCHEMA)
            con.execute(f"INSERT INTO bench_runs ({columns}) SELECT {columns} FROM _new_runs")
        finally:
            con.unregister("_new_runs")
    if closed:
        closing = ("done_at", "done_received_at", *_DONE_FIELDS)
        schema = pa.schema([("row", pa.int64())] + [f for f in _RUN_SCHEMA if f.name in closing or f.name == "run_id"])
        con.register("_closed", pa.Table.from_pylist([{"row": rowid, **done} for rowid, done in closed], schema=schema))
        try:
            sets = ", ".join([f"{name} = c.{name}" for name in closing] + ["run_id = coalesce(c.run_id, bench_runs.run_id)"])
            con.execute(f"UPDATE bench_runs SET {sets} FROM _closed c WHERE bench_runs.rowid = c.row")
        finally:
            con.unregister("_closed")


# --- an operator's repairs (docs/api.md: /api/v1/admin/events) ---------------------------------------
_ONE_EVENT = "instance_id = ? AND kind = ? AND ts = make_timestamp(?::BIGINT)"


def delete_event(con: duckdb.DuckDBPyConnection, instance_id: str, kind: str, ts_us: int, declarations: bool = True) -> int:
    """The writer's ``delete_event``: remove one stored event (its key is (instance_id, kind, ts)), e.g.
    one that broke a rule; returns how many rows went, 0 or 1. Counted first: PostgreSQL through DuckDB
    (lake mode) has no RETURNING. What the event already wrote into ``instances`` or ``bench_runs``
    stays; the views, which read ``events``, no longer see it, and a logs_complete's declarations are
    counted again from the instance's other events (``declarations``: file mode; the lake's are a view)."""
    params = [instance_id, kind, ts_us]
    (found,) = con.execute(f"SELECT count(*) FROM events WHERE {_ONE_EVENT}", params).fetchone()
    if found:
        con.execute(f"DELETE FROM events WHERE {_ONE_EVENT}", params)
        if kind == "logs_complete" and declarations:  # what the instance's remaining events declare (022)
            recount_stream_declarations(con, [instance_id])
    return found


def recount_stream_declarations(con: duckdb.DuckDBPyConnection, instance_ids: list[str]) -> None:
    """log_stream_declared (022) of ``instance_ids`` counted again from their stored events."""
    con.execute("DELETE FROM log_stream_declared WHERE instance_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": instance_ids})
    own = "(SELECT instance_id, kind, body FROM events WHERE instance_id IN (SELECT unnest($ids::VARCHAR[])))"
    con.execute(f"INSERT INTO log_stream_declared {STREAM_DECLARATIONS_SQL.format(events=own)}", {"ids": instance_ids})
