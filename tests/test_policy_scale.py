"""A policy cycle over a fleet of 1,000 instances within a small DuckDB memory limit (issue 20: the
server stays within its memory budget; issue 21: rules whose cost follows what changed)."""

from __future__ import annotations

import datetime as dt

from tests.fleet import bulk_fleet, rows, scale_fate, utcnow

N = 1000


async def test_policy_cycle_succeeds_when_a_fleet_of_1000_decides_at_once_within_128_mib(make_client):
    # every instance silent past stale_ttl_s (an outage, the fleet done): a mark_stale for each, beside the
    # destroys and exclusions of the failing ones, all decided in one cycle and stored in one commit
    client = await make_client(duckdb_memory_limit_mb=128, stale_ttl_s=0.0, policy_interval_s=0)
    await bulk_fleet(client, N, utcnow() - dt.timedelta(hours=1))
    r = await client.post("/api/v1/policy/run")
    body = await r.json()
    assert r.status == 200, body
    assert body["rule_errors"] == {}, body["rule_errors"]
    decided = dict(rows(client, "SELECT action, count(*) FROM decisions GROUP BY action"))
    failing = sum(scale_fate(i) != "passed" for i in range(N))
    [(unclassed,)] = rows(client, "SELECT count(*) FROM bench_runs WHERE exit_code = 1 AND failure_class IS NULL")
    assert decided["mark_stale"] == N
    assert decided["destroy"] == failing - unclassed  # a failed run not classed yet waits for its class
    assert len(body["new_decisions"]) == sum(decided.values())
    # the next cycle classes the rest (the rule's cap per cycle) and decides their destroys
    r = await client.post("/api/v1/policy/run")
    body = await r.json()
    assert r.status == 200, body
    assert body["rule_errors"] == {}, body["rule_errors"]
    [(destroys,)] = rows(client, "SELECT count(*) FROM decisions WHERE action = 'destroy'")
    assert destroys == failing
