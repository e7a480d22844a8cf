"""Lifecycle policies: the incident replay, each rule, idempotency, the cap, verdicts, actuators."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from ingest.app import create_app
from ingest.web.keys import CORE
from tests.fleet import (OOM_DAEMON_LOG, bench_instance, complete_logs, get, incident, post, push_lines, rows,
                         run_policies, utcnow)

FAKE_VASTAI = Path(__file__).parent / "scripts" / "fake_vastai.sh"


@pytest.fixture
def policy_settings(settings):
    return replace(settings, policy_interval_s=0)  # tests run cycles themselves


async def test_incident_replay_destroys_only_after_logs_complete(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=False)
    healthy_done = utcnow() - dt.timedelta(hours=2)
    await bench_instance(client, "C.40", 777, done=healthy_done, exit_code=0, rate=40.0, dph=0.8)
    await bench_instance(client, "C.31", 777, done=healthy_done + dt.timedelta(hours=1), exit_code=0, rate=31.0, dph=0.8)

    await run_policies(client)
    assert rows(client, "SELECT failure_class, failure_line FROM bench_runs WHERE instance_id = 'C.32733029'") == [
        ("oom", OOM_DAEMON_LOG[3])
    ]
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]  # evidence not yet safe
    host = await get(client, "/api/v1/hosts/55891")
    assert host["bad"] is True and host["eligible"] is False and "oom" in host["reason"]

    await complete_logs(client, "C.32733029", done, {"benchdaemon": 4, "benchout": 3})
    report = await run_policies(client)
    destroys = (await get(client, "/api/v1/decisions?action=destroy"))["decisions"]
    assert [d["subject"] for d in destroys] == ["C.32733029"]
    evidence = destroys[0]["evidence"]
    assert destroys[0]["state"] == "proposed" and destroys[0]["id"] in report.new_decisions
    assert evidence["failure_class"] == "oom" and evidence["waited_for"] == "logs_complete"
    assert "CUDA error: out of memory" in evidence["failure_excerpt"] and evidence["machine_id"] == 55891
    assert evidence["logs"]["benchdaemon"] == {"declared_last_seq": 4, "stored_lines": 5, "stored_last_seq": 4, "dropped": 0}

    good = await get(client, "/api/v1/hosts/777")
    assert (good["best_rate"], good["runs"], good["bad"], good["eligible"]) == (40.0, 2, False, True)
    assert good["dollars_per_proof"] == pytest.approx(0.8 / 40)
    assert rows(client, "SELECT count(*) FROM decisions WHERE subject IN ('C.40', 'C.31', '777')") == [(0,)]


async def test_destroy_waits_for_grace_when_logs_never_complete(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, destroy_grace_s=600)))
    done = utcnow() - dt.timedelta(seconds=300)
    await incident(client, done, logs_complete=False)
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]
    await run_policies(client, now=done + dt.timedelta(seconds=601))  # by the agent's clock: not yet
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]
    await run_policies(client, now=utcnow() + dt.timedelta(seconds=601))  # since the server stored it
    [(evidence,)] = rows(client, "SELECT evidence FROM decisions WHERE action = 'destroy'")
    assert orjson.loads(evidence)["waited_for"] == "grace_period"


async def test_incomplete_logs_with_a_gap_do_not_count_as_complete(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=False)
    await complete_logs(client, "C.32733029", done, {"benchdaemon": 6, "benchout": 3})  # 5 and 6 never arrived
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]


async def test_slow_benchmark_below_min_rate_is_destroyed_and_fast_one_kept(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, min_rate=29.0)))
    done = utcnow() - dt.timedelta(seconds=20)
    await bench_instance(client, "C.slow", 900, done=done, exit_code=0, rate=12.5)
    await bench_instance(client, "C.fast", 901, done=done, exit_code=0, rate=35.0)
    for instance in ("C.slow", "C.fast"):
        await complete_logs(client, instance, done, {"benchout": -1})
    await run_policies(client)
    decided = rows(client, "SELECT subject, action, reason FROM decisions ORDER BY subject")
    assert decided == [("C.slow", "destroy", "rate 12.5 proofs/hour < min_rate 29.0")]
    hosts = {h["machine_id"]: h for h in (await get(client, "/api/v1/hosts"))["hosts"]}
    assert hosts[900]["eligible"] is False and hosts[900]["bad"] is False  # slow, not broken
    assert hosts[901]["eligible"] is True


async def test_reruns_and_restarts_decide_nothing_twice(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=True)
    first = await run_policies(client)
    assert len(first.new_decisions) == 2  # exclude 55891, destroy C.32733029
    assert (await run_policies(client)).new_decisions == []
    await client.close()
    again = await aiohttp_client(create_app(policy_settings))
    assert (await run_policies(again)).new_decisions == []
    assert rows(again, "SELECT action, count(*) FROM decisions GROUP BY 1 ORDER BY 1") == [("destroy", 1), ("exclude_host", 1)]


@pytest.mark.parametrize(
    "line, exit_code, signal, expected",
    [
        ("CUDA error: out of memory (cudaErrorMemoryAllocation)", 1, None, "oom"),
        ("kernel: Out of memory: Killed process 4242 (cuzk-daemon)", 1, None, "oom_host"),
        ("Out of memory: Killed process 4242 (cuzk-daemon) total-vm:70123456kB, anon-rss:66012345kB", 1, None, "oom_host"),
        ("Memory cgroup out of memory: Killed process 4242 (cuzk-daemon)", 1, None, "oom_host"),
        ("kernel: cuzk-daemon invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0", 1, None, "oom_host"),
        ("ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) during PCE extraction", 1, None, "oom"),
        ("NVRM: Xid (PCI:0000:01:00): 79, pid=4242, GPU has fallen off the bus.", 1, None, "gpu_lost"),
        ("CUDA error: an illegal memory access was encountered", 1, None, "cuda_error"),
        ("error: warm-up proof timed out after 1800 s", 1, None, "timeout"),
        ("rpc error: code = Unavailable desc = connection refused (127.0.0.1:9820)", 1, None, "network"),
        ("failed to fetch params: v28-stacked-proof-of-replication: HTTP 503", 1, None, "param_fetch"),
        ("proof 3 started", 137, "SIGKILL", "signal"),
        ("proof 3 started", 2, None, "unknown"),
    ],
)
async def test_failure_classes(aiohttp_client, policy_settings, line, exit_code, signal, expected):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.9", 42, done=done, exit_code=exit_code, rate=0.0, signal=signal)
    await push_lines(client, "C.9", "benchdaemon", ["daemon starting", line, "daemon exiting"], at=done - dt.timedelta(minutes=1))
    await run_policies(client)
    [(failure_class, failure_line)] = rows(client, "SELECT failure_class, failure_line FROM bench_runs")
    assert failure_class == expected
    if expected not in ("signal", "unknown"):
        assert failure_line == line


async def test_operator_verdict_wins_until_a_newer_failure(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(hours=1)
    await incident(client, done, logs_complete=True)
    await bench_instance(client, "C.40", 777, done=done, exit_code=0, rate=40.0)
    await run_policies(client)
    assert (await get(client, "/api/v1/hosts/55891"))["bad"] is True

    r = await client.post("/api/v1/hosts/55891/include", data=orjson.dumps({"reason": "driver fixed by host"}))
    host = await r.json()
    assert (host["bad"], host["eligible"], host["verdict_by"]) == (False, True, "operator")
    r = await client.post("/api/v1/hosts/777/exclude", data=orjson.dumps({"reason": "flaky PSU", "expires_s": 3600}))
    host = await r.json()
    assert (host["bad"], host["eligible"], host["reason"]) == (True, False, "operator exclude: flaky PSU")

    await bench_instance(client, "C.again", 55891, done=utcnow() + dt.timedelta(seconds=5), exit_code=1, rate=0.0)
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/55891")
    assert (host["bad"], host["verdict_by"]) == (True, "rule")


async def test_verdict_on_bad_machine_id_is_400(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    r = await client.post("/api/v1/hosts/box-7/exclude", data=b"{}")
    assert r.status == 400 and "machine_id" in (await r.json())["error"]
    r = await client.post("/api/v1/hosts/7/exclude", data=orjson.dumps({"expires_s": "soon"}))
    assert r.status == 400 and "expires_s" in (await r.json())["error"]
    assert rows(client, "SELECT count(*) FROM host_verdicts") == [(0,)]


async def _failing_fleet(client, n: int, done: dt.datetime) -> None:
    for i in range(n):
        await bench_instance(client, f"C.{i}", 1000 + i, done=done, exit_code=1, rate=0.0)
        await complete_logs(client, f"C.{i}", done, {"benchout": -1})


async def test_command_actuator_destroys_at_most_cap_per_cycle(aiohttp_client, policy_settings, tmp_path, monkeypatch):
    log = tmp_path / "vastai.log"
    monkeypatch.setenv("FAKE_VASTAI_LOG", str(log))
    settings = replace(policy_settings, destroy_cap_per_cycle=3,
                       actuator_command=f"{FAKE_VASTAI} destroy instance {{instance_id}}")
    client = await aiohttp_client(create_app(settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await _failing_fleet(client, 5, done)
    dry = await run_policies(client, execute=False)
    assert dry.executed == [] and not log.exists()
    first = await run_policies(client, execute=True)
    assert len(first.executed) == 3 and first.capped == 2
    assert sorted(log.read_text().splitlines()) == [f"destroy instance C.{i}" for i in range(3)]
    second = await run_policies(client, execute=True)
    assert len(second.executed) == 2 and second.capped == 0
    assert rows(client, "SELECT state, count(*) FROM decisions WHERE action = 'destroy' GROUP BY 1") == [("executed", 5)]
    assert rows(client, "SELECT count(*) FROM instance_state WHERE state = 'killed'") == [(5,)]
    assert (await run_policies(client, execute=True)).executed == []  # nothing left, nothing twice
    metrics = await (await client.get("/metrics")).text()
    assert "fleetlog_policy_capped_destroys_total 2.0" in metrics


async def test_failing_command_is_retried_then_marked_failed(aiohttp_client, policy_settings, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VASTAI_LOG", str(tmp_path / "vastai.log"))
    monkeypatch.setenv("FAKE_VASTAI_EXIT", "1")
    settings = replace(policy_settings, actuator_retries=2, actuator_command=f"{FAKE_VASTAI} destroy instance {{instance_id}}")
    client = await aiohttp_client(create_app(settings))
    await _failing_fleet(client, 1, utcnow() - dt.timedelta(seconds=30))
    await run_policies(client, execute=True)
    assert rows(client, "SELECT state, attempts FROM decisions WHERE action = 'destroy'") == [("proposed", 1)]
    report = await run_policies(client, execute=True)
    assert report.failed and rows(client, "SELECT state, attempts, last_error FROM decisions WHERE action = 'destroy'") == [
        ("failed", 2, "fake_vastai.sh exited 1: error: instance not found".replace("fake_vastai.sh", str(FAKE_VASTAI)))
    ]
    assert rows(client, "SELECT count(*) FROM instance_state WHERE state = 'killed'") == [(0,)]


async def test_webhook_actuator_posts_the_decision(aiohttp_client, aiohttp_server, policy_settings):
    received = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"destroyed": True})

    hook_app = web.Application()
    hook_app.router.add_post("/destroy", hook)
    hook_server = await aiohttp_server(hook_app)
    settings = replace(policy_settings, actuator_webhook_url=str(hook_server.make_url("/destroy")))
    client = await aiohttp_client(create_app(settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=True)
    report = await run_policies(client, execute=True)
    assert len(report.executed) == 1
    [decision] = received
    assert decision["subject"] == "C.32733029" and decision["action"] == "destroy"
    assert decision["evidence"]["failure_class"] == "oom"
    detail = await get(client, "/api/v1/instances/C.32733029")
    assert detail["state"] == "killed" and detail["events"][-1]["body"]["by"] == "policy"


async def test_proposed_destroy_survives_restart_and_runs_with_execute(aiohttp_client, policy_settings, tmp_path, monkeypatch):
    log = tmp_path / "vastai.log"
    monkeypatch.setenv("FAKE_VASTAI_LOG", str(log))
    client = await aiohttp_client(create_app(policy_settings))
    await incident(client, utcnow() - dt.timedelta(seconds=30), logs_complete=True)
    await run_policies(client)  # dry run: proposed
    await client.close()
    settings = replace(policy_settings, actuator_command=f"{FAKE_VASTAI} destroy instance {{instance_id}}")
    again = await aiohttp_client(create_app(settings))
    r = await again.post("/api/v1/policy/run?execute=1")
    assert len((await r.json())["executed"]) == 1
    assert log.read_text() == "destroy instance C.32733029\n"


async def test_stale_then_retention_deletes_logs_only_with_execute(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, retention_s=0)))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=True)
    await post(client, "/api/v1/events", {"instance_id": "C.32733029", "kind": "killed", "ts": (done + dt.timedelta(seconds=5)).isoformat()})
    await run_policies(client)
    assert rows(client, "SELECT state FROM decisions WHERE action = 'mark_stale'") == [("executed",)]
    await run_policies(client)
    assert rows(client, "SELECT state FROM decisions WHERE action = 'delete_logs'") == [("proposed",)]
    assert rows(client, "SELECT count(*) FROM logs") == [(9,)]
    await run_policies(client, execute=True)
    assert rows(client, "SELECT count(*) FROM logs") == [(0,)]
    assert rows(client, "SELECT state FROM decisions WHERE action = 'delete_logs'") == [("executed",)]
    assert rows(client, "SELECT count(*) FROM bench_runs") == [(1,)]  # the verdict's evidence stays


async def test_retention_proposal_is_rechecked_and_superseded_when_the_instance_came_back(aiohttp_client, policy_settings):
    """A delete_logs proposed for a stale instance is carried out only if the retention rule still
    selects it: an instance heard from again after it was marked stale keeps its logs."""
    client = await aiohttp_client(create_app(replace(policy_settings, retention_s=0)))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=True)
    await post(client, "/api/v1/events", {"instance_id": "C.32733029", "kind": "killed", "ts": (done + dt.timedelta(seconds=5)).isoformat()})
    await run_policies(client)
    await run_policies(client)
    assert rows(client, "SELECT state FROM decisions WHERE action = 'delete_logs'") == [("proposed",)]
    # the kill did not happen after all: the daemon reports in again
    await post(client, "/api/v1/events", {"instance_id": "C.32733029", "kind": "running", "ts": utcnow().isoformat()})
    await run_policies(client, execute=True)
    assert rows(client, "SELECT count(*) FROM logs") == [(9,)]
    assert rows(client, "SELECT state, last_error FROM decisions WHERE action = 'delete_logs'") == [
        ("superseded", "rule retention no longer selects C.32733029")]


async def test_timer_counts_missed_runs(aiohttp_client, policy_settings):
    import asyncio

    client = await aiohttp_client(create_app(policy_settings))
    engine = client.app[CORE].policy
    cycles = []

    async def slow_cycle(execute, now=None, full=True):
        cycles.append(execute)
        await asyncio.sleep(0.25)  # a cycle that takes 2.5 intervals

    engine.run_cycle = slow_cycle
    stop = asyncio.Event()
    task = asyncio.ensure_future(engine.run_forever(0.1, False, stop))
    while len(cycles) < 3:
        await asyncio.sleep(0.01)
    stop.set()
    await task
    missed = client.app[CORE].policy.metrics.policy_missed._value.get()
    assert missed >= 2 * (len(cycles) - 1) - 1  # each long cycle skips ~2 ticks, none replayed
    assert len(cycles) <= 4


async def _woken_cycles(engine, cycle_s: float = 0.4):
    """The timer started with a 30 s interval (no run but the first is timed) and runs that take
    ``cycle_s``: [started, ended] of each run (time.monotonic()), the stop event and the timer's task."""
    import asyncio
    import time

    cycles: list[list[float]] = []

    async def slow_cycle(execute, now=None, full=True):
        cycles.append([time.monotonic(), 0.0])
        await asyncio.sleep(cycle_s)  # a run on a loaded host
        cycles[-1][1] = time.monotonic()

    engine.run_cycle = slow_cycle
    stop = asyncio.Event()
    task = asyncio.ensure_future(engine.run_forever(30.0, False, stop))
    return cycles, stop, task


