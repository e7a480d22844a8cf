"""Decisions true to the evidence (issue 12): one definition of each rule, late evidence, stale
proposals, blame by class, failing phases, notifications. Each case runs the real app on a real
DuckDB file; actuators and notification receivers are real HTTP servers on loopback."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from ingest.app import create_app
from ingest.web.keys import CORE
from ingest.db.sqlfiles import compose
from tests.conftest import REPO
from tests.fleet import (until, bench_instance, complete_logs, demo_fleet, get, hung_instance, incident, iso, log_push,
                         params_failure, post, push_lines, rows, run_policies, utcnow)


@pytest.fixture
def policy_settings(settings):
    return replace(settings, policy_interval_s=0)  # tests run cycles themselves


async def incomplete_log_instances(client) -> list[list]:
    """queries/incomplete_logs.sql through the SQL API."""
    sql = compose(REPO / "queries" / "incomplete_logs.sql", REPO / "queries")
    r = await client.post("/api/v1/query", data=orjson.dumps({"sql": sql}))
    assert r.status == 200, await r.text()
    return (await r.json())["rows"]


async def gauges(client) -> dict[str, dict[tuple, float]]:
    text = await (await client.get("/metrics")).text()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


class Recorder:
    """A loopback HTTP server that records every JSON body POSTed to it (and answers ``status``)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.status = 200

    def app(self) -> web.Application:
        async def hook(request: web.Request) -> web.Response:
            self.bodies.append(await request.json())
            return web.json_response({"ok": self.status == 200}, status=self.status)

        app = web.Application()
        app.router.add_post("/hook", hook)
        return app


async def recorder(aiohttp_server) -> tuple[Recorder, str]:
    rec = Recorder()
    server = await aiohttp_server(rec.app())
    return rec, str(server.make_url("/hook"))


# -- 1. one definition of each rule: the API, the gauges and the SQL agree ------------------------------

async def test_api_gauges_and_sql_agree_on_the_demo_fleet(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await demo_fleet(client, done)
    await run_policies(client)

    # logs complete: the read API (list and detail), the canned question, the view and the gauge
    listed = {row["instance_id"]: row for row in (await get(client, "/api/v1/instances"))["instances"]}
    api_incomplete = {i for i, row in listed.items() if not row["logs"]["complete"]}
    detail_incomplete = {i for i in listed if not (await get(client, f"/api/v1/instances/{i}"))["logs_complete"]}
    sql_incomplete = {i for (i,) in rows(client, "SELECT instance_id FROM instance_logs WHERE incomplete")}
    question = {r[0] for r in await incomplete_log_instances(client)}
    metrics = await gauges(client)
    assert api_incomplete == detail_incomplete == sql_incomplete == question == {"C.31", "C.drop", "C.hung"}
    assert metrics["fleetlog_fleet_incomplete_log_instances"][()] == 3

    # failed runs, by class: the gauge, the view; failed instances by phase: the gauge, the API, the view
    by_class = {k[0][1]: v for k, v in metrics["fleetlog_fleet_failed_bench_runs"].items()}
    sql_by_class = dict(rows(client, "SELECT failure_class, count(*) FROM bench_outcomes WHERE failed GROUP BY 1"))
    assert by_class == sql_by_class == {"oom": 1, "unknown": 1, "hung": 1}
    by_phase = {k[0][1]: v for k, v in metrics["fleetlog_fleet_failed_instances"].items()}
    api_phase: dict[str, int] = {}
    for row in listed.values():
        if row["failed_phase"] and row["state"] != "killed":
            api_phase[row["failed_phase"]] = api_phase.get(row["failed_phase"], 0) + 1
    assert by_phase == api_phase == {"benchmark": 3, "params": 1}
    assert {i: row["outcome"] for i, row in listed.items()} == {
        "C.32733029": "failed", "C.40": "passed", "C.31": "passed", "C.12": "below_min_rate", "C.drop": "failed",
        "C.params": "params_failed", "C.hung": "hung", "C.60": "passed", "C.30": "passed"}

    # degraded machines: the hosts API, the view, the rule's decisions (machine 782: 60, then 30)
    api_degraded = {h["machine_id"] for h in (await get(client, "/api/v1/hosts"))["hosts"] if h["degraded"]}
    sql_degraded = {m for (m,) in rows(client, "SELECT machine_id FROM host_degradation WHERE degraded")}
    decided = {int(s) for (s,) in rows(client, "SELECT subject FROM decisions WHERE rule = 'degraded_hosts'")}
    assert api_degraded == sql_degraded == decided == {782}

    # the destroy gate rests on the same definitions: complete logs, or (C.hung, C.drop) the grace period
    destroys = dict(rows(client, "SELECT subject, evidence->>'waited_for' FROM decisions WHERE action = 'destroy'"))
    assert destroys == {"C.32733029": "logs_complete", "C.12": "logs_complete", "C.params": "logs_complete",
                        "C.hung": "grace_period"}
    later = await run_policies(client, now=utcnow() + dt.timedelta(seconds=policy_settings.destroy_grace_s + 1))
    assert rows(client, "SELECT subject, evidence->>'waited_for' FROM decisions WHERE id = ?", later.new_decisions[:1]) == [
        ("C.drop", "grace_period")]


async def test_dropped_lines_make_a_stream_incomplete_in_api_and_sql(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.d", 5, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.d", "benchdaemon", ["a", "b", "c"], at=done)
    await post(client, "/api/v1/events", {"instance_id": "C.d", "kind": "logs_complete", "ts": iso(done),
                                           "sources": {"benchdaemon": 2}, "dropped": {"benchdaemon": 41}})
    logs = (await get(client, "/api/v1/instances/C.d"))["logs"]
    assert logs["benchdaemon"]["dropped"] == 41 and logs["benchdaemon"]["complete"] is False
    assert rows(client, "SELECT complete, why_incomplete FROM log_streams WHERE instance_id = 'C.d'") == [
        (False, "lines dropped by the agent")]
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]  # waits for the grace


