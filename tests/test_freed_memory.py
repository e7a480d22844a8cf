"""What the server frees leaves its RSS, whichever allocator held it (the memory budget's promise, and the RSS the
bench compares with VictoriaLogs').

Three allocators hold the server's memory: glibc's malloc (Python's objects; ``budget.start_heap_trimmer`` hands
its free pages back), Arrow's pool (the bodies' columns, the writer's tables) and DuckDB's own jemalloc (queries,
checkpoints). Arrow's default pool, mimalloc, kept every page it ever held: 300 MB of arrays built on one thread and
freed on another left 612 MiB resident. DuckDB's jemalloc kept a query's 220 MiB until the next query of the same
size reused it. Each test builds and frees memory as the server does, in a process of its own, and waits (polling,
generous deadline) for the RSS to come back near where it began.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RSS = r"""
import time
def rss_mib():
    return int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS")][0]) >> 10
def settles(base, slack_mib, deadline_s=20.0):
    # the lowest RSS seen while waiting for it to fall within slack_mib of base
    low, end = rss_mib(), time.monotonic() + deadline_s
    while low > base + slack_mib and time.monotonic() < end:
        time.sleep(0.1)
        low = min(low, rss_mib())
    return low
"""

ARROW_PROBE = RSS + r"""
import threading
import pyarrow as pa
from ingest import budget
budget.start_heap_trimmer(0.1)
budget.arrow_on_glibc()
base = rss_mib()
held = []
def build():  # the event loop parses bodies into columns...
    for _ in range(10_000):
        held.append(pa.array(["x" * 150] * 100))  # ~150 MB in all
thread = threading.Thread(target=build); thread.start(); thread.join()
peak = rss_mib()
thread = threading.Thread(target=held.clear); thread.start(); thread.join()  # ...the writer frees them
print(pa.default_memory_pool().backend_name, base, peak, settles(base, 40))
"""


def _run(probe: str) -> str:
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, cwd=REPO,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_arrow_buffers_freed_on_another_thread_leave_the_rss():
    pool, base, peak, low = _run(ARROW_PROBE).split()
    base, peak, low = int(base), int(peak), int(low)
    assert pool == "system"
    assert peak - base > 100, (base, peak)  # the arrays were really there
    assert low <= base + 40, (base, peak, low)  # mimalloc kept them all (612 of 625 MiB for twice as many)


DUCKDB_PROBE = RSS + r"""
import sys
from ingest.db import store
con = store.open_database(sys.argv[1], memory_limit_mb=256, threads=1)
base = rss_mib()
# a query of an engineer at the SQL prompt: a hash table of 3 M strings, ~220 MiB at its peak
con.execute("SELECT count(DISTINCT i::VARCHAR || 'abcdefghijkl') FROM range(3000000) t(i)").fetchall()
peak = rss_mib()
print(base, peak, settles(base, 40))
"""


def test_a_large_query_s_memory_leaves_the_rss_once_done(tmp_path):
    out = subprocess.run([sys.executable, "-c", DUCKDB_PROBE, str(tmp_path / "f.duckdb")], capture_output=True, text=True,
                         timeout=180, cwd=REPO, start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    base, peak, low = map(int, out.stdout.split())
    assert peak - base > 100, (base, peak)
    assert low <= base + 40, (base, peak, low)  # jemalloc kept it (310 MiB for a 91 MiB base, 3 s later)


def test_the_server_takes_arrow_buffers_from_glibc(server_process):
    server = server_process().start()
    assert "pool system" in server.wait_for_log(r"Arrow buffers from glibc's malloc \(pool \w+\)").group(0)
    with urllib.request.urlopen(server.url + "/readyz", timeout=10) as r:
        assert r.status == 200
