"""Latency of "last 200 lines of one stream" at 10 M stored rows, while the server ingests.

The database is filled with BENCH_TAIL_ROWS rows (default 10 M) in arrival order (streams
interleaved, as a fleet pushes them), then ``fleetlog serve`` opens it and a separate process
pushes 1,000-line bodies at BENCH_TAIL_INGEST_CONCURRENCY while this process asks for tails over
HTTP. Measured in the same run:
- the reference: the same tail query run straight on DuckDB (a fresh read-only connection on a copy
  of the file): what a scan costs without the server's tail cache;
- the first tail of each stream after start-up (loads the stream's newest lines from the database);
- later tails (served from the tail cache while the writer commits).
Targets: first tail p99 <= 10 ms (the load reads only the rows from the seq index's floor on, which
zone maps prune to a few row groups), cached tail p99 <= 5 ms.

    python bench/tail_latency.py        # BENCH_TAIL_ROWS=10000000 BENCH_TAIL_REQUESTS=2000
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402

from bench.common import Server, percentile  # noqa: E402
from bench.ingest_throughput import _send_all, make_bodies  # noqa: E402
from ingest import store  # noqa: E402

ROWS = int(os.environ.get("BENCH_TAIL_ROWS", "10000000"))
REQUESTS = int(os.environ.get("BENCH_TAIL_REQUESTS", "2000"))
INGEST_CONCURRENCY = int(os.environ.get("BENCH_TAIL_INGEST_CONCURRENCY", "4"))
INSTANCES, SOURCES = 400, ["benchout", "benchdaemon", "setup", "cuzk", "curio"]
STREAMS = INSTANCES * len(SOURCES)
TAIL_SQL = """SELECT source, run_id, seq, ts, line FROM logs WHERE instance_id = ? AND source = ?
              ORDER BY run_id DESC, seq DESC LIMIT 200"""


def fill(path: Path) -> float:
    """ROWS rows, streams interleaved in blocks of 1,000 lines (one body each), like arrivals."""
    con = store.open_database(path)
    t0 = time.perf_counter()
    con.execute(
        f"""
        INSERT INTO logs
        SELECT 'C.' || (33000000 + (b % {INSTANCES}))::VARCHAR,
               ['benchout', 'benchdaemon', 'setup', 'cuzk', 'curio'][1 + (b // {INSTANCES}) % 5],
               '0', (b // {STREAMS}) * 1000 + i, TIMESTAMP '2026-11-29 11:20:00' + to_microseconds(r),
               now()::TIMESTAMP,
               '2026-11-29T11:2' || (r % 10)::VARCHAR || 'Z INFO cuzk_daemon::prover: partition ' || (r % 16)::VARCHAR
                 || ' of PoRep C2 proof ' || r::VARCHAR || ' done in ' || (r % 200000)::VARCHAR || ' ms (gpu 0)',
               false
        FROM (SELECT range AS r, range // 1000 AS b, range % 1000 AS i FROM range({ROWS}))
        """
    )
    con.close()
    return time.perf_counter() - t0


def reference(path: Path, keys: list[tuple[str, str]]) -> list[float]:
    con = duckdb.connect(str(path), read_only=True)
    out = []
    for instance, source in keys:
        t0 = time.perf_counter()
        con.execute(TAIL_SQL, [instance, source]).fetchall()
        out.append(time.perf_counter() - t0)
    con.close()
    return out


def ingest_process(url: str, seconds: float, out) -> None:
    bodies = make_bodies(200_000)

    async def run() -> int:
        sent = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await _send_all(url, bodies, INGEST_CONCURRENCY)
            sent += len(bodies) * 1000
        return sent

    out.put(asyncio.run(run()))


async def tails(url: str, keys: list[tuple[str, str]]) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as session:
        for instance, source in keys:
            t0 = time.perf_counter()
            async with session.get(f"{url}/api/v1/instances/{instance}/logs", params={"source": source, "tail": "200"}) as r:
                body = await r.json()
            out.append(time.perf_counter() - t0)
            assert r.status == 200 and len(body["lines"]) == 200, (r.status, len(body.get("lines", [])))
    return out


def ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 50) * 1000:6.1f} ms  p99 {percentile(values, 99) * 1000:6.1f} ms  (n={len(values)})"


def main() -> None:
    rng = random.Random(3)
    blocks = ROWS // 1000  # block b holds 1,000 lines of stream (b % INSTANCES, (b // INSTANCES) % 5)
    all_keys = [(f"C.{33000000 + b % INSTANCES}", SOURCES[(b // INSTANCES) % 5]) for b in range(min(blocks, STREAMS))]
    cold_keys = rng.sample(all_keys, min(200, len(all_keys)))
    warm_keys = [rng.choice(cold_keys) for _ in range(REQUESTS)]
    with tempfile.TemporaryDirectory(prefix="fleetlog-tail-") as tmp:
        db = Path(tmp) / "tail.duckdb"
        fill_s = fill(db)
        shutil.copy(db, Path(tmp) / "ref.duckdb")
        ref = reference(Path(tmp) / "ref.duckdb", cold_keys[:100])
        server = Server(db)
        try:
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            ingest = ctx.Process(target=ingest_process, args=(server.url, 1e9, out))
            ingest.start()
            time.sleep(2)  # let the ingest load reach steady state before measuring
            cold = asyncio.run(tails(server.url, cold_keys))
            warm = asyncio.run(tails(server.url, warm_keys))
            ingest.terminate()
            ingest.join()
        finally:
            server.stop()
    print(f"rows: {ROWS:,} in {STREAMS} streams (filled in {fill_s:.1f} s); server start-up incl. seq index load {server.started_s:.1f} s")
    print(f"ingest running alongside: {INGEST_CONCURRENCY} connections of 1,000-line bodies")
    print(f"reference  DuckDB scan, fresh read-only connection: {ms(ref)}")
    print(f"fleetlog   first tail of a stream (loads from DB):   {ms(cold)}")
    print(f"fleetlog   tail from the tail cache:                 {ms(warm)}")
    ref99 = percentile(ref, 99)
    print(f"ratio      first tail p99 / reference p99 = {percentile(cold, 99) / ref99:.3f}; "
          f"first tail p99 {percentile(cold, 99) * 1000:.1f} ms (target <= 10 ms)")
    print(f"ratio      cached p99 / reference p99 = {percentile(warm, 99) / ref99:.3f}; "
          f"cached p99 {percentile(warm, 99) * 1000:.1f} ms (target <= 5 ms)")


if __name__ == "__main__":
    main()
