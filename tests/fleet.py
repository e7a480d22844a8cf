"""Fixture data from INCIDENT.md, pushed through the real API."""

from __future__ import annotations

import datetime as dt

import orjson

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


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


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
