"""A policy fast run (what a destroy waits for: the class, the destroy and the machine-exclusion rules)
on a fleet, against the same database with migration 019's log_streams: the in-process reference.

Builds a scratch database with tests/fleet.py's ``bulk_fleet`` (N instances, BENCH_LINES lines per
stream; one in 20 failed, below min_rate, failed fetch, hung: the fates the fast runs decide on), copies
it, and on the copy puts back 019's log_streams (which took every logs_complete body apart with
json_each at each read) in place of 022's (log_stream_declared, kept by the writer). Then, on each
file in turn, alternately, opens the server's own Core (one DuckDB thread on a small host, as the
server) and times ROUNDS fast runs (``run_cycle(full=False)``, nothing to execute) and each rule of
them (the engine's fleetlog_policy_rule_seconds). Prints the medians and the ratio to the reference.

    python bench/policy_fast_run.py [--instances 40 400] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from ingest.app import create_app  # noqa: E402
from ingest.config import Settings  # noqa: E402
from ingest.core import Core  # noqa: E402
from ingest.db import store  # noqa: E402
from ingest.metrics import IngestMetrics  # noqa: E402
from tests.fleet import bulk_fleet, utcnow  # noqa: E402

LINES = 100


def settings(db: str) -> Settings:
    return replace(Settings(db=db, port=0, otlp_grpc_port=0), policy_interval_s=0, min_rate=29.0)


async def build(db: str, n: int) -> None:
    import datetime as dt

    client = TestClient(TestServer(create_app(settings(db))))
    await client.start_server()
    try:
        await bulk_fleet(client, n, utcnow() - dt.timedelta(minutes=5), lines=LINES, samples=12)
    finally:
        await client.close()


def reference_view() -> str:
    """Migration 019's log_streams, as it stood before 022."""
    [(_, _, sql)] = [m for m in store.migrations() if m[0] == 19]
    [view] = [s.query for s in duckdb.extract_statements(sql) if re.search(r"VIEW\s+log_streams\b", s.query)]
    return view


async def fast_runs(db: str, rounds: int) -> dict[str, float]:
    """Median seconds of a fast run and of each of its rules on ``db``."""
    core = Core.open(settings(db), IngestMetrics(CollectorRegistry()))
    try:
        policy = core.policy
        registry = policy.metrics.registry
        names = [r.name for r in policy.rules]

        def rule_sums() -> dict[str, float]:
            return {n: registry.get_sample_value("fleetlog_policy_rule_seconds_sum", {"rule": n}) or 0.0 for n in names}

        await policy.run_cycle(False, full=False)  # the first run classes the backlog; then what every run costs
        runs: list[float] = []
        per_rule: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(rounds):
            before = rule_sums()
            started = time.perf_counter()
            await policy.run_cycle(False, full=False)
            runs.append(time.perf_counter() - started)
            for n, v in rule_sums().items():
                if v > before[n]:
                    per_rule[n].append(v - before[n])
        out = {"run": statistics.median(runs)}
        out.update({n: statistics.median(v) for n, v in per_rule.items() if v})
        return out
    finally:
        await core.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.instances:
            db, ref = str(Path(tmp) / f"fleet{n}.duckdb"), str(Path(tmp) / f"fleet{n}-019.duckdb")
            asyncio.run(build(db, n))
            shutil.copy(db, ref)
            con = duckdb.connect(ref)
            con.execute(reference_view())
            con.close()
            figures: dict[str, list[dict]] = {"022": [], "019": []}
            for _ in range(3):  # alternately, so that a slower minute of the machine weighs on both
                figures["022"].append(asyncio.run(fast_runs(db, args.rounds)))
                figures["019"].append(asyncio.run(fast_runs(ref, args.rounds)))
            print(f"{n} instances, {LINES} lines x 3 streams each; fast run medians of {args.rounds} runs, 3 rounds:")
            for key in figures["022"][0]:
                new = statistics.median(f[key] for f in figures["022"])
                old = statistics.median(f[key] for f in figures["019"] if key in f)
                print(f"  {key:24s} {new * 1000:8.1f} ms   019's log_streams {old * 1000:8.1f} ms   ratio {new / old:.2f}x")


if __name__ == "__main__":
    main()
