"""VictoriaLogs, run beside fleetlog in the side-by-side benchmarks (../shared/peers/README.md).

``VictoriaLogs`` starts the peer's binary in its own process group (killed as a group on ``stop``)
on a free loopback port with ``-retentionPeriod=1y`` (the default 7 days would refuse a corpus with
old timestamps) and a data directory of its own, ingests JSON lines through ``/insert/jsonline``,
queries through ``/select/logsql/query`` and reads its RSS and CPU from ``/proc``. ``binary()``
finds the peer: ``FLEETLOG_PEER_VICTORIALOGS``, else ``shared/peers/victoria-logs`` beside the
checkout or beside the worktrees' folder; None when absent (the benchmarks then say so and skip
their ratios).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
ENV = "FLEETLOG_PEER_VICTORIALOGS"
INGEST_PATH = "/insert/jsonline?_stream_fields=instance_id,source&_msg_field=line&_time_field=ts"


def binary() -> Path | None:
    """The VictoriaLogs executable, or None when there is none."""
    given = os.environ.get(ENV)
    if given:
        return Path(given) if Path(given).is_file() else None
    for p in (_ROOT.parent / "shared/peers/victoria-logs", _ROOT.parents[1] / "shared/peers/victoria-logs"):
        if p.is_file():
            return p
    return None


def where() -> str:
    """Where the peer was looked for, for the message that says it is absent."""
    return os.environ.get(ENV) or f"{_ROOT.parent / 'shared/peers/victoria-logs'} (or set {ENV})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads) in seconds, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size (or ``VmHWM``, its peak) of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class VictoriaLogs:
    """One VictoriaLogs process on a data directory; ``start`` again after ``stop`` reopens it."""

    def __init__(self, exe: Path, data: Path, log: Path | None = None) -> None:
        self.exe, self.data, self.log = exe, data, log or data.with_suffix(".log")
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60) -> float:
        """Starts the server and waits for ``/health``; returns the seconds it took."""
        self.port = free_port()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.exe), f"-storageDataPath={self.data}", f"-httpListenAddr=127.0.0.1:{self.port}", "-retentionPeriod=1y",
                 "-loggerLevel=WARN"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.perf_counter()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"VictoriaLogs exited {self.proc.returncode}: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            if time.perf_counter() - t0 > timeout_s:
                self.stop()
                raise RuntimeError("VictoriaLogs did not answer /health")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM to its process group (it flushes and exits), SIGKILL if it does not within timeout_s."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            self.proc.wait()
        self.proc = None

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout_s: float = 60) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def ingest(self, body: bytes) -> None:
        """One /insert/jsonline request (JSON objects, one a line: instance_id, source, seq, ts, line)."""
        status, answer = self.request("POST", INGEST_PATH, body, {"Content-Type": "application/stream+json"})
        if status // 100 != 2:
            raise RuntimeError(f"VictoriaLogs ingest: {status} {answer[:200]!r}")

    def flush(self) -> None:
        """Makes everything ingested searchable now (``/internal/force_flush``)."""
        self.request("GET", "/internal/force_flush")

    def query_params(self, logsql: str, limit: int, start_s: float | None = None, end_s: float | None = None) -> bytes:
        params: dict = {"query": logsql, "limit": limit}
        if start_s is not None:
            params["start"] = f"{start_s:.6f}"
        if end_s is not None:
            params["end"] = f"{end_s:.6f}"
        return urllib.parse.urlencode(params).encode()

    def query(self, logsql: str, limit: int, start_s: float | None = None, end_s: float | None = None) -> list[bytes]:
        """The answer's JSON lines (newest ``limit`` entries that match)."""
        status, answer = self.request("POST", "/select/logsql/query", self.query_params(logsql, limit, start_s, end_s),
                                      {"Content-Type": "application/x-www-form-urlencoded"})
        if status != 200:
            raise RuntimeError(f"VictoriaLogs query {logsql!r}: {status} {answer[:200]!r}")
        return [line for line in answer.split(b"\n") if line]

    @staticmethod
    def stream_query(instance_id: str, source: str) -> str:
        return f'_stream:{{instance_id="{instance_id}",source="{source}"}}'

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.pid)

    def disk_bytes(self) -> int:
        return dir_bytes(self.data)
