"""Fleet-wide log search: which instances printed this, newest first.

``search`` runs on its own cursor with a deadline (like every read); the window ``[since_us,
until_us)`` keeps it to the row groups whose ``ts`` can match (DuckDB's min/max zone maps), so the
cost follows the window, not the table. Text is matched case-insensitively as a plain substring, or
as a regular expression (RE2, DuckDB's) when ``regex`` is set; a pattern RE2 refuses is the client's
error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import duckdb

from ingest.codec import datetime_to_us
from ingest.errors import QueryError
from ingest.reads import deadline_cursor

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DEFAULT_WINDOW_S = 24 * 3600.0
MAX_PATTERN_CHARS = 1000

SEARCH_SQL = """
SELECT instance_id, source, run_id, seq, ts, line FROM logs
WHERE ts >= make_timestamp($since) AND ts < make_timestamp($until) {filters}
ORDER BY ts DESC, instance_id, source, run_id DESC, seq DESC
LIMIT $limit
"""


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


def search(con, timeout_s: float, query: SearchQuery) -> tuple[list[dict[str, Any]], bool]:
    """Hits as dicts (``ts`` in epoch microseconds), newest first, and whether more matched than ``limit``."""
    if not query.text or len(query.text) > MAX_PATTERN_CHARS:
        raise QueryError(f"q: expected 1 to {MAX_PATTERN_CHARS} characters")
    params: dict[str, Any] = {"since": query.since_us, "until": query.until_us, "limit": query.limit + 1, "q": query.text}
    if query.regex:
        filters = ["AND regexp_matches(line, $q, 'i')"]
    else:  # ILIKE without wildcards of the user's: % and _ are escaped
        filters = ["AND line ILIKE $q ESCAPE '\\'"]
        params["q"] = "%" + re.sub(r"([\\%_])", r"\\\1", query.text) + "%"
    for column, value in (("source", query.source), ("instance_id", query.instance_id)):
        if value is not None:
            filters.append(f"AND {column} = ${column}")
            params[column] = value
    with deadline_cursor(con, timeout_s) as cur:
        if query.regex:
            check_pattern(cur, query.text)
        cur.execute(SEARCH_SQL.format(filters=" ".join(filters)), params)
        rows = cur.fetchall()
    hits = [
        {"instance_id": i, "source": s, "run_id": r, "seq": seq, "ts": datetime_to_us(ts), "line": line}
        for i, s, r, seq, ts, line in rows[: query.limit]
    ]
    return hits, len(rows) > query.limit
