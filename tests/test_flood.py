"""The memory budget under a flood: 64 clients pushing 5,000-line bodies of 100-400-character lines
into a real ``fleetlog serve`` with a 256 MB budget. The server's peak RSS stays under its warmed-up
baseline plus the budget, beyond it clients get 503 + Retry-After, and every acknowledged line is
stored exactly once."""

from __future__ import annotations

import asyncio
import urllib.request

import orjson

from bench.flood_memory import flood, rss_kib
from tests.conftest import read_db

BUDGET_MB = 256


def test_flood_stays_under_the_memory_budget_and_loses_nothing(server_process):
    server = server_process("--memory-budget-mb", str(BUDGET_MB), "--duckdb-memory-limit-mb", "64", "--log-level", "WARNING").start()
    warm = orjson.dumps({"instance_id": "C.warm", "source": "s", "lines": [{"seq": i, "line": "x" * 300} for i in range(5000)]})
    request = urllib.request.Request(server.url + "/api/v1/logs", data=warm, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        assert r.status == 200
    baseline_mib = rss_kib(server.proc.pid, "VmRSS") / 1024
    result = asyncio.run(flood(server.url, clients=64, bodies=2, lines=5000, min_len=100, max_len=400, deadline_s=500))
    peak_mib = rss_kib(server.proc.pid, "VmHWM") / 1024
    assert not result.other_errors, result.other_errors[:10]
    assert result.lines == 64 * 2 * 5000
    assert peak_mib - baseline_mib <= BUDGET_MB, (peak_mib, baseline_mib)
    server.stop()
    stored = dict(read_db(str(server.db), """SELECT instance_id, count(*) FROM logs WHERE instance_id LIKE 'C.flood-%'
                                             GROUP BY 1"""))
    assert stored == result.acknowledged
    [(rows, distinct)] = read_db(str(server.db), "SELECT count(*), count(DISTINCT (instance_id, source, run_id, seq)) FROM logs")
    assert rows == distinct == result.lines + 5000
