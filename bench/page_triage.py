"""First paint of the triage view (the page's opening view) at 1,000 instances, against 10.

Two servers in the same run, one holding 1,000 instances (varied: passed, failed with a class, below
min_rate, a failed parameter fetch, still benchmarking; 200 machines, 5 GPU models, 8 locations,
the policies run once, so destroys are proposed and machines excluded), the other 10 of the same
kind. Debian's Chromium (Playwright) opens "/" on each, cold, RUNS times; first paint is the time
from navigation start until the list's first row and the counts are in the DOM and a frame has been
drawn after them (a MutationObserver installed before the page's scripts, then requestAnimationFrame).
Goal (issue 24): <= 1 s at 1,000 instances. The servers get DuckDB 1 GiB (--duckdb-memory-limit-mb
1024): at the default 256 MiB, POST /api/v1/policy/run over 1,000 instances is a 503 out of memory.

    python bench/page_triage.py        # BENCH_TRIAGE_INSTANCES=1000 BENCH_TRIAGE_RUNS=5
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Server  # noqa: E402

INSTANCES = int(os.environ.get("BENCH_TRIAGE_INSTANCES", "1000"))
RUNS = int(os.environ.get("BENCH_TRIAGE_RUNS", "5"))
CHROMIUM = os.environ.get("FLEETLOG_CHROMIUM", "/usr/bin/chromium")
GPUS = ["RTX 4090", "RTX 3090", "RTX PRO 4000", "A100", "H100"]
LOCATIONS = ["US-CA", "US-TX", "DE", "FR", "PL", "JP", "SG", "BR"]

FIRST_PAINT = """
new MutationObserver((_, observer) => {
  if (document.querySelector('#fleet-table tbody tr[data-instance]') && document.querySelector('#counts .n')) {
    observer.disconnect();
    requestAnimationFrame(() => setTimeout(() => { window.__firstPaint = performance.now(); }, 0));
  }
}).observe(document, { childList: true, subtree: true });
"""


def iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def post(url: str, path: str, doc, tries: int = 60) -> None:
    """POST, waiting out a 503 (the writer's queue full) as its Retry-After says."""
    why = b""
    for _ in range(tries):
        request = urllib.request.Request(url + path, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                assert r.status == 200, r.read()
                return
        except urllib.error.HTTPError as e:
            if e.code != 503:
                raise
            why = e.read()[:200]
            time.sleep(float(e.headers.get("Retry-After") or 1))
    raise RuntimeError(f"{path}: still 503 after {tries} tries: {why!r}")


def fill(url: str, n: int) -> None:
    rng = random.Random(24)
    now = dt.datetime.now(dt.timezone.utc)
    events = []
    for k in range(n):
        iid = f"C.{91000000 + k}"
        machine = 1000 + k % 200
        done = now - dt.timedelta(minutes=rng.randint(1, 600))
        started = done - dt.timedelta(minutes=10)
        events.append({"instance_id": iid, "kind": "registered", "ts": iso(started - dt.timedelta(minutes=4)), "machine_id": machine,
                       "host_id": machine * 10, "gpu_model": GPUS[machine % len(GPUS)], "gpu_count": 1 + (k % 7 == 0),
                       "dph": round(rng.uniform(0.2, 2.5), 3), "location": LOCATIONS[machine % len(LOCATIONS)]})
        kind = rng.random()
        if kind < 0.05:  # the parameter fetch failed
            events.append({"instance_id": iid, "kind": "params_done", "ts": iso(started), "exit_code": 2})
            continue
        events.append({"instance_id": iid, "kind": "params_done", "ts": iso(started - dt.timedelta(seconds=1)), "exit_code": 0})
        events.append({"instance_id": iid, "kind": "bench_started", "ts": iso(started), "proofs": 12, "concurrency": 3, "partition_workers": 16})
        if kind < 0.15:  # still benchmarking
            continue
        failed = kind < 0.30
        rate = 0.0 if failed else round(rng.uniform(10, 50), 1)
        events.append({"instance_id": iid, "kind": "bench_done", "ts": iso(done), "exit_code": 1 if failed else 0, "rate_per_hour": rate,
                       "duration_s": 600.0, "proofs_ok": 0 if failed else 12,
                       "failure_excerpt": "CUDA error: out of memory (cudaErrorMemoryAllocation)" if failed else None})
        if not failed and rate >= 29:
            events.append({"instance_id": iid, "kind": "running", "ts": iso(done + dt.timedelta(seconds=5))})
    for i in range(0, len(events), 200):
        post(url, "/api/v1/events", events[i:i + 200])
    try:  # destroys proposed, machines excluded: the counts on top have something to count
        post(url, "/api/v1/policy/run", {}, tries=3)
    except (RuntimeError, urllib.error.HTTPError) as e:
        print(f"(policy run refused: {e}; the counts of decisions stay 0)", file=sys.stderr)


async def first_paint(url: str) -> float:
    import asyncio

    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            await context.add_init_script(FIRST_PAINT)
            page = await context.new_page()
            await page.goto(url + "/")
            for _ in range(600):  # evaluate, not wait_for_function: the page's CSP allows no eval
                painted = await page.evaluate("window.__firstPaint")
                if painted is not None:
                    return painted / 1000
                await asyncio.sleep(0.05)
            raise RuntimeError("the triage view did not paint in 30 s")
        finally:
            await browser.close()


def main() -> None:
    import asyncio

    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for n in (10, INSTANCES):
                servers[n] = Server(Path(tmp) / f"triage{n}.duckdb", "--policy-interval", "0", "--duckdb-memory-limit-mb", "1024", "--memory-budget-mb", "2048")
                fill(servers[n].url, n)
            results = {n: [] for n in servers}
            for _ in range(RUNS):  # interleaved, so that the machine's load falls on both alike
                for n, server in servers.items():
                    results[n].append(asyncio.run(first_paint(server.url)))
        finally:
            for server in servers.values():
                server.stop()
    for n, times in results.items():
        print(f"first paint, triage view, {n:>5} instances: median {statistics.median(times):.3f} s, "
              f"max {max(times):.3f} s over {len(times)} cold loads")
    print(f"goal: <= 1 s at {INSTANCES}: {'met' if statistics.median(results[INSTANCES]) <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
