"""Read queries: each runs on its own cursor of the server's connection, with a deadline.

Called by ``ingest.db.reader.Reader`` on its threads; a query past ``timeout_s`` is interrupted
(datasette's ``sqlite_timelimit``, with ``cursor.interrupt``) and raises QueryTimeout.

User SQL (the SQL API, ``fleetlog query``) is judged before it runs and cannot change anything:

1. DuckDB's own parser must see exactly one SELECT, and its parse tree (``json_serialize_sql``) may
   hold only query nodes (SELECT, set operations, CTEs): a DELETE/INSERT/UPDATE node anywhere, even
   in a CTE nested in a scalar subquery, is refused;
2. every table it names is one of the project's tables or views in ``main`` (never a secret one like
   ``instance_tokens``, never a file), every table function is on a short allowlist (no file,
   network or catalog-query functions), and no side-effecting scalar function (``nextval``,
   ``setval``, ``write_log``, ...) is called;
3. it runs in a ``READ ONLY`` transaction that is always rolled back, so DuckDB itself refuses any
   write the check might have missed.
"""

from __future__ import annotations

import functools
import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import duckdb
import orjson

from ingest.contract.codec import MAX_EVENT_DEPTH, nests_deeper
from ingest.errors import QueryError, QueryTimeout, StorageUnavailable
from ingest.db.seqindex import TailBounds
from ingest.db.tailcache import TailRow
from ingest.timestamps import datetime_to_us

logger = logging.getLogger(__name__)


