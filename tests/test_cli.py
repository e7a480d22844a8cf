"""The operator's commands as a user runs them: real subprocesses against a real server with tokens on."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import subprocess
import sys
import time

import orjson
import pytest

from ingest.client import Client
from tests.conftest import REPO, ServerProcess, stop_group
from tests.fleet import BENCH_OUTPUT, OOM_DAEMON_LOG, iso, utcnow

READ, ADMIN, ENROLL = "read-" + "r" * 20, "admin-" + "a" * 20, "enroll-" + "e" * 20
TOKENS = ("--read-token", READ, "--admin-token", ADMIN, "--enroll-token", ENROLL)


def fleetlog(*args: str, token: str | None = READ, env: dict | None = None, cwd=REPO,
             timeout: float = 120) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")}
    if token:
        environ["FLEETLOG_TOKEN"] = token
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=environ, start_new_session=True)


def push_incident(client: Client, done: dt.datetime) -> None:
    """INCIDENT.md's C.32733029 (OOM on machine 55891, logs complete) and a healthy C.40 on machine 777."""
    start = done - dt.timedelta(minutes=10)
    for instance, machine, gpu, exit_code, rate, excerpt in (
        ("C.32733029", 55891, "RTX PRO 4000", 1, 0.0, "\n".join(OOM_DAEMON_LOG[-2:] + BENCH_OUTPUT[-1:])),
        ("C.40", 777, "RTX 4090", 0, 40.0, None),
    ):
        client.post("/api/v1/events", [
            {"instance_id": instance, "kind": "registered", "ts": iso(start - dt.timedelta(minutes=4)),
             "machine_id": machine, "host_id": machine * 10, "gpu_model": gpu, "gpu_count": 1, "dph": 0.35},
            {"instance_id": instance, "kind": "bench_started", "ts": iso(start), "proofs": 12},
            {"instance_id": instance, "kind": "bench_done", "ts": iso(done), "exit_code": exit_code,
             "rate_per_hour": rate, "duration_s": 600.0, "failure_excerpt": excerpt},
        ])
    for source, lines in (("benchdaemon", OOM_DAEMON_LOG), ("benchout", BENCH_OUTPUT)):
        client.post("/api/v1/logs", {"instance_id": "C.32733029", "source": source, "lines": [
            {"seq": i, "ts": iso(start + dt.timedelta(seconds=i)), "line": line} for i, line in enumerate(lines)]})
    client.post("/api/v1/events", {"instance_id": "C.32733029", "kind": "logs_complete", "ts": iso(done),
                                   "sources": {"benchdaemon": len(OOM_DAEMON_LOG) - 1, "benchout": len(BENCH_OUTPUT) - 1}})
    client.post("/api/v1/events", {"instance_id": "C.40", "kind": "running", "ts": iso(done + dt.timedelta(seconds=5))})
    client.post("/api/v1/logs", {"instance_id": "C.40", "source": "setup", "lines": [
        {"seq": 0, "ts": iso(start), "line": "[entrypoint] tunnels up"}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real server with tokens on, holding the incident, its policies run once."""
    tmp = tmp_path_factory.mktemp("cli")
    server = ServerProcess(tmp / "server.duckdb", tmp / "server.log", "--policy-interval", "0", *TOKENS)
    server.start(timeout_s=120)
    try:
        admin = Client(server.url, ADMIN)
        push_incident(admin, utcnow() - dt.timedelta(minutes=2))
        admin.post("/api/v1/policy/run")
        yield server
    finally:
        server.stop()


def lines_of(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_instances_table_fits_100_columns_with_the_read_token(server):
    proc = fleetlog("instances", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    rows = lines_of(proc.stdout)
    assert max(len(r) for r in rows) <= 100, rows
    assert rows[0].split()[:3] == ["instance", "state", "machine"]
    crashed = next(r for r in rows if r.startswith("C.32733029"))
    assert "bench_done" in crashed and "55891" in crashed and "oom" in crashed and "complete" in crashed
    assert any(r.startswith("C.40") and "running" in r for r in rows)


def test_instances_failed_and_state_filters_and_formats(server):
    failed = orjson.loads(fleetlog("instances", "--failed", "--format", "json", "--server", server.url).stdout)
    assert [r["instance_id"] for r in failed] == ["C.32733029"] and failed[0]["failure_class"] == "oom"
    running = list(csv.DictReader(io.StringIO(fleetlog("instances", "--state", "running", "--format", "csv",
                                                       "--server", server.url).stdout)))
    assert [r["instance_id"] for r in running] == ["C.40"]


def test_commands_without_a_token_say_how_to_give_one(server):
    proc = fleetlog("instances", "--server", server.url, token=None)
    assert proc.returncode == 1 and "401" in proc.stderr and "FLEETLOG_TOKEN" in proc.stderr
    proc = fleetlog("instances", "--server", server.url, "--token", "wrong", token=None)
    assert proc.returncode == 1 and "unknown token" in proc.stderr


def test_why_prints_the_failure_banner_as_text(server):
    proc = fleetlog("why", "C.32733029", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Benchmark failed: exit code 1, class oom" in out
    assert "this failure cost $0." in out  # failure_costs: dph x hours to the failure
    assert "deciding line:\n  " + OOM_DAEMON_LOG[3] in out
    assert "excerpt:\n  " + OOM_DAEMON_LOG[-2] in out
    assert "benchdaemon" in out and "5 lines  complete" in out
    head = lines_of(out)[:5]  # the decisions on it and its machine, up top
    assert any(h.startswith("decision: destroy C.32733029 proposed") for h in head), out
    assert any(h.startswith("decision: exclude_host 55891 executed") for h in head), out
    doc = orjson.loads(fleetlog("why", "C.32733029", "--format", "json", "--server", server.url).stdout)
    assert doc["bench"]["failure_class"] == "oom" and doc["logs"]["benchout"]["complete"] is True
    missing = fleetlog("why", "C.nope", "--server", server.url)
    assert missing.returncode == 1 and "not known" in missing.stderr


def test_hosts_lists_the_deploy_gate(server):
    proc = fleetlog("hosts", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    rows = lines_of(proc.stdout)
    assert max(len(r) for r in rows) <= 100
    bad = next(r for r in rows if r.startswith("55891"))
    assert " bad " in bad and " no " in bad
    assert any(r.startswith("777") and "eligible" in r for r in rows)
    hosts = orjson.loads(fleetlog("hosts", "--format", "json", "--server", server.url).stdout)
    assert {h["machine_id"]: h["eligible"] for h in hosts} == {55891: False, 777: True}


def test_search_finds_a_line_across_the_fleet(server):
    proc = fleetlog("search", "out of memory", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    rows = lines_of(proc.stdout)
    assert rows[0].split() == ["ts", "instance", "source", "seq", "line"]
    assert "C.32733029" in rows[2] and "benchdaemon" in rows[2] and rows[2].endswith(OOM_DAEMON_LOG[3])  # never cut
    assert rows[-1] == "(1 row)"
    hits = orjson.loads(fleetlog("search", "ERROR.*panicked", "--regex", "--since", "7d", "--format", "json",
                                 "--server", server.url).stdout)
    assert [h["line"] for h in hits] == [OOM_DAEMON_LOG[4]]
    bad = fleetlog("search", "(", "--regex", "--server", server.url)
    assert bad.returncode == 1 and "400" in bad.stderr


def test_logs_prints_the_tail_of_a_source_and_greps(server):
    proc = fleetlog("logs", "C.32733029", "--source", "benchdaemon", "--tail", "2", "--server", server.url)
    assert proc.returncode == 0, proc.stderr
    assert [line.split("  ", 2)[2] for line in lines_of(proc.stdout)] == OOM_DAEMON_LOG[-2:]
    every = fleetlog("logs", "C.32733029", "--server", server.url)
    assert len(lines_of(every.stdout)) == len(OOM_DAEMON_LOG) + len(BENCH_OUTPUT)
    grep = fleetlog("logs", "C.32733029", "--grep", "ERROR: (daemon|out of memory)", "--format", "json", "--server", server.url)
    found = [orjson.loads(line) for line in lines_of(grep.stdout)]
    assert [(f["source"], f["seq"]) for f in found] == [("benchout", 2), ("benchdaemon", 3)]  # oldest first
    assert fleetlog("logs", "C.nope", "--server", server.url).returncode == 1


def test_logs_follow_prints_new_lines_as_they_are_stored(server, tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")}
    out = tmp_path / "follow.out"
    with out.open("wb") as sink, (tmp_path / "follow.err").open("wb") as err:  # the child keeps its descriptors
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "logs", "C.40", "--source", "setup", "--follow", "--server", server.url],
            stdout=sink, stderr=err, env=dict(environ, FLEETLOG_TOKEN=READ, PYTHONUNBUFFERED="1"), cwd=REPO,
            start_new_session=True)
    try:
        def printed(text: str, timeout_s: float = 60) -> list[str]:
            deadline = time.monotonic() + timeout_s
            while text not in out.read_text():
                assert proc.poll() is None, (tmp_path / "follow.err").read_text()
                assert time.monotonic() < deadline, f"{text!r} not printed after {timeout_s} s: {out.read_text()}"
                time.sleep(0.1)
            return lines_of(out.read_text())

        printed("tunnels up")
        Client(server.url, ADMIN).post("/api/v1/logs", {"instance_id": "C.40", "source": "setup", "lines": [
            {"seq": 1, "line": "[entrypoint] starting curio"}]})
        lines = printed("starting curio")
        assert [line.split("  ", 2)[2] for line in lines] == ["[entrypoint] tunnels up", "[entrypoint] starting curio"]
    finally:
        stop_group(proc, timeout_s=5)


def test_query_sends_the_token_from_the_environment_and_from_fleetlog_toml(server, tmp_path):
    proc = fleetlog("query", "--server", server.url, "SELECT count(*) AS n FROM logs WHERE instance_id = $i",
                    "--param", "i=C.32733029", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["n", str(len(OOM_DAEMON_LOG) + len(BENCH_OUTPUT))]
    (tmp_path / "fleetlog.toml").write_text(f'[client]\nserver = "{server.url}"\ntoken = "{READ}"\n')
    named = fleetlog("query", "--file", "why_failed", "--param", "instance_id=C.32733029", "--format", "json",
                     token=None, cwd=tmp_path)  # server and token from ./fleetlog.toml; the file by its name
    assert named.returncode == 0, named.stderr
    assert orjson.loads(named.stdout)[0]["failure_class"] == "oom"
    from_env = fleetlog("hosts", token=None, cwd=tmp_path, env={"FLEETLOG_TOKEN": "wrong"})  # env beats the file
    assert from_env.returncode == 1 and "unknown token" in from_env.stderr


def test_policy_run_once_on_a_database_file(tmp_path):
    proc = fleetlog("policy", "run", "--once", "--db", str(tmp_path / "f.duckdb"), "--format", "json", token=None)
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["execute"] is False and report["new_decisions"] == [] and report["decisions"] == []


def test_policy_run_against_a_running_server_prints_its_decisions_as_a_table(server_process):
    server = server_process("--policy-interval", "0", *TOKENS).start(timeout_s=120)
    push_incident(Client(server.url, ADMIN), utcnow() - dt.timedelta(hours=1))
    held = fleetlog("policy", "run", "--once", "--db", str(server.db), token=None)
    assert held.returncode == 1 and "leave out --db" in held.stderr  # the server holds the file
    assert fleetlog("policy", "run", "--once", "--server", server.url).returncode == 1  # the read token may not
    proc = fleetlog("policy", "run", "--once", "--server", server.url, token=ADMIN)
    assert proc.returncode == 0, proc.stderr
    rows = lines_of(proc.stdout)
    assert rows[0].startswith("policy run, dry run") and "1 failures classified, 2 new decisions" in rows[0]
    assert rows[1].split() == ["id", "action", "subject", "state", "rule", "reason"]
    table = "\n".join(rows[3:])
    assert "exclude_host  55891" in table and "destroy       C.32733029" in table and "proposed" in table
    assert max(len(r) for r in rows) <= 100
    host = Client(server.url, READ).get("/api/v1/hosts/55891")
    assert host["bad"] is True and host["eligible"] is False
    again = fleetlog("policy", "run", "--once", "--server", server.url, token=ADMIN)
    assert "0 new decisions" in again.stdout  # nothing decided twice


def test_policy_run_help_lists_only_what_policies_use():
    out = fleetlog("policy", "run", "--help", token=None).stdout
    for text in ("--min-rate", "--destroy-grace-s", "--actuator-command", "--db", "--server", "--token"):
        assert text in out
    for text in ("--port", "--max-body-bytes", "--tail-cache-lines", "--otlp-grpc-port", "--read-token"):
        assert text not in out


def test_serve_help_lists_settings_with_env_names():
    proc = fleetlog("serve", "--help", token=None)
    assert proc.returncode == 0
    for text in ("--min-rate", "FLEETLOG_MIN_RATE", "--policy-interval", "--db"):
        assert text in proc.stdout
