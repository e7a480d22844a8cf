"""The lake storage mode (``serve --lake``): logs and metrics in a DuckLake, the keyed tables in
PostgreSQL, both attached to one in-memory DuckDB so every query keeps its one SQL statement.

Layout of the connection ``open_lake`` returns::

    lake  (ducklake:postgres:<dsn>, DATA_PATH <lake_data>)   logs, metrics           Parquet files
    pg    (postgres:<dsn>)                                   instances, events, bench_runs, decisions,
                                                             host_verdicts, instance_tokens,
                                                             schema_migrations       PostgreSQL rows
    memory.main                                              instance_state (a view over pg)

memory.main also holds one view per table (``logs`` is ``SELECT * FROM lake.main.logs``, ...): a
cursor (every read) starts in memory.main, so the unqualified names used by the reader, the
policies and queries/ resolve to the right catalog and the same files serve both modes. The
writer's own connection sets ``search_path`` to ``lake.main, pg.public, memory.main`` (a session
setting, not inherited by cursors), so its INSERT/UPDATE statements reach the tables themselves.
The SQL guard sees only memory.main: the secret tables by name, the lake's ``ducklake_*`` catalog
and other catalogs by qualification stay out of reach.

Invariants:

- DuckDB writes to one attached database per transaction. ``write_batch`` therefore commits a group
  in two transactions, PostgreSQL first (instances, events, policy actions: every statement there is
  idempotent on a retry, events by their UNIQUE key), then the lake (logs, metrics). A request is
  acknowledged only after both; a failure between them leaves keyed rows that the client's retry
  finds again (counted as duplicates), never a log line twice (the seq index guards the lake).
- The lake has no keys: uniqueness of a log line is the writer's seq index, as in file mode, which
  holds only while one writer owns an instance (ingest/db/lake/slots.py, when several nodes share a lake).
- File access stays off for queries (``enable_external_access = false``) except the lake's own
  ``DATA_PATH`` (``allowed_directories``); the SQL guard refuses postgres_query and every other
  table function outside its allowlist, and the ``ducklake_*`` catalog tables by name.
- Extensions come from the ``duckdb-extension-*`` PyPI packages, never from the network.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import psycopg
import pyarrow as pa

from ingest.db import store
from ingest.contract.codec import Event, MetricRows
from ingest.errors import Overloaded, StoreError

logger = logging.getLogger(__name__)

LAKE = "lake"  # catalog names inside the DuckDB connection
PG = "pg"
SEARCH_PATH = f"{LAKE}.main,{PG}.public,memory.main"
LAKE_TABLES = ("logs", "metrics")
PG_TABLES = ("instances", "events", "bench_runs", "decisions", "host_verdicts", "instance_tokens", "schema_migrations",
             "policy_settings", "enrollments")

# The order maintenance merges files into (tails read the newest lines of one stream).
SORTED_BY = {"logs": "instance_id, source, run_id, seq", "metrics": "instance_id, name, ts"}

# The migrations (ingest/db/migrations/) whose tables PG_DDL and the lake hold; the lake's tables (logs,
# metrics) and the views are created from the files themselves (``_lake_tables``, ``_migration_views``). A new migration must be folded in here too (open_lake refuses to start
# otherwise, so the two modes cannot drift apart silently).
# 10, 15, 16, 17, 18 and 21 only (re)define views (17 a macro too); 14, 20 and 25 (log_blocks and its runs, the search's token filter) have no lake
# table: the lake keeps no blocks and its searches scan the window (docs/scale-out.md). 19's table (log_stream_lines, what is
# stored of each log stream, kept by the file's writer) is a view here that counts the lake's lines (LAKE_STREAM_LINES), as 010 did.
LAKE_MIGRATIONS = frozenset({1, 2, 3, 5, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25})
# 23 keeps 19's figures as parts the file's writer appends, and makes log_stream_lines a view that folds them: the lake's
# log_stream_lines stays its own (LAKE_STREAM_LINES), so that view of the migrations is not made here (LAKE_OWN_VIEWS); nor
# 24's log_stream_tail (the lines after the file writer's mark, which the lake's view counts with the rest).
LAKE_OWN_VIEWS = frozenset({"log_stream_lines", "log_stream_tail"})
LAKE_STREAM_LINES = f"""CREATE OR REPLACE VIEW memory.main.log_stream_lines AS
SELECT {store.STREAM_FIGURES_SQL}, max(received_at) AS last_received_at
FROM {LAKE}.main.logs GROUP BY ALL"""
# 22's table (log_stream_declared, what logs_complete events declared of each stream) is a view here
# over the stored events, as 019's log_streams read them.
LAKE_STREAM_DECLARED = ("CREATE OR REPLACE VIEW memory.main.log_stream_declared AS"
                        + store.STREAM_DECLARATIONS_SQL.format(events=f"{PG}.public.events"))

# Native PostgreSQL DDL of the keyed tables (migrations 001-005 folded, JSON kept as text: DuckDB sees both as VARCHAR and casts one way only; bench_runs carries its own
# ``rowid`` column, which DuckDB's postgres scanner does not provide, so the writer's run matching
# is the same SQL in both modes).
PG_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text, applied_at timestamp DEFAULT now());
CREATE TABLE IF NOT EXISTS instances (
    instance_id text PRIMARY KEY, machine_id bigint, host_id bigint, gpu_model text, gpu_count integer,
    dph double precision, location text, labels text, first_seen timestamp NOT NULL, last_seen timestamp NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    instance_id text NOT NULL, kind text NOT NULL, ts timestamp NOT NULL, received_at timestamp NOT NULL,
    body text NOT NULL, UNIQUE (instance_id, kind, ts));
CREATE TABLE IF NOT EXISTS bench_runs (
    instance_id text NOT NULL, started_at timestamp, proofs integer, concurrency integer, partition_workers integer,
    done_at timestamp, exit_code integer, rate_per_hour double precision, duration_s double precision,
    proofs_ok integer, failure_excerpt text, failure_class text, failure_line text, rowid bigserial);
CREATE SEQUENCE IF NOT EXISTS decision_ids START 1;
CREATE TABLE IF NOT EXISTS decisions (
    id bigint PRIMARY KEY DEFAULT nextval('decision_ids'), rule text NOT NULL, rule_sha text NOT NULL,
    subject text NOT NULL, action text NOT NULL, reason text NOT NULL, evidence text NOT NULL,
    episode text NOT NULL, decided_at timestamp NOT NULL, expires_at timestamp, state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0, executed_at timestamp, last_error text, UNIQUE (rule, subject, episode));
-- DuckDB's scanner sends every column of an INSERT ... ON CONFLICT, NULL for the ones not named:
-- the defaults are applied here instead.
CREATE OR REPLACE FUNCTION fleetlog_decision_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.id := coalesce(NEW.id, nextval('decision_ids'));
    NEW.attempts := coalesce(NEW.attempts, 0);
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER fleetlog_decision_defaults BEFORE INSERT ON decisions
    FOR EACH ROW EXECUTE FUNCTION fleetlog_decision_defaults();
CREATE TABLE IF NOT EXISTS host_verdicts (
    machine_id bigint NOT NULL, verdict text NOT NULL, reason text NOT NULL, verdict_at timestamp NOT NULL,
    expires_at timestamp);
CREATE TABLE IF NOT EXISTS instance_tokens (instance_id text NOT NULL, token_sha256 text NOT NULL, issued_at timestamp NOT NULL);
CREATE TABLE IF NOT EXISTS policy_settings (name text PRIMARY KEY, value double precision NOT NULL, set_at timestamp NOT NULL);
CREATE TABLE IF NOT EXISTS enrollments (
    instance_id text PRIMARY KEY, declared_at timestamp, enrolled_at timestamp, vouched boolean NOT NULL);
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS class_final boolean;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS classified_at timestamp;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS class_scanned_to timestamp;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS class_priority integer;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS attempted_at timestamp;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS settled_at timestamp;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS run_id text;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS started_received_at timestamp;
ALTER TABLE bench_runs ADD COLUMN IF NOT EXISTS done_received_at timestamp;
INSERT INTO schema_migrations (version, name)
    VALUES (1, 'initial'), (2, 'policies'), (3, 'tokens'), (5, 'views'), (9, 'logs_line_zstd'), (10, 'views_data'), (11, 'enrollments'), (12, 'rule_progress'), (13, 'server_time'), (14, 'log_blocks'), (15, 'money'), (16, 'degradation'), (17, 'patterns'), (18, 'spikes'), (19, 'log_stream_lines'), (20, 'block_received'), (21, 'params_run'), (22, 'log_stream_declared'), (23, 'log_stream_parts'), (24, 'log_stream_mark'), (25, 'block_runs')
    ON CONFLICT DO NOTHING;
"""


