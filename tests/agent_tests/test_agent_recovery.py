"""What must not cost a line: the server down at first, the agent killed, logs rotated under it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agentlib import SCRIPTS, Api, assert_exactly_once, wait_until
from tests.conftest import kill_group


def slow_bench_lines(n: int) -> tuple[list[str], list[str]]:
    out = [f"proof progress line {i} of {n}" for i in range(1, n + 1)] + ["Throughput: 42.5 proofs/hour"]
    daemon = [f"INFO cuzk_daemon::prover: partition {i} of {n} synthesized" for i in range(1, n + 1)]
    return out, daemon


def test_server_down_when_the_agent_starts_and_up_later_gets_everything_once(tmp_path, server_process, agent):
    server = server_process()  # not started yet: its port refuses connections
    marker, log = tmp_path / "marker", tmp_path / "daemon.log"
    proc = agent("run", server.url, "C.5", "--tail", f"benchdaemon={log}", command=[SCRIPTS / "bench_slow.sh", log, 400, marker]).start()
    wait_until(lambda: marker.exists() and "finished" in marker.read_text(), what="the benchmark to finish")
    time.sleep(1.0)  # the scenario: the server stays down a while after the benchmark ended
    assert proc.poll() is None  # the agent is still trying to deliver
    server.start()
    assert proc.wait(timeout=30) == 0
    api = Api(server.url)
    out, daemon = slow_bench_lines(400)
    assert_exactly_once(api, "C.5", "benchout", out)
    assert_exactly_once(api, "C.5", "benchdaemon", daemon)
    assert [e["kind"] for e in api.instance("C.5")["events"] if e["kind"] != "gpu_state"] == ["registered", "bench_started", "bench_done", "logs_complete"]


def test_agent_killed_midway_and_restarted_loses_and_doubles_nothing(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    marker, log = tmp_path / "marker", tmp_path / "daemon.log"
    n = 2500
    run = agent("run", server.url, "C.6", "--tail", f"benchdaemon={log}", command=[SCRIPTS / "bench_slow.sh", log, n, marker])
    first = run.start()
    wait_until(lambda: api.count("C.6", "benchdaemon") >= 300, what="some lines to be stored")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert "finished" not in marker.read_text()  # killed midway: the benchmark runs on without it
    second = run.run(timeout_s=60)  # the same command line, the same state directory
    assert second.returncode == 0, second.stderr
    assert "resuming run" in second.stderr
    assert marker.read_text().splitlines() == ["started", "finished"]  # adopted, not started twice
    out, daemon = slow_bench_lines(n)
    assert_exactly_once(api, "C.6", "benchout", out)
    assert_exactly_once(api, "C.6", "benchdaemon", daemon)
    bench = api.instance("C.6")["bench"]
    assert (bench["exit_code"], bench["rate_per_hour"]) == (0, 42.5)
    assert all(s["complete"] for s in api.instance("C.6")["logs"].values())


def test_server_killed_midway_loses_and_doubles_nothing(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    marker, log = tmp_path / "marker", tmp_path / "daemon.log"
    n = 2000
    proc = agent("run", server.url, "C.7", "--tail", f"benchdaemon={log}", command=[SCRIPTS / "bench_slow.sh", log, n, marker]).start()
    wait_until(lambda: api.count("C.7", "benchdaemon") >= 200, what="some lines to be stored")
    server.kill()  # SIGKILL: what it acknowledged is committed; the rest the agent resends
    time.sleep(0.5)
    server.start()
    assert proc.wait(timeout=60) == 0
    out, daemon = slow_bench_lines(n)
    assert_exactly_once(api, "C.7", "benchout", out)
    assert_exactly_once(api, "C.7", "benchdaemon", daemon)


@pytest.mark.parametrize("mode", ["rename", "copytruncate"])
def test_log_rotated_while_written_loses_no_line(tmp_path, server_process, agent, mode):
    server = server_process().start()
    log = tmp_path / "cuzk.log"
    done = agent("run", server.url, "C.8", "--tail", f"cuzk={log}", "--rotate-wait", "0.5", command=[SCRIPTS / "daemon_rotating.sh", log, mode, 4, 300]).run()
    assert done.returncode == 0, done.stderr
    assert_exactly_once(Api(server.url), "C.8", "cuzk", (tmp_path / "cuzk.log.truth").read_text().splitlines())


RATE_LINE = "Benchmark result: 45.7 proofs/hour"


def _run_dir(spool: Path) -> Path:
    (run_dir,) = (spool / "runs").iterdir()
    return run_dir


@pytest.mark.parametrize("when", ["running", "exited", "reaper_lost"])
def test_agent_killed_after_the_rate_line_reports_the_rate_after_a_restart(tmp_path, server_process, agent, when):
    """Issue 21.1: the rate line was read (and stored) before the kill; the restarted agent reads on
    from the saved offsets and must still report it, with the command's real exit (or none at all)."""
    server = server_process().start()
    api = Api(server.url)
    go = tmp_path / "go"
    run = agent("run", server.url, "C.45", "--gpu-interval-s", "0", command=[SCRIPTS / "bench_rate_then_wait.sh", go])
    first = run.start()
    try:
        wait_until(lambda: RATE_LINE in [line for _r, _s, line in api.lines("C.45", "benchout")], what="the rate line to be stored")
        kill_group(first)  # SIGKILL: the benchmark lives on under its reaper, in a process group of its own
        run_dir = _run_dir(run.spool)
        if when == "reaper_lost":  # the reaper dies too: nobody can know how the benchmark ended
            os.kill(int((run_dir / "status.reaper").read_text()), signal.SIGKILL)
        go.touch()
        if when == "exited":
            wait_until(lambda: (run_dir / "status").exists(), what="the benchmark to exit")
        elif when == "reaper_lost":
            wait_until(lambda: "benchmark.sh: done" in (run_dir / "stdout").read_text(), what="the benchmark's last line")
        again = run.run(timeout_s=60)
    finally:
        go.touch()
    assert "resuming run" in again.stderr
    assert_exactly_once(api, "C.45", "benchout", [
        "proof 1/2 done in 78.4 s", "proof 2/2 done in 79.1 s", "warning: GPU temperature 81C", RATE_LINE, "benchmark.sh: done",
    ])
    (bench_done,) = api.events("C.45", "bench_done")
    assert bench_done["rate_per_hour"] == 45.7 and bench_done["rate_line"] == RATE_LINE
    assert bench_done["failure_excerpt"] == "== last lines of stderr ==\nwarning: GPU temperature 81C"  # read before the kill
    detail = api.instance("C.45")
    assert len(detail["bench_runs"]) == 1, detail["bench_runs"]
    assert detail["bench"]["rate_per_hour"] == 45.7
    if when == "reaper_lost":
        assert again.returncode == 1
        assert "exit_code" not in bench_done and "exit status was lost" in bench_done["error"]
    else:
        assert again.returncode == 0, again.stderr
        assert bench_done["exit_code"] == 0 and detail["bench"]["exit_code"] == 0
        assert detail["outcome"] == "passed", detail["bench"]
