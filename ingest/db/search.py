"""Fleet-wide log search: which instances printed this, newest first.

``search`` runs on its own cursor with a deadline (like every read); the window ``[since_us,
until_us)`` keeps it to the row groups whose ``ts`` can match (DuckDB's min/max zone maps), so the
cost follows the window, not the table; and the window is searched newest part first, stopping at
``limit`` hits. With the token filter (``ingest/db/searchtokens.py`` and ``searchplan.py``, file mode) only the time ranges of the
blocks that hold every letter trigram of the text are scanned, newest first, so a rare phrase costs
its hits' blocks and text found nowhere costs the blocks table; a regular expression, or text with
no trigram, scans the window as before, and the answer's plan says which. Text is matched case-insensitively as a plain substring, or
as a regular expression (RE2, DuckDB's) when ``regex`` is set; a pattern RE2 refuses is the client's
error.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import duckdb

from ingest.db import searchplan as plans, searchtokens as tokens
from ingest.errors import QueryError
from ingest.db.reads import deadline_cursor
from ingest.timestamps import datetime_to_us

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DEFAULT_WINDOW_S = 24 * 3600.0
MAX_PATTERN_CHARS = 1000
CHUNKS_S = (3600.0, 6 * 3600.0)  # searched first: the last hour, then the last 6 hours
# Plain text: what ``line ILIKE '%q%'`` (q's % _ \ literal) accepts, since DuckDB's ILIKE lowers both sides
# with ``lower`` and then compares; 4.6 ms of ILIKE against 1.5 ms for this on a block of 8,192 lines
# (tests/test_search_filter.py holds them equal). The logs endpoint's ``q`` is the same expression.
MATCH_SQL = "AND contains(lower(line), lower($q))"

# Parts of the window, each a branch (or one per received_at range of its admitted blocks, so that each
# scan reads only the row groups and vectors of its blocks: received_at's zone maps; an OR of the ranges in
# one scan prunes nothing in DuckDB 1.5), each branch with its own part's ts bounds, newest first overall.
SEARCH_SQL = """
SELECT * FROM ({branches})
ORDER BY ts DESC, instance_id, source, run_id DESC, seq DESC
LIMIT $limit
"""
BRANCH_SQL = """SELECT instance_id, source, run_id, seq, ts, line FROM logs
WHERE {window} {stamps} {filters}"""
# A part without received_at ranges is found by ts's zone maps: the bounds are the scan's own filter. With
# ranges, received_at's zone maps find the rows and the part's bounds are checked on those rows only: as a
# filter of the scan, DuckDB decoded the ts of every row of each row group read before received_at's
# (~0.7 of a block's ~2.4 ms; epoch_us(ts) keeps the bound out of the scan, and means the same).
WINDOW_SQL = "ts >= make_timestamp($since{i}) AND ts < make_timestamp($until{i})"
ROWS_WINDOW_SQL = "epoch_us(ts) >= $since{i} AND epoch_us(ts) < $until{i}"
STAMPS_SQL = "AND received_at BETWEEN make_timestamp($rlo{i}) AND make_timestamp($rhi{i})"
MAX_BRANCHES = 64  # branches one statement unions; a part's own ranges are at most plans.MAX_STAMP_RANGES
# Admitted blocks read in one statement whatever the limit: a rare phrase's 10 blocks (2 M lines) in one statement,
# not 1, 2, 4 and 2 parts a statement: 19.8 -> 16.7 ms CPU p50 in-process (40 alternating runs); at worst (the
# newest block holds the limit) 16 blocks read instead of one, ~25 ms
ONE_STATEMENT_BLOCKS = 16
FIRST_LINES = tokens.BLOCK_LINES // 2  # the lines of admitted blocks a search's first statement reads at least


def _statement(filters: str, parts: list[plans.Range]) -> tuple[str, dict[str, int]]:
    """The SQL of some parts of the window (disjoint) and its bounds' parameters."""
    branches, params = [], {}
    for part in parts:
        for stamp in part.stamps or (None,):
            i = len(branches)
            params[f"since{i}"], params[f"until{i}"] = part.lower, part.upper
            if stamp is not None:
                params[f"rlo{i}"], params[f"rhi{i}"] = stamp
            branches.append(BRANCH_SQL.format(i=i, filters=filters, window=(WINDOW_SQL if stamp is None else ROWS_WINDOW_SQL).format(i=i),
                                              stamps="" if stamp is None else STAMPS_SQL.format(i=i)))
    return SEARCH_SQL.format(branches="\nUNION ALL\n".join(branches)), params


