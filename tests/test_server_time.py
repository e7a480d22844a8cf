"""Every wait is measured by the server's clock, and a destroy waits for the logs of the phase it
judges (issue 21 items 7 and 8; migration 013)."""

from __future__ import annotations

import datetime as dt

import orjson

from tests.fleet import iso, post, push_lines, rows, run_policies, utcnow


async def _run(client, instance_id: str, machine_id: int, *, started: dt.datetime, done: dt.datetime, exit_code: int,
               rate: float | None, run_id: str, lines: dict[str, list[str]]) -> None:
    """An agent's run as the agent sends it: run_id on bench_started, bench_done and logs_complete."""
    done_event = {"instance_id": instance_id, "kind": "bench_done", "ts": iso(done), "exit_code": exit_code,
                  "duration_s": (done - started).total_seconds(), "run_id": run_id}
    if rate is not None:
        done_event["rate_per_hour"] = rate
    await post(client, "/api/v1/events", [
        {"instance_id": instance_id, "kind": "registered", "ts": iso(started - dt.timedelta(minutes=4)),
         "machine_id": machine_id, "host_id": machine_id * 10, "gpu_model": "RTX PRO 4000", "gpu_count": 1, "dph": 0.35},
        {"instance_id": instance_id, "kind": "params_done", "ts": iso(started - dt.timedelta(seconds=1)), "exit_code": 0},
        {"instance_id": instance_id, "kind": "bench_started", "ts": iso(started), "proofs": 12, "run_id": run_id},
        {"instance_id": instance_id, "kind": "gpu_state", "ts": iso(started), "state": "nvml_unavailable",
         "reason": "nvmlInit: NVML Shared Library Not Found (NVML error 12)"},
    ])
    for source, text in lines.items():
        await post(client, "/api/v1/logs", {"instance_id": instance_id, "source": source, "run_id": run_id,
                                            "lines": [{"seq": i, "ts": iso(started), "line": t} for i, t in enumerate(text)]})
    await post(client, "/api/v1/events", [
        done_event,
        {"instance_id": instance_id, "kind": "logs_complete", "ts": iso(done), "run_id": run_id,
         "sources": {s: len(t) - 1 for s, t in lines.items()}},
    ])


def _destroys(client, instance_id: str) -> list[dict]:
    return [{"state": s, "evidence": orjson.loads(e)} for s, e in
            rows(client, "SELECT state, evidence FROM decisions WHERE action = 'destroy' AND subject = ?", [instance_id])]


async def test_agent_clock_an_hour_behind_does_not_skip_the_grace_period(make_client):
    client = await make_client(destroy_grace_s=600.0)
    skew = dt.timedelta(hours=1)
    now = utcnow()
    # the benchmark ended (by the agent's clock) an hour ago: its logs are not complete (a gap)
    await _run(client, "C.skew", 55891, started=now - skew - dt.timedelta(minutes=10), done=now - skew, exit_code=1,
               rate=None, run_id="r1", lines={"benchdaemon": ["INFO cuzk_daemon: listening", "proof 1 started"]})
    await post(client, "/api/v1/logs", {"instance_id": "C.skew", "source": "benchout", "run_id": "r1",
                                        "lines": [{"seq": 3, "ts": iso(now - skew), "line": "after a gap"}]})
    await run_policies(client)
    assert _destroys(client, "C.skew") == []  # the server stored it just now: 600 s have not passed
    await run_policies(client, now=utcnow() + dt.timedelta(seconds=601))
    [destroy] = _destroys(client, "C.skew")
    assert destroy["evidence"]["waited_for"] == "grace_period"


async def test_below_min_rate_instance_running_its_daemons_is_destroyed_on_its_benchmarks_complete_logs(make_client):
    """Its daemons' streams never complete while it runs; the benchmark's run is all the evidence."""
    client = await make_client(destroy_grace_s=3600.0)
    now = utcnow()
    await _run(client, "C.slow", 41003, started=now - dt.timedelta(minutes=10), done=now, exit_code=0, rate=12.4,
               run_id="bench-1", lines={"benchout": ["proof 1/12 done", "Benchmark result: 12.4 proofs/hour"],
                                        "benchdaemon": ["INFO cuzk_daemon: listening"]})
    await post(client, "/api/v1/events", {"instance_id": "C.slow", "kind": "running", "ts": iso(now)})
    await push_lines(client, "C.slow", "cuzk", ["cuzk-daemon: heartbeat 1", "cuzk-daemon: heartbeat 2"], at=now)
    await run_policies(client)
    [destroy] = _destroys(client, "C.slow")
    assert destroy["evidence"]["waited_for"] == "logs_complete" and destroy["evidence"]["logs_complete"] is True
    # the decision says what the GPU said: here, that NVML could not be read
    assert destroy["evidence"]["gpu"]["state"] == "nvml_unavailable", destroy["evidence"]