# -- 2. a class follows its evidence ------------------------------------------------------------------

async def _otlp_line(client, instance_id: str, source: str, line: str) -> None:
    body = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.instance.id", "value": {"stringValue": instance_id}}]},
                              "scopeLogs": [{"logRecords": [{"body": {"stringValue": line}, "attributes": [
                                  {"key": "log.source", "value": {"stringValue": source}}]}]}]}]}
    r = await client.post("/v1/logs", data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status == 200, await r.text()


@pytest.mark.parametrize("pusher", ["log-push", "otlp"])
async def test_late_oom_line_reclassifies_the_run_and_what_depends_on_it(aiohttp_client, policy_settings, pusher):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    # an earlier failure on the machine, so that an `unknown` one is the second (blamed on repeat)
    await bench_instance(client, "C.before", 55891, done=done - dt.timedelta(hours=2), exit_code=1, rate=0.0)
    await complete_logs(client, "C.before", done - dt.timedelta(hours=2), {"benchout": -1})
    await bench_instance(client, "C.32733029", 55891, done=done, exit_code=1, rate=0.0, gpu_model="RTX PRO 4000")
    await run_policies(client)
    assert rows(client, "SELECT failure_class, failure_line, class_final FROM bench_runs WHERE instance_id = 'C.32733029'") == [
        ("unknown", None, False)]
    [(reason,)] = rows(client, "SELECT reason FROM decisions WHERE action = 'exclude_host' AND (evidence->>'instance_id') = 'C.32733029'")
    assert "unknown" in reason and "0.0 proofs/hour" not in reason and "no rate measured" in reason

    oom = "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating 3.2 GiB for NTT"
    if pusher == "log-push":
        await log_push(client, "C.32733029", "cuzk", ["prover thread starting", oom])
    else:
        await _otlp_line(client, "C.32733029", "cuzk", "prover thread starting")
        await _otlp_line(client, "C.32733029", "cuzk", oom)
    await complete_logs(client, "C.32733029", done, {"cuzk": 1})
    report = await run_policies(client)

    assert rows(client, "SELECT failure_class, failure_line, class_final FROM bench_runs WHERE instance_id = 'C.32733029'") == [
        ("oom", oom, True)]
    [(reason, evidence)] = rows(client, "SELECT reason, evidence FROM decisions WHERE action = 'exclude_host' "
                                        "AND (evidence->>'instance_id') = 'C.32733029'")
    assert reason.startswith("benchmark failed on instance C.32733029: oom") and orjson.loads(evidence)["failure_line"] == oom
    destroy = (await get(client, "/api/v1/decisions?action=destroy&subject=C.32733029"))["decisions"]
    assert [d["evidence"]["failure_class"] for d in destroy] == ["oom"] and "oom" in destroy[0]["reason"]
    assert destroy[0]["id"] in report.new_decisions
    host = await get(client, "/api/v1/hosts/55891")
    assert host["bad"] is True and "oom" in host["reason"]

    # final now: a later line changes nothing
    await log_push(client, "C.32733029", "cuzk", ["NVRM: Xid 79, GPU has fallen off the bus"])
    await run_policies(client)
    assert rows(client, "SELECT failure_class FROM bench_runs WHERE instance_id = 'C.32733029'") == [("oom",)]


async def test_class_is_final_after_the_grace_period(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, destroy_grace_s=600)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.9", 9, done=done, exit_code=1, rate=0.0)
    stored = utcnow()  # the grace runs from when the server stored the run's end
    await run_policies(client, now=stored + dt.timedelta(seconds=601))
    assert rows(client, "SELECT failure_class, class_final FROM bench_runs") == [("unknown", True)]
    await log_push(client, "C.9", "cuzk", ["CUDA error: out of memory"])
    await run_policies(client, now=stored + dt.timedelta(seconds=700))
    assert rows(client, "SELECT failure_class FROM bench_runs") == [("unknown",)]
    [(evidence,)] = rows(client, "SELECT evidence FROM decisions WHERE action = 'destroy'")
    assert orjson.loads(evidence)["failure_class"] == "unknown"


# -- 3. proposals re-checked right before they are carried out -------------------------------------------

async def test_stale_destroy_is_superseded_and_never_carried_out(aiohttp_client, aiohttp_server, policy_settings):
    actuator, actuator_url = await recorder(aiohttp_server)
    notified, notify_url = await recorder(aiohttp_server)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_webhook_url=actuator_url,
                                                     notify_webhook_url=notify_url)))
    done = utcnow() - dt.timedelta(minutes=20)
    await incident(client, done, logs_complete=True)
    r = await client.post("/api/v1/hosts/55891/exclude", data=orjson.dumps({"reason": "operator distrusts it"}))
    assert r.status == 200
    dry = await run_policies(client)  # dry run: the destroy is proposed
    [destroy] = (await get(client, "/api/v1/decisions?action=destroy"))["decisions"]
    assert destroy["state"] == "proposed" and destroy["id"] in dry.new_decisions

    # the instance benchmarks again, at 40 proofs/hour, with its logs complete
    again = utcnow() - dt.timedelta(seconds=5)
    await post(client, "/api/v1/events", [
        {"instance_id": "C.32733029", "kind": "bench_started", "ts": iso(again - dt.timedelta(minutes=5)), "proofs": 12},
        {"instance_id": "C.32733029", "kind": "bench_done", "ts": iso(again), "exit_code": 0, "rate_per_hour": 40.0,
         "duration_s": 300.0, "proofs_ok": 12},
    ])
    r = await client.post("/api/v1/policy/run?execute=1")
    report = await r.json()
    assert r.status == 200 and report["superseded"] == [destroy["id"]] and report["executed"] == []
    assert actuator.bodies == []  # the actuator was never called
    [after] = (await get(client, "/api/v1/decisions?state=superseded"))["decisions"]
    assert after["id"] == destroy["id"] and "no longer selects" in after["last_error"]
    assert (await get(client, "/api/v1/instances/C.32733029"))["state"] == "bench_done"
    await run_policies(client, execute=True)  # never executed later either
    assert actuator.bodies == [] and rows(client, "SELECT state FROM decisions WHERE id = ?", [destroy["id"]]) == [("superseded",)]
    host = await get(client, "/api/v1/hosts/55891")  # the operator's verdict still wins
    assert (host["bad"], host["verdict_by"]) == (True, "operator")

    await until("proposed and superseded notifications", lambda: {
        (b["event"], b["decision"]["id"]) for b in notified.bodies} >= {("proposed", destroy["id"]), ("superseded", destroy["id"])})
    sup = next(b for b in notified.bodies if b["event"] == "superseded")
    assert sup["decision"]["evidence"]["failure_class"] == "oom" and sup["decision"]["subject"] == "C.32733029"


