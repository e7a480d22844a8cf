"""Fixture data from INCIDENT.md, pushed through the real API."""

from __future__ import annotations

import datetime as dt

import orjson

from ingest.db import writes
from ingest.timestamps import utcnow  # noqa: F401 (the tests' clock is the server's; imported from here)

OOM_DAEMON_LOG = [
    "2026-11-29T11:20:49Z INFO cuzk_daemon: listening on 127.0.0.1:9820, 1 GPU (NVIDIA RTX PRO 4000 Blackwell, 24 GiB)",
    "2026-11-29T11:20:52Z INFO cuzk_daemon::srs: loading SRS for 32GiB sectors from /var/tmp/filecoin-proof-parameters",
    "2026-11-29T11:24:10Z INFO cuzk_daemon::pce: warm-up proof: PCE extraction started (partition-workers 16)",
    "2026-11-29T11:30:58Z ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating 3.2 GiB for NTT",
    "2026-11-29T11:30:58Z ERROR cuzk_daemon: prover thread panicked; shutting down",
]
BENCH_OUTPUT = [
    "[benchmark] starting cuzk-daemon (log: /tmp/cuzk-bench-daemon.log)",
    "[benchmark] warm-up proof (waits for PCE extraction)",
    "[benchmark] error: daemon exited while waiting for warm-up proof",
    "benchmark.sh exited with error",
]


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def post(client, path: str, doc) -> dict:
    r = await client.post(path, data=orjson.dumps(doc))
    assert r.status == 200, (path, r.status, await r.text())
    return await r.json()


async def push_lines(client, instance_id: str, source: str, lines: list[str], *, start: int = 0, at: dt.datetime) -> None:
    doc = {"instance_id": instance_id, "source": source,
           "lines": [{"seq": start + i, "ts": iso(at + dt.timedelta(milliseconds=i)), "line": line} for i, line in enumerate(lines)]}
    await post(client, "/api/v1/logs", doc)


async def bench_instance(client, instance_id: str, machine_id: int, *, done: dt.datetime, exit_code: int,
                         rate: float, gpu_model: str = "RTX 4090", dph: float = 0.4, excerpt: str | None = None,
                         proofs: int = 12, signal: str | None = None) -> None:
    """registered -> params_done -> bench_started -> bench_done, the benchmark ~10 minutes long."""
    started = done - dt.timedelta(minutes=10)
    done_event = {"instance_id": instance_id, "kind": "bench_done", "ts": iso(done), "exit_code": exit_code,
                  "rate_per_hour": rate, "duration_s": 600.0, "proofs_ok": 0 if exit_code else proofs,
                  "failure_excerpt": excerpt}
    if signal:
        done_event["signal"] = signal
    await post(client, "/api/v1/events", [
        {"instance_id": instance_id, "kind": "registered", "ts": iso(started - dt.timedelta(minutes=4)),
         "machine_id": machine_id, "host_id": machine_id * 10, "gpu_model": gpu_model, "gpu_count": 1, "dph": dph},
        {"instance_id": instance_id, "kind": "params_done", "ts": iso(started - dt.timedelta(seconds=1))},
        {"instance_id": instance_id, "kind": "bench_started", "ts": iso(started), "proofs": proofs, "concurrency": 3,
         "partition_workers": 16},
        done_event,
    ])


async def incident(client, done: dt.datetime, *, logs_complete: bool) -> None:
    """The RTX PRO 4000 failure: C.32733029 on machine 55891, daemon OOM, benchmark exit 1."""
    await bench_instance(client, "C.32733029", 55891, done=done, exit_code=1, rate=0.0, gpu_model="RTX PRO 4000",
                         dph=0.35, excerpt="\n".join(OOM_DAEMON_LOG[-2:] + BENCH_OUTPUT[-1:]))
    await push_lines(client, "C.32733029", "benchdaemon", OOM_DAEMON_LOG, at=done - dt.timedelta(minutes=10))
    await push_lines(client, "C.32733029", "benchout", BENCH_OUTPUT, at=done - dt.timedelta(minutes=10))
    if logs_complete:
        await complete_logs(client, "C.32733029", done, {"benchdaemon": len(OOM_DAEMON_LOG) - 1, "benchout": len(BENCH_OUTPUT) - 1})


