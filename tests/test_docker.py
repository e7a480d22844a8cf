"""The containers' parts without a container engine: the entrypoint runs for real against the real
server with stand-in commands; shellcheck; the compose file and the Dockerfiles are parsed and
cross-checked with the server's settings. tests/test_container.py builds and runs the images."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml

from ingest.config import Settings
from tests import procs
from tests.conftest import REPO

DOCKER = REPO / "docker"
SCRIPTS = REPO / "tests" / "scripts"
ENTRYPOINT = DOCKER / "entrypoint.sh"


def get(server, path: str):
    with urllib.request.urlopen(server.url + path, timeout=10) as r:
        return orjson.loads(r.read())


def wait_for(predicate, what: str, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def entrypoint_env(server, tmp_path: Path, **extra: str) -> dict[str, str]:
    agent_bin = Path(sys.executable).parent  # fleetlog-agent is installed beside this interpreter
    return {
        "PATH": f"{agent_bin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FLEETLOG_SERVER": server.url,
        "CONTAINER_ID": "32733029",
        "FLEETLOG_MACHINE_ID": "55891",
        "FLEETLOG_HOST_ID": "7140",
        "FLEETLOG_LOCATION": "Norway",
        "FLEETLOG_STATE_DIR": str(tmp_path / "state"),
        "FLEETLOG_LOG_DIR": str(tmp_path / "logs"),
        "FLEETLOG_BENCH_DAEMON_LOG": str(tmp_path / "cuzk-bench-daemon.log"),
        "FLEETLOG_BENCH_RESULTS_LOG": str(tmp_path / "cuzk-bench-results.log"),
        "FLEETLOG_GPU_MODEL": "RTX 4090",
        "FLEETLOG_IMAGE_VERSION": "0.1.0+test",
        "FLEETLOG_PARAMS_CMD": str(SCRIPTS / "standin_params.sh"),
        "FLEETLOG_BENCH_CMD": str(SCRIPTS / "standin_benchmark.sh"),
        "FLEETLOG_DAEMON_CMD": f"{SCRIPTS / 'standin_daemon.sh'} cuzk-daemon",
        "FLEETLOG_CURIO_CMD": f"{SCRIPTS / 'standin_daemon.sh'} curio",
        "BENCH_PROOFS": "3",
        "FLEETLOG_AGENT_FLUSH_TIMEOUT_S": "30",
        "FLEETLOG_AGENT_POLL_INTERVAL_S": "0.05",
        **extra,
    }


def start_entrypoint(env: dict[str, str], out: Path) -> subprocess.Popen:
    """The entrypoint in a process group of its own: killing the group ends every agent and daemon."""
    with out.open("wb") as f:
        return subprocess.Popen(["bash", str(ENTRYPOINT)], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(proc: subprocess.Popen, out: Path, timeout_s: float = 240) -> str:
    """Wait for the entrypoint; whatever happens, nothing of its group outlives the test."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_group(proc)
    return out.read_text(errors="replace")


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader: always sweep it
    except ProcessLookupError:
        pass
    proc.wait()


def run_entrypoint(env: dict[str, str], tmp_path: Path) -> tuple[int | None, str]:
    out = tmp_path / "entrypoint.out"
    proc = start_entrypoint(env, out)
    text = finish(proc, out)
    return proc.returncode, text


