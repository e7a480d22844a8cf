"""A degraded machine end to end: two rentals of one machine through real agents against a real
server, 40 then 20 proofs/hour; the deploy gate (`fleetlog hosts`, the hosts API) says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agentlib import REPO, SCRIPTS, Api, wait_until


def fleetlog(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")} | {"COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env, start_new_session=True)


def test_machine_that_fell_from_40_to_20_is_degraded_and_excluded_at_the_gate(tmp_path, server_process, agent):
    server = server_process("--policy-interval", "0", "--degrade-action", "exclude").start()
    api = Api(server.url)
    for instance_id, rate in (("C.d40", "40"), ("C.d20", "20")):  # one rental after the other, on machine 782
        log = tmp_path / f"{instance_id}-daemon.log"
        done = agent("run", server.url, instance_id, "--machine-id", "782", "--host-id", "7820", "--gpu-model", "RTX 4090",
                     "--gpu-count", "1", "--tail", f"benchdaemon={log}", spool=tmp_path / instance_id,
                     command=[SCRIPTS / "bench_rate.sh", log, rate]).run()
        assert done.returncode == 0, done.stderr
        wait_until(lambda i=instance_id: (api.instance(i) or {}).get("bench", {}).get("rate_per_hour"), what=f"{instance_id}'s rate")
    report = api._call("/api/v1/policy/run", {})
    assert report["ok"] and not report["rule_errors"], report

    host = api._call("/api/v1/hosts/782")
    assert (host["best_rate"], host["recent_rate"], host["recent_runs"]) == (40.0, 30.0, 2)
    assert (host["degraded"], host["bad"], host["eligible"], host["verdict_by"]) == (True, True, False, "rule")
    why = "recent rate 30.0 proofs/hour (mean of the last 2 runs: 20.0, 40.0) < 0.8 x best 40.0 = 32.0"
    assert host["degradation"] == why and host["reason"] == "degraded: " + why

    table = fleetlog("hosts", "--server", server.url)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("782"))
    assert " 40 " in row and " 30 " in row and "degraded" in row and " no " in row, table.stdout
    assert "degraded: recent rate 30.0 proofs/hour" in row, table.stdout
    [listed] = json.loads(fleetlog("hosts", "--format", "json", "--server", server.url).stdout)
    assert (listed["machine_id"], listed["recent_rate"], listed["degraded"], listed["eligible"]) == (782, 30.0, True, False)
    # the decision, with its evidence
    [decision] = api._call("/api/v1/decisions?subject=782")["decisions"]
    assert (decision["rule"], decision["action"], decision["state"]) == ("degraded_hosts", "exclude_host", "executed")
    assert decision["evidence"]["recent_rates"] == [20.0, 40.0] and decision["evidence"]["instance_id"] == "C.d20"