@contextmanager
def deadline_cursor(con: duckdb.DuckDBPyConnection, timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """``con`` itself (a DuckDB connection or cursor that one thread uses: the Reader hands each read
    a tracked cursor of its own, ``Reader.read``), interrupted after ``timeout_s``, DuckDB's errors
    translated. The caller closes it."""
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        yield con
    except duckdb.InterruptException as e:
        raise QueryTimeout(f"query interrupted after {timeout_s} s") from e
    except (duckdb.FatalException, duckdb.IOException) as e:
        raise StorageUnavailable(f"the database cannot be read right now ({type(e).__name__}); retry later") from e
    finally:
        timer.cancel()


def run_under_deadline(cur: duckdb.DuckDBPyConnection, timeout_s: float, run: Callable[[], Any]
                       ) -> tuple[Any, tuple[str, str] | None]:
    """``run()`` (queries on ``cur``) interrupted after ``timeout_s``: (its result, None), or (None,
    (reason, message)) when it timed out ("timeout") or DuckDB refused it ("error"). Storage failures
    are raised (they end a policy cycle)."""
    timer = threading.Timer(timeout_s, cur.interrupt)
    timer.start()
    try:
        return run(), None
    except duckdb.InterruptException:
        return None, ("timeout", f"interrupted after {timeout_s} s (query_timeout_s)")
    except (duckdb.FatalException, duckdb.IOException):
        raise
    except duckdb.Error as e:
        return None, ("error", str(e).splitlines()[0][:300])
    finally:
        timer.cancel()


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


INSTANCES_SQL = """
SELECT i.instance_id, coalesce(s.state, 'unknown') AS state, s.state_since, i.machine_id, i.host_id,
       i.gpu_model, i.gpu_count, i.dph, i.location, i.first_seen, i.last_seen,
       CASE WHEN b.rate_measured THEN b.rate_per_hour END AS rate_per_hour,  -- 0 is no measurement (005)
       CASE WHEN p.params_failed THEN p.params_exit_code::INTEGER ELSE b.exit_code END AS exit_code,
       -- the failed phase's class and line (a failed fetch has no run), else the latest run's
       coalesce(p.failure_class, b.failure_class) AS failure_class,
       coalesce(p.failure_line, b.failure_line) AS failure_line, p.outcome, p.failed_phase,
       coalesce(p.failing, false) AS failing  -- the destroy rule's set (instance_phase, migration 013)
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN (  -- the latest run, finished or not (bench_outcomes, migration 005)
    SELECT instance_id, rate_per_hour, rate_measured, exit_code, failure_class, failure_line FROM bench_outcomes WHERE latest
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
            {"kind": k, "ts": ts, "received_at": r, "body": _event_body(b)} for k, ts, r, b in cur.fetchall()
        ]
        cur.execute(
            """SELECT started_at, proofs, concurrency, partition_workers, done_at, exit_code, rate_per_hour,
                      duration_s, proofs_ok, failure_excerpt, failure_class, failure_line
               FROM bench_runs WHERE instance_id = ? ORDER BY coalesce(done_at, started_at)""",
            [instance_id],
        )
        detail["bench_runs"] = _dicts(cur)
        return detail


EVENTS_SQL = """
SELECT instance_id, kind, epoch_us(ts) AS ts_us, ts, received_at, body::VARCHAR AS body FROM events
WHERE instance_id = ? {kind}
ORDER BY ts, kind LIMIT ?
"""


def list_events(con, timeout_s: float, instance_id: str, kind: str | None, limit: int) -> list[dict[str, Any]]:
    """An instance's stored events, oldest first, each with its key (``ts_us``) and its body as the
    stored JSON text (not parsed: the admin's view of rows that may be what broke something)."""
    params: list[Any] = [instance_id] + ([kind] if kind else []) + [limit]
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(EVENTS_SQL.format(kind="AND kind = ?" if kind else ""), params)
        return _dicts(cur)


def _event_body(text: str) -> Any:
    """A stored body, parsed; as its stored text when it nests deeper than the door now allows (an
    older server stored up to 254 levels, more than the answer around it can be rendered with)."""
    body = orjson.loads(text)
    return text if nests_deeper(body, MAX_EVENT_DEPTH) else body


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


TAIL_LOAD_SQL = "SELECT seq, epoch_us(ts), line FROM logs WHERE instance_id = ? AND source = ? AND run_id = ? AND seq >= ?"
TAIL_WINDOW_SQL = TAIL_LOAD_SQL + " AND received_at BETWEEN make_timestamp(?) AND make_timestamp(?)"


def load_tail(con, timeout_s: float, instance_id: str, source: str, n: int,
              bounds: TailBounds | None) -> tuple[list[TailRow], bool]:
    """The newest ``n`` lines of (instance, source) for the tail cache, oldest first, and whether that
    is all of them; ``bounds`` (``StreamIndex.tail_bounds``) says where they are.

    The seq floor: they are run ``bounds.run_id``'s lines from ``bounds.first_seq`` on, so the query
    reads only the row groups that can hold them (zone maps on seq) instead of every row group of the
    instance, and needs no sort in DuckDB. Lines committed after the bounds were taken have higher
    seqs, or reach the cache through its pending list; either way the newest ``n`` are kept.

    The commit window: DuckDB keeps exact min/max of numbers per row group, and rows are stored in
    commit order, so ``received_at BETWEEN since AND until`` also skips every row group written outside
    the window: a stream that wrote its newest lines in the last minute reads the last minute's row
    groups, not the last hundred thousand rows of every instance. The window is checked, not trusted:
    when the rows found with seqs up to the newest one known do not number what the index holds, the
    load reads by the floor alone and says so in the log. No bounds: the plain newest-lines read."""
    if bounds is None:
        rows = read_logs(
            con, timeout_s, instance_id, source=source, run_id=None, tail=n + 1, after_seq=None, before_seq=None, q=None
        )
        tail = [(r, seq, ts, line) for _s, r, seq, ts, line in rows]
        return (tail[-n:] if n else []), len(tail) <= n
    floor = [instance_id, source, bounds.run_id, bounds.first_seq]
    found = None
    if bounds.since_us is not None and bounds.until_us is not None:
        found = _fetch(con, timeout_s, TAIL_WINDOW_SQL, floor + [bounds.since_us, bounds.until_us])
        known = sum(1 for seq, _ts, _line in found if seq <= bounds.last_seq)
        if known != bounds.lines:
            logger.warning("tail of %s/%s: %d of %d lines inside the commit window; reading without it",
                           instance_id, source, known, bounds.lines)
            found = None
    if found is None:
        found = _fetch(con, timeout_s, TAIL_LOAD_SQL, floor)
    found.sort()
    tail = [(bounds.run_id, seq, ts, line) for seq, ts, line in found[-n:]] if n else []
    return tail, bounds.complete and len(found) <= n


def _fetch(con, timeout_s: float, sql: str, params: list[Any]) -> list[tuple]:
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(sql, params)
        return cur.fetchall()


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


# Table functions user SQL may call: generators over values, nothing that reads a file, the network,
# the catalog's other databases or runs SQL given as a string (query, query_table).
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "json_each", "json_tree"})
# Volatile scalar functions that change nothing outside the query; every other volatile one
# (nextval, setval, currval, setseed, write_log, sleep_ms, ...) is refused.
HARMLESS_VOLATILE = frozenset({"random", "uuid", "uuidv4", "uuidv7", "gen_random_uuid", "error"})
SECRET_TABLES = frozenset({"instance_tokens"})
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
TABLE_REFS = frozenset({"BASE_TABLE", "TABLE_FUNCTION", "JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "EMPTY_FROM", "SHOW_REF"})

_parser_lock = threading.Lock()


@functools.cache
def _parser() -> duckdb.DuckDBPyConnection:
    """An empty in-memory database used only to parse: it holds no data and no files."""
    return duckdb.connect(":memory:")


@functools.cache
def _volatile_functions() -> frozenset[str]:
    with _parser_lock:
        rows = _parser().execute(
            "SELECT DISTINCT lower(function_name) FROM duckdb_functions() WHERE stability = 'VOLATILE'"
        ).fetchall()
    return frozenset(name for (name,) in rows) - HARMLESS_VOLATILE


def parse_tree(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of one SELECT (``json_serialize_sql``), or QueryError."""
    with _parser_lock:
        try:
            raw = _parser().execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()[0]
        except duckdb.Error as e:
            raise QueryError(f"sql: does not parse: {e}") from e
    tree = orjson.loads(raw)
    if tree.get("error"):
        raise QueryError(f"sql: only a plain SELECT is allowed ({tree.get('error_message', 'not a SELECT')})")
    if len(tree.get("statements", ())) != 1:
        raise QueryError("sql: expected exactly one statement")
    return tree["statements"][0]["node"]


def _cte_query(value: dict) -> dict:
    """A CTE's query node: DuckDB 2.x writes it as ``query_node``, 1.5 as ``query.node``."""
    if "query_node" in value:
        return value["query_node"]
    return value["query"]["node"]


class _Judge:
    """Walks a parse tree: only query nodes, allowed tables and table functions, no side effects."""

    def __init__(self, tables: frozenset[str] | None) -> None:
        self.tables = tables  # None: any table but the secret ones (no catalog at hand, e.g. loading rules)
        self.volatile = _volatile_functions()

    def node(self, node: dict, scope: frozenset[str]) -> None:
        kind = node.get("type")
        if kind not in QUERY_NODES:
            raise QueryError(f"sql: only a plain SELECT is allowed; found a {kind} (data-modifying or not a query)")
        for entry in node.get("cte_map", {}).get("map", ()):
            name = str(entry["key"]).lower()
            if name in SECRET_TABLES:
                raise QueryError(f"sql: {entry['key']!r} may not be used as a name")
            query = _cte_query(entry["value"])
            own = scope | {name} if query.get("type") == "RECURSIVE_CTE_NODE" else scope
            self.node(query, own)
            scope = scope | {name}
        if kind == "RECURSIVE_CTE_NODE":
            scope = scope | {str(node.get("cte_name", "")).lower()}
        for key, value in node.items():
            if key != "cte_map":
                self.value(value, scope)

    def value(self, value: Any, scope: frozenset[str]) -> None:
        if isinstance(value, list):
            for item in value:
                self.value(item, scope)
            return
        if not isinstance(value, dict):
            return
        if "cte_map" in value or str(value.get("type", "")).endswith("_NODE"):
            self.node(value, scope)
            return
        if "sample" in value and "type" in value and "class" not in value:
            self.table_ref(value, scope)
        elif value.get("class") == "FUNCTION":
            self.function(value)
        for item in value.values():
            self.value(item, scope)

    def table_ref(self, ref: dict, scope: frozenset[str]) -> None:
        kind = ref["type"]
        if kind not in TABLE_REFS:
            raise QueryError(f"sql: {kind} is not allowed in FROM")
        if kind == "BASE_TABLE":
            self.table(ref, scope)
        elif kind == "TABLE_FUNCTION":
            fn = ref.get("function") or {}
            name = str(fn.get("function_name", "")).lower()
            if fn.get("class") != "FUNCTION" or name not in TABLE_FUNCTIONS or fn.get("schema") or fn.get("catalog"):
                raise QueryError(
                    f"sql: table function {fn.get('function_name', '?')!r} is not allowed "
                    f"(allowed: {', '.join(sorted(TABLE_FUNCTIONS))})"
                )
        elif kind == "SHOW_REF" and ref.get("table_name"):
            raise QueryError("sql: SHOW of the catalog is not allowed; DESCRIBE a table instead")

    def table(self, ref: dict, scope: frozenset[str]) -> None:
        name = str(ref.get("table_name", ""))
        lowered = name.lower()
        schema, catalog = str(ref.get("schema_name", "")).lower(), str(ref.get("catalog_name", ""))
        qualified = bool(schema or catalog)
        if not qualified and lowered in scope and lowered not in SECRET_TABLES:
            return  # a CTE of this query
        if lowered in SECRET_TABLES:
            raise QueryError(f"sql: table {name!r} is not readable")
        if schema not in ("main", "") or (catalog and self.catalogs is not None and catalog.lower() not in self.catalogs):
            raise QueryError(
                f"sql: only the database's own tables in schema main may be read, not {'.'.join(filter(None, (catalog, schema, name)))}"
            )
        if self.tables is not None and lowered not in self.tables:
            raise QueryError(f"sql: no readable table or view named {name!r} (files and other databases are off)")

    catalogs: frozenset[str] | None = None  # None: not known here (checked again once it is)

    def function(self, fn: dict) -> None:
        name = str(fn.get("function_name", "")).lower()
        if name in self.volatile:
            raise QueryError(f"sql: function {fn.get('function_name')!r} has side effects and is not allowed")


def check_select(sql: str, tables: frozenset[str] | None = None, catalogs: frozenset[str] | None = None) -> None:
    """Exactly one plain SELECT, judged on DuckDB's own parse tree (see the module's docstring).

    ``tables``: the lower-cased names of the tables and views it may read (None: any but the secret
    ones); ``catalogs``: the names the database itself may be qualified with.
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"sql: does not parse: {e}") from e
    if len(statements) != 1:
        raise QueryError(f"sql: expected exactly one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryError(f"sql: only SELECT is allowed, got {statements[0].type.name}")
    judge = _Judge(tables)
    judge.catalogs = None if catalogs is None else frozenset(c.lower() for c in catalogs)
    judge.node(parse_tree(sql), frozenset())


def readable_tables(cursor: duckdb.DuckDBPyConnection) -> tuple[frozenset[str], frozenset[str]]:
    """(the tables and views of ``main`` user SQL may read, the database's own catalog names)."""
    rows = cursor.execute(
        """SELECT lower(table_name) FROM duckdb_tables() WHERE schema_name = 'main' AND database_name = current_database()
           UNION SELECT lower(view_name) FROM duckdb_views() WHERE schema_name = 'main' AND database_name = current_database()
               AND NOT internal"""
    ).fetchall()
    catalog = cursor.execute("SELECT current_database()").fetchall()[0][0]
    return frozenset(name for (name,) in rows) - SECRET_TABLES, frozenset({catalog})


@contextmanager
def _refused_as_query_error() -> Iterator[None]:
    """DuckDB's refusal of a query (not its interruption at the deadline) is the client's error."""
    try:
        yield
    except (duckdb.InterruptException, duckdb.FatalException):
        raise
    except duckdb.OutOfMemoryException as e:
        raise QueryError(f"sql: over the database's memory limit (duckdb_memory_limit_mb): {e}") from e
    except duckdb.Error as e:
        raise QueryError(f"sql: {type(e).__name__}: {e}") from e


@contextmanager
def user_select(con, sql: str, timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor for one checked user SELECT, inside a read-only transaction that is rolled back."""
    with deadline_cursor(con, timeout_s) as cur, _refused_as_query_error():
        cur.execute("BEGIN TRANSACTION READ ONLY")
        try:
            check_select(sql, *readable_tables(cur))
            yield cur
        finally:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:  # interrupted or aborted: closing the cursor ends the transaction
                pass


def run_select(con, sql: str, timeout_s: float, max_rows: int, params: dict[str, Any] | None = None
               ) -> tuple[list[str], list[tuple], bool]:
    """Run a checked SELECT; returns (columns, rows, truncated): for ``fleetlog query`` on a local
    file. The server's SQL API answers through ``ingest/db/answers.py``, bounded in bytes."""
    check_select(sql)
    with user_select(con, sql, timeout_s) as cur:
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


# -- the policy engine's reads (ingest/policy/engine.py) -----------------------------------------------
def evaluate_rule(cur: duckdb.DuckDBPyConnection, name: str, sql: str, params: dict[str, Any], *, decides: bool
                  ) -> list[tuple]:
    """A rule's result kept as a temporary table named after it (later rules read it); a rule that
    decides returns its (subject, action, reason, evidence, episode, expires_at) rows."""
    cur.execute(f'CREATE OR REPLACE TEMP TABLE "{name}" AS {sql}', params)
    if not decides:
        return []
    return cur.execute(f'SELECT subject, action, reason, evidence, episode, expires_at FROM "{name}"').fetchall()


def _decision_dicts(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    out = [dict(zip(names, row)) for row in cur.fetchall()]
    for d in out:
        d["evidence"] = orjson.loads(d["evidence"])
    return out


def decisions_by_id(con, timeout_s: float, ids: list[int]) -> list[dict[str, Any]]:
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute("SELECT * FROM decisions WHERE id IN (SELECT unnest(?::BIGINT[])) ORDER BY id", [ids])
        return _decision_dicts(cur)


def proposed_actions(con, timeout_s: float) -> list[dict[str, Any]]:
    """The destroys and log deletions waiting to be carried out, waiting longest first."""
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(
            "SELECT id, rule, subject, action, reason, evidence, episode, decided_at, attempts FROM decisions "
            "WHERE state = 'proposed' AND action IN ('destroy', 'delete_logs') "
            "ORDER BY coalesce(attempted_at, decided_at), id"
        )
        return _decision_dicts(cur)


def instance_state(con, timeout_s: float, instance_id: str) -> str | None:
    with deadline_cursor(con, timeout_s) as cur:
        row = cur.execute("SELECT state FROM instance_state WHERE instance_id = ?", [instance_id]).fetchone()
    return row[0] if row else None


# -- auth's reads (ingest/auth.py, ingest/web/push.py) ------------------------------------------------
def instance_tokens(cursor) -> list[tuple[str, str]]:
    """Every stored (instance_id, token digest): the token book's at start-up."""
    return cursor.execute("SELECT instance_id, token_sha256 FROM instance_tokens").fetchall()


def known_instances(cursor, instance_ids: list[str]) -> set[str]:
    """Which of ``instance_ids`` the database already holds (a reader's cursor)."""
    rows = cursor.execute("SELECT instance_id FROM instances WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))",
                          [instance_ids]).fetchall()
    return {instance_id for (instance_id,) in rows}