async def complete_logs(client, instance_id: str, done: dt.datetime, sources: dict[str, int]) -> None:
    await post(client, "/api/v1/events", {"instance_id": instance_id, "kind": "logs_complete",
                                           "ts": iso(done + dt.timedelta(seconds=1)), "sources": sources})


async def log_push(client, instance_id: str, source: str, lines: list[str]) -> None:
    """The old manager's plain-text endpoint: the server numbers the lines and stamps them on arrival."""
    r = await client.post("/api/log-push", data="\n".join(lines).encode() + b"\n",
                          headers={"X-Instance-Id": instance_id, "X-Log-Source": source})
    assert r.status == 200, (r.status, await r.text())


async def params_failure(client, instance_id: str, machine_id: int, *, at: dt.datetime, exit_code: int = 2,
                         run_id: str | None = None) -> None:
    """registered -> params_done with a non-zero exit code (the ~56 GiB parameter fetch failed);
    ``run_id``: the wrap run that sent it, as the agent does."""
    await post(client, "/api/v1/events", [
        {"instance_id": instance_id, "kind": "registered", "ts": iso(at - dt.timedelta(minutes=4)),
         "machine_id": machine_id, "host_id": machine_id * 10, "gpu_model": "RTX 3090", "gpu_count": 1, "dph": 0.3},
        {"instance_id": instance_id, "kind": "params_done", "ts": iso(at), "exit_code": exit_code,
         **({"run_id": run_id} if run_id else {})},
    ])


async def hung_instance(client, instance_id: str, machine_id: int, *, started: dt.datetime) -> None:
    """registered -> params_done -> bench_started, and nothing after: no bench_done ever came."""
    await post(client, "/api/v1/events", [
        {"instance_id": instance_id, "kind": "registered", "ts": iso(started - dt.timedelta(minutes=4)),
         "machine_id": machine_id, "host_id": machine_id * 10, "gpu_model": "RTX 4090", "gpu_count": 1, "dph": 0.4},
        {"instance_id": instance_id, "kind": "params_done", "ts": iso(started - dt.timedelta(seconds=1)), "exit_code": 0},
        {"instance_id": instance_id, "kind": "bench_started", "ts": iso(started), "proofs": 12, "concurrency": 3,
         "partition_workers": 16},
    ])
    # hung is measured by the server's clock (migration 013): the server heard of the start back then too
    # (an app in this process; a server in a subprocess is given a short --bench-timeout-s instead)
    if hasattr(client, "app"):
        rows(client, "UPDATE bench_runs SET started_received_at = started_at WHERE instance_id = ?", [instance_id])