async def test_destroy_still_selected_is_carried_out_with_current_evidence(aiohttp_client, aiohttp_server, policy_settings):
    actuator, actuator_url = await recorder(aiohttp_server)
    notified, notify_url = await recorder(aiohttp_server)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_webhook_url=actuator_url,
                                                     notify_webhook_url=notify_url)))
    await incident(client, utcnow() - dt.timedelta(seconds=30), logs_complete=True)
    await run_policies(client)
    report = await run_policies(client, execute=True)
    assert len(report.executed) == 1 and report.superseded == []
    [body] = actuator.bodies
    assert body["subject"] == "C.32733029" and body["evidence"]["failure_class"] == "oom"
    await until("executed notification", lambda: any(b["event"] == "executed" for b in notified.bodies))


# -- 4. blame by class ------------------------------------------------------------------------------

@pytest.mark.parametrize("line, blamed_at_once", [
    ("CUDA error: out of memory (cudaErrorMemoryAllocation)", True),
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", True),
    ("CUDA error: an illegal memory access was encountered", True),
    ("rpc error: code = Unavailable desc = connection refused (127.0.0.1:9820)", False),
    ("error: warm-up proof timed out after 1800 s", False),
    ("failed to fetch params: v28-stacked-proof-of-replication: HTTP 503", False),
    ("proof 3 started", False),  # unknown
])
async def test_machine_is_blamed_at_once_only_for_its_own_failure_classes(aiohttp_client, policy_settings, line, blamed_at_once):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(hours=3)
    await bench_instance(client, "C.a", 42, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.a", "benchdaemon", ["daemon starting", line], at=done - dt.timedelta(minutes=1))
    await complete_logs(client, "C.a", done, {"benchdaemon": 1})
    await run_policies(client)
    excluded = rows(client, "SELECT reason FROM decisions WHERE action = 'exclude_host'")
    assert bool(excluded) == blamed_at_once
    assert (await get(client, "/api/v1/hosts/42"))["bad"] is blamed_at_once

    # the same failure again on the same machine, within the exclusion TTL: now it is the machine
    await bench_instance(client, "C.b", 42, done=done + dt.timedelta(hours=1), exit_code=1, rate=0.0)
    await push_lines(client, "C.b", "benchdaemon", ["daemon starting", line], at=done + dt.timedelta(minutes=59))
    await complete_logs(client, "C.b", done + dt.timedelta(hours=1), {"benchdaemon": 1})
    await run_policies(client)
    reasons = [r for (r,) in rows(client, "SELECT reason FROM decisions WHERE action = 'exclude_host' ORDER BY id")]
    assert len(reasons) == 2 if blamed_at_once else len(reasons) == 1
    assert "failure 2 on this machine" in reasons[-1] or blamed_at_once
    assert all("0.0 proofs/hour" not in r and "no rate measured" in r for r in reasons)
    assert (await get(client, "/api/v1/hosts/42"))["bad"] is True


async def test_repeat_count_is_a_setting_and_counts_within_the_ttl_only(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, exclude_repeat_failures=3, bad_host_ttl_s=86400)))
    now = utcnow()
    for i, hours_ago in enumerate((50, 5, 3)):  # the first is outside the one-day TTL of the third
        await bench_instance(client, f"C.{i}", 7, done=now - dt.timedelta(hours=hours_ago), exit_code=1, rate=0.0)
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'exclude_host'") == [(0,)]
    await bench_instance(client, "C.3", 7, done=now - dt.timedelta(hours=1), exit_code=1, rate=0.0)
    await run_policies(client)
    [(reason,)] = rows(client, "SELECT reason FROM decisions WHERE action = 'exclude_host'")
    assert "failure 3 on this machine within 1.0 days" in reason


