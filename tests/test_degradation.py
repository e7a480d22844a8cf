"""Degradation (migration 016, rule 35_degraded_hosts): a machine's recent rate beside its best, and
what a machine whose recent rate fell below degrade_fraction of its best gets (degrade_action).

The best (MAX) rate per machine stays as the seeds asked (a later, lower run never lowers it); what
changes is that a machine that fell from 40 to 20 proofs/hour no longer looks like "best 40" and
nothing else: the deploy gate says degraded, why, and (with degrade_action) excludes it or proposes a
re-benchmark. The real agent against the real server: tests/agent_tests/test_agent_degraded_machine.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from ingest.app import create_app
from ingest.config import load
from ingest.errors import ConfigError
from tests.fleet import bench_instance, demo_fleet, get, rows, run_policies, utcnow
from tests.fleet import until
from tests.test_decisions import recorder


@pytest.fixture
def policy_settings(settings):
    return replace(settings, policy_interval_s=0)  # the tests run cycles themselves


async def fell_from_40_to_20(client, machine_id: int = 782, done: dt.datetime | None = None) -> dt.datetime:
    """Two rentals of one machine: 40 proofs/hour, then (an hour later) 20."""
    done = done or utcnow() - dt.timedelta(minutes=5)
    await bench_instance(client, "C.d40", machine_id, done=done - dt.timedelta(hours=1), exit_code=0, rate=40.0)
    await bench_instance(client, "C.d20", machine_id, done=done, exit_code=0, rate=20.0)
    return done


async def test_machine_that_fell_from_40_to_20_is_degraded_beside_its_best(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    done = await fell_from_40_to_20(client)
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/782")
    # the best is kept (MAX), the recent rate beside it: the mean of its last 3 measured runs (it has 2)
    assert (host["best_rate"], host["recent_rate"], host["recent_runs"]) == (40.0, 30.0, 2)
    assert host["degraded"] is True
    assert host["degradation"] == ("recent rate 30.0 proofs/hour (mean of the last 2 runs: 20.0, 40.0) "
                                   "< 0.8 x best 40.0 = 32.0")
    # degrade_action flag (the default): shown, still eligible (its best is above min_rate)
    assert host["eligible"] is True and host["bad"] is False and host["reason"] is None
    # the decision, with its evidence, recorded (nothing to carry out)
    [(action, state, reason, evidence, episode)] = rows(
        client, "SELECT action, state, reason, evidence, episode FROM decisions WHERE rule = 'degraded_hosts'")
    assert (action, state) == ("flag_degraded", "executed")
    assert reason == "degraded: " + host["degradation"]
    assert '"recent_rates":[20.0,40.0]' in evidence and '"instance_id":"C.d20"' in evidence
    assert episode == "flag " + done.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # the same machine again, the same runs: nothing new is decided
    assert (await run_policies(client)).new_decisions == []


async def test_a_steady_machine_and_a_single_run_are_not_degraded(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(policy_settings))
    await demo_fleet(client, utcnow() - dt.timedelta(minutes=30))  # machine 777: 40 then 31 proofs/hour
    await run_policies(client)  # (machine 782, the demo fleet's degraded one: 60 then 30)
    hosts = {h["machine_id"]: h for h in (await get(client, "/api/v1/hosts"))["hosts"]}
    assert (hosts[777]["best_rate"], hosts[777]["recent_rate"], hosts[777]["degraded"]) == (40.0, 35.5, False)
    assert hosts[777]["degradation"] is None
    assert (hosts[778]["recent_rate"], hosts[778]["degraded"]) == (12.5, False)  # one run: its own best
    # a failed run has no rate: not a recent rate, not a degradation (the bad_hosts rule judges it)
    assert hosts[55891]["recent_rate"] is None and hosts[55891]["degraded"] is False
    assert rows(client, "SELECT subject FROM decisions WHERE rule = 'degraded_hosts'") == [("782",)]
    assert (hosts[782]["best_rate"], hosts[782]["recent_rate"], hosts[782]["degraded"], hosts[782]["eligible"]) == (
        60.0, 45.0, True, True)


async def test_recent_runs_setting_narrows_the_window_to_the_latest_run(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_recent_runs=1)))
    await demo_fleet(client, utcnow() - dt.timedelta(minutes=30))
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/777")  # its latest run alone: 31 < 0.8 x 40
    assert (host["recent_rate"], host["recent_runs"], host["degraded"]) == (31.0, 1, True)
    assert host["degradation"] == "recent rate 31.0 proofs/hour (the last run: 31.0) < 0.8 x best 40.0 = 32.0"


async def test_degrade_fraction_setting_moves_the_line(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_fraction=0.7)))
    await fell_from_40_to_20(client)
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/782")  # 30 >= 0.7 x 40 = 28
    assert (host["recent_rate"], host["degraded"]) == (30.0, False)


async def test_degrade_action_exclude_closes_the_gate_until_the_machine_recovers(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_action="exclude")))
    done = await fell_from_40_to_20(client)
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/782")
    assert (host["degraded"], host["bad"], host["eligible"], host["verdict_by"]) == (True, True, False, "rule")
    assert host["reason"] == "degraded: " + host["degradation"]
    [(action, state, expires)] = rows(client, "SELECT action, state, expires_at FROM decisions WHERE rule = 'degraded_hosts'")
    assert (action, state) == ("exclude_host", "executed")
    assert expires == done + dt.timedelta(seconds=policy_settings.bad_host_ttl_s)
    # the operator rents it again anyway and it proves 41 an hour: the mean of its last 3 runs (33.7)
    # is no longer under 0.8 x its best (32.8): the exclusion no longer stands
    await bench_instance(client, "C.d41", 782, done=done + dt.timedelta(minutes=1), exit_code=0, rate=41.0)
    host = await get(client, "/api/v1/hosts/782")
    assert (host["best_rate"], host["degraded"], host["bad"], host["eligible"]) == (41.0, False, False, True)
    assert host["reason"] is None


async def test_an_operator_include_wins_over_a_degradation_exclusion(aiohttp_client, policy_settings):
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_action="exclude")))
    await fell_from_40_to_20(client)
    await run_policies(client)
    r = await client.post("/api/v1/hosts/782/include", data=b'{"reason": "PSU replaced"}')
    assert r.status == 200
    host = await r.json()
    # still degraded (that is what the numbers say), but the operator's verdict decides the gate
    assert (host["degraded"], host["bad"], host["eligible"], host["verdict_by"]) == (True, False, True, "operator")


async def test_degrade_action_rebenchmark_proposes_one_and_notifies(aiohttp_client, aiohttp_server, policy_settings):
    rec, url = await recorder(aiohttp_server)
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_action="rebenchmark", notify_webhook_url=url)))
    await fell_from_40_to_20(client)
    report = await run_policies(client, execute=True)
    [(action, state)] = rows(client, "SELECT action, state FROM decisions WHERE rule = 'degraded_hosts'")
    assert (action, state) == ("rebenchmark", "proposed")  # for the orchestrator: nothing in fleetlog carries it out
    assert report.executed == [] and report.failed == []
    host = await get(client, "/api/v1/hosts/782")
    assert (host["degraded"], host["eligible"]) == (True, True)
    body = await until("the proposal notified",
                       lambda: next((b for b in rec.bodies if b["decision"]["action"] == "rebenchmark"), None))
    assert body["event"] == "proposed" and body["decision"]["subject"] == "782"
    assert body["decision"]["evidence"]["recent_rate"] == 30.0 and body["decision"]["evidence"]["best_rate"] == 40.0


async def test_switching_the_action_decides_again(aiohttp_client, policy_settings, settings):
    client = await aiohttp_client(create_app(policy_settings))
    await fell_from_40_to_20(client)
    await run_policies(client)
    # the same database under a server restarted with degrade_action=exclude
    await client.close()
    client = await aiohttp_client(create_app(replace(policy_settings, degrade_action="exclude")))
    await run_policies(client)
    assert sorted(rows(client, "SELECT action FROM decisions WHERE rule = 'degraded_hosts'")) == [("exclude_host",), ("flag_degraded",)]
    assert (await get(client, "/api/v1/hosts/782"))["eligible"] is False
    # and back to flag: the exclusion recorded under exclude no longer closes the gate
    await client.close()
    client = await aiohttp_client(create_app(policy_settings))
    await run_policies(client)
    host = await get(client, "/api/v1/hosts/782")
    assert (host["degraded"], host["bad"], host["eligible"]) == (True, False, True)


def test_degrade_settings_are_checked_at_start_up():
    settings = load({}, {"FLEETLOG_DEGRADE_ACTION": "exclude", "FLEETLOG_DEGRADE_RECENT_RUNS": "5",
                         "FLEETLOG_DEGRADE_FRACTION": "0.5"})
    assert (settings.degrade_action, settings.degrade_recent_runs, settings.degrade_fraction) == ("exclude", 5, 0.5)
    for env, word in ((("FLEETLOG_DEGRADE_ACTION", "destroy"),), "degrade_action"), \
                     ((("FLEETLOG_DEGRADE_FRACTION", "1.5"),), "degrade_fraction"), \
                     ((("FLEETLOG_DEGRADE_RECENT_RUNS", "0"),), "degrade_recent_runs"):
        with pytest.raises(ConfigError, match=word):
            load({}, dict(env))