def _batches(ranges: Iterable[plans.Range], grow: bool, first: int = 1, first_lines: int = 0) -> Iterator[list[plans.Range]]:
    """The parts in statements, newest first: one part each, or (``grow``) ``first``, then twice as many ...
    parts a statement, at most MAX_BRANCHES branches: a statement costs ~1 ms to plan, the admitted blocks of a
    rare phrase a fraction of that to scan, and a common word still stops at its newest part. The first
    statement takes parts until they hold ``first_lines`` lines (a part that does not say counts as enough):
    the newest part is often the writer's open block alone, which may hold a handful (at 100 M lines in
    bench/search_scale.py, ~250: a common word read it alone, then two more blocks in a second statement).
    Lazy: the parts a search does not reach are never made."""
    parts = iter(ranges)
    pending = next(parts, None)
    size, want = first, first_lines
    while pending is not None:
        batch, branches, lines = [], 0, 0
        while pending is not None and (len(batch) < size or lines < want):
            n = len(pending.stamps or (None,))
            if batch and branches + n > MAX_BRANCHES:
                break
            batch.append(pending)
            branches += n
            lines += pending.lines if pending.lines is not None else want
            pending = next(parts, None)
        yield batch
        size, want = size * 2 if grow else 1, 0


@dataclass(frozen=True)
class SearchQuery:
    text: str
    regex: bool
    since_us: int
    until_us: int
    source: str | None = None
    instance_id: str | None = None
    limit: int = DEFAULT_LIMIT


def check_pattern(cursor, text: str) -> None:
    """RE2 (DuckDB's regular expressions) must accept ``text``; a refusal is a QueryError."""
    try:
        cursor.execute("SELECT regexp_matches('', $p)", {"p": text}).fetchall()
    except duckdb.Error as e:
        raise QueryError(f"q: not a valid regular expression: {str(e).splitlines()[-1][:200]}") from e


def _read(cur, filters: str, params: dict[str, Any], parts: list[plans.Range], limit: int) -> list[tuple]:
    """The newest ``limit`` hits of ``parts``, in the answer's order."""
    sql, bounds = _statement(filters, parts)
    cur.execute(sql, {**params, **bounds, "limit": limit})
    return cur.fetchall()


_SIDE: ThreadPoolExecutor | None = None
_SIDE_LOCK = threading.Lock()


def _side_pool() -> ThreadPoolExecutor:
    global _SIDE
    with _SIDE_LOCK:
        if _SIDE is None:
            # one per search running at once (search_max_concurrent, 2 by default): up to 16 none waits in a queue
            _SIDE = ThreadPoolExecutor(16, thread_name_prefix="fleetlog-search-side")
        return _SIDE


def _in_two(cur, timeout_s: float, filters: str, params: dict[str, Any], parts: list[plans.Range], limit: int
            ) -> list[tuple]:
    """``_read`` of ``parts`` (newest first, disjoint in ts) as two statements at once: the older half on a
    cursor of its own on another thread (DuckDB runs a statement without the GIL, and the server's DuckDB has
    one thread on a small host). A rare phrase's blocks are all read anyway: on 2 idle cores its 10 blocks
    cost about half the time. Every row of the newer half is newer than every row of the older one, so the
    answer is the newer half's rows, then the older's. The side cursor lives within this call: interrupted
    with it, and waited for before an error goes up."""
    cut, held, total = 0, 0, sum(max(1, len(p.blocks)) for p in parts)
    while cut < len(parts) - 1 and held + max(1, len(parts[cut].blocks)) <= total / 2:
        held += max(1, len(parts[cut].blocks))
        cut += 1
    cut = max(cut, 1)
    side = cur.cursor()
    try:
        with deadline_cursor(side, timeout_s):
            older = _side_pool().submit(_read, side, filters, params, parts[cut:], limit)
            try:
                newer = _read(cur, filters, params, parts[:cut], limit)
            except BaseException:
                side.interrupt()
                older.exception()  # waited for: the side cursor is done before the error goes up
                raise
            return (newer + older.result())[:limit]
    finally:
        side.close()


