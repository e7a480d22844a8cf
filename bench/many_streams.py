"""One instance opening many log streams: push time at BENCH_STREAMS streams against at 1,000, and
another instance's 1-line pushes meanwhile.

Starts ``fleetlog serve`` on a scratch database (``max_streams_per_instance`` raised to fit), then
one instance pushes BENCH_STREAMS_PER_PUSH (default 1,000) new sources per push until it holds
BENCH_STREAMS (default 16,000) streams, while another instance pushes one line at a time in a loop.
Prints the flood's push time over its first two and its last two pushes and their ratio, and the other instance's
1-line push median idle (before the flood), early in the flood and late in it.

Issue 20 item 9, on main: 1.0 s to 8.8 s per push (the writer scanned all of the instance's streams
for each new source), and the other instance's 1-line push 98 ms idle, 3.3 s late in the flood.

    python bench/many_streams.py        # BENCH_STREAMS=16000 BENCH_STREAMS_PER_PUSH=1000
"""

from __future__ import annotations

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

import orjson  # noqa: E402

from bench.common import Server  # noqa: E402

STREAMS = int(os.environ.get("BENCH_STREAMS", "16000"))
PER_PUSH = int(os.environ.get("BENCH_STREAMS_PER_PUSH", "1000"))


def post(url: str, doc) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(url + "/api/v1/logs", data=orjson.dumps(doc), method="POST")
    with urllib.request.urlopen(request, timeout=300) as r:
        r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - started


def flood_push(url: str, first: int) -> float:
    return post(url, {"streams": [
        {"instance_id": "C.flood", "source": f"src-{k}", "lines": [{"seq": 0, "ts": 1795951000, "line": "x"}]}
        for k in range(first, first + PER_PUSH)]})


class Other(threading.Thread):
    """Another instance's 1-line pushes, back to back (20 ms apart): (stored streams then, latency)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.phase = 0  # the flood's streams when each push started
        self.samples: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            latency = post(self.url, {"instance_id": "C.other", "source": "benchout",
                                      "lines": [{"seq": self.seq, "ts": 1795951000, "line": "one line"}]})
            self.seq += 1
            self.samples.append((phase, latency))
            self.stop.wait(0.02)


def main() -> None:
    os.environ["FLEETLOG_MAX_STREAMS_PER_INSTANCE"] = str(STREAMS + PER_PUSH)  # main has no such setting and ignores it
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "db.duckdb")
        try:
            idle = [post(server.url, {"instance_id": "C.other", "source": "idle", "lines": [{"seq": i, "line": "x"}]})
                    for i in range(30)]
            other = Other(server.url)
            other.start()
            pushes: list[tuple[int, float]] = []
            for first in range(0, STREAMS, PER_PUSH):
                other.phase = first
                pushes.append((first + PER_PUSH, flood_push(server.url, first)))
                print(f"  {first + PER_PUSH:6d} streams: push {pushes[-1][1]:6.2f} s", flush=True)
            other.stop.set()
            other.join()
        finally:
            server.stop()
    early = [s for phase, s in other.samples if phase < 2 * PER_PUSH]
    late = [s for phase, s in other.samples if phase >= STREAMS - 2 * PER_PUSH]
    first_s, last_s = statistics.median(s for _n, s in pushes[:2]), statistics.median(s for _n, s in pushes[-2:])
    print(f"flood push ({PER_PUSH} new sources, mean of two): to {2 * PER_PUSH} streams {first_s:.2f} s, to {STREAMS} "
          f"streams {last_s:.2f} s: ratio {last_s / first_s:.2f}x")
    print(f"other instance's 1-line push: idle p50 {statistics.median(idle) * 1000:.1f} ms; during the flood p50 "
          f"{statistics.median(early) * 1000:.1f} ms early ({len(early)}), {statistics.median(late) * 1000:.1f} ms late "
          f"({len(late)}): late/idle {statistics.median(late) / statistics.median(idle):.1f}x")


if __name__ == "__main__":
    main()
