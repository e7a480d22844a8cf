"""HTTP ingest throughput against an in-process DuckDB bulk append of the same rows.

Bodies of 1,000 lines of one (instance, source), ~133 B a line, sent by a client in a separate
process over loopback. The reference, measured in the same run on the same machine, is DuckDB taking
those rows in-process: one Arrow table, appended in transactions of REFERENCE_COMMIT_ROWS (100k)
rows, each an INSERT and a COMMIT, into a fresh database file with the same schema (decode excluded:
the floor). It is measured twice per round, with one DuckDB thread and with DuckDB's default threads
(one per core), and the ratio is taken against the faster of the two. The server runs with its
settings from the environment (``duckdb_threads`` 0: one thread on a host of up to 4 cores;
``FLEETLOG_DUCKDB_THREADS=2`` measures two here). Target: ingest >= 0.5x the reference.

Two client fleets, alternating with the reference in every round:
- 8 connections (the figure measured since the issue was filed). Ack after commit means at most 8
  bodies in flight, so a group commit holds at most 8,000 rows.
- 64 connections (the goal's figure): a fleet has hundreds of agents, each on its own connection,
  and a server sees tens of their pushes in flight at once; the writer then commits bigger groups.

Also printed: the server's CPU seconds per line (steadier than lines/s on a shared machine), and
DuckDB alone in commits as big as 8 bodies (the most a group commit of 8 clients can hold).

    python bench/ingest_throughput.py       # BENCH_LINES=500000 BENCH_CONCURRENCY=8,64 BENCH_REPEATS=3
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import SOURCES, Server, make_line, percentile  # noqa: E402
from ingest.db import store  # noqa: E402

LINES = int(os.environ.get("BENCH_LINES", "500000"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "8,64").split(",")]
GOAL_CONCURRENCY = CONCURRENCY[-1]
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
BODY_LINES = 1000
REFERENCE_COMMIT_ROWS = 100_000


def make_bodies(total: int) -> list[bytes]:
    rng = random.Random(7)
    bodies = []
    for b in range(total // BODY_LINES):
        instance, source = f"C.{32733000 + b % 50}", SOURCES[(b // 50) % len(SOURCES)]
        start = (b // 250) * BODY_LINES
        lines = [{"seq": start + i, "ts": 1795951248.0 + i / 1000, "line": make_line(rng, start + i)} for i in range(BODY_LINES)]
        bodies.append(orjson.dumps({"instance_id": instance, "source": source, "run_id": "0", "lines": lines}))
    return bodies


def reference_append(bodies: list[bytes], directory: Path, commit_rows: int = REFERENCE_COMMIT_ROWS, threads: int = 1) -> float:
    """Seconds for an in-process append of the same rows committed in ``commit_rows``-row
    transactions (decode excluded: the floor), with ``threads`` DuckDB threads."""
    cols: dict[str, list] = {k: [] for k in ("instance_id", "source", "run_id", "seq", "ts", "received_at", "line", "truncated")}
    for body in bodies:
        doc = orjson.loads(body)
        for line in doc["lines"]:
            cols["instance_id"].append(doc["instance_id"])
            cols["source"].append(doc["source"])
            cols["run_id"].append("0")
            cols["seq"].append(line["seq"])
            cols["ts"].append(int(line["ts"] * 1e6))
            cols["received_at"].append(int(line["ts"] * 1e6))
            cols["line"].append(line["line"])
            cols["truncated"].append(False)
    table = pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in store.LOG_SCHEMA], schema=store.LOG_SCHEMA)
    con = store.open_database(directory / f"reference-{commit_rows}-{threads}.duckdb", threads=threads)
    t0 = time.perf_counter()
    for start in range(0, table.num_rows, commit_rows):
        con.register("batch", table.slice(start, commit_rows))
        con.execute("BEGIN")
        con.execute("INSERT INTO logs SELECT * FROM batch")
        con.execute("COMMIT")
        con.unregister("batch")
    elapsed = time.perf_counter() - t0
    con.close()
    return elapsed


async def _send_all(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    import aiohttp

    latencies: list[float] = []
    queue = list(reversed(bodies))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                while True:
                    async with session.post(url + "/api/v1/logs", data=body, headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        if r.status == 200:
                            break
                        if r.status != 503:
                            raise RuntimeError(f"push failed: {r.status}")
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, latencies


def warm_up(url: str) -> None:
    """One small push before the clock starts: a server runs for days, the bench measures it warm."""
    body = orjson.dumps({"instance_id": "C.warm", "source": "warm", "lines": [{"seq": 0, "line": "warm"}]})
    request = urllib.request.Request(url + "/api/v1/logs", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        r.read()


def client_process(url: str, bodies: list[bytes], concurrency: int, out) -> None:
    out.put(asyncio.run(_send_all(url, bodies, concurrency)))


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads so far (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_ingest(bodies: list[bytes], directory: Path, concurrency: int) -> tuple[float, list[float], float]:
    """Seconds for a separate client process to push every body to a fresh server, each latency,
    and the server's CPU seconds meanwhile."""
    server = Server(directory / "server.duckdb")
    try:
        warm_up(server.url)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        cpu0 = server_cpu_s(server.proc.pid)
        proc = ctx.Process(target=client_process, args=(server.url, bodies, concurrency, out))
        proc.start()
        http_s, latencies = out.get()
        cpu_s = server_cpu_s(server.proc.pid) - cpu0
        proc.join()
    finally:
        server.stop()
    return http_s, latencies, cpu_s


