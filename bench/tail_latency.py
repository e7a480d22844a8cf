"""Latency of "last 200 lines of one stream" at 10 M stored rows, while the server ingests.

The database is filled with BENCH_TAIL_ROWS rows (default 10 M) in arrival order (streams
interleaved, as a fleet pushes them: bodies of 1,000 lines, eight to a commit, 50 ms apart, each
commit's rows sharing its received_at), then ``fleetlog serve`` opens it and a separate process
pushes new 1,000-line bodies (fresh seqs every round, so the writer really inserts) at
BENCH_TAIL_INGEST_CONCURRENCY while this process asks for tails over HTTP. Measured in the same run:
- references, straight on DuckDB with a fresh read-only connection on a copy of the file:
  - the tail query (``ORDER BY ... LIMIT 200``): what a scan costs without the server;
  - the same query on a copy sorted by (instance_id, source, run_id, seq), as a compaction into
    stream order would leave it (BENCH_TAIL_SORTED=0 skips it; it costs ~30 s);
  - the server's own load without it, in-process: the seq floor alone (how main loaded) and the floor
    plus the commit-time window (``reads.load_tail``);
- the first tail of each stream after start-up (loads the stream's newest lines from the database);
- later tails (served from the tail cache while the writer commits).
Targets: first tail p99 <= 10 ms, cached tail p99 <= 5 ms.

    python bench/tail_latency.py        # BENCH_TAIL_ROWS=10000000 BENCH_TAIL_REQUESTS=2000

BENCH_TAIL_SERVER_REPO=/path/to/another/checkout serves from that checkout's code (same bench, same
references: a before/after of the server alone).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
import orjson  # noqa: E402

from bench import common  # noqa: E402
from bench.common import Server, make_line, percentile, wait_for_log  # noqa: E402
from bench.ingest_throughput import _send_all  # noqa: E402
from ingest.db import reads, store  # noqa: E402
from ingest.db.seqindex import StreamIndex  # noqa: E402

ROWS = int(os.environ.get("BENCH_TAIL_ROWS", "10000000"))
REQUESTS = int(os.environ.get("BENCH_TAIL_REQUESTS", "2000"))
INGEST_CONCURRENCY = int(os.environ.get("BENCH_TAIL_INGEST_CONCURRENCY", "4"))
SORTED_REFERENCE = os.environ.get("BENCH_TAIL_SORTED", "1") == "1"
CACHE_LINES = 1000  # the server's default tail_cache_lines: what a first tail loads
INSTANCES, SOURCES = 400, ["benchout", "benchdaemon", "setup", "cuzk", "curio"]
STREAMS = INSTANCES * len(SOURCES)
TAIL_SQL = """SELECT source, run_id, seq, ts, line FROM logs WHERE instance_id = ? AND source = ?
              ORDER BY run_id DESC, seq DESC LIMIT 200"""


def fill(path: Path) -> float:
    """ROWS rows, streams interleaved in blocks of 1,000 lines (one body each), like arrivals; eight
    bodies a commit, commits 50 ms apart (received_at is the commit's time, as the writer sets it)."""
    con = store.open_database(path)
    t0 = time.perf_counter()
    con.execute(
        f"""
        INSERT INTO logs
        SELECT 'C.' || (33000000 + (b % {INSTANCES}))::VARCHAR,
               ['benchout', 'benchdaemon', 'setup', 'cuzk', 'curio'][1 + (b // {INSTANCES}) % 5],
               '0', (b // {STREAMS}) * 1000 + i, TIMESTAMP '2026-11-29 11:20:00' + to_microseconds(r),
               TIMESTAMP '2026-11-29 11:20:00' + to_microseconds((b // 8) * 50000),
               '2026-11-29T11:2' || (r % 10)::VARCHAR || 'Z INFO cuzk_daemon::prover: partition ' || (r % 16)::VARCHAR
                 || ' of PoRep C2 proof ' || r::VARCHAR || ' done in ' || (r % 200000)::VARCHAR || ' ms (gpu 0)',
               false
        FROM (SELECT range AS r, range // 1000 AS b, range % 1000 AS i FROM range({ROWS}))
        """
    )
    con.close()
    return time.perf_counter() - t0


def reference(path: Path, keys: list[tuple[str, str]], table: str = "logs") -> list[float]:
    con = duckdb.connect(str(path), read_only=True)
    out = []
    for instance, source in keys:
        t0 = time.perf_counter()
        con.execute(TAIL_SQL.replace("FROM logs", f"FROM {table}"), [instance, source]).fetchall()
        out.append(time.perf_counter() - t0)
    con.close()
    return out


def sort_copy(path: Path) -> float:
    """A copy of logs in stream order (what compaction would leave), with the same column encodings."""
    con = duckdb.connect(str(path))
    t0 = time.perf_counter()
    schema = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = 'logs'").fetchone()[0]
    con.execute(schema.replace("CREATE TABLE logs", "CREATE TABLE logs_sorted", 1))
    con.execute("INSERT INTO logs_sorted SELECT * FROM logs ORDER BY instance_id, source, run_id, seq")
    con.close()
    return time.perf_counter() - t0


def loads(path: Path, keys: list[tuple[str, str]]) -> tuple[list[float], list[float]]:
    """The server's first-tail load, in-process on a fresh connection: the seq floor alone (main's
    load), then the floor plus the commit-time window after start-up's narrowing pass."""
    con = duckdb.connect(str(path), read_only=True)
    index = StreamIndex()
    index.load(con.cursor())
    index.refine(con.cursor(), CACHE_LINES)
    floor_only, window = [], []
    for instance, source in keys:
        bounds = index.tail_bounds(instance, source, CACHE_LINES)
        t0 = time.perf_counter()
        reads.load_tail(con, 60, instance, source, CACHE_LINES, dataclasses.replace(bounds, since_us=None, until_us=None))
        t1 = time.perf_counter()
        rows, _complete = reads.load_tail(con, 60, instance, source, CACHE_LINES, bounds)
        window.append(time.perf_counter() - t1)
        floor_only.append(t1 - t0)
        assert len(rows) == CACHE_LINES
    con.close()
    return floor_only, window


def fresh_bodies(texts: list[str], round_: int) -> list[bytes]:
    """200 bodies of 1,000 new lines (50 instances x 4 sources, seqs from round_ * 1,000)."""
    bodies = []
    for b in range(200):
        instance, source = f"C.{32733000 + b % 50}", SOURCES[(b // 50) % len(SOURCES)]
        start = round_ * 1000
        lines = [{"seq": start + i, "ts": 1795951248.0 + (start + i) / 1000, "line": texts[(b * 1000 + i) % len(texts)]}
                 for i in range(1000)]
        bodies.append(orjson.dumps({"instance_id": instance, "source": source, "run_id": "0", "lines": lines}))
    return bodies


def ingest_process(url: str, seconds: float, out) -> None:
    rng = random.Random(7)
    texts = [make_line(rng, n) for n in range(20_000)]

    async def run() -> int:
        sent = 0
        t0 = time.perf_counter()
        round_ = 0
        while time.perf_counter() - t0 < seconds:
            await _send_all(url, fresh_bodies(texts, round_), INGEST_CONCURRENCY)
            sent += 200 * 1000
            round_ += 1
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


def has_windows(repo: Path) -> bool:
    """Whether the server code at ``repo`` narrows tail windows at start-up (ingest/tailload.py before
    the one load_tail, ``Reader.refine_tail_windows`` since)."""
    reader = next((p for p in (repo / "ingest" / "db" / "reader.py", repo / "ingest" / "reader.py") if p.exists()),
                  repo / "ingest" / "reader.py")
    return (repo / "ingest" / "tailload.py").exists() or (reader.exists() and "def refine_tail_windows" in reader.read_text())


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
        ref_db = Path(tmp) / "ref.duckdb"
        shutil.copy(db, ref_db)
        sorted_s = sort_copy(ref_db) if SORTED_REFERENCE else None
        ref = reference(ref_db, cold_keys[:100])
        ref_sorted = reference(ref_db, cold_keys[:100], "logs_sorted") if SORTED_REFERENCE else None
        floor_only, window = loads(ref_db, cold_keys[:100])
        server_repo = os.environ.get("BENCH_TAIL_SERVER_REPO")
        if server_repo:
            common.REPO = Path(server_repo)
        server = Server(db, "--log-level", "INFO")
        try:
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            ingest = ctx.Process(target=ingest_process, args=(server.url, 1e9, out))
            ingest.start()
            time.sleep(2)  # let the ingest load reach steady state before measuring
            narrowed_s = wait_for_log(server.log, "tail windows narrowed", 60) if has_windows(common.REPO) else None
            cold = asyncio.run(tails(server.url, cold_keys))
            warm = asyncio.run(tails(server.url, warm_keys))
            ingest.terminate()
            ingest.join()
        finally:
            server.stop()
    print(f"server code: {common.REPO}")
    print(f"rows: {ROWS:,} in {STREAMS} streams (filled in {fill_s:.1f} s); server start-up incl. seq index load {server.started_s:.1f} s")
    narrowing = ("n/a (that server has no commit-time windows)" if not has_windows(common.REPO)
                 else "%.1f s after the 2 s warm-up" % narrowed_s if narrowed_s is not None else "NOT within 60 s")
    print(f"ingest running alongside: {INGEST_CONCURRENCY} connections of new 1,000-line bodies; "
          f"start-up windows narrowed: {narrowing}")
    print(f"reference  DuckDB tail query, fresh read-only connection: {ms(ref)}")
    if ref_sorted is not None:
        print(f"reference  same, table in stream order (sorted in {sorted_s:.0f} s): {ms(ref_sorted)}")
    print(f"load       seq floor only (main's load), in-process:      {ms(floor_only)}")
    print(f"load       seq floor + commit-time window, in-process:    {ms(window)}")
    print(f"fleetlog   first tail of a stream (loads from DB):        {ms(cold)}")
    print(f"fleetlog   tail from the tail cache:                      {ms(warm)}")
    ref99 = percentile(ref, 99)
    print(f"ratio      first tail p99 / reference p99 = {percentile(cold, 99) / ref99:.3f}; "
          f"first tail p99 {percentile(cold, 99) * 1000:.1f} ms (target <= 10 ms)")
    print(f"ratio      cached p99 / reference p99 = {percentile(warm, 99) / ref99:.3f}; "
          f"cached p99 {percentile(warm, 99) * 1000:.1f} ms (target <= 5 ms)")


if __name__ == "__main__":
    main()
