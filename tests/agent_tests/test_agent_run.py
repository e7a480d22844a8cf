"""``fleetlog-agent run`` with a real benchmark script and the real server."""

from __future__ import annotations

import signal
import time

from agentlib import SCRIPTS, Api, assert_exactly_once, wait_until


def test_run_ships_every_line_once_and_reports_the_rate(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    log = tmp_path / "cuzk-bench-daemon.log"
    done = agent(
        "run", server.url, "C.32733029", "--tail", f"benchdaemon={log}", "--machine-id", "55891", "--host-id", "7140",
        "--gpu-model", "NVIDIA GeForce RTX 4090", "--gpu-count", "1", "--proofs", "300", "--concurrency", "3",
        command=[SCRIPTS / "bench_ok.sh", log, 300],
    ).run()
    assert done.returncode == 0, done.stderr
    assert "Throughput: 42.5 proofs/hour" in done.stdout  # still echoed
    assert "warning: GPU temperature 81C" in done.stderr
    expected_out = ["Starting benchmark: 300 proofs, concurrency 3, partition-workers 16"]
    expected_out += [f"proof {i}/300 done in 138.2 s" for i in range(1, 301)]
    expected_out += ["warning: GPU temperature 81C", "Throughput: 42.5 proofs/hour"]
    assert_exactly_once(api, "C.32733029", "benchout", expected_out)
    assert_exactly_once(api, "C.32733029", "benchdaemon", log.read_text().splitlines())
    detail = api.instance("C.32733029")
    assert detail["bench"]["exit_code"] == 0 and detail["bench"]["rate_per_hour"] == 42.5
    assert detail["bench"]["proofs"] == 300
    assert (detail["machine_id"], detail["host_id"], detail["gpu_model"]) == (55891, 7140, "NVIDIA GeForce RTX 4090")
    assert all(s["complete"] for s in detail["logs"].values()), detail["logs"]
    kinds = [e["kind"] for e in detail["events"] if e["kind"] != "gpu_state"]  # GPU telemetry: test_agent_gpu.py
    assert kinds == ["registered", "bench_started", "bench_done", "logs_complete"]


def test_run_of_a_failed_benchmark_reports_the_daemons_out_of_memory(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    log = tmp_path / "cuzk-bench-daemon.log"
    done = agent("run", server.url, "C.1", "--tail", f"benchdaemon={log}", command=[SCRIPTS / "bench_oom.sh", log]).run()
    assert done.returncode == 1
    bench = api.instance("C.1")["bench"]
    assert bench["exit_code"] == 1
    assert bench["rate_per_hour"] is None  # no rate parsed is not "0 proofs/hour"
    excerpt = bench["failure_excerpt"]
    assert excerpt.startswith("== error-looking lines ==\n[benchdaemon] ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation)")
    assert "[stderr] benchmark.sh exited with error" in excerpt
    # the daemon's last words had no newline: they arrive anyway
    assert_exactly_once(api, "C.1", "benchdaemon", log.read_text().splitlines())
    assert api.lines("C.1", "benchdaemon")[-1][2] == "thread main panicked at cuzk-core/src/pce.rs:211: PCE extraction failed"


def test_run_exits_with_the_commands_code_when_it_cannot_start(server_process, agent):
    server = server_process().start()
    done = agent("run", server.url, "C.2", command=["/nonexistent/benchmark.sh"]).run()
    assert done.returncode == 127
    bench = Api(server.url).instance("C.2")["bench"]
    assert bench["exit_code"] == 127
    assert "cannot run '/nonexistent/benchmark.sh'" in bench["failure_excerpt"]


def test_sigterm_is_forwarded_and_the_signal_reported(tmp_path, server_process, agent):
    server = server_process().start()
    api = Api(server.url)
    ready = tmp_path / "ready"
    proc = agent("run", server.url, "C.3", "--tail", f"benchdaemon={tmp_path / 'd.log'}", command=[SCRIPTS / "bench_hang.sh", tmp_path / "d.log", ready]).start()
    wait_until(ready.exists, what="the benchmark to start")
    wait_until(lambda: api.count("C.3", "benchdaemon") == 1, what="the daemon's line")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5
    bench = api.instance("C.3")["bench"]
    assert bench["exit_code"] == 143
    done = api.events("C.3", "bench_done")[0]
    assert done["signal"] == "SIGTERM"
    assert "waiting for proof 1/12" in done["failure_excerpt"]


def test_a_command_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, server_process, agent):
    server = server_process().start()
    ready = tmp_path / "ready"
    proc = agent("run", server.url, "C.4", "--grace", "0.5", command=[SCRIPTS / "bench_hang.sh", tmp_path / "d.log", ready, "ignore-term"]).start()
    wait_until(ready.exists, what="the benchmark to start")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert 0.4 < time.monotonic() - started < 10
    assert Api(server.url).events("C.4", "bench_done")[0]["signal"] == "SIGKILL"


def test_run_that_failed_after_5_of_12_proofs_reports_them_and_why_says_so(tmp_path, server_process, agent):
    import io

    from ingest import oncall
    from ingest.client import Client

    server = server_process().start()
    api = Api(server.url)
    log = tmp_path / "daemon.log"
    done = agent("run", server.url, "C.5", "--tail", f"benchdaemon={log}", "--proofs", "12", "--gpu-interval-s", "0",
                 command=[SCRIPTS / "bench_fail_after.sh", log, 5, 12]).run()
    assert done.returncode == 1, done.stderr
    (bench_done,) = api.events("C.5", "bench_done")
    assert bench_done["proofs_ok"] == 5  # each said twice (stdout and the daemon's log), proof 6 failed
    api._call("/api/v1/policy/run", {})
    out = io.StringIO()
    assert oncall.why(Client(server.url), {"instance": "C.5", "format": "table"}, out) == 0
    assert "5 of 12 proofs" in out.getvalue().splitlines()[1], out.getvalue()
