"""The operator's commands as on-call expects them from logcli / psql: global ``--server`` / ``--token``,
full lines, wide results shown vertically, comparable numbers, ``why`` with the GPU and the decision
up top, and a non-zero exit when asked work was not done. Real subprocesses against a real server."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from ingest.client import Client
from tests.conftest import ServerProcess
from tests.fleet import OOM_DAEMON_LOG, iso, utcnow
from tests.test_cli import ADMIN, READ, TOKENS, fleetlog, lines_of, push_incident

LONG_LINE = ("ERROR cuzk_daemon: CUDA error: out of memory allocating 3.2 GiB on device 0 while building the "
             "partition 7 of proof 3 (free 412 MiB of 24564 MiB; raise partition_workers or lower concurrency)")


def push_demo_like(client: Client, done: dt.datetime) -> None:
    """C.91000004: OOM, no rate measured, GPU samples in its last minute and a gpu_state event;
    C.91000003: exit 0 at 12.4 proofs/hour (< min_rate 29); machines with tiny, close $/proof."""
    start = done - dt.timedelta(minutes=10)
    for instance, machine, gpu, dph, exit_code, rate in (
        ("C.91000004", 55891, "RTX PRO 4000", 0.35, 1, None),
        ("C.91000003", 41003, "RTX A4000", 0.18, 0, 12.4),
        ("C.91000001", 41001, "RTX 4090", 0.42, 0, 44.1),
        ("C.91000002", 41002, "RTX 3090", 0.21, 0, 31.5),
    ):
        done_event = {"instance_id": instance, "kind": "bench_done", "ts": iso(done), "exit_code": exit_code,
                      "duration_s": 600.0}
        if rate is not None:
            done_event["rate_per_hour"] = rate
        client.post("/api/v1/events", [
            {"instance_id": instance, "kind": "registered", "ts": iso(start - dt.timedelta(minutes=4)),
             "machine_id": machine, "host_id": machine * 10, "gpu_model": gpu, "gpu_count": 1, "dph": dph},
            {"instance_id": instance, "kind": "bench_started", "ts": iso(start), "proofs": 12},
            {"instance_id": instance, "kind": "gpu_state", "ts": iso(start + dt.timedelta(seconds=1)), "state": "ok",
             "gpu": "0"},
            done_event,
        ])
    labels = {"gpu": "0", "UUID": "GPU-demo"}
    client.post("/api/v1/metrics", {"instance_id": "C.91000004", "samples": [
        {"name": name, "ts": (done - dt.timedelta(seconds=s)).timestamp(), "value": value + s, "labels": labels}
        for s in range(0, 30, 5) for name, value in (("DCGM_FI_DEV_GPU_UTIL", 60.0), ("DCGM_FI_DEV_FB_USED", 24000.0))]})
    client.post("/api/v1/logs", {"instance_id": "C.91000004", "source": "benchdaemon", "run_id": "1", "lines": [
        {"seq": i, "ts": iso(start + dt.timedelta(seconds=i)), "line": line}
        for i, line in enumerate([*OOM_DAEMON_LOG[:3], LONG_LINE])]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("terminal")
    server = ServerProcess(tmp / "server.duckdb", tmp / "server.log", "--policy-interval", "0", "--min-rate", "29",
                           "--destroy-grace-s", "0", *TOKENS)
    server.start(timeout_s=120)
    try:
        admin = Client(server.url, ADMIN)
        done = utcnow() - dt.timedelta(minutes=2)
        push_incident(admin, done)
        push_demo_like(admin, done)
        admin.post("/api/v1/policy/run")
        yield server
    finally:
        server.stop()


def test_server_and_token_are_accepted_before_the_subcommand(server):
    proc = fleetlog("--server", server.url, "--token", READ, "instances", token=None)
    assert proc.returncode == 0, proc.stderr
    assert "C.91000004" in proc.stdout
    after = fleetlog("instances", "--server", server.url, "--token", READ, token=None)  # still after, too
    assert after.returncode == 0 and after.stdout == proc.stdout
    query = fleetlog("--server", server.url, "query", "SELECT 1 AS one", "--format", "csv")
    assert query.returncode == 0 and query.stdout.split() == ["one", "1"], query.stderr


def test_why_shows_the_gpu_state_and_an_unmeasured_rate(server):
    proc = fleetlog("why", "C.91000004", "--server", server.url, env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "rate ," not in out and "rate not measured" in out, out
    gpu = out.split("GPU:", 1)[1].split("\n\n", 1)[0]
    assert "state ok" in gpu and "DCGM_FI_DEV_GPU_UTIL" in gpu and "DCGM_FI_DEV_FB_USED" in gpu, out
    assert "mean" in gpu and "max 85" in gpu, out  # 60 + 25 at 25 s before the end


def test_why_puts_the_decision_up_top_and_says_below_min_rate(server):
    out = fleetlog("why", "C.91000003", "--server", server.url).stdout
    head = lines_of(out)[:4]
    assert not any("passed" in line for line in head), out
    assert any("below min_rate" in line and "12.4" in line for line in head), out
    assert any(line.startswith("decision:") and "destroy" in line and "proposed" in line for line in head), out


def test_search_prints_the_whole_line_on_a_wide_terminal(server):
    proc = fleetlog("search", "out of memory", "--server", server.url, env={"COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    assert any(line.endswith(LONG_LINE) for line in lines_of(proc.stdout)), proc.stdout
    narrow = fleetlog("search", "out of memory", "--server", server.url, env={"COLUMNS": "80"})
    assert any(line.endswith(LONG_LINE) for line in lines_of(narrow.stdout)), narrow.stdout  # never cut


def test_hosts_shows_dollars_per_proof_to_comparable_precision_and_fills_why(server):
    hosts = {h["machine_id"]: h for h in orjson.loads(fleetlog("hosts", "--format", "json", "--server", server.url).stdout)}
    rows = {r.split()[0]: r for r in lines_of(fleetlog("hosts", "--server", server.url, env={"COLUMNS": "200"}).stdout)[2:-1]}
    per_proof = {m: h["dollars_per_proof"] for m, h in hosts.items() if h["dollars_per_proof"]}
    assert len(per_proof) >= 3, hosts
    for machine, value in per_proof.items():
        assert f"{value:.4g}" in rows[str(machine)] or f"{value:.3g}" in rows[str(machine)], (value, rows[str(machine)])
    slow = rows["41003"]  # best rate 12.4 < min_rate 29, not bad
    assert hosts[41003]["eligible"] is False
    assert "best rate 12.4 proofs/hour < min_rate 29" in slow, slow


def test_hosts_gives_every_machine_that_is_not_eligible_a_why(server):
    admin = Client(server.url, ADMIN)
    done = utcnow() - dt.timedelta(minutes=2)
    admin.post("/api/v1/events", [  # a second slow machine, let back in by the operator: still too slow to rent
        {"instance_id": "C.91000005", "kind": "registered", "ts": iso(done - dt.timedelta(minutes=14)), "machine_id": 41005,
         "host_id": 410050, "gpu_model": "RTX A4000", "gpu_count": 1, "dph": 0.18},
        {"instance_id": "C.91000005", "kind": "bench_started", "ts": iso(done - dt.timedelta(minutes=10)), "proofs": 12},
        {"instance_id": "C.91000005", "kind": "bench_done", "ts": iso(done), "exit_code": 0, "rate_per_hour": 10.5,
         "duration_s": 600.0}])
    admin.post("/api/v1/hosts/41005/include", {})
    admin.post("/api/v1/hosts/41002/exclude", {})  # the operator's exclusion, no reason given
    hosts = {h["machine_id"]: h for h in orjson.loads(fleetlog("hosts", "--format", "json", "--server", server.url).stdout)}
    rows = {r.split()[0]: r for r in lines_of(fleetlog("hosts", "--server", server.url, env={"COLUMNS": "250"}).stdout)[2:-1]}
    ineligible = {m: h for m, h in hosts.items() if not h["eligible"]}
    assert {41002, 41003, 41005, 55891} <= set(ineligible), hosts
    assert {m: h["reason"] for m, h in ineligible.items() if not h["reason"]} == {}, ineligible
    for machine, h in ineligible.items():
        assert h["reason"][:24] in rows[str(machine)], (h["reason"], rows[str(machine)])
    assert "best rate 10.5 proofs/hour < min_rate 29" in hosts[41005]["reason"], hosts[41005]  # not only "operator include"
    assert hosts[41002]["reason"].startswith("operator exclude"), hosts[41002]


def test_query_shows_a_wide_result_vertically(server):
    proc = fleetlog("query", "--file", "why_failed", "--param", "instance_id=C.91000004", "--server", server.url,
                    env={"COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    lines = lines_of(proc.stdout)
    assert lines[0].startswith("-[ RECORD 1 ]"), proc.stdout
    fields = {k.strip(): v.strip() for k, v in (line.split(" |", 1) for line in lines[1:] if " |" in line)}
    assert fields["instance_id"] == "C.91000004" and fields["outcome"] == "failed", fields
    assert "DCGM_FI_DEV_GPU_UTIL" in fields["gpu_last_minute"], fields
    as_json = fleetlog("query", "--file", "why_failed", "--param", "instance_id=C.91000004", "--server", server.url,
                       "--format", "json")
    assert set(fields) == set(orjson.loads(as_json.stdout)[0]), fields  # every column, one a line
    forced = fleetlog("query", "SELECT 1 AS one", "-x", "--server", server.url)
    assert lines_of(forced.stdout)[0].startswith("-[ RECORD 1 ]") and lines_of(forced.stdout)[1] == "one | 1", forced.stdout
    narrow = fleetlog("query", "SELECT 1 AS one", "--server", server.url)  # fits: a table still
    assert lines_of(narrow.stdout)[0] == "one", narrow.stdout


def test_policy_execute_without_an_actuator_exits_non_zero_and_says_why(server_process):
    server = server_process("--policy-interval", "0", "--destroy-grace-s", "0", *TOKENS).start(timeout_s=120)
    push_incident(Client(server.url, ADMIN), utcnow() - dt.timedelta(hours=1))
    proc = fleetlog("policy", "run", "--once", "--execute", "--server", server.url, token=ADMIN)
    assert proc.returncode != 0, proc.stdout
    assert "no actuator configured" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "not carried out" in proc.stdout, proc.stdout


def test_policy_run_reports_a_superseded_decision(server_process):
    server = server_process("--policy-interval", "0", "--destroy-grace-s", "0", "--min-rate", "29", *TOKENS)
    server.start(timeout_s=120)
    admin = Client(server.url, ADMIN)
    done = utcnow() - dt.timedelta(hours=1)

    def bench(at: dt.datetime, rate: float) -> None:
        admin.post("/api/v1/events", [
            {"instance_id": "C.5", "kind": "bench_started", "ts": iso(at - dt.timedelta(minutes=10)), "proofs": 12},
            {"instance_id": "C.5", "kind": "bench_done", "ts": iso(at), "exit_code": 0, "rate_per_hour": rate,
             "duration_s": 600.0}])

    admin.post("/api/v1/events", {"instance_id": "C.5", "kind": "registered", "ts": iso(done - dt.timedelta(minutes=20)),
                                  "machine_id": 5, "gpu_model": "RTX 4090", "gpu_count": 1, "dph": 0.3})
    bench(done, 12.0)
    proposed = fleetlog("policy", "run", "--once", "--server", server.url, token=ADMIN)
    assert proposed.returncode == 0 and "destroy" in proposed.stdout, proposed.stdout + proposed.stderr
    bench(done + dt.timedelta(minutes=30), 40.0)  # a rerun passed: the destroy no longer holds
    proc = fleetlog("policy", "run", "--once", "--execute", "--server", server.url, token=ADMIN)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # nothing asked was left undone
    rows = lines_of(proc.stdout)
    assert "1 superseded" in rows[0], proc.stdout
    assert any("destroy" in r and "C.5" in r and "superseded" in r for r in rows[1:]), proc.stdout
    why = lines_of(fleetlog("why", "C.5", "--server", server.url).stdout)
    assert any(line.startswith("decision: destroy C.5 superseded") for line in why[:4]), why  # up top, with its state