def _chunks(since_us: int, until_us: int) -> list[tuple[int, int]]:
    """The window cut newest first: the last hour, the 5 before, then the rest."""
    out, upper = [], until_us
    for back_s in CHUNKS_S:
        lower = max(since_us, until_us - int(back_s * 1_000_000))
        if lower < upper:
            out.append((lower, upper))
            upper = lower
    if since_us < upper:
        out.append((since_us, upper))
    return out


def search(con, timeout_s: float, query: SearchQuery, use_filter: bool = True,
           open_block: Callable[[], Any] | None = None, runs_written: Callable[[], int | None] | None = None
           ) -> tuple[list[dict[str, Any]], bool, plans.Plan]:
    """Hits as dicts (``ts`` in epoch microseconds), newest first, whether more matched than ``limit``,
    and the plan (how the token filter was used).

    The window is searched newest part first, and the search stops once ``limit`` lines are found:
    a common word costs a scan of its newest block (or the last hour without the filter), not of the
    whole day. ``use_filter`` False (the lake mode, which keeps no blocks) scans the window.
    ``open_block``: the writer's ``BlockWriter.open_block`` (the block it fills, whose row is not written
    yet); without it the rows after the newest stored block are read to stand for it (one more statement).
    ``runs_written``: the writer's ``BlockWriter.runs_written`` (how many runs of blocks are written transposed);
    without it, or when it says None, a statement reads it (``searchtokens.RUNS_SQL``).
    """
    if not query.text or len(query.text) > MAX_PATTERN_CHARS:
        raise QueryError(f"q: expected 1 to {MAX_PATTERN_CHARS} characters")
    params: dict[str, Any] = {"q": query.text}
    if query.regex:
        filters = ["AND regexp_matches(line, $q, 'i')"]
    else:  # ILIKE '%q%' with q's wildcards literal, in a third of ILIKE's time (both sides lowered, as ILIKE does)
        filters = [MATCH_SQL]
    for column, value in (("source", query.source), ("instance_id", query.instance_id)):
        if value is not None:
            filters.append(f"AND {column} = ${column}")
            params[column] = value
    filters_sql = " ".join(filters)
    rows: list[tuple] = []
    with deadline_cursor(con, timeout_s) as cur:
        if query.regex:
            check_pattern(cur, query.text)
        grams = set() if query.regex else tokens.trigrams(query.text.encode())
        if not use_filter:
            plan = plans.Plan("off")
        elif query.regex:
            plan = plans.Plan("regex")
        elif not grams:
            plan = plans.Plan("no trigram in q")
        else:
            plan = plans.Plan("trigrams")
        if plan.filter == "trigrams":  # the open block first: one it closes meanwhile is in log_blocks then
            view = open_block() if open_block is not None else tokens.uncovered(cur)
            runs = runs_written() if runs_written is not None else None
        ranges = ((window for part in plans.admitted_ranges(cur, grams, query.since_us, query.until_us, plan, view, runs)
                   for window in plans.newest_first(part)) if plan.filter == "trigrams"
                  else [plans.Range(lower, upper) for lower, upper in _chunks(query.since_us, query.until_us)])
        few = plan.filter == "trigrams" and plan.blocks_admitted <= ONE_STATEMENT_BLOCKS
        if few:
            ranges = list(ranges)
        for batch in _batches(ranges, grow=plan.filter == "trigrams", first=len(ranges) if few else 1,
                              first_lines=FIRST_LINES if plan.filter == "trigrams" else 0):
            plan.ranges_scanned += len(batch)
            want = query.limit + 1 - len(rows)
            if few and len(batch) > 1 and hasattr(cur, "cursor"):
                rows += _in_two(cur, timeout_s, filters_sql, params, batch, want)
            else:
                rows += _read(cur, filters_sql, params, batch, want)
            if len(rows) > query.limit:
                break
    hits = [
        {"instance_id": i, "source": s, "run_id": r, "seq": seq, "ts": datetime_to_us(ts), "line": line}
        for i, s, r, seq, ts, line in rows[: query.limit]
    ]
    return hits, len(rows) > query.limit, plan
