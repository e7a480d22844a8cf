"""/metrics under a flood of distinct GPU series: its size and scrape time against an empty server's.

Starts ``fleetlog serve`` on a scratch database, scrapes /metrics (the reference: an empty server,
same run), then sends BENCH_FLOOD_PUSHES (default 8) pushes of BENCH_FLOOD_SAMPLES (default 50,000)
DCGM samples, each with a distinct ``UUID`` label (one instance per push), and scrapes again. Prints
the size and the time of a scrape, their ratios to the reference, the GPU series exposed, and the
server's peak RSS. Before the series caps (gpu_gauge_max_series, gpu_gauge_max_series_per_instance)
every pushed series was exposed: 57.8 MB and 36-45 s a scrape.

    python bench/metrics_flood.py
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Server  # noqa: E402

PUSHES = int(os.environ.get("BENCH_FLOOD_PUSHES", "8"))
SAMPLES = int(os.environ.get("BENCH_FLOOD_SAMPLES", "50000"))


def scrape(url: str) -> tuple[int, float, int]:
    """(bytes, seconds, GPU series) of one scrape."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url + "/metrics", timeout=600) as r:
        body = r.read()
    seconds = time.perf_counter() - t0
    return len(body), seconds, sum(1 for line in body.split(b"\n") if line.startswith(b"DCGM_FI_"))


def push(url: str, instance_id: str, first: int) -> None:
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    samples = [{"name": "DCGM_FI_DEV_GPU_UTIL", "ts": now, "value": 97,
                "labels": {"gpu": "0", "UUID": f"GPU-{first + i:08d}", "modelName": "NVIDIA RTX PRO 4000"}}
               for i in range(SAMPLES)]
    body = json.dumps({"instance_id": instance_id, "samples": samples}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + "/api/v1/metrics", data=body, method="POST"), timeout=600) as r:
        assert r.status == 200, r.status


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "flood.duckdb", "--policy-interval", "0")
        try:
            ref = min((scrape(server.url) for _ in range(3)), key=lambda s: s[1])
            for p in range(PUSHES):
                push(server.url, f"C.{p}", p * SAMPLES)
            flood = scrape(server.url)
            rss = peak_rss_mb(server.proc.pid)
        finally:
            server.stop()
    print(f"empty server:  {ref[0] / 1e6:8.3f} MB  {ref[1]:7.3f} s  {ref[2]} GPU series")
    print(f"after {PUSHES}x{SAMPLES}: {flood[0] / 1e6:8.3f} MB  {flood[1]:7.3f} s  {flood[2]} GPU series"
          f"  (peak RSS {rss:.0f} MB)")
    print(f"ratio: size {flood[0] / ref[0]:.1f}x, scrape time {flood[1] / ref[1]:.1f}x the empty server's")


if __name__ == "__main__":
    main()
