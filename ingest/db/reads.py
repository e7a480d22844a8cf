"""Read queries: each runs on its own cursor of the server's connection, with a deadline.

Called by ``ingest.db.reader.Reader`` on its threads; a query past ``timeout_s`` is interrupted
(datasette's ``sqlite_timelimit``, with ``cursor.interrupt``) and raises QueryTimeout. User SQL is
judged by ``ingest/db/usersql.py``.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import duckdb
import orjson

from ingest.contract.codec import MAX_EVENT_DEPTH, nests_deeper
from ingest.db.deadlines import DEADLINES
from ingest.errors import QueryTimeout, StorageUnavailable
from ingest.db.seqindex import TailBounds
from ingest.db.tailcache import TailRow
from ingest.timestamps import datetime_to_us

logger = logging.getLogger(__name__)


@contextmanager
def deadline_cursor(con: duckdb.DuckDBPyConnection, timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """``con`` itself (a DuckDB connection or cursor that one thread uses: the Reader hands each read
    a tracked cursor of its own, ``Reader.read``), interrupted after ``timeout_s``, DuckDB's errors
    translated. The caller closes it."""
    deadline = DEADLINES.watch(con.interrupt, timeout_s)
    try:
        yield con
    except duckdb.InterruptException as e:
        raise QueryTimeout(f"query interrupted after {timeout_s} s") from e
    except (duckdb.FatalException, duckdb.IOException) as e:
        raise StorageUnavailable(f"the database cannot be read right now ({type(e).__name__}); retry later") from e
    except duckdb.OutOfMemoryException as e:  # other reads hold DuckDB's memory now, or this one is too big
        raise StorageUnavailable("the database's memory (duckdb_memory_limit_mb) is spent by reads; retry later, or ask "
                                 "for less (fewer lines)") from e
    finally:
        DEADLINES.cancel(deadline)


def run_under_deadline(cur: duckdb.DuckDBPyConnection, timeout_s: float, run: Callable[[], Any]
                       ) -> tuple[Any, tuple[str, str] | None]:
    """``run()`` (queries on ``cur``) interrupted after ``timeout_s``: (its result, None), or (None,
    (reason, message)) when it timed out ("timeout") or DuckDB refused it ("error"). Storage failures
    are raised (they end a policy cycle)."""
    deadline = DEADLINES.watch(cur.interrupt, timeout_s)
    try:
        return run(), None
    except duckdb.InterruptException:
        return None, ("timeout", f"interrupted after {timeout_s} s (query_timeout_s)")
    except (duckdb.FatalException, duckdb.IOException):
        raise
    except duckdb.Error as e:
        return None, ("error", str(e).splitlines()[0][:300])
    finally:
        DEADLINES.cancel(deadline)


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
       coalesce(p.failing, false) AS failing,  -- the destroy rule's set (instance_phase, migration 013)
       u.instance_id IS NOT NULL AS unproven  -- alive and burning money with no proof yet (unproven_burn, 015)
FROM instances i
LEFT JOIN instance_state s USING (instance_id)
LEFT JOIN (  -- the latest run, finished or not (bench_outcomes, migration 005)
    SELECT instance_id, rate_per_hour, rate_measured, exit_code, failure_class, failure_line FROM bench_outcomes WHERE latest
) b USING (instance_id)
LEFT JOIN instance_phase p USING (instance_id)  -- the latest step's outcome, and the phase it failed in
LEFT JOIN (SELECT instance_id FROM unproven_burn) u USING (instance_id)
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


MAX_LINES_ANSWER_BYTES = 16 * 2**20  # of line text in one answer of read_logs: 10,000 lines of 256 KiB were 2.5 GB
FETCH_LINES = 256


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
    byte_cap: bool = True,
) -> list[tuple[str, str, int, int, str]]:
    """Lines as (source, run_id, seq, ts_us, line), oldest first.

    With ``after_seq`` the first ``tail`` lines after it (following); otherwise the last ``tail``
    lines (before ``before_seq`` when given, for paging back). Order: (run_id, seq) within a source;
    across sources, by ts. At most MAX_LINES_ANSWER_BYTES of line text (one line always): fewer lines
    when they are long, those nearest where the read starts (a follower or a pager goes on from there).
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
    rows, size, cap = [], 0, MAX_LINES_ANSWER_BYTES if byte_cap else float("inf")
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(TAIL_SQL.format(filters=" ".join(filters), order=order), params)
        while size <= cap and (chunk := cur.fetchmany(FETCH_LINES)):
            for s, r, seq, ts, line in chunk:
                size += len(line)
                if size > cap and rows:
                    break  # the lines nearest the point asked from that fit; one line always goes
                rows.append((s, r, seq, datetime_to_us(ts), line))
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
            con, timeout_s, instance_id, source=source, run_id=None, tail=n + 1, after_seq=None, before_seq=None, q=None,
            byte_cap=False,  # its count says whether the cache holds all of the stream
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
def relations_read(con, timeout_s: float, sql: str) -> set[str]:
    """The tables (lower case) that ``sql`` reads, through the views it reads, transitively: each table
    or view of the database whose name is a word of its text, comments left out. A column named like a
    table counts too: more than it reads, never less."""
    with deadline_cursor(con, timeout_s) as cur:
        views = dict(cur.execute("SELECT lower(view_name), sql FROM duckdb_views() WHERE NOT internal").fetchall())
        tables = {name for (name,) in cur.execute("SELECT lower(table_name) FROM duckdb_tables()").fetchall()}
    found: set[str] = set()
    texts = [sql]
    while texts:
        words = set(_WORD.findall(_COMMENT.sub(" ", texts.pop()).lower()))
        for name in (words & (tables | views.keys())) - found:
            found.add(name)
            if name in views:
                texts.append(views[name])
    return found & tables


_WORD = re.compile(r"[a-z_][a-z0-9_]*")
_COMMENT = re.compile(r"--[^\n]*")


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
