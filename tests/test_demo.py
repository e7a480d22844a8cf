"""`fleetlog demo`: a newcomer's populated fleet, through the real agent, against the real server."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import orjson

from tests.conftest import REPO


def query(server, sql: str) -> list[list]:
    request = urllib.request.Request(server.url + "/api/v1/query", data=orjson.dumps({"sql": sql}), method="POST")
    with urllib.request.urlopen(request) as r:
        return orjson.loads(r.read())["rows"]


def test_demo_pushes_a_fleet_with_every_kind_of_outcome(server_process):
    server = server_process("--policy-interval", "0").start()
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "demo", "--server", server.url],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # network: blamed on repeat only; machine 41010 (40.2, then 20.1): C.91000011 below min_rate, flagged degraded
    assert "policies: 12 new decisions, 5 failures classified" in proc.stdout
    runs = query(server, "SELECT instance_id, exit_code, rate_per_hour, failure_class FROM bench_runs ORDER BY 1")
    assert runs == [
        ["C.91000001", 0, 44.1, None], ["C.91000002", 0, 31.5, None], ["C.91000003", 0, 12.4, None],
        ["C.91000004", 1, None, "oom"], ["C.91000005", 2, None, "gpu_lost"], ["C.91000006", 1, None, "network"],
        ["C.91000007", 0, 33.0, None], ["C.91000008", 1, None, "oom"], ["C.91000009", 1, None, "oom"],
        ["C.91000010", 0, 40.2, None], ["C.91000011", 0, 20.1, None],
    ]
    states = dict(query(server, "SELECT instance_id, state FROM instance_state"))
    assert states["C.91000001"] == "running" and states["C.91000004"] == "bench_done"
    # every instance's logs arrived complete, through the agent
    incomplete = query(server, "SELECT count(*) FROM (" + (REPO / "queries" / "incomplete_logs.sql").read_text() + ")")
    assert incomplete == [[0]]
    sources = query(server, "SELECT DISTINCT source FROM logs ORDER BY 1")
    assert sources == [["benchdaemon"], ["benchout"], ["setup"]]
    gpu = query(server, "SELECT count(DISTINCT instance_id) FROM metrics WHERE name = 'DCGM_FI_DEV_GPU_UTIL'")
    assert gpu == [[11]]
    destroys = query(server, "SELECT subject FROM decisions WHERE action = 'destroy' ORDER BY 1")
    assert destroys == [["C.91000003"], ["C.91000004"], ["C.91000005"], ["C.91000006"], ["C.91000008"], ["C.91000009"],
                        ["C.91000011"]]
    # the OOM at three sizes on three machines is one pattern; it parts from its model's healthy run
    spread = query(server, "SELECT machine_ids, failures FROM pattern_spread ORDER BY machines DESC, pattern_id")
    assert spread[0] == [[41008, 41009, 55891], 3] and len(spread) == 3, spread
    assert query(server, "SELECT healthy_instance_id FROM run_baselines WHERE instance_id = 'C.91000004'") == [["C.91000007"]]
    # machine 41010, rented twice (40.2 then 20.1 proofs/hour): best kept, recent beside it, degraded
    degraded = query(server, "SELECT machine_id, best_rate, round(recent_rate, 2), degraded FROM host_degradation WHERE degraded")
    assert degraded == [[41010, 40.2, 30.15, True]]


def test_demo_without_a_server_says_how_to_start_one():
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "demo", "--server", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1 and "make run" in proc.stderr