async def test_a_wake_up_during_a_woken_run_is_not_held_after_it(aiohttp_client, policy_settings):
    """Evidence stored just after a woken run began is seen by the next run: that one starts as soon
    as the first ends (the fleet sim's slowest decisions waited a whole run's length more, then their own)."""
    import asyncio
    import time

    client = await aiohttp_client(create_app(policy_settings))
    engine = client.app[CORE].policy
    cycles, stop, task = await _woken_cycles(engine)
    deadline = time.monotonic() + 30
    while not (cycles and cycles[0][1]):  # the timer's first run, at start-up
        assert time.monotonic() < deadline, "no run at start-up"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # an idle spell (what is measured below starts after it)
    engine.wake()
    while len(cycles) < 2:
        assert time.monotonic() < deadline, "a wake-up ran no cycle"
        await asyncio.sleep(0.01)
    engine.wake()  # evidence stored while the woken run runs
    while len(cycles) < 3:
        assert time.monotonic() < deadline, "the second wake-up ran no cycle"
        await asyncio.sleep(0.01)
    stop.set()
    await task
    first, second = cycles[1], cycles[2]
    run_s, gap_s = first[1] - first[0], second[0] - first[1]
    assert gap_s < run_s / 2, f"the second woken run waited {gap_s:.2f} s after a {run_s:.2f} s run"


