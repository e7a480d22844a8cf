"""Lake mode with 1, 2 and 3 nodes in one run, against one single-file server measured in the same run.

Every configuration gets the same load for ``--seconds``: ``--pushers`` threads, each owning
``--instances`` instances and pushing batches of ``--batch`` lines to the nodes in turn (so about
(n-1)/n of the pushes are forwarded to the owner), while one thread tails random instances on random
nodes. Printed per configuration: aggregate acknowledged lines/s, push (commit) p50/p99, tail p99,
each as a ratio to the single file.

On a 2-core machine the nodes, PostgreSQL and the load generator share the same two cores: this
measures the lake's overheads (two commits per group, the fence query, forwarding hops, Parquet
tails), not scaling. Scaling needs a core budget per node.

    .venv/bin/python bench/lake_nodes.py [--seconds 15] [--pushers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, Server, free_port, make_line, percentile  # noqa: E402
from tests.lake_pg import Postgres, pg_bin  # noqa: E402


def post(url: str, doc, failures: list[int] | None = None) -> bool:
    """POST, retrying 503/429; another error raises, or with ``failures`` is appended there (False)."""
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
                return True
        except urllib.error.HTTPError as e:
            if e.code not in (503, 429):
                if failures is None:
                    raise
                failures.append(e.code)
                return False
            time.sleep(0.05)


def run_load(urls: list[str], seconds: float, pushers: int, instances: int, batch: int) -> dict[str, float]:
    rng = random.Random(7)
    lines = [make_line(rng, n) for n in range(2000)]
    stop = threading.Event()
    push_s: list[float] = []
    tail_s: list[float] = []
    acked = [0]
    failures: list[int] = []  # pushes answered with an error (not 503/429): their lines are not acknowledged
    lock = threading.Lock()
    names = [f"B.{k}.{j}.{uuid.uuid4().hex[:6]}" for k in range(pushers) for j in range(instances)]

    def pusher(k: int) -> None:
        mine = names[k * instances:(k + 1) * instances]
        seq = {i: 0 for i in mine}
        turn = k
        while not stop.is_set():
            for instance in mine:
                start = seq[instance]
                doc = {"instance_id": instance, "source": "benchout",
                       "lines": [{"seq": s, "ts": 1795951000.0 + s, "line": lines[s % len(lines)]} for s in range(start, start + batch)]}
                t0 = time.perf_counter()
                ok = post(urls[turn % len(urls)] + "/api/v1/logs", doc, failures)
                turn += 1
                if not ok:
                    continue  # the same lines again next time
                with lock:
                    push_s.append(time.perf_counter() - t0)
                    acked[0] += batch
                seq[instance] = start + batch

    def tailer() -> None:
        trng = random.Random(11)
        while not stop.is_set():
            url = trng.choice(urls) + f"/api/v1/instances/{trng.choice(names)}/logs?source=benchout&tail=100"
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as r:
                r.read()
            tail_s.append(time.perf_counter() - t0)
            time.sleep(0.02)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(pushers)] + [threading.Thread(target=tailer)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"lines_s": acked[0] / elapsed, "push_p50_ms": percentile(push_s, 50) * 1e3,
            "push_p99_ms": percentile(push_s, 99) * 1e3, "tail_p99_ms": percentile(tail_s, 99) * 1e3,
            "failed_pushes": len(failures)}


class LakeNodes:
    def __init__(self, n: int, dsn: str, tmp: Path, lease_s: float = 6.0, extra: tuple[str, ...] = ()) -> None:
        self.procs, self.urls = [], []
        for i in range(n):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = (tmp / f"node{i}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "ingest.cli", "serve", "--port", str(port), "--otlp-grpc-port", "0",
                 "--db", str(tmp / f"node{i}.duckdb"), "--lake", dsn, "--lake-data", str(tmp / "lake"),
                 "--node-id", f"node{i}", "--advertise-url", url, "--lake-lease-s", str(lease_s),
                 "--policy-interval-s", "0", "--log-level", "WARNING", *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1")))
            self.urls.append(url)
        import psycopg

        deadline = time.monotonic() + 180
        pg_dsn = dsn.removeprefix("postgres:")
        while True:  # every node ready and the slots spread over all of them
            try:
                with psycopg.connect(pg_dsn) as conn:
                    owners = conn.execute("SELECT count(DISTINCT owner), count(*) FROM fleetlog_slots WHERE expires_at > now()").fetchone()
                if owners == (n, 64):
                    break
            except psycopg.Error:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"lake nodes did not settle; see {tmp}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--pushers", type=int, default=4)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    bindir = pg_bin()
    if bindir is None:
        sys.exit("PostgreSQL server binaries missing: run scripts/test-deps.sh")
    load = dict(seconds=args.seconds, pushers=args.pushers, instances=args.instances, batch=args.batch)
    print(f"cores: {os.cpu_count()}  load: {load}")
    print("On few cores the nodes, PostgreSQL and this load share the CPUs: this shows the lake's overheads, not scaling.")
    with tempfile.TemporaryDirectory(prefix="fleetlog-lakebench-") as tmp_name:
        tmp = Path(tmp_name)
        server = Server(tmp / "single.duckdb")
        try:
            ref = run_load([server.url], **load)
        finally:
            server.stop()
        rows = [("single file", ref)]
        pg = Postgres(bindir).start()
        try:
            for n in (1, 2, 3):
                dsn = pg.createdb(f"bench{n}")
                work = tmp / f"lake{n}"
                work.mkdir()
                nodes = LakeNodes(n, dsn, work)
                try:
                    rows.append((f"lake, {n} node{'s' if n > 1 else ''}", run_load(nodes.urls, **load)))
                finally:
                    nodes.stop()
        finally:
            pg.stop()
    print(f"{'':16} {'lines/s':>10} {'x file':>7} {'push p50 ms':>12} {'push p99 ms':>12} {'x file':>7} {'tail p99 ms':>12} {'x file':>7}")
    for name, r in rows:
        print(f"{name:16} {r['lines_s']:10.0f} {r['lines_s'] / ref['lines_s']:7.2f} {r['push_p50_ms']:12.1f} "
              f"{r['push_p99_ms']:12.1f} {r['push_p99_ms'] / ref['push_p99_ms']:7.2f} {r['tail_p99_ms']:12.1f} "
              f"{r['tail_p99_ms'] / ref['tail_p99_ms']:7.2f}")


if __name__ == "__main__":
    main()
