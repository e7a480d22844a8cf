"""Every answer is bounded in bytes: a user query's result is counted as it is fetched and refused
past ``query_max_result_bytes`` (413 naming it), whatever the format, and what a query holds counts
against the memory budget, so the read token cannot take a real ``fleetlog serve`` past its budget."""

from __future__ import annotations

import concurrent.futures
import urllib.error
import urllib.request

import orjson

from bench.flood_memory import rss_kib

ENROLL, READ, ADMIN = "enroll-7f3a", "read-91bc", "admin-c2d4"
BUDGET_MB = 256
# 2 x ~150 MB of 100-byte rows, in every format. Before results were bounded in bytes, these took the
# server ~1.2 GB over its baseline with a 256 MB budget. (Rows of kilobytes are buffered by DuckDB
# 1.5.5 itself before the first is fetched, duckdb/duckdb-python#617: not bounded here.)
BIG_SQL = "SELECT repeat('x', 94) || lpad(i::VARCHAR, 6, '0') AS s FROM range(1500000) r(i)"


def _query(url: str, sql: str, fmt: str, token: str = READ) -> tuple[int, bytes]:
    request = urllib.request.Request(url + f"/api/v1/query?format={fmt}", data=orjson.dumps({"sql": sql}),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_big_results_are_refused_413_under_the_budget_in_every_format(server_process):
    server = server_process("--memory-budget-mb", str(BUDGET_MB), "--duckdb-memory-limit-mb", "64", "--query-max-rows", "2000000",
                            "--read-token", READ, "--admin-token", ADMIN, "--enroll-token", ENROLL,
                            "--log-level", "WARNING").start()
    for fmt in ("json", "csv", "arrow"):  # warm every path: its modules and first allocations are baseline
        assert _query(server.url, "SELECT repeat('x', 1000) AS s FROM range(1000)", fmt)[0] == 200
    baseline_mib = rss_kib(server.proc.pid, "VmRSS") / 1024
    answers = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for fmt in ("json", "csv", "arrow"):
            answers += [(fmt, *f.result()) for f in [pool.submit(_query, server.url, BIG_SQL, fmt) for _ in range(2)]]
    assert server.proc.poll() is None, "the server died"
    peak_mib = rss_kib(server.proc.pid, "VmHWM") / 1024
    statuses = [(fmt, status, len(body)) for fmt, status, body in answers]
    assert peak_mib - baseline_mib <= BUDGET_MB, (peak_mib, baseline_mib, statuses)
    for fmt, status, body in answers:
        assert status in (413, 503, 408), (fmt, status, len(body))  # past the cap, the budget or the deadline
        if status == 413:
            assert "query_max_result_bytes" in orjson.loads(body)["error"]
    assert any(status == 413 for _, status, _ in answers)
    assert _query(server.url, "SELECT 1 AS one", "json") == (200, b'{"columns":["one"],"rows":[[1]],"truncated":false}')
