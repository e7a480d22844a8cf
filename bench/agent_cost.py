"""What the agent costs, each figure beside a reference measured in the same run.

1. Throughput: a file of 100,000 daemon-log lines, tailed by the real agent into the real server.
   Agent CPU seconds (user+sys, from wait4) per 100,000 lines shipped, beside ``cat`` and ``gzip -1``
   of the same file.
2. Steady state: a writer appends 1,000 lines/s for --seconds; the agent's CPU over that time as a
   share of one core (the target: <= 2 %), and line-written → queryable latency p50/p99 (the target:
   p99 <= 1 s), beside the same lines pushed straight to the server by the writer itself every 10 ms
   (no agent; what the server and the measuring poll alone cost).

Usage: python bench/agent_cost.py [--lines 100000] [--seconds 10] [--rate 1000]
Runs in well under a minute with the defaults. Default agent settings (poll 0.1 s, batch 0.2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINE = "INFO cuzk_daemon::prover: PoRep C2 partition {i} synthesized in 1.84 s, gpu 0 mem 21.4 GiB, queue 3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def count(url: str, instance_id: str) -> int:
    return call(url, "/api/v1/query", {"sql": f"SELECT count(*) FROM logs WHERE instance_id = '{instance_id}'"})["rows"][0][0]


def cpu_of(argv: list[str], **kw) -> float:
    """CPU seconds (user+sys) of a command run to its end."""
    proc = subprocess.Popen(argv, **kw)
    _pid, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


class Server:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "serve", "--port", str(self.port), "--db", str(workdir / "bench.duckdb")],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                call(self.url, "/readyz")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("server did not start; see server.log")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


class Agent:
    def __init__(self, url: str, instance_id: str, path: Path, spool: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "tail", "--server", url, "--instance-id", instance_id, "--spool", str(spool), "--tail", f"benchdaemon={path}"],
            cwd=REPO,
        )

    def cpu_now(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> float:
        """SIGTERM, wait; the CPU seconds of its whole life."""
        self.proc.send_signal(signal.SIGTERM)
        _pid, _status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = 0
        return usage.ru_utime + usage.ru_stime


def wait_for(url: str, instance_id: str, n: int, timeout_s: float = 120) -> float:
    started = time.monotonic()
    while count(url, instance_id) < n:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{instance_id}: fewer than {n} lines after {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - started


def throughput(url: str, workdir: Path, n: int) -> None:
    path = workdir / "daemon-100k.log"
    with open(path, "w") as f:
        for i in range(n):
            f.write(LINE.format(i=i) + "\n")
    agent = Agent(url, "B.throughput", path, workdir / "spool-throughput")
    elapsed = wait_for(url, "B.throughput", n)
    agent_cpu = agent.stop()
    cat_cpu = cpu_of(["cat", str(path)], stdout=subprocess.DEVNULL)
    gzip_cpu = cpu_of(["gzip", "-1", "-c", str(path)], stdout=subprocess.DEVNULL)
    per_100k = agent_cpu * 100_000 / n
    size_mb = path.stat().st_size / 1e6
    print(f"throughput: {n} lines ({size_mb:.1f} MB) stored in {elapsed:.2f} s ({n / elapsed:,.0f} lines/s)")
    print(f"  agent CPU per 100,000 lines shipped: {per_100k:.3f} s  (whole agent life, start-up and shutdown included)")
    print(f"  reference cat of the same file:      {cat_cpu * 100_000 / n:.3f} s   agent/cat  = {agent_cpu / max(cat_cpu, 1e-3):,.0f}x")
    print(f"  reference gzip -1 of the same file:  {gzip_cpu * 100_000 / n:.3f} s   agent/gzip = {agent_cpu / max(gzip_cpu, 1e-3):.1f}x")
    print(f"  => at 1,000 lines/s that is {per_100k / 100_000 * 1000 * 100:.2f} % of a core (marginal, without the idle polling)")


def writer(path: Path | None, url: str | None, instance_id: str, rate: int, seconds: float) -> int:
    """Write (to a file) or push (to the server) ``rate`` lines/s in slices every 10 ms; returns the count."""
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    n = 0
    seq = 0
    f = open(path, "a", buffering=1) if path else None
    start = time.monotonic()
    next_at = start
    while time.monotonic() - start < seconds:
        now = time.time()
        lines = [f"{now:.6f} " + LINE.format(i=n + k) for k in range(per_tick)]
        if f:
            f.write("\n".join(lines) + "\n")
            f.flush()
        else:
            call(url, "/api/v1/logs", {"instance_id": instance_id, "source": "direct", "run_id": "r", "lines": [{"seq": seq + k, "ts": now, "line": l} for k, l in enumerate(lines)]})
            seq += per_tick
        n += per_tick
        next_at += tick
        time.sleep(max(0.0, next_at - time.monotonic()))
    if f:
        f.close()
    return n


def watch(url: str, instance_id: str, source: str, stop: threading.Event, latencies: list[float]) -> None:
    """Poll the read API every 20 ms; a line's latency is when it was first seen minus when it was written."""
    after = -1
    while not stop.is_set():
        lines = call(url, f"/api/v1/instances/{instance_id}/logs?source={source}&after_seq={after}&tail=10000")["lines"]
        seen = time.time()
        for line in lines:
            latencies.append(seen - float(line["line"].split(" ", 1)[0]))
            after = max(after, line["seq"])
        if not lines:
            time.sleep(0.02)


def steady(url: str, workdir: Path, rate: int, seconds: float) -> None:
    def run(instance_id: str, source: str, through_agent: bool) -> tuple[list[float], float | None, int]:
        path = workdir / f"{instance_id}.log"
        path.touch()
        agent = Agent(url, instance_id, path, workdir / f"spool-{instance_id}") if through_agent else None
        if agent:
            time.sleep(1.0)  # start-up done before measuring its CPU
            cpu0 = agent.cpu_now()
        latencies: list[float] = []
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(url, instance_id, source, stop, latencies))
        watcher.start()
        started = time.monotonic()
        n = writer(path if agent else None, url, instance_id, rate, seconds)
        share = None
        if agent:
            wait_for(url, instance_id, n)
            share = (agent.cpu_now() - cpu0) / (time.monotonic() - started)
        else:
            wait_for(url, instance_id, n)
        deadline = time.monotonic() + 10
        while len(latencies) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        watcher.join()
        if agent:
            agent.stop()
        return latencies, share, n

    agent_lat, share, n = run("B.steady", "benchdaemon", True)
    direct_lat, _none, _n = run("B.direct", "direct", False)

    def pct(values: list[float], p: float) -> float:
        return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if len(values) > 1 else values[0]

    print(f"steady state: {rate} lines/s for {seconds:g} s ({n} lines), default agent settings")
    print(f"  agent CPU: {share * 100:.2f} % of a core (target <= 2 %)")
    a50, a99, d50, d99 = pct(agent_lat, 50), pct(agent_lat, 99), pct(direct_lat, 50), pct(direct_lat, 99)
    print(f"  written -> queryable through the agent: p50 {a50 * 1000:.0f} ms, p99 {a99 * 1000:.0f} ms (target p99 <= 1000 ms)")
    print(f"  reference, pushed straight to the server: p50 {d50 * 1000:.0f} ms, p99 {d99 * 1000:.0f} ms")
    print(f"  ratio agent/direct: p50 {a50 / d50:.1f}x, p99 {a99 / d99:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetlog-bench-") as tmp:
        workdir = Path(tmp)
        server = Server(workdir)
        try:
            print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
            throughput(server.url, workdir, args.lines)
            steady(server.url, workdir, args.rate, args.seconds)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
