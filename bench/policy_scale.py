"""One policy cycle over a fleet of N instances, at DuckDB's default memory limit.

Builds a scratch database per fleet size with tests/fleet.py's ``bulk_fleet`` (the shapes of
bench_instance / demo_fleet: registered, params_done, bench_started, bench_done, gpu_state,
logs_complete; BENCH_LINES log lines per stream, 3 streams; BENCH_SAMPLES DCGM samples per metric,
4 metrics; one in 20 failed, below min_rate, failed fetch, hung), then, in a fresh process on that
file (so that the peak RSS is the cycle's), starts the real app with ``--duckdb-memory-limit-mb``
(default 256) and times ``POST /api/v1/policy/run`` (a first cycle, with every failed run to class,
then a second, nothing changed) and each rule (the engine's fleetlog_policy_rule_seconds), and
records the peak RSS of the cycles (VmHWM, reset before them). Prints each size's figures as ratios
against a 10-instance fleet measured in the same run.

    python bench/policy_scale.py [--instances 1000 10000] [--memory-limit-mb 256] [--queries DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from ingest.app import create_app  # noqa: E402
from ingest.config import Settings  # noqa: E402
from ingest.web.keys import CORE  # noqa: E402
from tests.fleet import bulk_fleet, utcnow  # noqa: E402

LINES = int(os.environ.get("BENCH_LINES", "100"))
SAMPLES = int(os.environ.get("BENCH_SAMPLES", "60"))
REFERENCE = 10


def settings(db: str, memory_limit_mb: int, queries: str | None) -> Settings:
    s = replace(Settings(db=db, port=0, otlp_grpc_port=0), policy_interval_s=0, query_timeout_s=600.0,
                duckdb_memory_limit_mb=memory_limit_mb)
    return replace(s, queries_dir=queries) if queries else s


async def build(db: str, n: int) -> float:
    started = time.perf_counter()
    client = TestClient(TestServer(create_app(settings(db, 256, None))))
    await client.start_server()
    try:
        import datetime as dt

        await bulk_fleet(client, n, utcnow() - dt.timedelta(hours=1), lines=LINES, samples=SAMPLES)
    finally:
        await client.close()
    return time.perf_counter() - started


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def cycle(db: str, memory_limit_mb: int, queries: str | None) -> dict:
    """(In the child.) Two cycles on the file; their times, statuses, rule times and peak RSS."""
    client = TestClient(TestServer(create_app(settings(db, memory_limit_mb, queries))))
    await client.start_server()
    try:
        registry = client.app[CORE].policy.metrics.registry
        rules = [r.name for r in client.app[CORE].policy.rules]
        with open("/proc/self/clear_refs", "w") as f:  # the peak from here on: the cycles', not the start-up's
            f.write("5")
        out: dict = {"cycles": []}
        for _ in range(2):
            before = {r: registry.get_sample_value("fleetlog_policy_rule_seconds_sum", {"rule": r}) or 0.0 for r in rules}
            started = time.perf_counter()
            r = await client.post("/api/v1/policy/run")
            took = time.perf_counter() - started
            body = await r.json()
            out["cycles"].append({
                "status": r.status, "seconds": took, "errors": body.get("rule_errors") or body.get("error"),
                "classified": body.get("classified"),
                "rules": {n: (registry.get_sample_value("fleetlog_policy_rule_seconds_sum", {"rule": n}) or 0.0) - before[n]
                          for n in rules},
            })
        out["peak_rss_mb"] = peak_rss_mb()
        return out
    finally:
        await client.close()


def measure(n: int, memory_limit_mb: int, queries: str | None, tmp: str) -> dict:
    db = str(Path(tmp) / f"fleet{n}.duckdb")
    built_s = asyncio.run(build(db, n))
    child = subprocess.run([sys.executable, __file__, "--cycle", db, "--memory-limit-mb", str(memory_limit_mb),
                            *(["--queries", queries] if queries else [])],
                           capture_output=True, text=True, check=True)
    result = json.loads(child.stdout.strip().splitlines()[-1])
    result["built_s"] = built_s
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[1000])
    parser.add_argument("--memory-limit-mb", type=int, default=256)
    parser.add_argument("--queries", help="another checkout's queries/ (e.g. main's, for the figure before)")
    parser.add_argument("--cycle", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cycle:
        print(json.dumps(asyncio.run(cycle(args.cycle, args.memory_limit_mb, args.queries))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        ref = measure(REFERENCE, args.memory_limit_mb, args.queries, tmp)
        print(f"memory limit {args.memory_limit_mb} MiB, {LINES} lines x 3 streams, {SAMPLES} samples x 4 metrics per instance")
        for n, res in [(REFERENCE, ref)] + [(n, measure(n, args.memory_limit_mb, args.queries, tmp)) for n in args.instances]:
            for k, (c, rc) in enumerate(zip(res["cycles"], ref["cycles"])):
                slow = sorted(c["rules"].items(), key=lambda kv: -kv[1])[:3]
                print(f"{n:>6} instances  cycle {k + 1}: HTTP {c['status']}  {c['seconds']:7.2f} s "
                      f"({c['seconds'] / rc['seconds']:6.1f}x the {REFERENCE})  slowest: "
                      + ", ".join(f"{name} {s:.2f} s" for name, s in slow)
                      + (f"  errors: {c['errors']}" if c["errors"] else ""))
            print(f"{n:>6} instances  peak RSS {res['peak_rss_mb']:7.0f} MiB ({res['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x)"
                  f"  (built in {res['built_s']:.1f} s)")


if __name__ == "__main__":
    main()
