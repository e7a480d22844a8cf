"""A user query's answer, bounded in bytes: the SQL API's JSON, CSV or Arrow IPC stream.

Rows are capped (``query_max_rows``) and so are bytes (``query_max_result_bytes``). The checked SELECT
(``usersql.user_select``) runs on its own thread and its result is taken from DuckDB's streaming result
a slice at a time (``fetchmany`` for JSON and CSV, Arrow record batches for Arrow); each slice is
rendered at once and counted, so what the answer holds is its rendered bytes and one slice:

- past ``max_bytes`` the query stops and is refused (413 naming ``query_max_result_bytes``);
- each slice is paid for from the memory budget (``cover``, a ``budget.ResultCharge``) before the
  next is fetched (503 when the budget is spent);
- the deadline covers fetching and rendering, not only DuckDB's execution (408).

The answer is its parts, written to the client as they are (no joined copy). What this cannot bound
is DuckDB's own share: it builds each 2048-row vector outside its ``memory_limit``, and DuckDB 1.5.5
buffers a streaming result whose rows hold strings of kilobytes (duckdb/duckdb-python#617).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from ingest.db import usersql
from ingest.errors import PayloadTooLarge, QueryTimeout

SLICE_BYTES = 1 << 20  # rendered bytes aimed at per slice: the rows per fetch follow the rows' width
FIRST_ROWS = 16
MAX_SLICE_ROWS = 2048  # one DuckDB vector
ARROW_BATCH_ROWS = 128  # a batch is copied before its bytes can be counted: kept small for wide rows


@dataclass
class Answer:
    parts: list[bytes]
    size: int
    truncated: bool
    content_type: str


def _dumps(value: Any) -> bytes:  # as ingest.web.http.dumps, which renders every other answer
    return orjson.dumps(value, default=str, option=orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS)


class _Tally:
    """The answer's parts so far: counted, paid for, refused past the cap or the deadline."""

    def __init__(self, max_bytes: int, deadline: float, timeout_s: float, cover: Callable[[int], None]) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.max_bytes, self.deadline, self.timeout_s, self.cover = max_bytes, deadline, timeout_s, cover

    def check(self, more: int = 0) -> None:
        if self.size + more > self.max_bytes:
            raise PayloadTooLarge(
                f"result: over the limit of {self.max_bytes} bytes (query_max_result_bytes); select fewer rows or "
                "columns, or aggregate"
            )
        if time.monotonic() > self.deadline:
            raise QueryTimeout(f"query interrupted after {self.timeout_s} s (fetching and rendering its result)")

    def add(self, part: bytes) -> None:
        self.check(len(part))
        self.parts.append(part)
        self.size += len(part)
        self.cover(self.size)

    # a file for Arrow's IPC writer (through pyarrow.PythonFile)
    closed = False

    def write(self, data) -> int:
        self.add(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def _rows(cur, max_rows: int, render: Callable[[list[tuple], bool], bytes], tally: _Tally) -> bool:
    """Fetch at most ``max_rows`` rows a slice at a time, each rendered into ``tally``; True when
    more rows were there (truncated)."""
    step, taken = FIRST_ROWS, 0
    while True:
        tally.check()
        rows = cur.fetchmany(min(step, max_rows + 1 - taken))
        if not rows:
            return False
        keep = rows[: max_rows - taken]
        if keep:
            part = render(keep, taken == 0)
            tally.add(part)
            step = max(1, min(MAX_SLICE_ROWS, SLICE_BYTES * len(keep) // max(1, len(part))))
        taken += len(rows)
        if taken > max_rows:
            return True


def _json(cur, max_rows: int, tally: _Tally) -> tuple[bool, str]:
    tally.add(b'{"columns":' + _dumps([d[0] for d in cur.description]) + b',"rows":[')
    truncated = _rows(cur, max_rows, lambda rows, first: (b"" if first else b",") + _dumps(rows)[1:-1], tally)
    tally.add(b'],"truncated":' + (b"true" if truncated else b"false") + b"}")
    return truncated, "application/json"


def _csv_rows(rows: list[tuple], header: list[str] | None = None) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    if header is not None:
        writer.writerow(header)
    writer.writerows([["true" if v is True else "false" if v is False else v for v in row] for row in rows])
    return out.getvalue().encode()


def _csv(cur, max_rows: int, tally: _Tally) -> tuple[bool, str]:
    tally.add(_csv_rows([], [d[0] for d in cur.description]))
    return _rows(cur, max_rows, lambda rows, first: _csv_rows(rows), tally), "text/csv"


def _arrow(cur, max_rows: int, tally: _Tally) -> tuple[bool, str]:
    import pyarrow as pa

    reader = cur.to_arrow_reader(ARROW_BATCH_ROWS)
    taken = 0
    try:
        with pa.ipc.new_stream(pa.PythonFile(tally, mode="w"), reader.schema) as writer:
            for batch in reader:
                tally.check(batch.nbytes)  # refused before it is copied into the stream
                keep = batch.slice(0, max(0, max_rows - taken))
                if keep.num_rows:
                    writer.write_batch(keep)
                taken += batch.num_rows
                if taken > max_rows:
                    break
    finally:
        reader.close()  # the transaction ends with a ROLLBACK, which needs the result closed
    return taken > max_rows, "application/vnd.apache.arrow.stream"


FORMATS = {"json": _json, "csv": _csv, "arrow": _arrow}


def answer(con, sql: str, timeout_s: float, *, params: dict[str, Any] | None, fmt: str, max_rows: int, max_bytes: int,
           cover: Callable[[int], None] = lambda n: None) -> Answer:
    """Run a checked SELECT (``usersql.user_select``) and render its answer in ``fmt`` (see the module)."""
    deadline = time.monotonic() + timeout_s
    render = FORMATS[fmt]
    usersql.check_select(sql)  # refuse before taking a cursor
    tally = _Tally(max_bytes, deadline, timeout_s, cover)
    with usersql.user_select(con, sql, timeout_s) as cur:
        cur.execute(sql, params or None)
        truncated, content_type = render(cur, max_rows, tally)
    return Answer(tally.parts, tally.size, truncated, content_type)