async def demo_fleet(client, done: dt.datetime) -> None:
    """One instance of each kind the rules tell apart, every one with logs expected:

    C.32733029  the incident: OOM, exit 1, logs complete                     failed (oom), complete
    C.40, C.31  machine 777: 40 and 31 proofs/hour; C.31 has a gap, no logs_complete   passed, incomplete
    C.12        12.5 proofs/hour, logs complete                              below_min_rate, complete
    C.drop      exit 1, logs_complete declared, but the agent dropped 2 lines failed, incomplete
    C.params    the parameter fetch exited 2, its setup log complete         params_failed, complete
    C.hung      bench_started 3 hours ago, no bench_done, no logs_complete   hung, incomplete
    C.60, C.30  machine 782: 60, then (an hour later) 30 proofs/hour         passed, complete; degraded
                (best 60, recent 45 < 0.8 x 60: still above min_rate, half as fast as it was)
    """
    await incident(client, done, logs_complete=True)
    await bench_instance(client, "C.40", 777, done=done - dt.timedelta(hours=1), exit_code=0, rate=40.0, dph=0.8)
    await complete_logs(client, "C.40", done - dt.timedelta(hours=1), {"benchout": -1})
    await bench_instance(client, "C.31", 777, done=done, exit_code=0, rate=31.0, dph=0.8)
    await push_lines(client, "C.31", "benchout", ["proof 1 ok", "proof 2 ok"], at=done)
    await push_lines(client, "C.31", "benchout", ["proof 9 ok"], start=8, at=done)  # a gap: 2..7 missing
    await bench_instance(client, "C.12", 778, done=done, exit_code=0, rate=12.5)
    await push_lines(client, "C.12", "benchout", ["proof 1 ok"], at=done)
    await complete_logs(client, "C.12", done, {"benchout": 0})
    await bench_instance(client, "C.drop", 779, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.drop", "benchdaemon", ["daemon starting", "proof 1 started", "daemon exiting"], at=done)
    await post(client, "/api/v1/events", {"instance_id": "C.drop", "kind": "logs_complete", "ts": iso(done + dt.timedelta(seconds=1)),
                                           "sources": {"benchdaemon": 2}, "dropped": {"benchdaemon": 2}})
    await params_failure(client, "C.params", 780, at=done)
    await push_lines(client, "C.params", "setup", ["fetching parameters", "error: paramfetch: HTTP 503"], at=done)
    await complete_logs(client, "C.params", done, {"setup": 1})
    await hung_instance(client, "C.hung", 781, started=done - dt.timedelta(hours=3))
    await push_lines(client, "C.hung", "benchout", ["[benchmark] warm-up proof (waits for PCE extraction)"],
                     at=done - dt.timedelta(hours=3))
    await degraded_machine(client, done)


async def degraded_machine(client, done: dt.datetime) -> None:
    """Machine 782 rented twice: 60 proofs/hour, then 30 an hour later (logs complete both times)."""
    for instance_id, rate, at in (("C.60", 60.0, done - dt.timedelta(hours=1)), ("C.30", 30.0, done)):
        await bench_instance(client, instance_id, 782, done=at, exit_code=0, rate=rate, gpu_model="RTX 5090", dph=0.9)
        await complete_logs(client, instance_id, at, {"benchout": -1})


# -- helpers of the policy tests (a running app from aiohttp_client) ------------------------------
async def run_policies(client, execute: bool = False, now: dt.datetime | None = None):
    from ingest.web.keys import CORE

    return await client.app[CORE].policy.run_cycle(execute, now=now)


def rows(client, sql, params=()):
    from ingest.web.keys import DB

    cur = client.app[DB].cursor()
    try:
        return cur.execute(sql, list(params)).fetchall()
    finally:
        cur.close()


async def get(client, path):
    r = await client.get(path)
    assert r.status == 200, await r.text()
    return await r.json()


# -- a fleet of many instances, bulk (the scale tests and bench/policy_scale.py) --------------------
SCALE_SOURCES = ("setup", "benchout", "benchdaemon")
DCGM = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")


def scale_fate(i: int) -> str:
    """One in 20 failed (daemon OOM), one below min_rate, one failed parameter fetch, one hung; passed."""
    return {0: "failed", 1: "below_min_rate", 2: "params_failed", 3: "hung"}.get(i % 20, "passed")


async def bulk_fleet(client, n: int, done: dt.datetime, *, lines: int = 100, samples: int = 60,
                     prefix: str = "C.s") -> None:
    """``n`` instances in the shapes of bench_instance / demo_fleet, written in a few commits: their
    events through the writer (registered, params_done, bench_started, bench_done, gpu_state,
    logs_complete: the store's own side effects on instances and bench_runs), then ``lines`` log lines
    per stream (setup, benchout, benchdaemon; the last daemon line of a failed run is a CUDA OOM) and
    ``samples`` DCGM samples per metric (4 metrics, 5 s apart, up to the run's end) in one statement
    each. Logs complete, except the hung instances' (no logs_complete)."""
    from ingest.contract.codec import Event
    from ingest.web.keys import WRITER

    writer = client.app[WRITER]
    us = lambda t: int((t - dt.datetime(1970, 1, 1)).total_seconds() * 1_000_000)  # noqa: E731
    events, fates = [], {}
    for i in range(n):
        iid, fate = f"{prefix}{i}", scale_fate(i)
        fates[iid] = fate
        end = done - dt.timedelta(seconds=i % 600)
        started = end - dt.timedelta(minutes=10) if fate != "hung" else done - dt.timedelta(hours=3)
        evs = [("registered", started - dt.timedelta(minutes=4),
                {"machine_id": 10_000 + i // 2, "host_id": 100_000 + i, "gpu_model": ("RTX 4090", "RTX 3090")[i % 2],
                 "gpu_count": 1, "dph": 0.4}),
               ("params_done", started - dt.timedelta(seconds=1), {"exit_code": 2 if fate == "params_failed" else 0})]
        if fate != "params_failed":
            evs.append(("bench_started", started, {"proofs": 12, "concurrency": 3, "partition_workers": 16}))
            evs.append(("gpu_state", started, {"state": "ok"}))
        if fate in ("passed", "below_min_rate", "failed"):
            rate = {"passed": 40.0 + i % 7, "below_min_rate": 12.5, "failed": 0.0}[fate]
            evs.append(("bench_done", end, {"exit_code": 1 if fate == "failed" else 0, "rate_per_hour": rate,
                                            "duration_s": 600.0, "proofs_ok": 0 if fate == "failed" else 12,
                                            "failure_excerpt": "\n".join(OOM_DAEMON_LOG[-2:]) if fate == "failed" else None}))
        if fate != "hung":
            evs.append(("logs_complete", end + dt.timedelta(seconds=1),
                        {"sources": {s: lines - 1 for s in SCALE_SOURCES}}))
        events += [Event(iid, kind, us(t), {"instance_id": iid, "kind": kind, "ts": iso(t), **body}) for kind, t, body in evs]
    for lo in range(0, len(events), 5000):
        await writer.submit(events=events[lo:lo + 5000], kind="events")
    ids = list(fates)
    failed = [iid for iid, fate in fates.items() if fate == "failed"]
    hung = [iid for iid, fate in fates.items() if fate == "hung"]

    def insert(con) -> None:
        # the hung ones: the server heard of their start back then (hung is measured by its clock)
        con.execute("UPDATE bench_runs SET started_received_at = started_at WHERE instance_id IN (SELECT unnest(?::VARCHAR[]))",
                    [hung])
        con.execute(
            """INSERT INTO logs
               SELECT r.instance_id, s.source, '0', t.seq, r.done_at - to_microseconds((? - t.seq) * 1000000),
                      now()::TIMESTAMP,
                      CASE WHEN s.source = 'benchdaemon' AND t.seq = ? - 1 AND list_contains(?::VARCHAR[], r.instance_id)
                           THEN ? ELSE s.source || ': partition ' || t.seq::VARCHAR || ' of PoRep C2 proof synthesized in '
                                       || (800 + t.seq % 97)::VARCHAR || ' ms (constraints 130278869)' END,
                      false
               FROM (SELECT instance_id, max(coalesce(done_at, started_at + INTERVAL 10 MINUTE, TIMESTAMP '2026-01-01')) AS done_at
                     FROM instances LEFT JOIN bench_runs USING (instance_id)
                     WHERE instance_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL) r,
                    unnest(?::VARCHAR[]) s(source), range(?) t(seq)""",
            [lines, lines, failed, OOM_DAEMON_LOG[3], ids, list(SCALE_SOURCES), lines],
        )
        writes.recount_stream_lines(con, ids)  # the writer counts the lines of its own batches only
        con.execute(
            """INSERT INTO metrics
               SELECT r.instance_id, m.name, r.done_at - to_microseconds(t.k * 5000000),
                      CASE m.name WHEN 'DCGM_FI_DEV_GPU_UTIL' THEN 90 + t.k % 10 WHEN 'DCGM_FI_DEV_FB_USED' THEN 20000 + t.k
                                  WHEN 'DCGM_FI_DEV_POWER_USAGE' THEN 300.5 ELSE 70 END,
                      '{"gpu":"0"}', now()::TIMESTAMP
               FROM (SELECT instance_id, done_at FROM bench_runs WHERE done_at IS NOT NULL
                     AND instance_id IN (SELECT unnest(?::VARCHAR[]))) r,
                    unnest(?::VARCHAR[]) m(name), range(?) t(k)""",
            [ids, list(DCGM), samples],
        )

    await writer.execute(insert, kind="policy")


async def until(what: str, check, timeout_s: float = 30.0):
    """Poll ``check()`` (every 50 ms) until it is true, and return what it returned; fail after ``timeout_s``."""
    import asyncio
    import time

    import pytest

    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout_s} s")
        await asyncio.sleep(0.05)
