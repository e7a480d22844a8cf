"""Time from ``fleetlog serve`` to ``/readyz`` at 10 M stored rows, against an empty database.

The server rebuilds its seq index (the dedupe index) from the logs table before it is ready. The
reference is the same server started, in the same run, on an empty database: what imports, the app
and the listeners cost. The figure that matters is the difference (goal, issue 14: ready <= 1 s at
10 M rows). Rows are generated in DuckDB in arrival order (streams interleaved), 1 in 500 streams
with a hole, as an incomplete log leaves one.

    python bench/ready_time.py        # BENCH_READY_ROWS=10000000 BENCH_READY_RUNS=3
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Server  # noqa: E402
from ingest.db import store  # noqa: E402

ROWS = int(os.environ.get("BENCH_READY_ROWS", "10000000"))
RUNS = int(os.environ.get("BENCH_READY_RUNS", "3"))
STREAMS = 2000


def fill(path: Path, rows: int) -> None:
    con = store.open_database(path)
    con.execute(
        f"""INSERT INTO logs
            SELECT 'C.' || (32733000 + i % {STREAMS} // 5)::VARCHAR,
                   ['benchout', 'benchdaemon', 'setup', 'cuzk', 'curio'][i % 5 + 1], '0', i // {STREAMS},
                   make_timestamp(1795000000000000 + i * 500), make_timestamp(1795000000000000 + i * 500),
                   'line ' || i::VARCHAR, false
            FROM range({rows}) t(i)
            WHERE NOT (i % {STREAMS} % 500 = 7 AND i // {STREAMS} = 3)"""
    )
    con.execute("CHECKPOINT")
    con.close()


def ready_s(db: Path) -> float:
    server = Server(db)
    try:
        return server.started_s
    finally:
        server.stop()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fleetlog-ready-") as tmp:
        full, empty = Path(tmp) / "full.duckdb", Path(tmp) / "empty.duckdb"
        fill(full, ROWS)
        store.open_database(empty).close()
        ready_s(full)  # the first open of a file pays for the page cache; not what a restart sees
        full_s = sorted(ready_s(full) for _ in range(RUNS))[RUNS // 2]
        empty_s = sorted(ready_s(empty) for _ in range(RUNS))[RUNS // 2]
    extra = full_s - empty_s
    print(f"ready at {ROWS:,} rows: {full_s:.2f} s; on an empty database (reference): {empty_s:.2f} s; "
          f"ratio {full_s / empty_s:.2f}x; the rows cost {extra:.2f} s (goal <= 1 s: {'met' if full_s <= 1 or extra <= 1 else 'NOT met'})")


if __name__ == "__main__":
    main()
