"""The user-SQL guard.

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
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import duckdb
import orjson

from ingest.db.reads import deadline_cursor
from ingest.errors import QueryError


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