async def test_agent_timeout_is_classed_timeout_and_blamed_on_repeat_only(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.t", 60, done=done - dt.timedelta(minutes=10), exit_code=0, rate=0.0)  # started
    await post(client, "/api/v1/events", {"instance_id": "C.t", "kind": "bench_done", "ts": iso(done), "exit_code": 143,
                                           "timeout": True, "max_duration_s": 5400})
    await complete_logs(client, "C.t", done, {"benchout": -1})
    await run_policies(client)
    assert rows(client, "SELECT failure_class, failure_line FROM bench_runs WHERE done_at = ?", [done]) == [
        ("timeout", "bench_done: timed out (agent --max-duration 5400 s)")]
    [(reason,)] = rows(client, "SELECT reason FROM decisions WHERE action = 'destroy'")
    assert reason == "benchmark failed (exit 143, no rate measured, timeout)"
    # the earlier run (exit 0, no rate) and this one: two failures on machine 60, so now it is excluded
    [(exclusion,)] = rows(client, "SELECT reason FROM decisions WHERE action = 'exclude_host' ORDER BY id DESC LIMIT 1")
    assert exclusion.startswith("benchmark failed on instance C.t: timeout (exit 143, no rate measured); failure 2")


# -- 5. phases fail too ----------------------------------------------------------------------------

async def test_failed_parameter_fetch_fails_the_instance_and_proposes_a_destroy(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    at = utcnow() - dt.timedelta(seconds=30)
    await params_failure(client, "C.p", 780, at=at, exit_code=2)
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]  # no evidence yet
    assert rows(client, "SELECT failed_phase, failure_class FROM instance_phase WHERE instance_id = 'C.p'") == [
        ("params", "param_fetch")]
    await push_lines(client, "C.p", "setup", ["fetching parameters", "error: paramfetch: HTTP 503"], at=at)
    await complete_logs(client, "C.p", at, {"setup": 1})
    await run_policies(client)
    [(reason, evidence)] = rows(client, "SELECT reason, evidence FROM decisions WHERE action = 'destroy'")
    evidence = orjson.loads(evidence)
    assert reason == "parameter fetch failed (exit 2, param_fetch)"
    assert (evidence["phase"], evidence["failure_class"], evidence["waited_for"]) == ("params", "param_fetch", "logs_complete")
    detail = await get(client, "/api/v1/instances")
    assert [(r["outcome"], r["failed_phase"]) for r in detail["instances"]] == [("params_failed", "params")]
    # one failed fetch does not blame the machine (param_fetch is blamed on repeat)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'exclude_host'") == [(0,)]


async def test_failed_fetch_waits_for_its_own_run_logs_not_the_entrypoints(aiohttp_client, policy_settings):
    # wrap's params_done names its run (as bench_started does): its evidence is that run's streams. The
    # entrypoint's own log stays open until the container stops; waiting for it made a failed fetch's
    # destroy wait out the grace period (the fleet sim: 5 s after the fetch's logs were complete)
    client = await aiohttp_client(create_app(policy_settings))
    at = utcnow() - dt.timedelta(seconds=30)
    await params_failure(client, "C.pr", 781, at=at, exit_code=3, run_id="20261202T163000Z-aa01")
    await post(client, "/api/v1/logs", {"instance_id": "C.pr", "source": "entrypoint", "run_id": "20261202T162900Z-0e01",
                                        "lines": [{"seq": 0, "ts": iso(at), "line": "fetching proving parameters"}]})
    await post(client, "/api/v1/logs", {"instance_id": "C.pr", "source": "setup", "run_id": "20261202T163000Z-aa01",
                                        "lines": [{"seq": 0, "ts": iso(at), "line": "curl: (28) Operation timed out"}]})
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'") == [(0,)]  # its run not complete yet
    await post(client, "/api/v1/events", {"instance_id": "C.pr", "kind": "logs_complete", "ts": iso(at),
                                           "run_id": "20261202T163000Z-aa01", "sources": {"setup": 0}})
    await run_policies(client)
    [(evidence,)] = rows(client, "SELECT evidence FROM decisions WHERE action = 'destroy'")
    evidence = orjson.loads(evidence)
    assert (evidence["phase"], evidence["waited_for"]) == ("params", "logs_complete")
    assert rows(client, "SELECT logs_complete, evidence_complete FROM instance_phase WHERE instance_id = 'C.pr'") == [(False, True)]


async def test_params_done_exit_code_must_be_an_integer(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    r = await client.post("/api/v1/events", data=orjson.dumps(
        {"instance_id": "C.p", "kind": "params_done", "ts": iso(utcnow()), "exit_code": "two"}))
    assert r.status == 400 and "exit_code" in (await r.json())["error"]
    assert rows(client, "SELECT count(*) FROM events") == [(0,)]


async def test_hung_benchmark_is_classed_hung_and_destroyed(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, bench_timeout_s=3600)))
    await hung_instance(client, "C.hung", 781, started=utcnow() - dt.timedelta(hours=3))
    await hung_instance(client, "C.busy", 782, started=utcnow() - dt.timedelta(minutes=30))  # still within its time
    await run_policies(client)
    assert dict(rows(client, "SELECT instance_id, outcome FROM bench_outcomes")) == {"C.hung": "hung", "C.busy": "running"}
    [(subject, reason, evidence)] = rows(client, "SELECT subject, reason, evidence FROM decisions WHERE action = 'destroy'")
    assert subject == "C.hung" and reason == "benchmark hung (no bench_done 3600 s after bench_started)"
    assert orjson.loads(evidence)["failure_class"] == "hung" and orjson.loads(evidence)["waited_for"] == "grace_period"
    host = await get(client, "/api/v1/hosts/781")
    assert host["bad"] is False and host["failed_runs"] == 1  # hung once: not yet the machine's fault


