"""A real PostgreSQL for the lake tests: Debian's server binaries, a cluster in a temporary directory,
run as ``nobody`` when the tests run as root (PostgreSQL refuses root), on a free loopback port, its
process group killed at the end. scripts/test-deps.sh installs the binaries."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


class Postgres:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="fleetlog-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.as_user = ["runuser", "-u", "nobody", "--"] if os.getuid() == 0 else []

    def _own(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(path, "nobody")

    def start(self) -> "Postgres":
        os.chmod(self.root, 0o755)
        data, sockets = self.root / "data", self.root / "run"
        self._own(data)
        self._own(sockets)
        subprocess.run([*self.as_user, str(self.bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                        "--no-sync"], check=True, capture_output=True, timeout=120)
        self.log = open(self.root / "postgres.log", "wb")
        self.proc = subprocess.Popen(
            [*self.as_user, str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(sockets),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True)
            if ready.returncode == 0:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("postgres did not start: " + (self.root / "postgres.log").read_text()[-2000:])
            time.sleep(0.1)
        return self

    def createdb(self, name: str) -> str:
        """A fresh database; returns the ``--lake`` value naming it."""
        subprocess.run([str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name],
                       check=True, capture_output=True, timeout=60)
        return f"postgres:dbname={name} host=127.0.0.1 port={self.port} user=postgres"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        if self.proc is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL for the session's lake tests (each test makes its own database)."""
    bindir = pg_bin()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is missing: run scripts/test-deps.sh")
        pytest.skip("PostgreSQL server binaries missing (scripts/test-deps.sh installs them)")
    pg = Postgres(bindir).start()
    try:
        yield pg
    finally:
        pg.stop()


class LakeNode:
    """One ``fleetlog serve --lake`` process of a lake (its own process group), for tests that need a
    second node beside the in-process one."""

    def __init__(self, name: str, dsn: str, data: Path, tmp: Path, lease_s: float = 3.0, *extra: str) -> None:
        from tests.conftest import REPO

        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        args = [sys.executable, "-m", "ingest.cli", "serve", "--port", str(self.port), "--otlp-grpc-port", "0",
                "--db", str(tmp / f"{name}.duckdb"), "--lake", dsn, "--lake-data", str(data), "--node-id", name,
                "--advertise-url", self.url, "--lake-lease-s", str(lease_s), "--policy-interval-s", "0",
                "--log-level", "WARNING", *extra]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
