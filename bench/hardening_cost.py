"""What the input bounds cost: HTTP ingest of this tree against a base ref (default main), measured
in the same run, alternating A B A B, with the same bodies and client as ``ingest_throughput.py``.

Two figures per tree: lines/s (wall clock; noisy on a shared machine) and the server process's CPU
seconds per million lines (user + system, from /proc: what the hardening itself costs, steadier
under load). Target: this tree's lines/s >= 0.90x the base, its CPU per line <= 1.10x.

    python bench/hardening_cost.py [BASE_REF]      # ROUNDS=3 BENCH_LINES=200000 BENCH_CONCURRENCY=8
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port  # noqa: E402
from bench.ingest_throughput import BODY_LINES, _send_all, make_bodies  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "8"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(tree: Path, bodies: list[bytes], directory: Path) -> tuple[float, float]:
    """(lines/s, server CPU seconds per million lines) of a fresh server of ``tree``."""
    port = free_port()
    db = directory / f"{tree.name}-{time.monotonic_ns()}.duckdb"
    with open(db.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "serve", "--port", str(port), "--db", str(db), "--log-level", "WARNING",
             "--otlp-grpc-port", "0", "--policy-interval-s", "0"],
            cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/readyz", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(db.with_suffix(".log").read_text()[-2000:]) from None
                time.sleep(0.05)
        cpu0 = cpu_seconds(proc.pid)
        elapsed, _latencies = asyncio.run(_send_all(url, bodies, CONCURRENCY))
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    lines = len(bodies) * BODY_LINES
    return lines / elapsed, cpu / lines * 1e6


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else "main"
    rounds = int(os.environ.get("ROUNDS", "3"))
    bodies = make_bodies(int(os.environ.get("BENCH_LINES", "200000")))
    results: dict[str, list[tuple[float, float]]] = {base: [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="fleetlog-base-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=REPO, check=True, capture_output=True)
        try:
            for _ in range(rounds):
                results[base].append(run_once(tree, bodies, Path(tmp)))
                results["this tree"].append(run_once(REPO, bodies, Path(tmp)))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False, capture_output=True)
    medians = {}
    for name, runs in results.items():
        rate, cpu = statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs)
        medians[name] = (rate, cpu)
        print(f"{name:>10}: {', '.join(f'{r:,.0f}' for r, _ in runs)} lines/s (median {rate:,.0f}); "
              f"server CPU {', '.join(f'{c:.2f}' for _, c in runs)} s per million lines (median {cpu:.2f})")
    (b_rate, b_cpu), (a_rate, a_cpu) = medians[base], medians["this tree"]
    print(f"ratio this tree / {base}: lines/s {a_rate / b_rate:.2f} (target >= 0.90), CPU per line {a_cpu / b_cpu:.2f} (target <= 1.10)")


if __name__ == "__main__":
    main()