# -- 6. notifications ------------------------------------------------------------------------------

async def test_failing_notify_webhook_is_counted_and_never_blocks_the_cycle(aiohttp_client, aiohttp_server, policy_settings):
    notified, notify_url = await recorder(aiohttp_server)
    notified.status = 500
    client = await aiohttp_client(create_app(replace(policy_settings, notify_webhook_url=notify_url)))
    await incident(client, utcnow() - dt.timedelta(seconds=30), logs_complete=True)
    report = await run_policies(client)
    assert len(report.new_decisions) == 2
    await until("both notifications tried", lambda: len(notified.bodies) == 2)
    events = sorted((b["event"], b["decision"]["action"]) for b in notified.bodies)
    assert events == [("executed", "exclude_host"), ("proposed", "destroy")]
    assert all("evidence" in b["decision"] for b in notified.bodies)

    async def dropped():
        return (await gauges(client)).get("fleetlog_policy_notifications_dropped_total", {}).get((("reason", "status"),))

    import asyncio
    for _ in range(200):
        if await dropped() == 2:
            break
        await asyncio.sleep(0.05)
    assert await dropped() == 2


async def test_unreachable_notify_webhook_is_counted(aiohttp_client, policy_settings):
    from tests.conftest import free_port

    client = await aiohttp_client(create_app(replace(policy_settings, notify_webhook_url=f"http://127.0.0.1:{free_port()}/x")))
    await incident(client, utcnow() - dt.timedelta(seconds=30), logs_complete=True)
    assert len((await run_policies(client)).new_decisions) == 2
    await client.app[CORE].policy.close()  # waits for the two attempts
    counted = (await gauges(client))["fleetlog_policy_notifications_dropped_total"]
    assert counted[(("reason", "unreachable"),)] == 2


async def test_one_webhook_client_posts_json_and_names_an_unreachable_hook(aiohttp_server):
    """``notify.post_json`` serves the notifier and the webhook actuator alike: naive datetimes go out
    as UTC, the answer comes back as (status, text), and no answer is one error."""
    from ingest.policy.actuator import ActuationError, WebhookActuator
    from ingest.policy.notify import WebhookUnreachable, post_json
    from tests.conftest import free_port

    hook, url = await recorder(aiohttp_server)
    hook.status = 503
    status, text = await post_json(url, {"at": dt.datetime(2024, 5, 1, 12, 0)}, 5.0)
    assert (status, orjson.loads(text)) == (503, {"ok": False})
    assert hook.bodies == [{"at": "2024-05-01T12:00:00+00:00"}]
    with pytest.raises(WebhookUnreachable, match="ClientConnectorError"):
        await post_json(f"http://127.0.0.1:{free_port()}/x", {}, 5.0)
    with pytest.raises(ActuationError, match=r"^webhook answered 503: \{\"ok\": false\}$"):
        await WebhookActuator(url, 5.0).carry_out({"id": 1})
