"""The failure_class rule on a backlog of failed runs, against one fixed-pattern scan of the same lines.

Builds a scratch database in-process (the real app): BENCH_RUNS (default 16) failed benchmark runs
whose logs never complete (so their class is never final and every policy cycle considers them), each
with BENCH_LINES (default 3000) daemon lines bulk-inserted in one statement. Then times, in the same
run:

- reference: one scan of those lines with one fixed pattern (regexp_matches with a literal);
- cycle 1: the rule on the whole backlog (what a first cycle, or every cycle before issue 21, costs);
- cycle 2: the rule after 10 new lines arrived for one run (what a steady-state cycle costs).

and prints each as a ratio of the reference. ``--queries DIR`` takes the rule from another checkout's
queries/ (e.g. main's, for the figure before): the engine stores either rule's output.

    python bench/failure_class.py [--queries /path/to/queries]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from ingest.app import create_app  # noqa: E402
from ingest.config import Settings  # noqa: E402
from ingest.web.keys import CORE, DB, WRITER  # noqa: E402
from tests.fleet import push_lines, utcnow  # noqa: E402
from tests.test_policy_cycle import backlog  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "16"))
LINES = int(os.environ.get("BENCH_LINES", "3000"))
OOM = "(?i)(out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|oom-kill|Killed process|memory allocation failed|cannot allocate memory)"


def reference_s(client) -> tuple[float, int]:
    """The best of three scans (the first also reads the file into the cache)."""
    cur = client.app[DB].cursor()
    try:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            [(n,)] = cur.execute(
                "SELECT count(*) FROM logs WHERE instance_id LIKE 'C.backlog%' AND NOT regexp_matches(line, '" + OOM + "')"
            ).fetchall()
            best = min(best, time.perf_counter() - started)
        return best, n
    finally:
        cur.close()


async def classify_s(client) -> tuple[float, int]:
    engine = client.app[CORE].policy
    [rule] = [r for r in engine.rules if r.output == "classify"]
    params = engine.params.values(utcnow())
    errors: dict[str, str] = {}
    started = time.perf_counter()
    rows = await asyncio.to_thread(engine._classify, rule, params, errors)
    took = time.perf_counter() - started
    if errors:
        raise SystemExit(f"the rule failed: {errors}")
    from ingest.db.writes import store_classes as _store_classes

    await client.app[WRITER].execute(lambda con: _store_classes(con, rows, utcnow()), kind="policy")
    return took, len(rows)


async def main(queries: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = replace(Settings(db=str(Path(tmp) / "bench.duckdb"), port=0, otlp_grpc_port=0),
                           policy_interval_s=0, query_timeout_s=600.0, queries_dir=queries)
        client = TestClient(TestServer(create_app(settings)))
        await client.start_server()
        try:
            done = utcnow() - dt.timedelta(seconds=60)
            await backlog(client, RUNS, LINES, done)
            ref, n = reference_s(client)
            first, classed = await classify_s(client)
            await push_lines(client, "C.backlog3", "cuzk", [f"prover line {i}" for i in range(10)],
                             at=done - dt.timedelta(seconds=1))
            second, reclassed = await classify_s(client)
            print(f"rule: {Path(queries or 'queries') / 'policies'}; {RUNS} failed runs x {LINES} lines = {n} lines")
            print(f"reference, one fixed pattern over the lines: {ref:8.3f} s   1.0x")
            print(f"cycle 1, the whole backlog ({classed} runs):  {first:8.3f} s  {first / ref:6.1f}x")
            print(f"cycle 2, 10 new lines ({reclassed} runs):        {second:8.3f} s  {second / ref:6.1f}x")
        finally:
            await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="", help="queries/ directory holding policies/ (default: this checkout's)")
    asyncio.run(main(parser.parse_args().queries))
