"""Migration 017's line_template (the masking behind failure patterns and `why --diff`) against a plain
scan of the same lines.

A scratch DuckDB file migrated by the store holds BENCH_LINES (default 200000) log lines of the
shapes bench/common.py makes, plus one CUDA OOM line in 20 with its own size, request id and
pointer. In the same run, the best of three of:

- reference: a plain scan of the lines (sum of their lengths);
- one pattern: one regexp_matches of the failure_class rule's OOM pattern over them (what the rule
  pays per pattern and line);
- template: line_template over every line, counting the distinct templates.

Each is printed as a ratio of the reference, with the cost per line, and how many distinct lines
became how many templates. The views mask one line per failure (pattern_spread) and the lines of two
runs (run_diff), so the cost per line says what a fleet's failures cost to group.

    python bench/patterns.py
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402

from bench.common import make_line  # noqa: E402
from ingest.db import store  # noqa: E402

LINES = int(os.environ.get("BENCH_LINES", "200000"))
OOM = "(?i)(out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|memory allocation failed|cannot allocate memory)"


def lines(n: int) -> list[str]:
    rng = random.Random(17)
    out = []
    for i in range(n):
        if i % 20 == 0:
            out.append(f"2026-11-29T11:30:{i % 60:02d}Z ERROR cuzk_daemon::pce: CUDA error: out of memory "
                       f"(cudaErrorMemoryAllocation) allocating {rng.randint(1, 40)}.{rng.randint(0, 9)} GiB for NTT "
                       f"(request {uuid.UUID(int=rng.getrandbits(128))}, buffer {hex(rng.getrandbits(40))})")
        else:
            out.append(make_line(rng, i))
    return out


def best_of_three(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, tuple]:
    best, result = float("inf"), None
    for _ in range(3):
        t = time.perf_counter()
        result = con.execute(sql).fetchone()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "bench.duckdb"))
        store.migrate(con)
        con.execute("CREATE TABLE bench_lines AS SELECT unnest(?::VARCHAR[]) AS line", [lines(LINES)])
        reference, _ = best_of_three(con, "SELECT sum(length(line)) FROM bench_lines")
        one, (matched,) = best_of_three(con, f"SELECT count(*) FILTER (WHERE regexp_matches(line, '{OOM}')) FROM bench_lines")
        masked, (distinct, templates) = best_of_three(
            con, "SELECT count(DISTINCT line), count(DISTINCT line_template(line)) FROM bench_lines")
        con.close()
    print(f"{LINES} lines ({matched} OOM lines), DuckDB {duckdb.__version__}, threads {os.cpu_count()}")
    for name, seconds in (("reference: plain scan", reference), ("one pattern (regexp_matches)", one),
                          ("line_template (8 regexp_replace)", masked)):
        print(f"  {name:<34} {seconds * 1000:8.1f} ms  {seconds / LINES * 1e6:7.3f} us/line  x{seconds / reference:7.1f}")
    print(f"  {distinct} distinct lines -> {templates} templates")


if __name__ == "__main__":
    main()
