"""The cost of the forwarding hop in lake mode: plain-text /api/log-push and OTLP/HTTP (protobuf) sent
to the instance's owner (the reference) or to a node that is not the owner (forwarded), alternating
phases on the same 3 nodes in one run.

Each phase: ``--pushers`` threads, each with its own instances, pushing batches of ``--batch`` lines
one after the other for ``--seconds``. Printed per phase: acknowledged lines/s and push p50/p99,
and each forwarded phase as a ratio to the direct phase before it. On 2 shared cores the hop's CPU
(the receiving node reads, splits and re-sends the body) competes with the owner's commits.

    .venv/bin/python bench/lake_forward.py [--seconds 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import make_line, percentile  # noqa: E402
from bench.lake_nodes import LakeNodes  # noqa: E402
from tests.lake_pg import Postgres, pg_bin  # noqa: E402


def owners(dsn: str) -> dict[int, str]:
    import psycopg

    with psycopg.connect(dsn.removeprefix("postgres:")) as conn:
        return dict(conn.execute("SELECT slot, url FROM fleetlog_slots WHERE expires_at > now()").fetchall())


def post(url: str, body: bytes, headers: dict[str, str]) -> None:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
                return
        except urllib.error.HTTPError as e:
            if e.code not in (503, 429):
                raise
            time.sleep(0.05)


def otlp_body(instance_id: str, lines: list[str], first_seq: int) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    request = ExportLogsServiceRequest()
    resource = request.resource_logs.add()
    attr = resource.resource.attributes.add()
    attr.key, attr.value.string_value = "service.instance.id", instance_id
    scope = resource.scope_logs.add()
    for k, line in enumerate(lines):
        record = scope.log_records.add()
        record.body.string_value = line
        for key, value in (("log.source", "otlp"), ("log.seq", first_seq + k)):
            a = record.attributes.add()
            a.key = key
            if isinstance(value, int):
                a.value.int_value = value
            else:
                a.value.string_value = value
    return request.SerializeToString()


def phase(kind: str, forwarded: bool, urls: list[str], owner_url, seconds: float, pushers: int, batch: int,
          tag: str) -> dict[str, float]:
    rng = random.Random(11)
    lines = [make_line(rng, n) for n in range(batch)]
    stop = threading.Event()
    push_s: list[float] = []
    acked = [0]
    lock = threading.Lock()

    def pusher(k: int) -> None:
        instances = [f"F.{tag}.{k}.{j}" for j in range(3)]
        seq = {i: 0 for i in instances}
        for turn in range(10**9):
            if stop.is_set():
                return
            instance = instances[turn % len(instances)]
            owner = owner_url(instance)
            target = next(u for u in urls[turn % len(urls):] + urls if (u != owner) == forwarded)
            started = time.perf_counter()
            if kind == "log-push":
                post(target + "/api/log-push", "\n".join(lines).encode(),
                     {"X-Instance-Id": instance, "X-Log-Source": "managerlog", "Content-Type": "text/plain"})
            else:
                post(target + "/v1/logs", otlp_body(instance, lines, seq[instance]), {"Content-Type": "application/x-protobuf"})
                seq[instance] += len(lines)
            with lock:
                push_s.append(time.perf_counter() - started)
                acked[0] += len(lines)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(pushers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    elapsed = time.monotonic() - started
    return {"lines_s": acked[0] / elapsed, "p50_ms": percentile(push_s, 50) * 1000, "p99_ms": percentile(push_s, 99) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pushers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    bindir = pg_bin()
    if bindir is None:
        sys.exit("PostgreSQL server binaries missing: run scripts/test-deps.sh")
    print(f"cores: {os.cpu_count()}  seconds: {args.seconds}  pushers: {args.pushers}  batch: {args.batch}")
    with tempfile.TemporaryDirectory(prefix="fleetlog-fwdbench-") as tmp_name:
        tmp = Path(tmp_name)
        pg = Postgres(bindir).start()
        try:
            dsn = pg.createdb("fwdbench")
            nodes = LakeNodes(3, dsn, tmp)
            try:
                slots = owners(dsn)
                owner_url = lambda instance: slots[zlib.crc32(instance.encode()) % 64]  # noqa: E731 (ingest.db.lake.slots.slot_of)
                print(f"{'':22} {'lines/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'x direct lines/s':>17} {'x direct p50':>13}")
                for round_ in range(args.rounds):
                    for kind in ("log-push", "otlp-http"):
                        direct = phase(kind, False, nodes.urls, owner_url, args.seconds, args.pushers, args.batch,
                                       f"d{round_}{kind[0]}")
                        hop = phase(kind, True, nodes.urls, owner_url, args.seconds, args.pushers, args.batch,
                                    f"f{round_}{kind[0]}")
                        for name, r in ((f"{kind} to owner", direct), (f"{kind} forwarded", hop)):
                            ratio = "" if r is direct else (f"{r['lines_s'] / direct['lines_s']:17.2f} "
                                                            f"{r['p50_ms'] / direct['p50_ms']:13.2f}")
                            print(f"{name:22} {r['lines_s']:9.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {ratio}")
                if owners(dsn) != slots:
                    print("note: the slots moved during the run; some pushes went another way than labelled")
            finally:
                nodes.stop()
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
