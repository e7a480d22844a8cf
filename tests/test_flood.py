"""The memory budget under a flood: 64 clients pushing 5,000-line bodies of 100-400-character lines
into a real ``fleetlog serve`` with a 256 MB budget. The server's peak RSS stays under its warmed-up
baseline plus the budget, beyond it clients get 503 + Retry-After, and every acknowledged line is
stored exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
import urllib.request

import orjson
import pytest

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


TRIM_PROBE = """
import sys, time
from ingest.budget import start_heap_trimmer

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

big = bytearray(400_000)
del big  # a large block freed: glibc raises its mmap threshold, later ones come from the heap
held = [bytearray(300_000) for _ in range(400)]  # ~115 MiB in the heap
pin = bytearray(300_000)  # after them: the heap's top is in use, so free() alone gives nothing back
before = rss_mib()
del held
freed = rss_mib()
trimming = sys.argv[1] == "trim" and start_heap_trimmer(0.05)
deadline = time.monotonic() + 30
while trimming and rss_mib() > before - 80 and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, freed, rss_mib())
"""


@pytest.mark.parametrize("trim", [False, True])
def test_what_the_server_frees_leaves_its_rss(trim):
    """glibc keeps freed blocks in its heaps: without the server's trimmer (``budget.start_heap_trimmer``) the
    ~115 MiB freed here stay resident; with it they go back to the system (the flood above stayed over its
    budget once freed bodies piled up)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TRIM_PROBE, "trim" if trim else "keep"], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
    assert out.returncode == 0, out.stderr
    before, freed, after = map(float, out.stdout.split())
    assert freed > before - 20, (before, freed)  # free() alone gave (almost) nothing back
    if trim:
        assert after < before - 80, (before, freed, after)
    else:
        assert after > before - 20, (before, freed, after)