def main() -> None:
    bodies = make_bodies(LINES)
    lines = len(bodies) * BODY_LINES
    mb = sum(map(len, bodies)) / 1e6
    print(f"rows: {lines:,} in {len(bodies)} bodies of {BODY_LINES} lines ({mb:.0f} MB JSON), client connections "
          f"{' and '.join(map(str, CONCURRENCY))}, {REPEATS} rounds (reference, then HTTP per fleet, alternating)")
    ratios: dict[int, list[float]] = {c: [] for c in CONCURRENCY}
    latencies: dict[int, list[float]] = {c: [] for c in CONCURRENCY}
    for round_ in range(REPEATS):
        with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp:
            one_rate = lines / reference_append(bodies, Path(tmp), threads=1)
            default_rate = lines / reference_append(bodies, Path(tmp), threads=len(os.sched_getaffinity(0)))
            # what DuckDB alone does with commits as big as 8 clients' requests in flight can make
            small_rate = lines / reference_append(bodies, Path(tmp), 8 * BODY_LINES)
        ref_rate = max(one_rate, default_rate)
        print(f"round {round_ + 1}  reference (in-process DuckDB append, 100k-row commits) {ref_rate:,.0f} lines/s "
              f"[1 DuckDB thread {one_rate:,.0f}, one per core {default_rate:,.0f}; "
              f"in 8,000-row commits {small_rate:,.0f}, {small_rate / ref_rate:.2f}x]")
        for concurrency in CONCURRENCY:
            with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp:
                http_s, round_latencies, cpu_s = http_ingest(bodies, Path(tmp), concurrency)
            http_rate = lines / http_s
            latencies[concurrency] += round_latencies
            ratios[concurrency].append(http_rate / ref_rate)
            print(f"         HTTP ingest, {concurrency:3d} connections (separate client, ack after commit) {http_rate:,.0f} lines/s; "
                  f"ratio {ratios[concurrency][-1]:.2f}; server CPU {cpu_s / lines * 1e6:.2f} us/line")
    for concurrency in CONCURRENCY:
        lat, rs = latencies[concurrency], ratios[concurrency]
        goal = "  (target >= 0.50)" if concurrency == GOAL_CONCURRENCY else ""
        print(f"ratio      ingest / reference, {concurrency:3d} connections = {statistics.median(rs):.2f} median of {REPEATS} "
              f"(min {min(rs):.2f}, max {max(rs):.2f}); request latency p50 {percentile(lat, 50) * 1000:.0f} ms, "
              f"p99 {percentile(lat, 99) * 1000:.0f} ms{goal}")


if __name__ == "__main__":
    main()