async def test_a_killed_instance_that_sends_a_late_bench_done_is_not_destroyed_again(make_client):
    client = await make_client(destroy_grace_s=3600.0)
    now = utcnow()
    await _run(client, "C.oom", 55891, started=now - dt.timedelta(minutes=10), done=now, exit_code=1, rate=None,
               run_id="r1", lines={"benchdaemon": ["CUDA error: out of memory"]})
    await run_policies(client)
    assert len(_destroys(client, "C.oom")) == 1
    await post(client, "/api/v1/events", {"instance_id": "C.oom", "kind": "killed", "ts": iso(utcnow()), "by": "policy"})
    # its agent, not yet dead, reports a second run ending on the kill's SIGTERM
    later = utcnow() + dt.timedelta(seconds=2)
    await _run(client, "C.oom", 55891, started=later - dt.timedelta(seconds=1), done=later, exit_code=143, rate=None,
               run_id="r2", lines={"benchout": ["terminated"]})
    await run_policies(client)
    assert len(_destroys(client, "C.oom")) == 1


async def test_a_lost_exit_status_with_a_measured_rate_is_judged_by_the_rate(make_client):
    """The agent and the reaper both killed: no exit_code, but the benchmark printed its result."""
    client = await make_client()
    now = utcnow()
    await _run(client, "C.lost", 41001, started=now - dt.timedelta(minutes=10), done=now, exit_code=0, rate=45.7,
               run_id="r1", lines={"benchout": ["Benchmark result: 45.7 proofs/hour"]})
    rows(client, "UPDATE bench_runs SET exit_code = NULL WHERE instance_id = 'C.lost'")
    [(outcome,)] = rows(client, "SELECT outcome FROM bench_outcomes WHERE instance_id = 'C.lost'")
    assert outcome == "passed"


async def test_agent_clock_an_hour_behind_does_not_freeze_the_class_before_a_late_oom_line(make_client):
    # no timer: the logs_complete would wake a cycle that, run before the gap line is stored, rightly finds
    # the declared logs complete and the class final (seen once in CI on a loaded machine)
    client = await make_client(destroy_grace_s=600.0, policy_interval_s=0)
    skew = dt.timedelta(hours=1)
    now = utcnow()
    await _run(client, "C.late", 55891, started=now - skew - dt.timedelta(minutes=10), done=now - skew, exit_code=1,
               rate=None, run_id="r1", lines={"benchout": ["waiting for warm-up proof..."]})
    await post(client, "/api/v1/logs", {"instance_id": "C.late", "source": "benchdaemon", "run_id": "r1",
                                        "lines": [{"seq": 1, "ts": iso(now - skew), "line": "starting"}]})  # a gap
    await run_policies(client)
    assert rows(client, "SELECT class_final FROM bench_runs WHERE instance_id = 'C.late'") == [(False,)]
    await post(client, "/api/v1/logs", {"instance_id": "C.late", "source": "benchdaemon", "run_id": "r1",
                                        "lines": [{"seq": 0, "ts": iso(now - skew), "line": "CUDA error: out of memory"}]})
    await run_policies(client)
    assert rows(client, "SELECT failure_class FROM bench_runs WHERE instance_id = 'C.late'") == [("oom",)]


async def test_a_failed_run_not_classed_yet_is_neither_destroyed_nor_blamed_on_its_machine(make_client):
    """Rules run one after the other: a bench_done stored after the class rule ran, and before the
    destroy rule did, was destroyed "unclassified" (seen in the fleet simulation under load)."""
    from ingest.web.keys import CORE, DB

    client = await make_client()
    now = utcnow()
    await _run(client, "C.gpu", 55001, started=now - dt.timedelta(minutes=10), done=now, exit_code=2, rate=None,
               run_id="r1", lines={"benchdaemon": ["NVRM: Xid (PCI:0000:41:00): 79, pid=4242, GPU has fallen off the bus."]})
    engine = client.app[CORE].policy
    values = engine.params.values(utcnow())
    cur = client.app[DB].cursor()
    try:  # the two rules as the engine runs them, before the class rule has seen the run
        for name in ("bad_hosts", "destroy_below_min_rate"):
            [rule] = [r for r in engine.rules if r.name == name]
            got = cur.execute(f"SELECT count(*) FROM ({rule.sql})", {p: values[p] for p in rule.params}).fetchall()
            assert got == [(0,)], name
    finally:
        cur.close()
    await run_policies(client)  # the class rule first, then the others: now it is classed, and acted on
    assert rows(client, "SELECT failure_class FROM bench_runs WHERE instance_id = 'C.gpu'") == [("gpu_lost",)]
    assert len(_destroys(client, "C.gpu")) == 1
