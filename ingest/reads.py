"""Read queries: each runs on its own cursor of the server's connection, with a deadline.

Called from handlers through ``asyncio.to_thread``; a query past ``timeout_s`` is interrupted
(datasette's ``sqlite_timelimit``, with ``cursor.interrupt``) and raises QueryTimeout.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import duckdb
import orjson

from ingest.codec import datetime_to_us
from ingest.errors import QueryError, QueryTimeout
from ingest.tailcache import TailRow


@contextmanager
def deadline_cursor(con: duckdb.DuckDBPyConnection, timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    cursor = con.cursor()
    timer = threading.Timer(timeout_s, cursor.interrupt)
    timer.start()
    try:
        yield cursor
    except duckdb.InterruptException as e:
        raise QueryTimeout(f"query interrupted after {timeout_s} s") from e
    finally:
        timer.cancel()
        cursor.close()


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


INSTANCES_SQL = """
SELECT i.instance_id, coalesce(s.state, 'unknown') AS state, s.state_since, i.machine_id, i.host_id,
       i.gpu_model, i.gpu_count, i.dph, i.location, i.first_seen, i.last_seen,
       b.rate_per_hour, b.exit_code, b.failure_class, b.failure_line, p.outcome, p.failed_phase
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN (  -- the latest run, finished or not (bench_outcomes, migration 005)
    SELECT instance_id, rate_per_hour, exit_code, failure_class, failure_line FROM bench_outcomes WHERE latest
) b USING (instance_id)
LEFT JOIN instance_phase p USING (instance_id)  -- the latest step's outcome, and the phase it failed in
{where}
ORDER BY i.last_seen DESC
"""


def list_instances(con, timeout_s: float, state: str | None = None) -> list[dict[str, Any]]:
    where, params = ("WHERE coalesce(s.state, 'unknown') = ?", [state]) if state else ("", [])
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(INSTANCES_SQL.format(where=where), params)
        return _dicts(cur)


def instance_detail(con, timeout_s: float, instance_id: str) -> dict[str, Any] | None:
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(INSTANCES_SQL.format(where="WHERE i.instance_id = ?"), [instance_id])
        rows = _dicts(cur)
        if not rows:
            return None
        detail = rows[0]
        cur.execute(
            "SELECT kind, ts, received_at, body FROM events WHERE instance_id = ? ORDER BY ts, received_at",
            [instance_id],
        )
        detail["events"] = [
            {"kind": k, "ts": ts, "received_at": r, "body": orjson.loads(b)} for k, ts, r, b in cur.fetchall()
        ]
        cur.execute(
            """SELECT started_at, proofs, concurrency, partition_workers, done_at, exit_code, rate_per_hour,
                      duration_s, proofs_ok, failure_excerpt, failure_class, failure_line
               FROM bench_runs WHERE instance_id = ? ORDER BY coalesce(done_at, started_at)""",
            [instance_id],
        )
        detail["bench_runs"] = _dicts(cur)
        return detail


TAIL_SQL = """
SELECT source, run_id, seq, ts, line FROM logs
WHERE instance_id = ? {filters}
ORDER BY {order} LIMIT ?
"""


def read_logs(
    con,
    timeout_s: float,
    instance_id: str,
    *,
    source: str | None,
    run_id: str | None,
    tail: int,
    after_seq: int | None,
    before_seq: int | None,
    q: str | None,
) -> list[tuple[str, str, int, int, str]]:
    """Lines as (source, run_id, seq, ts_us, line), oldest first.

    With ``after_seq`` the first ``tail`` lines after it (following); otherwise the last ``tail``
    lines (before ``before_seq`` when given, for paging back). Order: (run_id, seq) within a source;
    across sources, by ts.
    """
    filters, params = [], [instance_id]
    for column, value, op in (("source", source, "="), ("run_id", run_id, "="), ("seq", after_seq, ">"), ("seq", before_seq, "<")):
        if value is not None:
            filters.append(f"AND {column} {op} ?")
            params.append(value)
    if q:
        filters.append("AND contains(lower(line), lower(?))")
        params.append(q)
    key = "run_id, seq" if source else "ts, source, run_id, seq"
    forward = after_seq is not None
    order = key if forward else ", ".join(f"{c} DESC" for c in key.split(", "))
    params.append(tail)
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(TAIL_SQL.format(filters=" ".join(filters), order=order), params)
        rows = [(s, r, seq, datetime_to_us(ts), line) for s, r, seq, ts, line in cur.fetchall()]
    return rows if forward else rows[::-1]


def load_tail(con, timeout_s: float, instance_id: str, source: str, n: int) -> tuple[list[TailRow], bool]:
    """The newest ``n`` lines of (instance, source) for the tail cache, and whether that is all of them."""
    rows = read_logs(
        con, timeout_s, instance_id, source=source, run_id=None, tail=n + 1, after_seq=None, before_seq=None, q=None
    )
    complete = len(rows) <= n
    return [(r, seq, ts, line) for _s, r, seq, ts, line in rows[-n:] if n], complete


# -- log completeness: the log_streams and instance_logs views (migration 005) decide it ----------------
LOG_STREAMS_SQL = """
SELECT s.instance_id, s.source, s.run_id, s.lines, s.last_seq, s.declared_last_seq, s.dropped, s.missing, s.complete,
       l.complete AS instance_complete
