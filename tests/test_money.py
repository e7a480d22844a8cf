"""Money as views (migration 015): they agree with a hand computation on tests/fleet.py's demo fleet."""

from __future__ import annotations

import datetime as dt

import pytest

from ingest.app import create_app
from tests.fleet import demo_fleet, get, iso, post, rows, run_policies, utcnow


@pytest.fixture
async def fleet(aiohttp_client, settings):
    client = await aiohttp_client(create_app(settings))
    done = utcnow() - dt.timedelta(minutes=30)
    await demo_fleet(client, done)
    # the incident's instance was destroyed 5 minutes after its benchmark ended: its life is over
    await post(client, "/api/v1/events", {"instance_id": "C.32733029", "kind": "killed", "ts": iso(done + dt.timedelta(minutes=5))})
    await run_policies(client)
    return client


def approx(x):
    return pytest.approx(x, rel=1e-6)


async def test_money_views_agree_with_a_hand_computation_on_the_demo_fleet(fleet):
    # C.32733029: registered 14 min before its bench_done, killed 5 min after: 19 min at $0.35/h
    [(hours, cost, alive)] = rows(fleet, "SELECT hours, cost_usd, alive FROM instance_costs WHERE instance_id = 'C.32733029'")
    assert (hours, cost, alive) == (approx(19 / 60), approx(0.35 * 19 / 60), False)
    # its benchmark: 600 s at $0.35/h
    [(bench_cost,)] = rows(fleet, "SELECT cost_usd FROM bench_run_costs WHERE instance_id = 'C.32733029'")
    assert bench_cost == approx(0.35 * 600 / 3600)
    # its failure: 14 min from registered to the failure, at $0.35/h; C.params: 4 min at $0.30/h
    costs = dict(rows(fleet, "SELECT instance_id, cost_usd FROM failure_costs WHERE instance_id IN ('C.32733029', 'C.params')"))
    assert costs == {"C.32733029": approx(0.35 * 14 / 60), "C.params": approx(0.30 * 4 / 60)}
    by_class = rows(fleet, "SELECT failure_class, gpu_model, machine_id, failures, cost_usd FROM failure_class_costs "
                           "WHERE machine_id IN (55891, 780) ORDER BY machine_id DESC")
    assert by_class == [("oom", "RTX PRO 4000", 55891, 1, approx(0.35 * 14 / 60)), ("param_fetch", "RTX 3090", 780, 1, approx(0.30 * 4 / 60))]
    # burning now, with no proof: C.drop ($0.40/h), C.params ($0.30/h), C.hung ($0.40/h); not the killed
    # incident, not C.40/C.31/C.12 (they measured a rate)
    burn = dict(rows(fleet, "SELECT instance_id, usd_per_hour FROM unproven_burn"))
    assert burn == {"C.drop": 0.4, "C.params": 0.3, "C.hung": 0.4}
    [(per_hour,)] = rows(fleet, "SELECT sum(usd_per_hour) FROM unproven_burn")
    assert per_hour == approx(1.1)
    # a living instance's life runs to now: C.hung registered 3 h 4 min before `done` (30 min ago)
    [(hung_hours,)] = rows(fleet, "SELECT hours FROM instance_costs WHERE instance_id = 'C.hung'")
    assert 3 + 4 / 60 + 0.5 - 0.02 < hung_hours < 3 + 4 / 60 + 0.5 + 0.02


async def test_the_instance_list_says_unproven_as_the_view_does(fleet):
    """The page's "$/hour with no proof yet" count reads the instance list: its `unproven` is
    unproven_burn's (one definition), so a run that failed after 5 of 12 proofs has proved something
    (no rate, proofs_ok 5) and is not counted, as the view does not count it."""
    done = utcnow() - dt.timedelta(minutes=20)
    await post(fleet, "/api/v1/events", [
        {"instance_id": "C.five", "kind": "registered", "ts": iso(done - dt.timedelta(minutes=14)), "machine_id": 790,
         "gpu_model": "RTX 4090", "gpu_count": 1, "dph": 0.45},
        {"instance_id": "C.five", "kind": "bench_started", "ts": iso(done - dt.timedelta(minutes=10)), "proofs": 12},
        {"instance_id": "C.five", "kind": "bench_done", "ts": iso(done), "exit_code": 1, "duration_s": 600.0,
         "proofs_ok": 5},
    ])
    burn = {i for (i,) in rows(fleet, "SELECT instance_id FROM unproven_burn")}
    assert "C.five" not in burn and burn
    listed = await get(fleet, "/api/v1/instances")
    flagged = {i["instance_id"] for i in listed["instances"] if i["unproven"]}
    assert flagged == burn
    assert (await get(fleet, "/api/v1/instances/C.five"))["unproven"] is False
