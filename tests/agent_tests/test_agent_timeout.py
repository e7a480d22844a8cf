"""``--max-duration``: a benchmark that runs too long is ended, shipped whole, and reported as a timeout."""

from __future__ import annotations

import re
import signal
import time

import pytest

from agent.config import ConfigError, load
from agentlib import Api, wait_until

TICKER = "i=0; while :; do echo \"proof $i still running\"; i=$((i+1)); sleep 0.05; done"
TIMEOUT_CLASS = re.compile(r"(?i)(timed out|timeout|deadline exceeded|DeadlineExceeded)")  # queries/policies/10_failure_class.sql


def _assert_ticks_once(api: Api, instance_id: str) -> list[str]:
    """Every line of the ticker, once, in order, and nothing after the agent's note but signal talk."""
    stored = api.lines(instance_id, "benchout")
    assert [seq for _r, seq, _l in stored] == list(range(len(stored)))
    lines = [line for _r, _s, line in stored]
    ticks = [line for line in lines if line.startswith("proof ")]
    assert ticks == [f"proof {i} still running" for i in range(len(ticks))]
    assert len(ticks) >= 5
    return lines


@pytest.mark.parametrize(("script", "code", "sig"), [(TICKER, 128 + signal.SIGTERM, "SIGTERM"), ("trap '' TERM; " + TICKER, 128 + signal.SIGKILL, "SIGKILL")])
def test_run_past_max_duration_is_ended_and_reported_as_a_timeout(server_process, agent, script, code, sig):
    server = server_process().start()
    api = Api(server.url)
    started = time.monotonic()
    done = agent("run", server.url, "C.50", "--max-duration", "1.5", "--grace", "1", command=["sh", "-c", script]).run(timeout_s=60)
    elapsed = time.monotonic() - started
    assert done.returncode == code, done.stderr
    assert 1.5 <= elapsed < 30
    assert "timed out after 1.5 s (--max-duration)" in done.stderr  # the person reading the container's output sees it
    lines = _assert_ticks_once(api, "C.50")
    assert "fleetlog-agent: sh timed out after 1.5 s (--max-duration): SIGTERM to its process group, SIGKILL in 1 s unless it exits" in lines
    (bench_done,) = api.events("C.50", "bench_done")
    assert bench_done["timeout"] is True and bench_done["max_duration_s"] == 1.5
    assert (bench_done["exit_code"], bench_done["signal"]) == (code, sig)
    first = bench_done["failure_excerpt"].splitlines()[0]
    assert first == "fleetlog-agent: sh timed out after 1.5 s (--max-duration)" and TIMEOUT_CLASS.search(first)
    kinds = [e["kind"] for e in api.instance("C.50")["events"] if e["kind"] != "gpu_state"]
    assert kinds == ["registered", "bench_started", "bench_done", "logs_complete"]
    detail = api.instance("C.50")
    assert detail["bench"]["exit_code"] == code
    assert detail["logs"]["benchout"]["complete"]
    api._call("/api/v1/policy/run", {})  # the server's failure classifier (a dry run decides nothing else)
    assert api.query("SELECT failure_class FROM bench_runs WHERE instance_id = 'C.50'") == [["timeout"]]


def test_a_command_that_exits_0_on_the_timeout_still_fails(server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    script = "trap 'echo stopping cleanly; exit 0' TERM; " + TICKER.replace("sleep 0.05", "sleep 0.05 & wait")
    done = agent("run", server.url, "C.51", "--max-duration", "1", "--grace", "5", command=["sh", "-c", script]).run(timeout_s=60)
    assert done.returncode == 124, done.stderr
    (bench_done,) = api.events("C.51", "bench_done")
    assert (bench_done["exit_code"], bench_done["timeout"]) == (124, True)
    assert "stopping cleanly" in [line for _r, _s, line in api.lines("C.51", "benchout")]


def test_wrap_past_max_duration_sends_its_done_event_as_a_timeout(server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    done = agent("wrap", server.url, "C.52", "--max-duration", "1", "--grace", "1", "--done-event", "params_done", command=["sh", "-c", TICKER]).run(timeout_s=60)
    assert done.returncode == 128 + signal.SIGTERM
    assert [e["kind"] for e in api.instance("C.52")["events"]] == ["logs_complete", "params_done"]
    (params_done,) = api.events("C.52", "params_done")
    assert (params_done["exit_code"], params_done["timeout"], params_done["max_duration_s"]) == (128 + signal.SIGTERM, True, 1)
    lines = [line for _r, _s, line in api.lines("C.52", "setup")]
    assert any("timed out after 1 s" in line for line in lines)


def test_run_within_max_duration_is_not_a_timeout(server_process, agent):
    server = server_process().start()
    done = agent("run", server.url, "C.53", "--max-duration", "60", command=["sh", "-c", "echo 'Throughput: 42.5 proofs/hour'"]).run(timeout_s=60)
    assert done.returncode == 0, done.stderr
    (bench_done,) = Api(server.url).events("C.53", "bench_done")
    assert "timeout" not in bench_done and bench_done["exit_code"] == 0
    assert Api(server.url).instance("C.53")["logs"]["benchout"]["complete"]


def test_the_limit_holds_for_an_agent_that_adopts_the_command_after_a_crash(server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    run = agent("run", server.url, "C.54", "--max-duration", "3", "--grace", "1", command=["sh", "-c", TICKER])
    first = run.start()
    wait_until(lambda: api.count("C.54", "benchout") >= 3, what="the first lines")
    first.send_signal(signal.SIGKILL)  # the agent dies; the command goes on under its reaper
    first.wait()
    again = run.run(timeout_s=60)
    assert again.returncode == 128 + signal.SIGTERM, again.stderr
    assert "resuming run" in again.stderr
    _assert_ticks_once(api, "C.54")
    (bench_done,) = api.events("C.54", "bench_done")
    assert bench_done["timeout"] is True and 3 <= bench_done["duration_s"] < 30


def test_max_duration_is_a_setting_of_run_and_wrap():
    base = ["--server", "http://127.0.0.1:8080", "--instance-id", "C.1"]
    assert load(["run", *base, "--max-duration", "3600", "--", "true"], {}).settings.max_duration_s == 3600.0
    assert load(["wrap", *base, "--", "true"], {"FLEETLOG_AGENT_MAX_DURATION_S": "90"}).settings.max_duration_s == 90.0
    assert load(["run", *base, "--", "true"], {}).settings.max_duration_s is None
    with pytest.raises(ConfigError, match="--max-duration-s: must be >= 0.001"):
        load(["run", *base, "--max-duration", "0", "--", "true"], {})