def test_entrypoint_runs_every_phase_through_the_agent(server_process, tmp_path):
    server = server_process("--policy-interval", "0").start()
    out = tmp_path / "entrypoint.out"
    proc = start_entrypoint(entrypoint_env(server, tmp_path), out)
    try:
        def running_with_daemon_logs():
            try:
                detail = get(server, "/api/v1/instances/C.32733029")
            except urllib.error.HTTPError as e:  # not registered yet
                assert e.code == 404
                return None
            kinds = [e["kind"] for e in detail["events"]]
            return "running" in kinds and {"cuzk", "curio"} <= set(detail["logs"]) and detail

        wait_for(running_with_daemon_logs, "the proving stack to run and ship its logs")
        proc.send_signal(signal.SIGTERM)  # the leader only, as docker stop does
        text = finish(proc, out)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, text
    detail = wait_for(lambda: (d := get(server, "/api/v1/instances/C.32733029"))["logs"].get("entrypoint", {}).get("complete") and d,
                      "the entrypoint's own lines to be complete")
    kinds = [e["kind"] for e in detail["events"] if e["kind"] not in ("logs_complete", "gpu_state")]
    assert kinds == ["registered", "params_done", "bench_started", "bench_done", "running"], kinds
    assert detail["machine_id"] == 55891 and detail["location"] == "Norway" and detail["gpu_model"] == "RTX 4090"
    registered = next(e for e in detail["events"] if e["kind"] == "registered")
    assert registered["body"]["labels"] == {"image_version": "0.1.0+test"}
    assert detail["bench"]["exit_code"] == 0 and detail["bench"]["rate_per_hour"] == 41.7
    assert detail["bench"]["proofs"] == 3 and detail["bench"]["partition_workers"] == 16
    for source in ("setup", "benchout", "benchdaemon", "benchresults", "cuzk", "curio", "entrypoint"):
        assert detail["logs"][source]["complete"] is True, (source, detail["logs"][source])
    results = [l["line"] for l in get(server, "/api/v1/instances/C.32733029/logs?source=benchresults")["lines"]]
    assert results == ["proof 1/3: 141.0 s", "proof 2/3: 141.0 s", "proof 3/3: 141.0 s"]
    own = [l["line"] for l in get(server, "/api/v1/instances/C.32733029/logs?source=entrypoint&tail=1000")["lines"]]
    assert own[0].startswith("[entrypoint] ") and "registering C.32733029" in own[0], own
    assert "stopping: daemons first" in own[-1], own  # its last words before the exit, shipped
    setup = get(server, "/api/v1/instances/C.32733029/logs?source=setup")["lines"]
    assert [l["line"] for l in setup] == ["fetching v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher.params",
                                          "fetched 3 of 3 parameter files (56.2 GiB) in 212 s"]
    # the daemons' last words were shipped after SIGTERM, none lost
    cuzk = [l["line"] for l in get(server, "/api/v1/instances/C.32733029/logs?source=cuzk&tail=10000")["lines"]]
    assert cuzk[0].startswith("cuzk-daemon: started") and cuzk[-1] == "cuzk-daemon: stopping on SIGTERM"
    assert detail["logs"]["cuzk"]["gaps"] == [] and detail["logs"]["curio"]["complete"] is True


def test_entrypoint_failed_benchmark_exits_with_its_code_after_the_evidence(server_process, tmp_path):
    server = server_process("--policy-interval", "0").start()
    rc, out = run_entrypoint(entrypoint_env(server, tmp_path, STANDIN_BENCH="oom"), tmp_path)
    assert rc == 1, out
    assert "benchmark.sh exited with error" in out
    detail = get(server, "/api/v1/instances/C.32733029")
    assert "running" not in [e["kind"] for e in detail["events"]]
    assert detail["bench"]["exit_code"] == 1 and "out of memory" in detail["bench"]["failure_excerpt"]
    for source in ("benchdaemon", "benchresults", "entrypoint"):
        assert detail["logs"][source]["complete"] is True, (source, detail["logs"][source])


def test_entrypoint_stops_when_the_parameter_fetch_fails(server_process, tmp_path):
    server = server_process("--policy-interval", "0").start()
    rc, out = run_entrypoint(entrypoint_env(server, tmp_path, STANDIN_PARAMS_EXIT="3"), tmp_path)
    assert rc == 3, out
    detail = get(server, "/api/v1/instances/C.32733029")
    kinds = [e["kind"] for e in detail["events"] if e["kind"] != "logs_complete"]
    assert kinds == ["registered", "params_done"]  # no benchmark
    [params_done] = [e for e in detail["events"] if e["kind"] == "params_done"]
    assert params_done["body"]["exit_code"] == 3
    assert detail["logs"]["setup"]["complete"] is True and detail["logs"]["entrypoint"]["complete"] is True
    setup = get(server, "/api/v1/instances/C.32733029/logs?source=setup")["lines"]
    assert len(setup) == 2  # the failed fetch's output is stored all the same


