"""bench/peer.py runs VictoriaLogs as the side-by-side benchmarks need it, and bench/vs_victorialogs.py
prints every goal of issue 23 with its ratio, or says the peer is absent and skips the ratios."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import peer

REPO = Path(__file__).resolve().parents[1]
GOALS = ["search rare phrase p50", "search rare phrase p99", "search nowhere p99", "search common word p99",
         "first tail after restart, p99", "cached tail p99", "server CPU per line, 8 connections",
         "server CPU per line, 64 connections", "RSS after", "bytes on disk per line"]
needs_peer = pytest.mark.skipif(peer.binary() is None, reason=f"VictoriaLogs not found at {peer.where()}")


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@needs_peer
def test_peer_ingests_queries_and_stops_its_process_group(tmp_path):
    vl = peer.VictoriaLogs(peer.binary(), tmp_path / "data")
    vl.start()
    pid = vl.pid
    try:
        assert os.getpgid(pid) == pid  # its own process group
        now = time.time() - 3600 * 24 * 200  # 200 days back: kept with -retentionPeriod=1y
        rows = [{"instance_id": "C.1", "source": "benchdaemon", "seq": i, "ts": now + i, "line": f"line {i} partition"}
                for i in range(5)] + [{"instance_id": "C.2", "source": "setup", "seq": 0, "ts": now, "line": "CUDA out of memory"}]
        vl.ingest(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
        vl.flush()
        deadline = time.monotonic() + 30
        while not vl.query('"out of memory"', 10) and time.monotonic() < deadline:
            time.sleep(0.1)
        hits = vl.query('"out of memory"', 10)
        assert [json.loads(h)["instance_id"] for h in hits] == ["C.2"]
        tail = vl.query(vl.stream_query("C.1", "benchdaemon"), 2)
        assert sorted(json.loads(h)["seq"] for h in tail) == ["3", "4"]  # the newest 2, its fields as strings
        assert vl.rss_bytes() > 1 << 20
        # /proc counts CPU in clock ticks (10 ms): a fast machine can serve the above in less than one,
        # so keep it querying until a tick shows, rather than expect one from so little work
        deadline = time.monotonic() + 60
        while vl.cpu_s() == 0 and time.monotonic() < deadline:
            vl.query('"out of memory"', 10)
        assert vl.cpu_s() > 0
    finally:
        vl.stop()
    assert _gone(pid)
    assert vl.disk_bytes() > 0


def test_peer_absent_when_the_variable_names_no_file(monkeypatch, tmp_path):
    monkeypatch.setenv(peer.ENV, str(tmp_path / "no-such-binary"))
    assert peer.binary() is None
    assert str(tmp_path / "no-such-binary") in peer.where()


def _bench(tmp_path: Path, env: dict) -> str:
    cmd = [sys.executable, "bench/vs_victorialogs.py", "--lines", "6000", "--rounds", "1", "--repeat", "2", "--tails", "5", "--cached", "5"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "BENCH_CACHE_DIR": str(tmp_path / "cache"), **env})
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def _goal_rows(text: str) -> dict[str, str]:
    rows = {}
    for goal in GOALS:
        found = [line for line in text.splitlines() if line.startswith(goal)]
        assert found, f"{goal!r} not printed:\n{text}"
        rows[goal] = found[0]
    return rows


@needs_peer
def test_vs_victorialogs_prints_every_goal_with_its_ratio_and_reference(tmp_path):
    text = _bench(tmp_path, {})
    for goal, row in _goal_rows(text).items():
        assert "(absent)" not in row
        assert "x  rounds " in row, row  # the ratio, and its range over the rounds
        if "p50" not in goal:
            assert "met" in row, row  # whether the goal is met
    assert "in-process search.search" in text and "zstd -3 of the text" in text  # fleetlog's own reference


def test_vs_victorialogs_without_the_peer_says_so_and_skips_the_ratios(tmp_path):
    text = _bench(tmp_path, {peer.ENV: str(tmp_path / "absent")})
    assert "VictoriaLogs: not found at" in text
    for goal, row in _goal_rows(text).items():
        assert "(absent)" in row, row
    assert "in-process search.search" in text
