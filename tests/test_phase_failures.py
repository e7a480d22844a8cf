"""A failure in any phase is shown wherever a benchmark failure is: the instance's read API, the fleet
list, `fleetlog instances --failed` (issue 21 item 6 and 8)."""

from __future__ import annotations

import io

from ingest import oncall
from tests.fleet import bench_instance, complete_logs, params_failure, push_lines, run_policies, utcnow


async def test_failed_parameter_fetch_shows_its_class_exit_and_line_in_the_instance_api(client):
    at = utcnow()
    await params_failure(client, "C.params", 780, at=at, exit_code=3)
    await push_lines(client, "C.params", "setup", ["fetching parameters", "error: paramfetch: HTTP 503"], at=at)
    await complete_logs(client, "C.params", at, {"setup": 1})
    await run_policies(client)
    detail = await (await client.get("/api/v1/instances/C.params")).json()
    assert detail["failure_class"] == "param_fetch", detail
    assert detail["failure_line"] == "params_done exit code 3"
    assert detail["exit_code"] == 3 and detail["failed_phase"] == "params"
    [row] = [r for r in (await (await client.get("/api/v1/instances")).json())["instances"] if r["instance_id"] == "C.params"]
    assert row["failure_class"] == "param_fetch" and row["exit_code"] == 3


async def test_instances_failed_lists_every_instance_the_destroy_rule_would_take(client):
    """`--failed` is the rule's set: a failed fetch, a failed or hung run, and a run below min_rate."""
    at = utcnow()
    await params_failure(client, "C.params", 780, at=at, exit_code=3)
    await bench_instance(client, "C.slow", 781, done=at, exit_code=0, rate=12.4)
    await bench_instance(client, "C.good", 782, done=at, exit_code=0, rate=44.1)
    await bench_instance(client, "C.oom", 783, done=at, exit_code=1, rate=0.0)
    rows = (await (await client.get("/api/v1/instances")).json())["instances"]
    failing = {r["instance_id"] for r in rows if oncall.is_failed(r)}
    assert failing == {"C.params", "C.slow", "C.oom"}, failing
    [oom] = [r for r in rows if r["instance_id"] == "C.oom"]
    assert oom["rate_per_hour"] is None  # a rate of 0 is no measurement: the API says so, as the rules do
    [slow] = [r for r in rows if r["instance_id"] == "C.slow"]
    assert slow["rate_per_hour"] == 12.4
    out = io.StringIO()
    oncall.print_records([r for r in rows if oncall.is_failed(r)], oncall.INSTANCE_COLUMNS, "table", out)
    assert "C.slow" in out.getvalue() and "C.good" not in out.getvalue()


async def test_a_machine_excluded_for_a_hung_run_that_then_passed_is_eligible_again(make_client):
    """The run looked hung (no bench_done within bench_timeout_s), then its bench_done came: passed.
    The exclusion was decided on a failure that no longer stands (seen in the fleet simulation)."""
    from tests.fleet import hung_instance, iso, post
    import datetime as dt

    client = await make_client(exclude_repeat_failures=1)
    started = utcnow() - dt.timedelta(hours=3)
    await hung_instance(client, "C.late", 777, started=started)
    await run_policies(client, execute=True)
    host = (await (await client.get("/api/v1/hosts/777")).json())
    assert host["bad"] is True, host
    await post(client, "/api/v1/events", {"instance_id": "C.late", "kind": "bench_done", "ts": iso(utcnow()),
                                          "exit_code": 0, "rate_per_hour": 44.1, "duration_s": 10800.0})
    await run_policies(client)
    host = (await (await client.get("/api/v1/hosts/777")).json())
    assert host["bad"] is False and host["eligible"] is True, host