async def test_a_storm_of_wake_ups_gets_at_most_about_half_the_time(aiohttp_client, policy_settings):
    """Wake-ups without pause (a fleet completing its logs all at once): woken runs take at most about
    half of the time once a burst of two back to back is spent, so ingest and reads keep the rest."""
    import asyncio
    import time

    client = await aiohttp_client(create_app(policy_settings))
    engine = client.app[CORE].policy
    cycles, stop, task = await _woken_cycles(engine, cycle_s=0.1)
    deadline = time.monotonic() + 60
    while not (cycles and cycles[0][1]):
        assert time.monotonic() < deadline, "no run at start-up"
        await asyncio.sleep(0.01)
    while len(cycles) < 16:
        engine.wake()
        assert time.monotonic() < deadline, "wake-ups ran no cycles"
        await asyncio.sleep(0.005)
    stop.set()
    await task
    woken = [c for c in cycles[1:] if c[1]]
    busy = sum(end - start for start, end in woken)
    span = woken[-1][1] - woken[0][0]
    assert busy / span <= 0.6, f"woken runs took {busy / span:.0%} of {span:.2f} s"
    assert busy / span >= 0.3, f"woken runs took only {busy / span:.0%} of {span:.2f} s: held too long"


async def test_broken_rule_stops_startup_naming_the_file(tmp_path, settings):
    queries = tmp_path / "queries"
    (queries / "policies").mkdir(parents=True)
    (queries / "policies" / "10_bad.sql").write_text("-- rule: bad\n-- output: decisions\nDELETE FROM logs")
    from ingest.config import ConfigError
    from ingest.db.sqlfiles import load_rules

    with pytest.raises(ConfigError, match="10_bad.sql.*only SELECT"):
        load_rules(queries)


