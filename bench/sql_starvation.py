"""The page's instance list while slow SQL API queries run: p50/max latency against an idle server.

Starts ``fleetlog serve`` on a scratch database with a few hundred instances, measures
``GET /api/v1/instances`` idle (the reference), then again while BENCH_SQL_SLOW (default 6) slow
SQL queries are in flight (each a count over generated rows, interrupted at query_timeout_s), and
prints the ratios (max is what starvation shows: on main the first list waited ~19.5 s, the
whole query_timeout_s of the slow queries; with the Reader ~0.1 s). With the Reader, user SQL runs on its own pool (query_max_concurrent, the rest 429)
and the instance list does not wait behind it.

    python bench/sql_starvation.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import ServerProcess  # noqa: E402

SLOW = int(os.environ.get("BENCH_SQL_SLOW", "6"))
SAMPLES = int(os.environ.get("BENCH_SQL_SAMPLES", "30"))


def call(url: str, body: dict | list | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST" if data else "GET"), timeout=120) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def latencies(url: str) -> list[float]:
    out = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        assert call(url + "/api/v1/instances") == 200
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "db.duckdb", Path(tmp) / "log", "--query-timeout-s", "20").start()
        try:
            events = [{"instance_id": f"C.{i}", "kind": "registered", "ts": 1795951000, "machine_id": i} for i in range(300)]
            assert call(server.url + "/api/v1/events", events) == 200
            idle = latencies(server.url)
            statuses: list[int] = []
            slow = [threading.Thread(target=lambda: statuses.append(call(server.url + "/api/v1/query", {
                "sql": "SELECT count(*) FROM range(100000000000) a"}))) for _ in range(SLOW)]
            for t in slow:
                t.start()
            time.sleep(0.5)
            busy = latencies(server.url)
            for t in slow:
                t.join()
        finally:
            server.stop()
    p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
    print(f"instance list idle:             p50 {p50_idle * 1000:7.1f} ms  max {max(idle) * 1000:7.1f} ms")
    print(f"instance list with {SLOW} slow SQL: p50 {p50_busy * 1000:7.1f} ms  max {max(busy) * 1000:7.1f} ms")
    print(f"ratio busy/idle: p50 {p50_busy / p50_idle:.2f}x, max {max(busy) / max(idle):.2f}x; "
          f"slow SQL answers: {sorted(statuses)}")


if __name__ == "__main__":
    main()
