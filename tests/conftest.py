"""Shared fixtures: the real app on a real DuckDB file, and the real server as a subprocess."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest

from ingest.app import create_app
from ingest.config import Settings
from ingest.web.keys import WRITER

REPO = Path(__file__).resolve().parent.parent


SUBPROCESS_FIXTURES = {"server_process", "agent", "prometheus", "page"}


@pytest.fixture(autouse=True)
def collect_what_subprocess_tests_leave(request):
    """A test that drove subprocesses collects its garbage before it ends: a pipe or transport it
    left unclosed then fails that test (filterwarnings = error), not whichever test the garbage
    collector happens to run in later (under load, tests/test_malformed_bodies.py's long loop)."""
    yield
    if SUBPROCESS_FIXTURES.intersection(request.fixturenames):
        gc.collect()


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(db=str(tmp_path / "fleetlog.duckdb"), port=0, otlp_grpc_port=0)


@pytest.fixture
async def make_client(aiohttp_client, settings):
    """Build a test client on the real app; ``await make_client(**overrides)``."""

    async def make(**overrides):
        app = create_app(replace(settings, **overrides))
        client = await aiohttp_client(app)
        client.writer = app[WRITER]
        return client

    return make


@pytest.fixture
async def client(make_client):
    return await make_client()


def read_db(path: str, sql: str, params=()):
    """Open the database file on its own (the server must have released it) and query it."""
    con = duckdb.connect(path, read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with start_new_session=True) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_group(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM the process group of ``proc``; SIGKILL it if ``proc`` has not exited after ``timeout_s``.
    Whatever else is left in the group is killed too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc)


class ServerProcess:
    """``fleetlog serve`` in a subprocess, on a free loopback port."""

    def __init__(self, db: Path, log: Path, *extra: str) -> None:
        self.db = db
        self.log = log
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30) -> "ServerProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ingest.cli", "serve", "--port", str(self.port), "--db", str(self.db),
                 "--otlp-grpc-port", "0", *self.extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,  # its own process group, killed with it
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout_s} s: {self.log.read_text()[-2000:]}")

    def wait_for_log(self, pattern: str, timeout_s: float = 60) -> re.Match:
        """The first match of ``pattern`` in the server's log, polled until it appears (AssertionError after
        ``timeout_s``, with the log's end)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found is not None:
                return found
            assert time.monotonic() < deadline, f"{pattern!r} not in the log: {self.log.read_text()[-2000:]}"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc:
            kill_group(self.proc)

    def stop(self) -> None:
        if self.proc:
            stop_group(self.proc)


@pytest.fixture
def server_process(tmp_path):
    """Factory of real servers; every one started is stopped at the end of the test."""
    started: list[ServerProcess] = []

    def make(*extra: str, db: Path | None = None) -> ServerProcess:
        server = ServerProcess(db or tmp_path / "server.duckdb", tmp_path / "server.log", *extra)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
