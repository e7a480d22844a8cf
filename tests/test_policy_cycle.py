"""A policy cycle whose cost follows what changed (issue 21.2, 21.3) and a record that says what
happened (21.4): incremental classification over a backlog of failed runs, one rule timing out
while the others still run, a destroy cap that serves everyone in turn, decisions carried out
within two intervals of the logs completing, true timestamps, stale episodes that cannot double.

The backlog is bulk-inserted (one INSERT ... SELECT through the writer): failed runs whose logs
never complete, so their class is never final and every cycle considers them."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import replace

import pytest

from ingest.app import create_app
from ingest.db import writes
from ingest.web.keys import CORE, WRITER
from tests.fleet import bench_instance, complete_logs, get, iso, post, push_lines, rows, run_policies, until, utcnow


@pytest.fixture
def policy_settings(settings):
    return replace(settings, policy_interval_s=0, min_rate=29.0)  # tests run cycles themselves


async def backlog(client, runs: int, lines: int, done: dt.datetime) -> None:
    """``runs`` failed benchmark runs (exit 1, no rate, logs never complete) of ``lines`` daemon
    lines each, none of which names a failure class; the lines were received a while ago."""
    for i in range(runs):
        await bench_instance(client, f"C.backlog{i}", 5000 + i, done=done, exit_code=1, rate=0.0)
    ts0, recv0 = done - dt.timedelta(minutes=10), done - dt.timedelta(minutes=5)

    def insert(con) -> None:
        con.execute(
            """INSERT INTO logs
               SELECT 'C.backlog' || (i % ?)::VARCHAR, 'benchdaemon', '0', i // ?, ?::TIMESTAMP + to_microseconds(i * 1000),
                      ?::TIMESTAMP + to_microseconds(i * 100),
                      'INFO cuzk_daemon::prover: partition ' || i::VARCHAR || ' synthesized in 812 ms (constraints 130278869)',
                      false
               FROM range(?) t(i)""",
            [runs, runs, ts0, recv0, runs * lines],
        )
        writes.recount_stream_lines(con)

    await client.app[WRITER].execute(insert, kind="policy")


def lines_fed_to_patterns(client, rule_name: str, now: dt.datetime) -> int:
    """EXPLAIN ANALYZE of the rule as the next cycle would run it: the most rows that entered an
    operator matching lines against the patterns (regexp_matches)."""
    engine = client.app[CORE].policy
    [rule] = [r for r in engine.rules if r.name == rule_name]
    params = engine.params.values(now)
    from ingest.web.keys import DB

    cur = client.app[DB].cursor()
    try:
        [(_, plan)] = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + rule.sql, {p: params[p] for p in rule.params}).fetchall()
    finally:
        cur.close()

    def walk(node) -> int:
        children = node.get("children", [])
        here = 0
        if "regexp_matches" in json.dumps(node.get("extra_info", {})):
            here = max((c.get("operator_cardinality", 0) for c in children), default=0)
        return max([here, *(walk(c) for c in children)])

    return walk(json.loads(plan))


async def test_second_cycle_classes_only_the_new_lines_of_a_backlog(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, query_timeout_s=120.0)))
    done = utcnow() - dt.timedelta(seconds=60)
    await backlog(client, 16, 300, done)
    first = await run_policies(client)
    assert first.classified == 16
    assert dict(rows(client, "SELECT failure_class, count(*) FROM bench_runs GROUP BY 1")) == {"unknown": 16}

    # new evidence for two runs: a line naming no class, and an OOM line
    await push_lines(client, "C.backlog3", "cuzk", ["prover thread starting"], at=done - dt.timedelta(seconds=1))
    oom = "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation)"
    await push_lines(client, "C.backlog7", "cuzk", ["prover thread starting", oom], at=done - dt.timedelta(seconds=1))
    fed = lines_fed_to_patterns(client, "failure_class", utcnow())
    assert fed <= 3, f"the next cycle matches {fed} lines against the patterns, not the 3 new ones"
    second = await run_policies(client)
    assert second.class_lines_scanned == 3
    assert rows(client, "SELECT instance_id, failure_class, failure_line FROM bench_runs WHERE failure_class <> 'unknown'") == [
        ("C.backlog7", "oom", oom)]
    third = await run_policies(client)  # nothing new: nothing matched, nothing rewritten
    assert third.class_lines_scanned == 0 and third.classified == 0
    metrics = await (await client.get("/metrics")).text()
    assert "fleetlog_policy_class_lines_scanned_total 4803.0" in metrics  # 4,800 once, then the 3 new ones


async def test_a_backlog_never_classed_is_worked_off_over_cycles(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=60)
    await backlog(client, 40, 3, done)
    assert [(await run_policies(client)).classified for _ in range(3)] == [32, 8, 0]  # at most 32 first passes a cycle
    assert rows(client, "SELECT count(*) FROM bench_runs WHERE failure_class = 'unknown'") == [(40,)]


SLOW_CLASSIFY = """SELECT instance_id, done_at, 'unknown' AS failure_class, NULL AS failure_line, false AS final
FROM bench_runs WHERE (SELECT sum(r) FROM range(100000000000) t(r)) < 0"""


async def test_timed_out_class_rule_lets_the_other_rules_run_and_is_reported(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, query_timeout_s=1.0)))
    engine = client.app[CORE].policy
    engine.rules = [replace(r, sql=SLOW_CLASSIFY, params=()) if r.output == "classify" else r for r in engine.rules]
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.slow", 900, done=done, exit_code=0, rate=12.5)
    await complete_logs(client, "C.slow", done, {"benchout": -1})

    report = await run_policies(client)
    assert rows(client, "SELECT subject, action FROM decisions") == [("C.slow", "destroy")]
    assert set(report.rule_errors) == {"failure_class"} and "timeout" in report.rule_errors["failure_class"]
    metrics = await (await client.get("/metrics")).text()
    assert 'fleetlog_policy_rule_errors_total{reason="timeout",rule="failure_class"} 1.0' in metrics
    assert 'fleetlog_policy_rule_failing{rule="failure_class"} 1.0' in metrics
    assert 'fleetlog_policy_rule_failing{rule="destroy_below_min_rate"} 0.0' in metrics
    ready = await (await client.get("/readyz")).json()
    assert list(ready["policy"]["failing_rules"]) == ["failure_class"]


async def test_destroy_whose_recheck_times_out_stays_proposed(aiohttp_client, policy_settings, tmp_path):
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, query_timeout_s=1.0, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.slow", 900, done=done, exit_code=0, rate=12.5)
    await complete_logs(client, "C.slow", done, {"benchout": -1})
    await run_policies(client)  # dry run: proposed
    engine = client.app[CORE].policy
    slow = "SELECT * FROM instances WHERE (SELECT sum(r) FROM range(100000000000) t(r)) < 0"  # past query_timeout_s
    engine.rules = [replace(r, sql=slow, params=()) if r.name == "destroy_below_min_rate" else r for r in engine.rules]
    report = await run_policies(client, execute=True)
    assert "destroy_below_min_rate" in report.rule_errors and report.superseded == [] and report.executed == []
    assert calls() == [] and rows(client, "SELECT state FROM decisions WHERE action = 'destroy'") == [("proposed",)]


async def actuator_script(tmp_path, fail_for: str = "") -> tuple[str, object]:
    """A command actuator that records, per call, its instance id and its own clock (epoch seconds);
    it exits 1 for ``fail_for``."""
    log = tmp_path / "actuator.log"
    script = tmp_path / "actuator.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"echo \"$1 $(date +%s.%N)\" >> {log}\n"
        f"if [ \"$1\" = \"{fail_for or '-'}\" ]; then echo 'error: provider refused' >&2; exit 1; fi\n"
    )
    script.chmod(0o755)

    def calls() -> list[tuple[str, dt.datetime]]:
        if not log.exists():
            return []
        out = []
        for line in log.read_text().splitlines():
            subject, clock = line.split()
            out.append((subject, dt.datetime.fromtimestamp(float(clock), dt.timezone.utc).replace(tzinfo=None)))
        return out

    return f"{script} {{instance_id}}", calls


async def test_destroy_cap_serves_a_waiting_destroy_before_retrying_a_failing_one(aiohttp_client, policy_settings, tmp_path):
    command, calls = await actuator_script(tmp_path, fail_for="C.bad")
    client = await aiohttp_client(create_app(replace(policy_settings, destroy_cap_per_cycle=1, actuator_retries=5,
                                                     actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=60)
    for instance, at in (("C.bad", done), ("C.good", done + dt.timedelta(seconds=1))):
        await bench_instance(client, instance, 700 if instance == "C.bad" else 701, done=at, exit_code=1, rate=0.0)
        await complete_logs(client, instance, at, {"benchout": -1})
    await run_policies(client, execute=True)  # the older one goes first, and fails
    await run_policies(client, execute=True)
    assert [s for s, _ in calls()] == ["C.bad", "C.good"]
    assert dict(rows(client, "SELECT subject, state FROM decisions WHERE action = 'destroy'")) == {
        "C.bad": "proposed", "C.good": "executed"}


async def test_destroys_are_carried_out_within_two_intervals_of_logs_complete(aiohttp_client, policy_settings, tmp_path):
    interval_s = 1.0
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(
        policy_settings, policy_interval_s=interval_s, policy_execute=True, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=60)
    await backlog(client, 16, 300, done)
    targets = [f"C.t{i}" for i in range(6)]
    for i, instance in enumerate(targets):
        await bench_instance(client, instance, 800 + i, done=done, exit_code=1, rate=0.0)
        await push_lines(client, instance, "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
    for instance in targets:
        await asyncio.sleep(0.4)
        await complete_logs(client, instance, done, {"cuzk": 1})

    deadline = time.monotonic() + 60
    while len({s for s, _ in calls()}) < len(targets) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stored = dict(rows(client, "SELECT instance_id, received_at FROM events WHERE kind = 'logs_complete'"))
    latency = sorted((clock - stored[s]).total_seconds() for s, clock in calls())
    assert len(latency) == len(targets), f"destroyed {len(latency)} of {len(targets)} in 60 s: {latency}"
    print(f"logs complete -> destroy executed, interval {interval_s} s: "
          f"p50 {latency[len(latency) // 2]:.2f} s, max {latency[-1]:.2f} s")
    assert latency[-1] <= 2 * interval_s, f"logs complete -> destroy executed: {latency} s (interval {interval_s} s)"


async def test_decision_times_follow_the_evidence_and_the_actuator(aiohttp_client, policy_settings, tmp_path):
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.oom", 55891, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.oom", "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
    cycle_start = utcnow()  # the cycle starts; the logs_complete is stored while its rules have not run yet
    await asyncio.sleep(0.01)
    await complete_logs(client, "C.oom", done, {"cuzk": 1})
    report = await run_policies(client, execute=True, now=cycle_start)
    assert len(report.executed) == 1
    [(stored,)] = rows(client, "SELECT received_at FROM events WHERE kind = 'logs_complete'")
    [(decided_at, executed_at)] = rows(client, "SELECT decided_at, executed_at FROM decisions WHERE action = 'destroy'")
    [(_, clock)] = calls()
    assert decided_at >= stored, (decided_at, stored)
    assert executed_at >= stored, (executed_at, stored)
    [(settled_at,)] = rows(client, "SELECT settled_at FROM decisions WHERE action = 'destroy'")
    assert executed_at <= clock <= settled_at, (executed_at, clock, settled_at)
    detail = await get(client, "/api/v1/decisions?action=destroy")
    assert detail["decisions"][0]["settled_at"] is not None


async def test_killed_instance_is_marked_stale_once_when_last_seen_moves_without_a_push(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.k", 42, done=done, exit_code=0, rate=40.0)
    await post(client, "/api/v1/events", {"instance_id": "C.k", "kind": "killed", "ts": iso(utcnow())})
    await run_policies(client)
    assert rows(client, "SELECT count(*) FROM decisions WHERE action = 'mark_stale'") == [(1,)]

    # the writer keeps last_seen to a one-second step: an instance seen in a commit moves at the next
    # step's commit, whoever pushed it (here: directly), with nothing pushed for the instance
    await client.app[WRITER].execute(
        lambda con: con.execute("UPDATE instances SET last_seen = last_seen + INTERVAL 3 SECOND WHERE instance_id = 'C.k'"),
        kind="policy")
    await run_policies(client)
    # and a dying agent's last line arrives after the kill
    await push_lines(client, "C.k", "benchout", ["shutting down"], at=utcnow())
    await run_policies(client)
    assert rows(client, "SELECT count(*), min(reason) FROM decisions WHERE action = 'mark_stale'") == [(1, "killed")]


async def policy_runs(client) -> float:
    text = await (await client.get("/metrics")).text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("fleetlog_policy_runs_total{"))


async def test_a_destroy_is_carried_out_within_cycles_of_logs_complete_not_timer_periods(aiohttp_client, policy_settings,
                                                                                         tmp_path):
    interval_s = 30.0  # the timer alone would carry the destroy out up to 30 s later
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(
        policy_settings, policy_interval_s=interval_s, policy_execute=True, actuator_command=command)))
    deadline = time.monotonic() + 30
    while await policy_runs(client) < 1:  # the timer's first cycle, at start-up
        assert time.monotonic() < deadline, "no policy cycle at start-up"
        await asyncio.sleep(0.05)
    done = utcnow() - dt.timedelta(seconds=5)
    await bench_instance(client, "C.oom", 901, done=done, exit_code=1, rate=0.0)
    await push_lines(client, "C.oom", "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
    await complete_logs(client, "C.oom", done, {"cuzk": 1})
    [(stored,)] = rows(client, "SELECT received_at FROM events WHERE instance_id = 'C.oom' AND kind = 'logs_complete'")
    deadline = time.monotonic() + interval_s / 2
    while not calls() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert [s for s, _ in calls()] == ["C.oom"], f"not destroyed within {interval_s / 2} s of its logs completing"
    latency = (calls()[0][1] - stored).total_seconds()
    print(f"logs complete -> destroy executed with a {interval_s} s timer: {latency:.2f} s")
    assert latency < 5, latency
    sql = "SELECT r.failure_class, d.state FROM bench_runs r JOIN decisions d ON d.subject = r.instance_id WHERE d.action = 'destroy'"
    while rows(client, sql)[0][1] != "executed" and time.monotonic() < deadline:  # settled right after the call
        await asyncio.sleep(0.05)
    assert rows(client, sql) == [("oom", "executed")]
    metrics = await (await client.get("/metrics")).text()
    [woken] = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("fleetlog_policy_woken_runs_total ")]
    assert woken >= 1


async def test_lines_alone_do_not_wake_the_policy_cycle(aiohttp_client, policy_settings, tmp_path):
    client = await aiohttp_client(create_app(replace(policy_settings, policy_interval_s=30.0)))
    deadline = time.monotonic() + 30
    while await policy_runs(client) < 1:
        assert time.monotonic() < deadline, "no policy cycle at start-up"
        await asyncio.sleep(0.05)
    done = utcnow() - dt.timedelta(seconds=5)
    await bench_instance(client, "C.busy", 902, done=done, exit_code=0, rate=40.0)
    await complete_logs(client, "C.busy", done, {"benchout": -1})  # wake-ups: params_done, logs_complete
    engine = client.app[CORE].policy
    deadline = time.monotonic() + 10
    while await policy_runs(client) < 2 or engine._lock.locked() or engine._woken.is_set():
        assert time.monotonic() < deadline, "a logs_complete stored did not wake the policy cycle"
        await asyncio.sleep(0.05)
    runs = await policy_runs(client)  # and no cycle running or due but the timer's, 30 s from now
    for i in range(20):  # lines stream in all the time: they wake nothing
        await push_lines(client, "C.busy", "cuzk", [f"partition {i} done"], start=i, at=done)
    await client.app[WRITER].flush()
    await asyncio.sleep(1.0)  # what is measured is an absence: a woken cycle starts within milliseconds of its commit
    assert await policy_runs(client) == runs


async def test_a_wave_of_destroys_is_rechecked_by_one_evaluation(aiohttp_client, policy_settings, tmp_path, monkeypatch):
    from ingest.policy import engine as policy

    monkeypatch.setattr(policy, "RECHECK_MAX_AGE_S", 0.0)  # every re-check must evaluate the rules again
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, destroy_cap_per_cycle=3, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    for i in range(3):
        await bench_instance(client, f"C.w{i}", 910 + i, done=done, exit_code=0, rate=12.5)
        await complete_logs(client, f"C.w{i}", done, {"benchout": -1})
    engine = client.app[CORE].policy
    evaluations = engine.metrics.policy_rule_seconds.labels(rule="destroy_below_min_rate")

    def count() -> float:
        return next(s.value for m in evaluations.collect() for s in m.samples if s.name.endswith("_count"))

    # each subject is sent a sample after the cycle's evaluation: the re-check has something new to read
    await _after_the_destroy_rule(engine, monkeypatch, lambda: [post(client, "/api/v1/metrics", {
        "instance_id": f"C.w{i}", "samples": [{"name": "gpu_temp_c", "value": 60, "ts": iso(utcnow())}]}) for i in range(3)])
    before = count()
    report = await run_policies(client, execute=True)
    assert sorted(s for s, _ in calls()) == ["C.w0", "C.w1", "C.w2"] and len(report.executed) == 3
    assert count() - before == 2, "the cycle's evaluation, then one re-check for the wave of three"


async def _after_the_destroy_rule(engine, monkeypatch, pushes) -> None:
    """Right after the destroy rule's first evaluation (on its worker thread), await ``pushes()`` (a list
    of coroutines) on the test's loop: evidence stored between a cycle's evaluation and its re-check."""
    run_rule, loop, done = engine._run_rule, asyncio.get_running_loop(), []

    def then_push(rule, cur, run, errors):
        result = run_rule(rule, cur, run, errors)
        if rule.name == "destroy_below_min_rate" and not done:
            done.append(True)
            for push in pushes():
                asyncio.run_coroutine_threadsafe(push, loop).result(timeout=30)
        return result

    monkeypatch.setattr(engine, "_run_rule", then_push)


def _destroy_rule_runs(engine):
    evaluations = engine.metrics.policy_rule_seconds.labels(rule="destroy_below_min_rate")
    return lambda: next(s.value for m in evaluations.collect() for s in m.samples if s.name.endswith("_count"))


async def test_a_destroy_whose_instance_stored_nothing_since_the_evaluation_is_not_evaluated_again(
        aiohttp_client, policy_settings, tmp_path, monkeypatch):
    """The re-check's evaluation is the cycle's own when no commit changed the instance since it began,
    whatever its age: on the fleet sim's loaded host the evaluation, the decisions' commit and the wave's
    reads took over RECHECK_MAX_AGE_S, and each destroy waited for a second evaluation with nothing new."""
    from ingest.policy import engine as policy

    monkeypatch.setattr(policy, "RECHECK_MAX_AGE_S", 0.0)  # older than the age that serves whatever changed
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.same", 960, done=done, exit_code=0, rate=12.5)
    await complete_logs(client, "C.same", done, {"benchout": -1})
    await bench_instance(client, "C.other", 961, done=done, exit_code=0, rate=40.0)  # healthy: stays
    engine = client.app[CORE].policy
    count = _destroy_rule_runs(engine)
    # another instance's evidence stored meanwhile changes nothing of C.same's
    await _after_the_destroy_rule(engine, monkeypatch, lambda: [push_lines(client, "C.other", "cuzk", ["proof 3 done"], at=utcnow())])
    before = count()
    report = await run_policies(client, execute=True)
    assert [s for s, _ in calls()] == ["C.same"] and len(report.executed) == 1, report
    assert count() - before == 1, "evaluated again though nothing of C.same was stored since"


async def test_a_destroy_whose_instance_stored_evidence_since_the_evaluation_is_evaluated_again(
        aiohttp_client, policy_settings, tmp_path, monkeypatch):
    """A hung benchmark's bench_done stored between the cycle's evaluation and the actuator call: the
    re-check reads it, and the healthy instance is not destroyed."""
    from ingest.policy import engine as policy
    from tests.fleet import hung_instance

    monkeypatch.setattr(policy, "RECHECK_MAX_AGE_S", 0.0)
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, bench_timeout_s=3600, actuator_command=command)))
    started = utcnow() - dt.timedelta(hours=3)
    await hung_instance(client, "C.late", 962, started=started)
    engine = client.app[CORE].policy
    count = _destroy_rule_runs(engine)
    await _after_the_destroy_rule(engine, monkeypatch, lambda: [post(client, "/api/v1/events", {
        "instance_id": "C.late", "kind": "bench_done", "ts": iso(utcnow()), "exit_code": 0, "rate_per_hour": 45.7,
        "duration_s": 300.0, "proofs_ok": 12})])
    before = count()
    report = await run_policies(client, execute=True)
    assert calls() == [] and report.executed == [] and len(report.superseded) == 1, report
    assert count() - before == 2, "the re-check did not evaluate the rule again on the new evidence"


async def test_a_destroy_whose_logs_complete_while_its_run_is_classed_waits_for_the_class(aiohttp_client, policy_settings,
                                                                                          tmp_path):
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.race", 903, done=done, exit_code=1, rate=0.0)
    engine = client.app[CORE].policy
    classify, loop = engine._classify, asyncio.get_running_loop()

    async def arrive() -> None:
        await push_lines(client, "C.race", "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
        await complete_logs(client, "C.race", done, {"cuzk": 1})

    def classify_then_the_lines_arrive(*args):
        # the class rule has read the run (no lines yet: unknown); its lines and logs_complete are stored
        # before the destroy rule runs, which then sees complete logs
        rows = classify(*args)
        engine._classify = classify
        asyncio.run_coroutine_threadsafe(arrive(), loop).result(timeout=30)
        return rows

    engine._classify = classify_then_the_lines_arrive
    first = await run_policies(client, execute=True)
    assert calls() == [] and first.executed == [], "destroyed on a class read before its lines arrived"
    second = await run_policies(client, execute=True)
    assert [s for s, _ in calls()] == ["C.race"] and len(second.executed) == 1
    [(reason, cls)] = rows(client, "SELECT reason, evidence->>'failure_class' FROM decisions WHERE action = 'destroy'")
    assert cls == "oom" and "oom" in reason, reason


async def _slow_destroy_rule(engine, monkeypatch, order: list[str], slow_s: float = 0.0) -> None:
    """Record the order in which the rules run and the actuator is called (``order``); the destroy
    rule takes ``slow_s`` longer, as on a loaded host."""
    run_rule, carry_out = engine._run_rule, engine.actuator.carry_out

    def timed(rule, cur, run, errors):
        order.append(rule.name)
        if rule.name == "destroy_below_min_rate" and slow_s:
            time.sleep(slow_s)
        return run_rule(rule, cur, run, errors)

    async def actuated(decision):
        order.append(f"actuator {decision['subject']}")
        return await carry_out(decision)

    monkeypatch.setattr(engine, "_run_rule", timed)
    monkeypatch.setattr(engine.actuator, "carry_out", actuated)


async def test_a_destroy_is_carried_out_before_the_rules_after_the_destroy_rule_run(aiohttp_client, policy_settings,
                                                                                   tmp_path, monkeypatch):
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_command=command)))
    done = utcnow() - dt.timedelta(seconds=30)
    await bench_instance(client, "C.d1", 931, done=done, exit_code=0, rate=12.5)
    await complete_logs(client, "C.d1", done, {"benchout": -1})
    engine, order = client.app[CORE].policy, []
    await _slow_destroy_rule(engine, monkeypatch, order)
    report = await run_policies(client, execute=True)
    assert [s for s, _ in calls()] == ["C.d1"] and len(report.executed) == 1
    cycle = [name for name in order if name != "failure_class"]
    later = [r.name for r in engine.rules if r.name > "destroy_below_min_rate" and r.output == "decisions"]
    assert later and cycle.index("actuator C.d1") < min(cycle.index(name) for name in later), order


async def test_a_superseded_destroy_is_carried_out_once_its_rule_selects_it_again(aiohttp_client, policy_settings,
                                                                                 tmp_path):
    """A failed fetch's evidence is the instance's streams: a new one (the entrypoint's) seen between the
    decision and its re-check supersedes the destroy; once that stream is declared complete, the rule
    selects the instance again, and the destroy of that same episode is carried out (found by the fleet
    simulation: the episode could never be destroyed again, and the fleet never settled)."""
    from tests.fleet import params_failure

    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(policy_settings, actuator_command=command)))
    at = utcnow() - dt.timedelta(seconds=30)
    await params_failure(client, "C.p1", 940, at=at, exit_code=3)
    await push_lines(client, "C.p1", "setup", ["fetching parameters", "error: paramfetch: HTTP 503"], at=at)
    await complete_logs(client, "C.p1", at, {"setup": 1})
    assert len((await run_policies(client)).new_decisions) == 1  # proposed
    await push_lines(client, "C.p1", "entrypoint", ["[entrypoint] parameter fetch failed"], at=at)
    report = await run_policies(client, execute=True)
    assert len(report.superseded) == 1 and calls() == []
    await complete_logs(client, "C.p1", at + dt.timedelta(seconds=2), {"entrypoint": 0})
    report = await run_policies(client, execute=True)
    assert [s for s, _ in calls()] == ["C.p1"] and len(report.executed) == 1, report
    assert rows(client, "SELECT state, last_error FROM decisions WHERE subject = 'C.p1' AND action = 'destroy'") == [
        ("executed", None)]


async def test_a_slow_lookback_rule_does_not_hold_up_the_next_destroy(aiohttp_client, policy_settings, tmp_path, monkeypatch):
    """On a loaded host the rules that look back over hours (staleness, retention, degradation, spikes)
    took seconds a run: a logs_complete stored while a woken run was in them waited for that run to end,
    then for as long again (woken runs take at most half the time). The timer runs them at most every
    policy_full_interval_s; the runs between run what a destroy and the deploy gate wait for."""
    slow_s = 2.0
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(
        policy_settings, policy_interval_s=30.0, policy_full_interval_s=300.0, policy_execute=True, actuator_command=command)))
    engine, order = client.app[CORE].policy, []
    run_rule = engine._run_rule

    def timed(rule, cur, run, errors):
        order.append(rule.name)
        if rule.name == "stale_instances":
            time.sleep(slow_s)  # as on a loaded host
        return run_rule(rule, cur, run, errors)

    monkeypatch.setattr(engine, "_run_rule", timed)
    deadline = time.monotonic() + 60
    while await policy_runs(client) < 1:  # the timer's first run, at start-up: every rule
        assert time.monotonic() < deadline, "no policy cycle at start-up"
        await asyncio.sleep(0.05)
    assert "stale_instances" in order and "retention" in order

    async def fail(instance_id: str, machine: int) -> dt.datetime:
        done = utcnow() - dt.timedelta(seconds=5)
        await bench_instance(client, instance_id, machine, done=done, exit_code=1, rate=0.0)
        await push_lines(client, instance_id, "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
        await complete_logs(client, instance_id, done, {"cuzk": 1})
        [(stored,)] = rows(client, f"SELECT received_at FROM events WHERE instance_id = '{instance_id}' AND kind = 'logs_complete'")
        return stored

    async def destroyed(instance_id: str) -> dt.datetime:
        deadline = time.monotonic() + 30
        while instance_id not in dict(calls()):
            assert time.monotonic() < deadline, f"{instance_id} not destroyed within 30 s; calls {calls()}, order {order}"
            await asyncio.sleep(0.02)
        return dict(calls())[instance_id]

    order.clear()
    await fail("C.w1", 941)
    await destroyed("C.w1")
    stored = await fail("C.w2", 942)  # while the run woken by C.w1 would be in the look-back rules
    latency = (await destroyed("C.w2") - stored).total_seconds()
    print(f"second destroy {latency:.2f} s after its logs completed; rules run: {order}")
    assert latency < slow_s, f"{latency:.2f} s: held up by the {slow_s} s look-back rule ({order})"
    deadline = time.monotonic() + 30
    excluded = "SELECT count(*) FROM decisions WHERE action = 'exclude_host' AND subject IN ('941', '942')"
    while rows(client, excluded) != [(2,)]:  # the deploy gate keeps up: decided in the same runs, after the destroys
        assert time.monotonic() < deadline, f"machines excluded: {rows(client, excluded)}; rules run: {order}"
        await asyncio.sleep(0.05)
    assert "stale_instances" not in order and "bad_hosts" in order


async def test_a_rule_failing_in_a_full_run_stays_failing_through_the_runs_that_skip_it(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    engine = client.app[CORE].policy
    engine.rules = [replace(r, sql="SELECT 1 FROM no_such_table", params=()) if r.name == "stale_instances" else r
                    for r in engine.rules]
    full = await engine.run_cycle(False)
    assert "stale_instances" in full.rule_errors
    fast = await engine.run_cycle(False, full=False)
    assert fast.rule_errors == {} and not fast.full
    assert "stale_instances" in engine.failing_rules()  # not run is not mended
    ready = await (await client.get("/readyz")).json()
    assert "stale_instances" in json.dumps(ready)


async def test_evidence_stored_during_a_full_runs_slow_rules_is_decided_before_the_next_one(aiohttp_client, policy_settings,
                                                                                            tmp_path, monkeypatch):
    """A full run's rules that look back over hours took up to 2 s on the fleet sim's loaded host; a destroy
    whose logs completed meanwhile waited for all of them, then for a run of its own (the sim's p99,
    2.67 s). Here a full run's staleness rule is held while the evidence is stored, and its retention rule
    (the next one) until the destroy is carried out (at most 20 s)."""
    import threading

    from ingest.policy import engine as policy

    holds = {"stale_instances": (threading.Event(), threading.Event()), "retention": (threading.Event(), threading.Event())}
    armed = [False]
    real = policy.evaluate_rule

    def evaluate_rule(cur, name, sql, params, *, decides):
        if armed[0] and name in holds:
            held, release = holds[name]
            held.set()
            release.wait(20)  # a slow rule on a loaded host
        return real(cur, name, sql, params, decides=decides)

    monkeypatch.setattr(policy, "evaluate_rule", evaluate_rule)
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(
        policy_settings, policy_interval_s=30.0, policy_full_interval_s=0.0, policy_execute=True, actuator_command=command)))
    engine = client.app[CORE].policy
    try:
        deadline = time.monotonic() + 30
        while await policy_runs(client) < 1:  # the timer's first run, at start-up
            assert time.monotonic() < deadline, "no policy run at start-up"
            await asyncio.sleep(0.05)
        done = utcnow() - dt.timedelta(seconds=5)
        armed[0] = True
        await bench_instance(client, "C.fine", 903, done=done, exit_code=0, rate=40.0)
        await complete_logs(client, "C.fine", done, {"benchout": -1})  # wakes a full run
        await until("the woken full run never reached its staleness rule", holds["stale_instances"][0].is_set)
        await bench_instance(client, "C.oom", 904, done=done, exit_code=1, rate=0.0)
        await push_lines(client, "C.oom", "cuzk", ["prover thread starting", "CUDA error: out of memory"], at=done)
        await complete_logs(client, "C.oom", done, {"cuzk": 1})
        await until("the logs_complete stored woke nothing", engine._woken.is_set)
        holds["stale_instances"][1].set()
        deadline = time.monotonic() + 10
        while not calls() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert [s for s, _ in calls()] == ["C.oom"], "the destroy waited for the full run's slow rules"
        assert not holds["retention"][1].is_set()  # carried out before the full run's next rule ended
    finally:
        for _, release in holds.values():
            release.set()
    await until("the full run never ended", lambda: not engine._lock.locked())
    assert not engine.failing, engine.failing


async def test_the_writer_says_which_instances_a_commit_changed(aiohttp_client, policy_settings):
    """What the re-check's shortcut trusts (Writer.unchanged_since): a push changes its instances; an
    action changes those it names, or, naming none, every instance (an admin's declaration, a verdict)."""
    client = await aiohttp_client(create_app(policy_settings))
    writer = client.app[WRITER]
    since = time.monotonic()
    assert writer.unchanged_since("C.a", since) and writer.unchanged_since("C.b", since)
    await push_lines(client, "C.a", "cuzk", ["proof 1 done"], at=utcnow())
    assert not writer.unchanged_since("C.a", since) and writer.unchanged_since("C.b", since)
    await writer.execute(lambda con: None, kind="policy", touches=())  # the decisions' writes: nobody's
    await writer.execute(lambda con: con.execute("SELECT 1"), kind="policy", touches=("C.b",))
    assert not writer.unchanged_since("C.b", since) and writer.unchanged_since("C.c", since)
    later = time.monotonic()
    assert writer.unchanged_since("C.a", later) and writer.unchanged_since("C.b", later)
    await writer.execute(lambda con: con.execute("SELECT 1"), kind="verdict")  # says nothing: anything changed
    assert not writer.unchanged_since("C.c", later) and not writer.unchanged_since("C.a", later)


async def test_evidence_stored_while_a_runs_destroy_rule_ran_is_decided_before_its_other_rules(
        aiohttp_client, policy_settings, tmp_path, monkeypatch):
    """A run between the full ones: evidence stored while its destroy rule ran waited for the run's
    other rules (machine exclusions) and then for a run of its own (the fleet sim's slowest decisions,
    1.9-2.2 s after their evidence on the loaded host). Here the destroy rule of a woken run is held while
    the evidence is stored, and its exclusion rule until the destroy is carried out (at most 20 s)."""
    import threading

    from ingest.policy import engine as policy

    holds = {"destroy_below_min_rate": (threading.Event(), threading.Event()), "bad_hosts": (threading.Event(), threading.Event())}
    armed = [False]
    real = policy.evaluate_rule

    def evaluate_rule(cur, name, sql, params, *, decides):
        hold = armed[0] and name in holds and not holds[name][0].is_set()  # each held once
        # the destroy rule has read what it reads when it is held; the exclusion rule is held before it reads
        result = real(cur, name, sql, params, decides=decides) if name == "destroy_below_min_rate" else None
        if hold:
            held, release = holds[name]
            held.set()
            release.wait(20)  # a slow rule on a loaded host
        return result if name == "destroy_below_min_rate" else real(cur, name, sql, params, decides=decides)

    monkeypatch.setattr(policy, "evaluate_rule", evaluate_rule)
    command, calls = await actuator_script(tmp_path)
    client = await aiohttp_client(create_app(replace(
        policy_settings, policy_interval_s=30.0, policy_full_interval_s=3600.0, policy_execute=True, actuator_command=command)))
    engine = client.app[CORE].policy
    try:
        deadline = time.monotonic() + 30
        while await policy_runs(client) < 1:  # the timer's first run (a full one), at start-up
            assert time.monotonic() < deadline, "no policy run at start-up"
            await asyncio.sleep(0.05)
        done = utcnow() - dt.timedelta(seconds=5)
        armed[0] = True
        await bench_instance(client, "C.fine", 905, done=done, exit_code=0, rate=40.0)
        await complete_logs(client, "C.fine", done, {"benchout": -1})  # wakes a run that is not full
        await until("the woken run never reached its destroy rule", holds["destroy_below_min_rate"][0].is_set)
        await bench_instance(client, "C.slow", 906, done=done, exit_code=0, rate=12.5)
        await complete_logs(client, "C.slow", done, {"benchout": -1})
        await until("the logs_complete stored woke nothing", engine._woken.is_set)
        holds["destroy_below_min_rate"][1].set()
        deadline = time.monotonic() + 10
        while not calls() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert [s for s, _ in calls()] == ["C.slow"], "the destroy waited for the run's other rules and a run of its own"
        assert not holds["bad_hosts"][1].is_set()
    finally:
        for _, release in holds.values():
            release.set()
    await until("the run never ended", lambda: not engine._lock.locked())
    assert not engine.failing, engine.failing


async def test_the_rules_that_read_the_decisions_table_are_known_through_their_views(aiohttp_client, policy_settings):
    """The re-check's shortcut does not follow the decisions table: it is off for a rule that reads it,
    directly or through a view (reads.relations_read), and on for the destroy rule."""
    import duckdb

    from ingest.db.reads import relations_read

    con = duckdb.connect()
    con.execute("CREATE TABLE decisions (subject VARCHAR); CREATE TABLE logs (instance_id VARCHAR)")
    con.execute("CREATE VIEW latest AS SELECT * FROM decisions; CREATE VIEW outer_view AS SELECT * FROM latest")
    assert relations_read(con, 10, "SELECT * FROM outer_view -- not logs") == {"decisions"}
    assert relations_read(con, 10, "-- decisions\nSELECT * FROM logs WHERE $now IS NOT NULL") == {"logs"}
    client = await aiohttp_client(create_app(policy_settings))
    engine = client.app[CORE].policy
    assert not await asyncio.to_thread(engine.reads_decisions, {"destroy_below_min_rate"})
    assert await asyncio.to_thread(engine.reads_decisions, {"retention"})
