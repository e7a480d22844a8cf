"""``fleetlog serve`` start-up errors: one line that names the fix, a non-zero exit, no traceback; a port
another process holds (HTTP or OTLP/gRPC) stops start-up instead of being shared."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.conftest import REPO, free_port

SERVE_TIMEOUT_S = 60


def serve(tmp_path, *args: str, python: tuple[str, ...] = ("-m", "ingest.cli")) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")}
    return subprocess.run([sys.executable, *python, "serve", "--db", str(tmp_path / "f.duckdb"), *args],
                          capture_output=True, text=True, timeout=SERVE_TIMEOUT_S, cwd=REPO, env=environ,
                          start_new_session=True)


def one_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line or line.startswith("fleetlog")]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_serve_on_a_busy_http_port_says_so_in_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = serve(tmp_path, "--port", str(port), "--otlp-grpc-port", "0")
    assert proc.returncode != 0
    line = one_line(proc)
    assert str(port) in line and "--port" in line and "FLEETLOG_PORT" in line, line


def test_serve_on_a_grpc_port_another_server_holds_stops(tmp_path, server_process):
    grpc_port = free_port()
    first = server_process("--otlp-grpc-port", str(grpc_port)).start(timeout_s=SERVE_TIMEOUT_S)
    assert f"OTLP/gRPC listening on 127.0.0.1:{grpc_port}" in first.log.read_text()
    proc = serve(tmp_path, "--port", str(free_port()), "--otlp-grpc-port", str(grpc_port))
    assert proc.returncode != 0, proc.stderr  # not a second listener on the same port
    line = one_line(proc)
    assert str(grpc_port) in line and "--otlp-grpc-port" in line and "FLEETLOG_OTLP_GRPC_PORT" in line, line


# An agent-only install (pip install ".[agent]"): none of the server extra's modules can be imported.
SERVER_EXTRA_MODULES = ("duckdb", "pyarrow", "msgspec", "prometheus_client", "grpc", "psycopg")
AGENT_ONLY = ("-c", f"import sys; sys.modules.update(dict.fromkeys({SERVER_EXTRA_MODULES!r})); "
                    "from ingest.cli import main; sys.argv[0] = 'fleetlog'; sys.exit(main())")


def fleetlog_agent_only(*args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")}
    return subprocess.run([sys.executable, *AGENT_ONLY, *args], capture_output=True, text=True, timeout=SERVE_TIMEOUT_S,
                          cwd=REPO, env=environ, start_new_session=True)


def test_serve_without_the_server_extra_names_the_install(tmp_path):
    proc = serve(tmp_path, "--port", str(free_port()), python=AGENT_ONLY)
    assert proc.returncode != 0
    line = one_line(proc)
    assert "pip install 'fleetlog[server]'" in line and "no module" in line, line


def test_policy_run_on_a_file_without_the_server_extra_names_the_install(tmp_path):
    proc = fleetlog_agent_only("policy", "run", "--once", "--db", str(tmp_path / "f.duckdb"))
    assert proc.returncode != 0
    line = one_line(proc)
    assert "pip install 'fleetlog[server]'" in line and "policy run" in line, line
    query = fleetlog_agent_only("query", "SELECT 1", "--db", str(tmp_path / "f.duckdb"))
    assert query.returncode != 0
    assert "pip install 'fleetlog[server]'" in one_line(query), query.stderr


def test_operator_commands_over_http_run_without_the_server_extra(server_process):
    """The operator's commands only speak HTTP: an agent-only install runs them against a server."""
    server = server_process("--policy-interval", "0").start(timeout_s=SERVE_TIMEOUT_S)
    for args in (("instances",), ("hosts",), ("query", "SELECT 41 + 1 AS answer"),
                 ("query", "--file", "why_failed", "--param", "instance_id=C.none"), ("search", "out of memory")):
        proc = fleetlog_agent_only(*args, "--server", server.url)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.returncode == 0, (args, proc.stderr)
        if args[0] == "query" and len(args) == 2:
            assert "42" in proc.stdout, proc.stdout