def _lake_tables(migrations: list[tuple[int, str, str]]) -> list[str]:
    """CREATE TABLE of the lake's tables (LAKE_TABLES) as the migrations leave them: they are applied to
    an empty in-memory DuckDB and the columns read back, so the logs DDL is written once, in the
    migrations (JSON is VARCHAR to the lake; compression and keys are the file's own). Once per
    process and list (applying them costs a few hundred ms)."""
    return list(_lake_tables_of(tuple(migrations)))


@functools.lru_cache(maxsize=4)
def _lake_tables_of(migrations: tuple[tuple[int, str, str], ...]) -> tuple[str, ...]:
    scratch = duckdb.connect(":memory:")
    try:
        store.migrate(scratch, list(migrations))
        out = []
        for table in LAKE_TABLES:
            columns = scratch.execute("SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
                                      "WHERE table_name = ? ORDER BY column_index", [table]).fetchall()
            body = ",\n    ".join(f"{name:<12} {'VARCHAR' if kind == 'JSON' else kind}{'' if nullable else ' NOT NULL'}"
                                  for name, kind, nullable in columns)
            out.append(f"CREATE TABLE IF NOT EXISTS {LAKE}.{table} (\n    {body}\n)")
        return tuple(out)
    finally:
        scratch.close()


def _migration_views(migrations: list[tuple[int, str, str]]) -> list[str]:
    """Every CREATE VIEW (and MACRO) of the migrations, in order, as CREATE OR REPLACE VIEW memory.main.<name>
    (re-created at every start; they read the per-table views, so the same SQL serves both modes)."""
    out = []
    for version, name, sql in migrations:
        if version not in LAKE_MIGRATIONS:
            raise StoreError(f"lake: migration {version:03d}_{name} has no lake counterpart in ingest/db/lake/storage.py")
        for statement in duckdb.extract_statements(sql):
            text = re.sub(r"^(\s*--[^\n]*\n|\s+)*", "", statement.query)  # the comments before it
            match = re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?(VIEW|MACRO)\s+(\w+)\b", text, re.IGNORECASE)
            if match and match.group(2).lower() not in LAKE_OWN_VIEWS:  # a macro (017's line_template) before the views that call it, as in the file
                out.append(f"CREATE OR REPLACE {match.group(1).upper()} memory.main.{match.group(2)}" + text[match.end():])
    return out