async def test_metrics_expose_fleet_gauges(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await incident(client, done, logs_complete=False)
    await bench_instance(client, "C.40", 777, done=done, exit_code=0, rate=40.0, gpu_model="RTX 4090")
    await run_policies(client)
    text = await (await client.get("/metrics")).text()
    for line in (
        'fleetlog_fleet_instances{state="bench_done"} 2.0',
        'fleetlog_fleet_best_rate_proofs_per_hour{gpu_model="RTX 4090",machine_id="777"} 40.0',
        "fleetlog_fleet_bad_hosts 1.0",
        "fleetlog_fleet_eligible_hosts 1.0",
        'fleetlog_fleet_failed_bench_runs{failure_class="oom"} 1.0',
        "fleetlog_fleet_incomplete_log_instances 2.0",
        'fleetlog_policy_decisions{action="exclude_host",state="executed"} 1.0',
    ):
        assert line in text, line


async def test_gpu_lost_event_from_the_agent_classifies_a_failure_without_log_evidence(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.lost", 43, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.lost", "benchout", ["proof 1 started"], at=done - dt.timedelta(minutes=2))
    await post(client, "/api/v1/events", {"instance_id": "C.lost", "kind": "gpu_state", "state": "gpu_lost", "gpu": 0,
                                           "reason": "NVML: GPU_IS_LOST", "ts": (done - dt.timedelta(seconds=5)).isoformat()})
    await run_policies(client)
    [(failure_class, failure_line)] = rows(client, "SELECT failure_class, failure_line FROM bench_runs")
    assert failure_class == "gpu_lost" and "NVML: GPU_IS_LOST" in failure_line
