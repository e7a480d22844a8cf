"""Retention on a lake while its nodes ingest: how long a retention delete takes, and what it does to
the acknowledgement (commit) latency of the ingest around it, against the same ingest without
retention, measured in the same run on the same nodes.

Rounds alternate: ingest alone, then ingest while this process carries out retention deletes one
after another, each the way a node's writer does (``lake.write_batch`` with a ``lake.LakeAction``
inside the delete window, ingest/db/lake/jobs.py), each deleting one stale instance seeded beforehand.
A last round runs the same deletes without the window (the DuckLake DELETE as it was before), to
count how many of them commit beside ingest (and how many pushes fail: a DELETE that wins makes the
inserts around it fail). Printed: lines/s, push p50/p99 and failed pushes per round, deletes
committed, delete p50/max, and push p99 as a ratio to the ingest-alone round before it.

On a 2-core machine the nodes, PostgreSQL and the load share the CPUs: the figures are noisy
(run it 2-3 times) and show the window's cost, not a production latency.

    .venv/bin/python bench/lake_retention.py [--nodes 3] [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile  # noqa: E402
from bench.lake_nodes import LakeNodes, post, run_load  # noqa: E402
from tests.lake_pg import Postgres, pg_bin  # noqa: E402


class Deleter:
    """Retention deletes, one stale instance each, one after another until stopped."""

    def __init__(self, dsn: str, data: Path, stale: list[str], windowed: bool) -> None:
        from ingest.db.lake import storage as lake, jobs as lakejobs
        from ingest.contract.codec import MetricRows
        from ingest.timestamps import now_us
        from ingest.db.writes import delete_logs as _delete_logs
        from ingest.db.store import LogColumns

        self.con = lake.open_lake(dsn, str(data))
        self.window = lakejobs.DeleteWindow(dsn.removeprefix("postgres:")) if windowed else None
        self.stale, self.seconds, self.failed = stale, [], 0
        self.stop = threading.Event()

        def one(instance_id: str) -> None:
            action = lake.LakeAction(lambda con: _delete_logs(con, instance_id))
            lake.write_batch(self.con, LogColumns.empty(), [], MetricRows(), {}, now_us(), [action], window=self.window)

        self.one = one
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.is_set() and self.stale:
            instance_id = self.stale.pop()
            t0 = time.perf_counter()
            try:
                self.one(instance_id)
                self.seconds.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 (a conflict: counted)
                self.failed += 1
            self.stop.wait(0.2)

    def __enter__(self) -> "Deleter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        if self.window is not None:
            self.window.close()
        self.con.close()


def seed(urls: list[str], n: int, lines: int) -> list[str]:
    """``n`` instances of ``lines`` lines each, killed (stale); their names."""
    names = [f"STALE.{k}" for k in range(n)]
    for k, name in enumerate(names):
        url = urls[k % len(urls)]
        for start in range(0, lines, 500):
            post(url + "/api/v1/logs", {"instance_id": name, "source": "benchout", "lines": [
                {"seq": s, "ts": 1795951000.0 + s, "line": f"stale line {s}"} for s in range(start, min(lines, start + 500))]})
        post(url + "/api/v1/events", {"instance_id": name, "kind": "killed", "ts": 1795951500})
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pushers", type=int, default=4)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--stale-lines", type=int, default=2000)
    args = parser.parse_args()
    bindir = pg_bin()
    if bindir is None:
        sys.exit("PostgreSQL server binaries missing: run scripts/test-deps.sh")
    load = dict(seconds=args.seconds, pushers=args.pushers, instances=args.instances, batch=args.batch)
    print(f"cores: {os.cpu_count()}  nodes: {args.nodes}  load: {load}")
    print("On few cores the nodes, PostgreSQL and this load share the CPUs: noisy; compare within a run.")
    results = []
    with tempfile.TemporaryDirectory(prefix="fleetlog-lakeret-") as tmp_name:
        tmp = Path(tmp_name)
        pg = Postgres(bindir).start()
        try:
            dsn = pg.createdb("retention")
            nodes = LakeNodes(args.nodes, dsn, tmp, extra=("--lake-maintenance-interval-s", "0"))
            try:
                stale = seed(nodes.urls, 40 * (args.rounds + 1), args.stale_lines)
                for _ in range(args.rounds):
                    results.append(("ingest alone", run_load(nodes.urls, **load), None))
                    with Deleter(dsn, tmp / "lake", stale, windowed=True) as deleter:
                        ingest = run_load(nodes.urls, **load)
                    results.append(("ingest + retention (window)", ingest, deleter))
                with Deleter(dsn, tmp / "lake", stale, windowed=False) as deleter:
                    ingest = run_load(nodes.urls, **load)
                results.append(("ingest + DELETE, no window", ingest, deleter))
            finally:
                nodes.stop()
        finally:
            pg.stop()
    print(f"{'':28} {'lines/s':>9} {'push p50 ms':>12} {'push p99 ms':>12} {'x alone':>8} {'failed pushes':>14} "
          f"{'deletes ok/tried':>17} {'delete p50 ms':>14} {'delete max ms':>14}")
    reference = None
    for name, r, deleter in results:
        if deleter is None:
            reference = r
        ratio = r["push_p99_ms"] / reference["push_p99_ms"]
        dels = "" if deleter is None else f"{len(deleter.seconds)}/{len(deleter.seconds) + deleter.failed}"
        p50 = f"{percentile(deleter.seconds, 50) * 1e3:.1f}" if deleter and deleter.seconds else "-"
        top = f"{max(deleter.seconds) * 1e3:.1f}" if deleter and deleter.seconds else "-"
        print(f"{name:28} {r['lines_s']:9.0f} {r['push_p50_ms']:12.1f} {r['push_p99_ms']:12.1f} {ratio:8.2f} {r['failed_pushes']:14d} {dels:>17} "
              f"{p50:>14} {top:>14}")


if __name__ == "__main__":
    main()
