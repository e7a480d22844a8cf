"""Shared by the benchmarks: realistic log lines, a server subprocess, percentiles."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ["benchout", "benchdaemon", "setup", "cuzk", "curio"]
TEMPLATES = [
    "2026-11-29T11:2{m}:{s:02d}.{ms:03d}Z INFO cuzk_daemon::prover: partition {p} of PoRep C2 proof {n} done in {t} ms (gpu 0)",
    "[entrypoint] 11:2{m}:{s:02d} fetching params: v28-stacked-proof-of-replication-merkletree-poseidon_hasher {p}%",
    "2026-11-29T11:2{m}:{s:02d}Z WARN cuzk_daemon::pce: PCE extraction waiting for synthesis, queue depth {p}, elapsed {t} ms",
    "proof {n}: ok, duration {t} ms, throughput so far {p}.{s} proofs/hour",
]


def make_line(rng: random.Random, n: int) -> str:
    template = TEMPLATES[n % len(TEMPLATES)]
    return template.format(m=rng.randint(0, 9), s=rng.randint(0, 59), ms=rng.randint(0, 999), p=rng.randint(0, 99),
                           n=n, t=rng.randint(1000, 200000))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, db: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = db.with_suffix(".log")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ingest.cli", "serve", "--port", str(self.port), "--db", str(db), "--log-level", "WARNING", "--otlp-grpc-port", "0", *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        self.started_s = self._wait_ready()

    def _wait_ready(self, timeout_s: float = 600) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1):
                    return time.perf_counter() - t0
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def wait_for_log(log: Path, text: str, timeout_s: float) -> float | None:
    """Seconds until ``text`` appears in the server's log, or None."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if text in log.read_text(errors="replace"):
            return time.perf_counter() - t0
        time.sleep(0.05)
    return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
