"""GET /api/v1/instances (the list the page polls every 5 s) at 1,000 instances, against the same
server built from an earlier commit, in the same run.

Two servers, each holding the same 1,000 instances (bench/page_triage.py's fleet: passed, failed,
below min_rate, a failed parameter fetch, still benchmarking; the policies run once): one from this
tree, one from BENCH_REF_COMMIT (default 10c2dda, the commit before the list joined unproven_burn ->
instance_costs for its ``unproven``), checked out with ``git archive`` into a temporary directory.
The list is fetched ROUNDS times from each, interleaved so that the machine's load falls on both
alike; the answer's time is from the request to its last byte.

    python bench/instances_api.py       # BENCH_TRIAGE_INSTANCES=1000 BENCH_API_ROUNDS=40 BENCH_REF_COMMIT=10c2dda
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, Server  # noqa: E402
from bench.page_triage import INSTANCES, fill  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_API_ROUNDS", "40"))
REF_COMMIT = os.environ.get("BENCH_REF_COMMIT", "10c2dda")
SERVER_ARGS = ("--policy-interval", "0", "--duckdb-memory-limit-mb", "1024", "--memory-budget-mb", "2048")


def start_from(tree: Path, db: Path) -> Server:
    """bench.common's Server, run from a checkout: its ingest/ and queries/."""
    here = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)  # the child's ingest/ is the tree's
    import bench.common as common

    saved, common.REPO = common.REPO, tree  # Server runs its child in REPO
    try:
        return Server(db, *SERVER_ARGS)
    finally:
        common.REPO = saved
        if here is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = here


def fetch_s(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url + "/api/v1/instances", timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = Path(tmp) / "ref"
        ref_tree.mkdir()
        archive = subprocess.run(["git", "archive", REF_COMMIT], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(ref_tree)], input=archive, check=True)
        servers = {}
        try:
            servers["this tree"] = start_from(REPO, Path(tmp) / "now.duckdb")
            servers[REF_COMMIT] = start_from(ref_tree, Path(tmp) / "ref.duckdb")
            for server in servers.values():
                fill(server.url, INSTANCES)
            sizes = {name: fetch_s(s.url)[1] for name, s in servers.items()}  # warm: the first answer opens the views
            times: dict[str, list[float]] = {name: [] for name in servers}
            for _ in range(ROUNDS):
                for name, server in servers.items():
                    times[name].append(fetch_s(server.url)[0])
        finally:
            for server in servers.values():
                server.stop()
    for name, ts in times.items():
        print(f"GET /api/v1/instances, {INSTANCES} instances, {name:>9}: median {statistics.median(ts) * 1000:.1f} ms, "
              f"p90 {sorted(ts)[int(len(ts) * 0.9)] * 1000:.1f} ms over {len(ts)} ({sizes[name]:,} bytes)")
    ratio = statistics.median(times["this tree"]) / statistics.median(times[REF_COMMIT])
    print(f"this tree / {REF_COMMIT}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
