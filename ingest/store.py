"""The DuckDB file: opening it, numbered migrations, and the statements the writer commits.

Only the writer thread calls ``write_batch`` (on the one write connection). Every read goes through
``ingest/reader.py`` (a cursor per call).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import duckdb
import orjson
import pyarrow as pa

from ingest.codec import Event, MetricRows
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
    """(version, name, sql) for every file ``ingest/migrations/NNN_name.sql``, in order."""
    out = []
    for entry in resources.files("ingest").joinpath("migrations").iterdir():
        if entry.name.endswith(".sql"):
            number, _, name = entry.name.removesuffix(".sql").partition("_")
            out.append((int(number), name, entry.read_text()))
    return sorted(out)


TEMP_DIR_FACTOR = 8  # spilled query state may take this many times the memory limit on disk


def open_database(path: str | Path, memory_limit_mb: int = 256) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) and migrate the database, then lock it down for readers.

    DuckDB's memory is capped at ``memory_limit_mb``, beyond which queries spill to
    ``<db>.tmp/`` (itself capped); file and network access are switched off and the configuration
    locked for the whole database instance, so no cursor handed to the SQL API can read files or
    change that.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path))
    except duckdb.Error as e:
        raise StoreError(f"cannot open database {path}: {e}") from e
    try:
        migrate(con)
        con.execute(f"SET memory_limit = '{int(memory_limit_mb)}MB'")
        con.execute("SET temp_directory = '{}'".format((str(path) + ".tmp").replace("'", "''")))
        con.execute(f"SET max_temp_directory_size = '{int(memory_limit_mb) * TEMP_DIR_FACTOR}MB'")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except Exception:
        con.close()
        raise
    return con


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP DEFAULT now())")
    applied = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    done = 0
    for version, name, sql in migrations():
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
    return done


@dataclass
class LogColumns:
    instance_id: list[str]
    source: list[str]
    run_id: list[str]
    seq: list[int]
    ts_us: list[int]
    line: list[str]
    truncated: list[bool]

    @classmethod
    def empty(cls) -> "LogColumns":
        return cls([], [], [], [], [], [], [])

    def __len__(self) -> int:
        return len(self.seq)


def write_batch(
    con: duckdb.DuckDBPyConnection,
    logs: LogColumns,
    events: list[Event],
    metrics: MetricRows,
    instances: dict[str, int],
    received_us: int,
    actions: list[Callable[[duckdb.DuckDBPyConnection], Any]] = (),
) -> tuple[list[bool], list[Any]]:
    """Write one group commit; returns, per event, whether it was new (not a duplicate), and
    what each action returned (actions run last, inside the same transaction).

    ``instances`` maps every instance seen in the batch to its newest timestamp (for last_seen).
    Everything happens in one transaction: on error it is rolled back and StoreError raised.
    """
    received = pa.scalar(received_us, pa.timestamp("us"))
    fresh: list[bool] = []
    try:
        con.execute("BEGIN")
        _upsert_instances(con, instances, received_us)
        if len(logs):
            n = len(logs)
            table = pa.Table.from_arrays(
                [
                    pa.array(logs.instance_id, pa.string()),
                    pa.array(logs.source, pa.string()),
                    pa.array(logs.run_id, pa.string()),
                    pa.array(logs.seq, pa.int64()),
                    pa.array(logs.ts_us, pa.timestamp("us")),
                    pa.repeat(received, n),
                    pa.array(logs.line, pa.string()),
                    pa.array(logs.truncated, pa.bool_()),
                ],
                schema=LOG_SCHEMA,
            )
            con.register("_log_batch", table)
            con.execute("INSERT INTO logs SELECT * FROM _log_batch")
            con.unregister("_log_batch")
        if len(metrics):
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
            con.register("_metric_batch", table)
            con.execute("INSERT INTO metrics SELECT * FROM _metric_batch")
            con.unregister("_metric_batch")
        for event in events:
            fresh.append(_write_event(con, event, received_us))
        results = [action(con) for action in actions]
        con.execute("COMMIT")
    except Exception as e:  # a database error or a failing action: nothing of the group stays
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            logger.exception("rollback failed")
        raise StoreError(str(e)) from e
    return fresh, results


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


def _write_event(con: duckdb.DuckDBPyConnection, event: Event, received_us: int) -> bool:
    body = event.body
    inserted = con.execute(
        """
        INSERT INTO events (instance_id, kind, ts, received_at, body)
        VALUES (?, ?, make_timestamp(?), make_timestamp(?), ?)
        ON CONFLICT DO NOTHING RETURNING 1
        """,
        [event.instance_id, event.kind, event.ts_us, received_us, orjson.dumps(body).decode()],
    ).fetchall()
    if not inserted:
        return False
    if event.kind == "registered":
        labels = body.get("labels")
        con.execute(
            """
            UPDATE instances SET machine_id = coalesce(?, machine_id), host_id = coalesce(?, host_id),
                   gpu_model = coalesce(?, gpu_model), gpu_count = coalesce(?, gpu_count),
                   dph = coalesce(?, dph), location = coalesce(?, location), labels = coalesce(?, labels)
            WHERE instance_id = ?
            """,
            [
                body.get("machine_id"), body.get("host_id"), body.get("gpu_model"), body.get("gpu_count"),
                body.get("dph"), body.get("location"), orjson.dumps(labels).decode() if labels is not None else None,
                event.instance_id,
            ],
        )
    elif event.kind == "bench_started":
        con.execute(
            "INSERT INTO bench_runs (instance_id, started_at, proofs, concurrency, partition_workers) VALUES (?, make_timestamp(?), ?, ?, ?)",
            [event.instance_id, event.ts_us, body.get("proofs"), body.get("concurrency"), body.get("partition_workers")],
        )
    elif event.kind == "bench_done":
        done = [
            event.ts_us, body.get("exit_code"), body.get("rate_per_hour"), body.get("duration_s"),
            body.get("proofs_ok"), body.get("failure_excerpt"),
        ]
        open_run = con.execute(
            "SELECT rowid FROM bench_runs WHERE instance_id = ? AND done_at IS NULL AND started_at <= make_timestamp(?) ORDER BY started_at DESC LIMIT 1",
            [event.instance_id, event.ts_us],
        ).fetchone()
        if open_run:
            con.execute(
                """UPDATE bench_runs SET done_at = make_timestamp(?), exit_code = ?, rate_per_hour = ?, duration_s = ?,
                   proofs_ok = ?, failure_excerpt = ? WHERE rowid = ?""",
                [*done, open_run[0]],
            )
        else:
            con.execute(
                """INSERT INTO bench_runs (instance_id, done_at, exit_code, rate_per_hour, duration_s, proofs_ok, failure_excerpt)
                   VALUES (?, make_timestamp(?), ?, ?, ?, ?, ?)""",
                [event.instance_id, *done],
            )
    return True
