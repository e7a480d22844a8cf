"""The operator's commands as a user runs them: real subprocesses, a real server."""

from __future__ import annotations

import subprocess
import sys

import orjson

from tests.conftest import REPO


def fleetlog(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_policy_run_once_on_a_database_file(tmp_path):
    db = str(tmp_path / "f.duckdb")
    proc = fleetlog("policy", "run", "--once", "--db", db)
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["execute"] is False and report["new_decisions"] == []


def test_policy_run_against_a_running_server(server_process, tmp_path):
    server = server_process("--policy-interval", "0").start()
    import urllib.request

    events = [
        {"instance_id": "C.32733029", "kind": "registered", "ts": "2026-11-29T11:16:00Z", "machine_id": 55891},
        {"instance_id": "C.32733029", "kind": "bench_started", "ts": "2026-11-29T11:20:48Z", "proofs": 12},
        {"instance_id": "C.32733029", "kind": "bench_done", "ts": "2026-11-29T11:31:08Z", "exit_code": 1,
         "rate_per_hour": 0, "failure_excerpt": "CUDA error: out of memory"},
    ]
    req = urllib.request.Request(server.url + "/api/v1/events", data=orjson.dumps(events), method="POST")
    with urllib.request.urlopen(req) as r:
        assert r.status == 200
    held = fleetlog("policy", "run", "--once", "--db", str(server.db))
    assert held.returncode == 1 and "--server" in held.stderr  # the server holds the file
    proc = fleetlog("policy", "run", "--once", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["classified"] == 1 and len(report["new_decisions"]) == 2  # exclude 55891 + destroy (grace passed)
    with urllib.request.urlopen(server.url + "/api/v1/hosts/55891") as r:
        host = orjson.loads(r.read())
    assert host["bad"] is True and host["eligible"] is False


def test_serve_help_lists_settings_with_env_names():
    proc = fleetlog("serve", "--help")
    assert proc.returncode == 0
    for text in ("--min-rate", "FLEETLOG_MIN_RATE", "--policy-interval", "--db"):
        assert text in proc.stdout