FROM log_streams s JOIN instance_logs l USING (instance_id)
{where}
ORDER BY s.instance_id, s.source, s.run_id
"""


def log_streams(con, timeout_s: float, instance_id: str | None = None) -> dict[str, dict[str, Any]]:
    """Per instance, its streams as the ``log_streams`` view sees them (sorted by source, run_id) and
    whether its logs are complete (``instance_logs``); every instance's when ``instance_id`` is None."""
    where, params = ("WHERE s.instance_id = ?", [instance_id]) if instance_id is not None else ("", [])
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(LOG_STREAMS_SQL.format(where=where), params)
        out: dict[str, dict[str, Any]] = {}
        for row in _dicts(cur):
            own = out.setdefault(row.pop("instance_id"), {"complete": row["instance_complete"], "streams": []})
            del row["instance_complete"]
            own["streams"].append(row)
        return out
# -- end of log completeness ----------------------------------------------------------------------------


def check_select(sql: str) -> None:
    """Exactly one SELECT statement, judged by DuckDB's own parser."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"sql: does not parse: {e}") from e
    if len(statements) != 1:
        raise QueryError(f"sql: expected exactly one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryError(f"sql: only SELECT is allowed, got {statements[0].type.name}")


@contextmanager
def _refused_as_query_error() -> Iterator[None]:
    """DuckDB's refusal of a query (not its interruption at the deadline) is the client's error."""
    try:
        yield
    except duckdb.InterruptException:
        raise
    except duckdb.Error as e:
        raise QueryError(f"sql: {type(e).__name__}: {e}") from e


def run_select_arrow(con, sql: str, timeout_s: float, max_rows: int, params: dict[str, Any] | None = None
                     ) -> tuple[bytes, bool]:
    """Run a checked SELECT; returns (an Arrow IPC stream of at most ``max_rows`` rows, truncated)."""
    import pyarrow as pa

    check_select(sql)
    with deadline_cursor(con, timeout_s) as cur, _refused_as_query_error():
        reader = cur.sql(sql, params=params or None).to_arrow_reader(batch_size=min(max_rows + 1, 100_000))
        batches, rows = [], 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if rows > max_rows:
                break
    table = pa.Table.from_batches(batches, schema=reader.schema).slice(0, max_rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes(), rows > max_rows


def run_select(con, sql: str, timeout_s: float, max_rows: int, params: dict[str, Any] | None = None
               ) -> tuple[list[str], list[tuple], bool]:
    """Run a checked SELECT; returns (columns, rows, truncated)."""
    check_select(sql)
    with deadline_cursor(con, timeout_s) as cur, _refused_as_query_error():
        cur.execute(sql, params or None)
        columns = [d[0] for d in cur.description]
        rows = cur.fetchmany(max_rows + 1)
    return columns, rows[:max_rows], len(rows) > max_rows


def hosts(con, timeout_s: float, hosts_sql: str, min_rate: float, now, machine_id: int | None = None) -> list[dict[str, Any]]:
    """The deploy gate: ``hosts_sql`` is queries/hosts.sql composed with what it needs."""
    sql = f"SELECT * FROM ({hosts_sql})"
    params: dict[str, Any] = {"min_rate": min_rate, "now": now}
    if machine_id is not None:
        sql += " WHERE machine_id = $machine_id"
        params["machine_id"] = machine_id
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(sql, params)
        return _dicts(cur)


def decisions(con, timeout_s: float, *, state: str | None, action: str | None, subject: str | None,
              limit: int) -> list[dict[str, Any]]:
    filters, params = [], []
    for column, value in (("state", state), ("action", action), ("subject", subject)):
        if value:
            filters.append(f"{column} = ?")
            params.append(value)
    where = ("WHERE " + " AND ".join(filters)) if filters else ""
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(f"SELECT * FROM decisions {where} ORDER BY id DESC LIMIT ?", [*params, limit])
        rows = _dicts(cur)
    for row in rows:
        row["evidence"] = orjson.loads(row["evidence"])
    return rows
