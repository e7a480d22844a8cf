"""Latency of fleet-wide search (``GET /api/v1/search``'s query) over a 24 h window at 10 M rows.

The database is filled with BENCH_SEARCH_ROWS rows (default 10 M) in arrival order, 400 instances x
5 sources interleaved in 1,000-line bodies, spread over BENCH_SEARCH_SPAN_H hours ending now
(default 24: every row is in the window, the worst case). One line in 100,000 is an out-of-memory
error. Then ``ingest.db.search.search`` (what the handler runs, on a cursor with a deadline) answers a
mix of questions, each BENCH_SEARCH_REPEAT times:
- a rare phrase ("out of memory": ~100 hits, the whole window scanned);
- a common word (hits the limit of 100 at once);
- text that is nowhere;
- a regular expression for the rare phrase;
- the rare phrase for one instance.
Reference, measured in the same run: a plain scan of the window that reads every line
(``count(*) ... WHERE ts in the window AND NOT contains(line, 'text that is nowhere')``, case
sensitive, no lower-casing), the floor any text search of the whole window pays.
Goal: p99 <= 500 ms.

    python bench/search_latency.py      # BENCH_SEARCH_ROWS=10000000 BENCH_SEARCH_REPEAT=20
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile  # noqa: E402
from ingest.db import search, store, searchtokens as tokens  # noqa: E402
from ingest.timestamps import now_us  # noqa: E402

ROWS = int(os.environ.get("BENCH_SEARCH_ROWS", "10000000"))
SPAN_H = float(os.environ.get("BENCH_SEARCH_SPAN_H", "24"))
REPEAT = int(os.environ.get("BENCH_SEARCH_REPEAT", "20"))
INSTANCES = 400
ABSENT = "qqq-this-text-is-nowhere-qqq"


def fill(path: Path, end_us: int) -> float:
    con = store.open_database(path)
    step_us = max(1, int(SPAN_H * 3600e6 / ROWS))
    start_us = end_us - step_us * ROWS
    t0 = time.perf_counter()
    con.execute(
        f"""
        INSERT INTO logs
        SELECT 'C.' || (33000000 + (b % {INSTANCES}))::VARCHAR,
               ['benchout', 'benchdaemon', 'setup', 'cuzk', 'curio'][1 + (b // {INSTANCES}) % 5],
               '0', (b // ({INSTANCES} * 5)) * 1000 + i, make_timestamp({start_us} + r * {step_us}),
               now()::TIMESTAMP,
               CASE WHEN r % 100000 = 77777
                    THEN 'ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating '
                         || (r % 7)::VARCHAR || '.2 GiB for NTT'
                    ELSE '2026-11-29T11:2' || (r % 10)::VARCHAR || 'Z INFO cuzk_daemon::prover: partition '
                         || (r % 16)::VARCHAR || ' of PoRep C2 proof ' || r::VARCHAR || ' done in '
                         || (r % 200000)::VARCHAR || ' ms (gpu 0)' END,
               false
        FROM (SELECT range AS r, range // 1000 AS b, range % 1000 AS i FROM range({ROWS}))
        """
    )
    tokens.cover_unindexed(con)  # written around the writer: one catch-all block, so searches scan (bench/search_scale.py measures the filter)
    con.execute("CHECKPOINT")
    con.close()
    return time.perf_counter() - t0


def timed(fn, repeat: int) -> tuple[list[float], object]:
    out, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        out.append(time.perf_counter() - t0)
    return out, result


def main() -> int:
    end_us = now_us()
    since_us = end_us - 24 * 3600 * 1_000_000
    with tempfile.TemporaryDirectory(prefix="fleetlog-search-") as tmp:
        db = Path(tmp) / "search.duckdb"
        fill_s = fill(db, end_us)
        con = store.open_database(db)
        view = tokens.uncovered(con)  # what the server's writer would hold open (none: cover_unindexed covers every row)
        try:
            def reference():
                cur = con.cursor()
                try:
                    return cur.execute("SELECT count(*) FROM logs WHERE ts >= make_timestamp(?) AND ts < make_timestamp(?) "
                                       "AND NOT contains(line, ?)", [since_us, end_us + 1, ABSENT]).fetchone()[0]
                finally:
                    cur.close()

            timed(reference, 2)  # warm the cache: the file was just written
            ref_times, window_rows = timed(reference, REPEAT)
            cases = {
                "rare phrase": dict(text="out of memory", regex=False),
                "common word": dict(text="partition", regex=False),
                "nowhere": dict(text="no such text anywhere", regex=False),
                "regex": dict(text=r"out of mem\w+ \(cuda", regex=True),
                "one instance": dict(text="out of memory", regex=False, instance_id="C.33000077"),
            }
            print(f"search latency: {ROWS:,} rows over {SPAN_H:g} h, {window_rows:,} in the 24 h window "
                  f"(filled in {fill_s:.1f} s), {REPEAT} runs each")
            ref_p50 = percentile(ref_times, 50)
            print(f"  reference (scan of every line in the window)   p50 {ref_p50 * 1e3:7.1f} ms  "
                  f"p99 {percentile(ref_times, 99) * 1e3:7.1f} ms")
            every: list[float] = []
            for name, case in cases.items():
                query = search.SearchQuery(since_us=since_us, until_us=end_us + 1, **case)
                times, (hits, truncated, _plan) = timed(lambda: search.search(con, 30.0, query, open_block=lambda: view), REPEAT)
                every += times
                print(f"  {name:<14} {len(hits):>4} hits{'+' if truncated else ' '}                   p50 "
                      f"{percentile(times, 50) * 1e3:7.1f} ms  p99 {percentile(times, 99) * 1e3:7.1f} ms  "
                      f"({percentile(times, 99) / ref_p50:.2f}x the reference)")
            p99 = percentile(every, 99)
            print(f"  all searches p99 {p99 * 1e3:.1f} ms = {p99 / ref_p50:.2f}x the reference scan "
                  f"(goal <= 500 ms: {'met' if p99 <= 0.5 else 'NOT met'}); CPUs: {os.cpu_count()}, "
                  f"load average {os.getloadavg()[0]:.1f}")
        finally:
            con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