def _extension_files() -> dict[str, Path]:
    """The two extensions, copied once under the names their entry points expect."""
    import duckdb_extension_ducklake
    import duckdb_extension_postgres

    version = "v" + duckdb.__version__
    cache = Path(tempfile.gettempdir()) / f"fleetlog-duckdb-extensions-{os.getuid()}" / version
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for module, packaged, name in (
        (duckdb_extension_ducklake, "ducklake", "ducklake"),
        (duckdb_extension_postgres, "postgres", "postgres_scanner"),
    ):
        source = Path(module.__file__).parent / "extensions" / version / f"{packaged}.duckdb_extension"
        target = cache / f"{name}.duckdb_extension"
        if not target.exists() or target.stat().st_size != source.stat().st_size:
            partial = target.with_suffix(f".{os.getpid()}.part")
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        out[name] = target
    return out


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def open_lake(dsn: str, data_path: str, memory_limit_mb: int = 256, temp_dir: str | None = None,
              schema: bool = True, migrations: list[tuple[int, str, str]] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake and its PostgreSQL attached, schema created (unless
    ``schema`` is False: the maintenance job's own instance, opened on a lake that exists), locked down.
    ``migrations``: the (version, name, sql) the lake's tables and views follow (``store.migrations()``
    unless given)."""
    if not dsn.startswith("postgres:"):
        raise StoreError(f"lake: expected 'postgres:<libpq connection string>', got {dsn!r}")
    store.no_pandas_search()
    pg_dsn = dsn.removeprefix("postgres:")
    data = Path(data_path).resolve()
    data.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        for path in _extension_files().values():
            con.execute(f"LOAD {_quote(str(path))}")
        with _init_lock(pg_dsn) if schema else nullcontext():  # nodes starting together would each create the catalog
            con.execute(f"ATTACH {_quote('ducklake:postgres:' + pg_dsn)} AS {LAKE} (DATA_PATH {_quote(str(data) + '/')})")
            con.execute(f"ATTACH {_quote(pg_dsn)} AS {PG} (TYPE postgres)")
            con.execute(f"SET search_path = {_quote(SEARCH_PATH)}")
            if schema:
                _create_schema(con, store.migrations() if migrations is None else migrations)
        con.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
        tmp = Path(temp_dir) if temp_dir else data.parent / (data.name + ".tmp")
        con.execute(f"SET temp_directory = {_quote(str(tmp))}")
        con.execute(f"SET max_temp_directory_size = '{int(memory_limit_mb) * store.TEMP_DIR_FACTOR}MB'")
        con.execute(f"SET allowed_directories = [{_quote(str(data) + '/')}, {_quote(str(tmp) + '/')}]")
        con.execute(store.ALLOCATOR_SQL)
        con.execute("SET enable_external_access = false")
        # A commit that found others committed meanwhile is retried in the catalog without rewriting
        # files; a merge beside nodes committing back to back needs more than the default 10 tries.
        con.execute(f"SET ducklake_max_retry_count = {COMMIT_RETRIES}")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as e:
        con.close()
        raise StoreError(f"cannot open the lake {dsn!r} at {data_path}: {e}") from e
    except Exception:
        con.close()
        raise
    return con


INIT_LOCK_KEY = 0x666C6F68
COMMIT_RETRIES = 200


@contextmanager
def _init_lock(pg_dsn: str) -> Iterator[None]:
    """A PostgreSQL session advisory lock held while this node attaches and creates the schema."""
    try:
        conn = psycopg.connect(pg_dsn, autocommit=True)
    except psycopg.Error as e:
        raise StoreError(f"lake: cannot connect to PostgreSQL: {e}") from e
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", [INIT_LOCK_KEY])
        yield
    finally:
        conn.close()  # the lock goes with the session


def _create_schema(con: duckdb.DuckDBPyConnection, migrations: list[tuple[int, str, str]], attempts: int = 20) -> None:
    """Idempotent; nodes starting together may conflict on the lake's catalog, so it is retried."""
    views = _migration_views(migrations)  # refuses a migration the lake does not know before touching it
    tables = _lake_tables(migrations)
    for attempt in range(attempts):
        try:
            con.execute(f"CALL postgres_execute({_quote(PG)}, {_quote(PG_DDL)})")
            for statement in tables:
                con.execute(statement)
            break
        except duckdb.Error as e:
            if attempt == attempts - 1:
                raise
            logger.info("lake schema creation conflicted (%s); retrying", e)
            time.sleep(0.1 * (attempt + 1))
    # No inlined rows: on 1.5.5 a retention DELETE of inlined rows, with the flushes and merges of
    # maintenance around it, left metrics with a count(*) of -2 ("INT128 with value -2 can't be cast",
    # tests/test_lake_retention.py failed 3 runs in 4); every commit writes its Parquet file instead,
    # which maintenance merges. Set once (an option change is a catalog change, like an ALTER).
    inlining = con.execute(f"SELECT value FROM ducklake_options('{LAKE}') WHERE option_name = 'data_inlining_row_limit'"
                           ).fetchall()
    if inlining != [("0",)]:
        con.execute(f"CALL ducklake_set_option('{LAKE}', 'data_inlining_row_limit', 0)")
    for table, key in SORTED_BY.items():  # once: an ALTER conflicts with every concurrent insert
        unsorted = con.execute(
            f"""SELECT count(*) = 0 FROM __ducklake_metadata_{LAKE}.ducklake_sort_info s
                JOIN __ducklake_metadata_{LAKE}.ducklake_table t ON s.table_id = t.table_id
                WHERE t.table_name = ? AND t.end_snapshot IS NULL AND s.end_snapshot IS NULL""", [table]).fetchone()[0]
        if unsorted:
            con.execute(f"ALTER TABLE {LAKE}.main.{table} SET SORTED BY ({key})")
    for name in LAKE_TABLES:
        con.execute(f"CREATE OR REPLACE VIEW memory.main.{name} AS SELECT * FROM {LAKE}.main.{name}")
    for name in PG_TABLES:
        con.execute(f"CREATE OR REPLACE VIEW memory.main.{name} AS SELECT * FROM {PG}.public.{name}")
    con.execute(LAKE_STREAM_LINES)
    con.execute(LAKE_STREAM_DECLARED)
    for view in views:
        con.execute(view)


Fence = Callable[[duckdb.DuckDBPyConnection, set[str]], None]


class LakeAction:
    """A writer action that writes the lake (a retention DELETE), not PostgreSQL: ``write_batch`` runs
    it in a lake transaction of its own, inside the delete window (ingest/db/lake/jobs.py)."""

    def __init__(self, action: Callable[[duckdb.DuckDBPyConnection], Any]) -> None:
        self.action = action

    def __call__(self, con: duckdb.DuckDBPyConnection) -> Any:
        return self.action(con)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:  # a failed COMMIT has already ended the transaction: keep its error, not this one
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def write_batch(
    con: duckdb.DuckDBPyConnection,
    logs: store.LogColumns,
    events: list[Event],
    metrics: MetricRows,
    instances: dict[str, int],
    received_us: int,
    actions: list[Callable[[duckdb.DuckDBPyConnection], Any]] = (),
    fence: Fence | None = None,
    window=None,
) -> tuple[list[bool], list[Any]]:
    """``store.write_batch`` for the lake: PostgreSQL's part committed first, then each ``LakeAction``
    alone, then the lake's rows; with several nodes, ``fence`` checks inside each transaction that
    this node still owns every instance written (ingest/db/lake/slots.py) and raises Overloaded (503, the
    client retries) when not, and ``window`` (an ingest.db.lake.jobs.DeleteWindow) holds the lake's
    delete window shared around the rows' commit and exclusive around a LakeAction's."""
    fresh: list[bool] = []
    results: list[Any] = [None] * len(actions)
    in_pg = [(k, a) for k, a in enumerate(actions) if not isinstance(a, LakeAction)]
    in_lake = [(k, a) for k, a in enumerate(actions) if isinstance(a, LakeAction)]
    logged = logs.instances()
    # The instances whose rows this group writes. Not ``instances``: it also carries last_seen touches
    # of instances seen earlier, whose slot may have moved since; fencing those would refuse every
    # later group of this node (the touch stays due until it commits).
    owned = {e.instance_id for e in events} | logged | set(metrics.instance_id)
    checks = [lambda c: fence(c, owned)] if fence is not None and owned else []
    try:
        if instances or events or in_pg:
            con.execute("BEGIN")
            try:
                store._upsert_instances(con, instances, received_us)
                if events:
                    fresh = _write_events(con, events, received_us)
                for k, action in in_pg:
                    results[k] = action(con)
                for check in checks:
                    check(con)
                con.execute("COMMIT")
            except Exception:
                _rollback(con)
                raise
        for k, action in in_lake:
            with window.exclusive() if window is not None else nullcontext():
                con.execute("BEGIN")
                try:
                    results[k] = action(con)
                    con.execute("COMMIT")
                except Exception:
                    _rollback(con)
                    raise
        if len(logs) or len(metrics):
            with window.commit() if window is not None else nullcontext():
                store.write_batch(con, logs, [], metrics, {}, received_us, checks)
    except StoreError:
        raise
    except Exception as e:
        raise StoreError(str(e)) from e
    return fresh, results


def slot_fence(slots) -> Fence:
    """The fence of ``write_batch`` for a node holding ``slots`` (an ingest.db.lake.slots.Slots)."""

    def fence(con: duckdb.DuckDBPyConnection, instance_ids: set[str]) -> None:
        sql = slots.fence_sql(instance_ids)
        if sql is not None:
            n, want = con.execute(f"SELECT * FROM postgres_query({_quote(PG)}, {_quote(sql)})").fetchone()
            if n == want:
                return
        raise Overloaded("this node no longer owns an instance of the request; retry (another node serves it)",
                         retry_after_s=1)

    return fence


def _write_events(con: duckdb.DuckDBPyConnection, events: list[Event], received_us: int) -> list[bool]:
    """PostgreSQL through DuckDB has no RETURNING: the keys already stored are read first (inside the
    transaction; one writer owns an instance, so nothing else inserts them meanwhile)."""
    keys = pa.table({
        "instance_id": pa.array([e.instance_id for e in events], pa.string()),
        "kind": pa.array([e.kind for e in events], pa.string()),
        "ts_us": pa.array([e.ts_us for e in events], pa.int64()),
    })
    con.register("_event_keys", keys)
    try:
        stored = set(con.execute(
            """SELECT e.instance_id, e.kind, epoch_us(e.ts) FROM events e
               WHERE e.instance_id IN (SELECT DISTINCT instance_id FROM _event_keys)
                 AND (e.instance_id, e.kind, epoch_us(e.ts)) IN (SELECT (instance_id, kind, ts_us) FROM _event_keys)"""
        ).fetchall())
    finally:
        con.unregister("_event_keys")
    fresh = [(e.instance_id, e.kind, e.ts_us) not in stored for e in events]
    new_events = [e for e, is_new in zip(events, fresh) if is_new]
    if new_events:
        table = pa.Table.from_arrays(
            [
                pa.array([e.instance_id for e in new_events], pa.string()),
                pa.array([e.kind for e in new_events], pa.string()),
                pa.array([e.ts_us for e in new_events], pa.timestamp("us")),
                pa.repeat(pa.scalar(received_us, pa.timestamp("us")), len(new_events)),
                pa.array([store.orjson.dumps(e.body).decode() for e in new_events], pa.string()),
            ],
            schema=store.EVENT_SCHEMA,
        )
        con.register("_event_batch", table)
        try:
            con.execute("INSERT INTO events SELECT * FROM _event_batch ON CONFLICT DO NOTHING")
        finally:
            con.unregister("_event_batch")
        store._apply_registered(con, [e for e in new_events if e.kind == "registered"])
        store._apply_bench(con, [e for e in new_events if e.kind in ("bench_started", "bench_done")], received_us)
    return fresh


def maintain(con: duckdb.DuckDBPyConnection, snapshot_keep_s: float = 3600.0) -> dict[str, int]:
    """One maintenance pass, on a connection of its own (never the writer's): flush inlined rows
    into files (lakes created with inlining on), merge the one-file-per-commit output into larger
    files sorted by stream (``SORTED_BY``: tails read few row groups), expire snapshots older than
    ``snapshot_keep_s`` and delete the files nothing references any more. Appends do not conflict
    with any of it; a retention delete does, so on several nodes this runs under the maintenance
    lock (ingest/db/lake/jobs.py). Returns the data file counts before and after.

    Not ``ducklake_rewrite_data_files``: rows a retention delete removed stay in their files, masked
    by delete files. It was in the pass while DuckLake 1.5.5 raised the internal
    errors that the lake's settings now avoid (see ``_create_schema`` and lakejobs.Maintenance), and
    it was taken out then; it is not needed for what any query returns."""
    cur = con.cursor()
    try:
        def files() -> int:
            return sum(cur.execute(f"SELECT count(*) FROM ducklake_list_files('{LAKE}', '{t}')").fetchone()[0]
                       for t in LAKE_TABLES)

        before = files()
        cur.execute(f"CALL ducklake_flush_inlined_data('{LAKE}')")
        cur.execute(f"CALL ducklake_merge_adjacent_files('{LAKE}')")
        cur.execute(f"CALL ducklake_expire_snapshots('{LAKE}', older_than => now() - to_seconds({float(snapshot_keep_s)}))")
        cur.execute(f"CALL ducklake_cleanup_old_files('{LAKE}', cleanup_all => true)")
        return {"files_before": before, "files_after": files()}
    finally:
        cur.close()


# Every log line stored once: (instance_id, source, run_id, seq) never twice across the whole lake.
AUDIT_SQL = """
SELECT instance_id, source, run_id, seq, count(*) AS copies
FROM logs GROUP BY instance_id, source, run_id, seq HAVING count(*) > 1
ORDER BY copies DESC, instance_id, source, run_id, seq LIMIT 100
"""


def audit(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """The log lines stored more than once (at most 100); empty when exactly-once held."""
    cur = con.cursor()
    try:
        return cur.execute(AUDIT_SQL).fetchall()
    finally:
        cur.close()