def test_entrypoint_ships_its_last_lines_when_its_tail_agent_is_slow_to_start(server_process, tmp_path):
    """A loaded machine: the fetch fails before the agent tailing the entrypoint's own lines has its
    SIGTERM handler (CI, 2026-12-05). A SIGTERM then would kill it unheard and the lines die with
    the container: the entrypoint waits until the agent catches SIGTERM, then stops it."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real = Path(sys.executable).parent / "fleetlog-agent"
    (shim / "fleetlog-agent").write_text(f'#!/bin/bash\n[[ $1 == tail ]] && sleep 3\nexec {real} "$@"\n')
    (shim / "fleetlog-agent").chmod(0o755)
    server = server_process("--policy-interval", "0").start()
    env = entrypoint_env(server, tmp_path, STANDIN_PARAMS_EXIT="3")
    env["PATH"] = f"{shim}:{env['PATH']}"
    rc, out = run_entrypoint(env, tmp_path)
    assert rc == 3, out
    detail = get(server, "/api/v1/instances/C.32733029")
    assert detail["logs"].get("entrypoint", {}).get("complete") is True, (out, detail["logs"])
    own = [l["line"] for l in get(server, "/api/v1/instances/C.32733029/logs?source=entrypoint&tail=1000")["lines"]]
    assert "registering C.32733029" in own[0] and own[-1].endswith("parameter fetch failed (exit 3)"), own


def test_entrypoint_passes_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing (.ci/run installs Debian's shellcheck)")
        pytest.skip("shellcheck not installed")
    proc = subprocess.run([shellcheck, "--severity=style", str(ENTRYPOINT), *SCRIPTS.glob("standin_*.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_references_existing_files_and_the_servers_ports():
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"ingest", "prometheus", "grafana"}
    ingest = services["ingest"]
    # without a profile only the ingest server starts, from a local image: no registry needed
    assert [name for name, s in services.items() if not s.get("profiles")] == ["ingest"]
    assert ingest["image"].startswith("${FLEETLOG_INGEST_IMAGE:-localhost/") and ingest["pull_policy"] == "never"
    assert ingest["build"]["args"]["BASE"].endswith(":-python:3.11-slim}")  # the Dockerfile's default
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    build = ingest["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()
    defaults = Settings()
    assert f"{defaults.port}:{defaults.port}" in ingest["ports"] and f"{defaults.otlp_grpc_port}:{defaults.otlp_grpc_port}" in ingest["ports"]
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                if source.endswith("read-token"):
                    continue  # a secret the operator writes, ignored by git
                assert (DOCKER / source).exists(), volume
            else:
                assert source in compose["volumes"], volume
    settings = {f"FLEETLOG_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    assert set(ingest["environment"]) <= settings


def test_prometheus_and_grafana_in_compose_point_at_the_ingest_service():
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == [f"ingest:{Settings().port}"]
    ours = yaml.safe_load((DOCKER / "grafana" / "datasources.yaml").read_text())["datasources"]
    theirs = yaml.safe_load((REPO / "dashboards" / "provisioning" / "datasources" / "fleetlog.yaml").read_text())["datasources"]
    assert {(d["uid"], d["type"]) for d in ours} == {(d["uid"], d["type"]) for d in theirs}
    assert {d["url"] for d in ours} == {"http://prometheus:9090", f"http://ingest:{Settings().port}"}


@pytest.mark.parametrize("dockerfile", ["ingest.Dockerfile", "agent.Dockerfile"])
def test_dockerfiles_copy_what_exists_and_set_real_settings(dockerfile):
    text = (DOCKER / dockerfile).read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:  # --from copies from a build stage
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), line
    settings = {f"FLEETLOG_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    for name in re.findall(r"\b(FLEETLOG_[A-Z_]+)=", text):
        own = name == "FLEETLOG_IMAGE_VERSION" and name in ENTRYPOINT.read_text()  # the image's, sent by the entrypoint
        assert name in settings or name.startswith("FLEETLOG_AGENT_") or own, name
    assert re.search(r"^FROM ", text, re.MULTILINE) and re.search(r"^ENTRYPOINT \[", text, re.MULTILINE)


@pytest.mark.parametrize("dockerfile", ["ingest.Dockerfile", "agent.Dockerfile"])
def test_dockerfiles_take_their_base_and_version_as_build_arguments(dockerfile):
    text = (DOCKER / dockerfile).read_text()
    default = {"ingest.Dockerfile": "python:3.11-slim", "agent.Dockerfile": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}[dockerfile]
    assert re.search(rf"^ARG BASE={re.escape(default)}$", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE\}", text, re.MULTILINE)
    assert "ARG FLEETLOG_IMAGE_VERSION" in text and 'org.opencontainers.image.version="${FLEETLOG_IMAGE_VERSION}"' in text
    assert "--mount=type=secret,id=ca" in text and "COPY /etc/ssl" not in text  # the CA bundle is never a layer


def test_agent_image_carries_no_server():
    text = (DOCKER / "agent.Dockerfile").read_text()
    assert '".[agent]"' in text and "duckdb" not in text.lower().replace("no duckdb", "")
    assert "--no-deps" in text and "site-packages/ingest" in text
    agent_sources = "\n".join(p.read_text() for p in (REPO / "agent").glob("*.py"))
    assert not re.search(r"^\s*(from|import)\s+(ingest|duckdb)\b", agent_sources, re.MULTILINE)


def test_entrypoint_with_tokens_on_enrolls_once_and_pushes_with_the_instance_token(server_process, tmp_path):
    server = server_process("--policy-interval", "0", "--enroll-token", "fleet-enroll", "--read-token", "fleet-read",
                            "--admin-token", "fleet-admin").start()
    env = entrypoint_env(server, tmp_path, STANDIN_BENCH="oom", FLEETLOG_ENROLL_TOKEN="fleet-enroll",
                         FLEETLOG_AGENT_TOKEN_FILE=str(tmp_path / "instance.token"))
    rc, out = run_entrypoint(env, tmp_path)
    assert rc == 1, out
    request = urllib.request.Request(server.url + "/api/v1/instances/C.32733029",
                                     headers={"Authorization": "Bearer fleet-read"})
    with urllib.request.urlopen(request) as r:
        detail = orjson.loads(r.read())
    assert [e["kind"] for e in detail["events"]].count("registered") == 1
    assert detail["bench"]["exit_code"] == 1 and detail["logs"]["benchdaemon"]["complete"] is True
    assert (tmp_path / "instance.token").stat().st_mode & 0o777 == 0o600
    assert detail["logs"]["entrypoint"]["complete"] is True  # the self-tail agent used the instance token too
    assert "fleet-enroll" not in out


def test_entrypoint_restarted_after_its_agent_was_killed_reports_the_benchmark_it_adopts(server_process, tmp_path):
    """The benchmark's agent SIGKILLed after the rate line was stored, the entrypoint run again on the
    same state (a container restart): the parameter fetch must not adopt the benchmark's run, and the
    benchmark's new agent reports the run it adopts with the rate it printed before the kill."""
    server = server_process("--policy-interval", "0").start()
    hold = tmp_path / "hold"
    env = entrypoint_env(server, tmp_path, FLEETLOG_BENCH_CMD=str(SCRIPTS / "sim_benchmark.sh"), SIM_RATE="45.7",
                         SIM_HOLD_FILE=str(hold), SIM_LINES="2")
    first = start_entrypoint(env, tmp_path / "entrypoint.0.out")
    second = None
    try:
        def rate_line_stored():
            try:
                lines = get(server, "/api/v1/instances/C.32733029/logs?source=benchout&tail=100")["lines"]
            except urllib.error.HTTPError:
                return False
            return any(l["line"].startswith("Benchmark result:") for l in lines)

        wait_for(rate_line_stored, "the rate line to be stored")
        [agent_pid] = procs.agent_runs(first.pid)
        os.kill(agent_pid, signal.SIGKILL)
        first.wait(timeout=120)  # the entrypoint exits on its agent's death; the benchmark runs on
        second = start_entrypoint(env, tmp_path / "entrypoint.1.out")

        def adopting():
            return bool(procs.agent_runs(second.pid))

        wait_for(adopting, "the restarted entrypoint's benchmark agent")
        hold.touch()
        wait_for(lambda: "running" in [e["kind"] for e in get(server, "/api/v1/instances/C.32733029")["events"]],
                 "the restarted instance to run its proving stack")
    finally:
        for proc in (first, second):
            if proc:
                kill_group(proc)
    detail = get(server, "/api/v1/instances/C.32733029")
    assert detail["bench"]["exit_code"] == 0 and detail["bench"]["rate_per_hour"] == 45.7, detail["bench"]
    assert [e["kind"] for e in detail["events"]].count("bench_started") == 1  # adopted, never run twice
    assert detail["failure_class"] is None
