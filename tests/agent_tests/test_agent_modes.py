"""``wrap``, ``event`` and ``tail``: the entrypoint's other phases, with the same guarantees."""

from __future__ import annotations

import signal

from agentlib import SCRIPTS, Api, assert_exactly_once, wait_until


def test_wrap_ships_a_setup_step_and_sends_its_done_event(server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    done = agent("wrap", server.url, "C.10", "--done-event", "params_done", command=["sh", "-c", "echo fetching 56 GiB of parameters; echo fetch ok >&2"]).run()
    assert done.returncode == 0, done.stderr
    assert_exactly_once(api, "C.10", "setup", ["fetching 56 GiB of parameters", "fetch ok"])
    assert [e["kind"] for e in api.instance("C.10")["events"]] == ["logs_complete", "params_done"]
    assert api.instance("C.10")["logs"]["setup"]["complete"]


def test_wrap_of_a_failing_step_sends_its_done_event_with_its_code(server_process, agent):
    # the failure is the event the rules act on: sent by this agent after its lines, not by a second
    # process the entrypoint starts later (seconds on a loaded host, or never if it is killed first)
    server = server_process().start()
    done = agent("wrap", server.url, "C.11", "--done-event", "params_done", command=["sh", "-c", "echo 'curl: (28) Operation timed out' >&2; exit 3"]).run()
    assert done.returncode == 3
    api = Api(server.url)
    assert [e["kind"] for e in api.instance("C.11")["events"]] == ["logs_complete", "params_done"]
    (params_done,) = api.events("C.11", "params_done")
    assert params_done["exit_code"] == 3 and "timeout" not in params_done
    (logs_complete,) = api.events("C.11", "logs_complete")
    assert params_done["run_id"] == logs_complete["run_id"]  # the run whose streams are its evidence
    assert_exactly_once(api, "C.11", "setup", ["curl: (28) Operation timed out"])
    assert api.instance("C.11")["failure_line"] == "params_done exit code 3"


def test_event_is_delivered_with_its_fields(server_process, agent):
    server = server_process().start()
    done = agent("event", server.url, "C.12", "running", "note=proving", "partitions=16").run()
    assert done.returncode == 0, done.stderr
    (body,) = Api(server.url).events("C.12", "running")
    assert (body["note"], body["partitions"]) == ("proving", 16)


def test_event_while_the_server_is_down_is_kept_and_sent_by_the_next_agent(server_process, agent):
    server = server_process()
    first = agent("event", server.url, "C.13", "params_done", "--flush-timeout", "0.5").run()
    assert first.returncode == 75  # queued on disk, not yet delivered
    assert "not delivered" in first.stderr and "params_done" in first.stderr
    server.start()
    second = agent("event", server.url, "C.13", "running").run()
    assert second.returncode == 0
    kinds = [e["kind"] for e in Api(server.url).instance("C.13")["events"]]
    assert kinds == ["params_done", "running"]


def test_tail_runs_until_stopped_and_a_second_tail_reads_on_without_doubles(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    cuzk, curio = tmp_path / "cuzk.log", tmp_path / "curio.log"
    cuzk.write_text("cuzk 1\ncuzk 2\n")
    tail = agent("tail", server.url, "C.14", "--tail", f"cuzk={cuzk}", "--tail", f"curio={curio}")
    proc = tail.start()
    wait_until(lambda: api.count("C.14", "cuzk") == 2, what="the cuzk lines")
    curio.write_text("curio: lotus API on 127.0.0.1:1234 unreachable\n")  # a file that appears later
    with cuzk.open("a") as f:
        f.write("cuzk 3\n")
    wait_until(lambda: api.count("C.14") == 4, what="the new lines")
    with cuzk.open("a") as f:
        f.write("cuzk 4 without newline")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert api.events("C.14", "logs_complete")[0]["sources"] == {"cuzk": 3, "curio": 0}
    with cuzk.open("a") as f:
        f.write("\ncuzk 5\n")
    proc = tail.start()  # the same state directory: positions are kept, nothing is read twice,
    # and the newline that ends "cuzk 4", shipped when the first agent stopped, is no empty line
    wait_until(lambda: api.count("C.14", "cuzk") == 5, what="the line after the restart")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert_exactly_once(api, "C.14", "cuzk", ["cuzk 1", "cuzk 2", "cuzk 3", "cuzk 4 without newline", "cuzk 5"])


def test_event_reaches_a_running_agent_through_its_inbox(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    log = tmp_path / "cuzk.log"
    log.write_text("cuzk up\n")
    proc = agent("tail", server.url, "C.15", "--tail", f"cuzk={log}").start()
    wait_until(lambda: api.count("C.15") == 1, what="the tail agent to run")
    done = agent("event", server.url, "C.15", "running").run()  # the same --spool, locked by the tail agent
    assert done.returncode == 0, done.stderr
    wait_until(lambda: api.events("C.15", "running"), what="the event")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_full_spool_drops_the_oldest_lines_counts_them_and_says_so(tmp_path, server_process, agent):
    server = server_process()
    marker, log = tmp_path / "marker", tmp_path / "daemon.log"
    proc = agent(
        "run", server.url, "C.16", "--tail", f"benchdaemon={log}", "--spool-max-bytes", "65536",
        command=[SCRIPTS / "bench_slow.sh", log, 3000, marker],
    ).start()
    wait_until(lambda: marker.exists() and "finished" in marker.read_text(), what="the benchmark to finish")
    server.start()
    assert proc.wait(timeout=30) == 0
    api = Api(server.url)
    done = api.events("C.16", "bench_done")[0]
    complete = api.events("C.16", "logs_complete")[0]
    stored = {s: api.count("C.16", s) for s in ("benchout", "benchdaemon")}
    assert complete["dropped_lines"] == done["dropped_lines"]
    assert stored["benchout"] + complete["dropped_lines"]["benchout"] == 3001
    assert stored["benchdaemon"] + complete["dropped_lines"]["benchdaemon"] == 3000
    assert api.lines("C.16", "benchdaemon")[-1][2].endswith("partition 3000 of 3000 synthesized")  # the newest are kept
    (dropped,) = api.query("SELECT sum(value) FROM (SELECT arg_max(value, ts) AS value FROM metrics WHERE instance_id = 'C.16' AND name = 'fleetlog_agent_dropped_lines_total' GROUP BY labels)")
    assert dropped[0] == sum(complete["dropped_lines"].values())
    assert not api.instance("C.16")["logs"]["benchdaemon"]["complete"]  # the gap shows


def test_with_tokens_on_the_agent_enrolls_once_and_every_phase_uses_the_instances_token(tmp_path, server_process, agent):
    server = server_process("--enroll-token", "fleet-enroll", "--read-token", "fleet-read", "--admin-token", "fleet-admin").start()
    api = Api(server.url, token="fleet-read")
    token_file = tmp_path / "instance.token"
    auth = ["--enroll-token", "fleet-enroll", "--token-file", str(token_file)]
    log = tmp_path / "daemon.log"
    done = agent("wrap", server.url, "C.17", *auth, "--done-event", "params_done", command=["echo", "params fetched"]).run()
    assert done.returncode == 0, done.stderr
    done = agent("run", server.url, "C.17", *auth, "--tail", f"benchdaemon={log}", command=[SCRIPTS / "bench_ok.sh", log, 2]).run()
    assert done.returncode == 0, done.stderr
    assert agent("event", server.url, "C.17", *auth, "running").run().returncode == 0
    assert token_file.stat().st_mode & 0o777 == 0o600
    kinds = [e["kind"] for e in api.instance("C.17")["events"] if e["kind"] != "gpu_state"]
    # one enrollment (the wrap's), then everything with the instance's own token
    assert kinds == ["registered", "logs_complete", "params_done", "registered", "bench_started", "bench_done", "logs_complete", "running"]
    assert api.instance("C.17")["bench"]["rate_per_hour"] == 42.5
    assert_exactly_once(api, "C.17", "benchdaemon", log.read_text().splitlines())
    # the enrollment token alone cannot push lines
    refused = agent("event", server.url, "C.18", "--token", "fleet-enroll", "--token-file", str(tmp_path / "other"), "running", "--flush-timeout", "0.3").run()
    assert refused.returncode == 75 and "403" in refused.stderr


def test_the_docs_entrypoint_registers_before_a_failed_fetch_and_the_failure_shows(server_process, tmp_path):
    """docs/agent.md's entrypoint, its first steps run as written (bash, the real agent): the instance
    is registered before the fetch's lines and its params_done, and a fetch that fails is a failure
    wherever one is shown (it ran ``wrap`` before anything sent ``registered``)."""
    import os
    import re
    import subprocess
    import sys

    from agentlib import REPO
    from tests.conftest import kill_group

    block = re.search(r"## An entrypoint\n\n```sh\n(.*?)```", (REPO / "docs" / "agent.md").read_text(), re.S).group(1)
    steps = [line for line in block.splitlines() if line.startswith("fleetlog-agent ")]
    assert steps[0].startswith("fleetlog-agent event registered"), steps
    wrap = next(i for i, line in enumerate(steps) if " wrap " in line)
    (tmp_path / "fetch-params.sh").write_text("#!/bin/sh\necho 'fetching 56 GiB of parameters'\necho 'curl: (28) Operation timed out' >&2\nexit 3\n")
    (tmp_path / "fetch-params.sh").chmod(0o755)
    server = server_process().start()
    script = f'fleetlog-agent() {{ "{sys.executable}" -m agent.cli "$@"; }}\n' + "\n".join(steps[:wrap + 1]) + "\n"
    env = dict(os.environ, FLEETLOG_SERVER=server.url, CONTAINER_ID="55891001", FLEETLOG_MACHINE_ID="55891",
               FLEETLOG_HOST_ID="7140", FLEETLOG_AGENT_SPOOL=str(tmp_path / "state"), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == 3, out  # the fetch's own code, the script's last command
    api = Api(server.url)
    detail = api.instance("C.55891001")
    kinds = [e["kind"] for e in detail["events"]]
    assert kinds[0] == "registered" and kinds.index("registered") < kinds.index("params_done"), kinds
    assert detail["machine_id"] == 55891, detail
    assert detail["failure_class"] == "param_fetch" and detail["failure_line"] == "params_done exit code 3", detail
    assert_exactly_once(api, "C.55891001", "setup", ["fetching 56 GiB of parameters", "curl: (28) Operation timed out"])
