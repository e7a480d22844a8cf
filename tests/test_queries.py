"""Every file in queries/ runs on a demo data set and returns rows; `fleetlog query` as a user runs it."""

from __future__ import annotations

import datetime as dt
import hashlib
import subprocess
import sys
from dataclasses import replace

import orjson
import pytest

from ingest.app import create_app
from ingest.web.keys import CORE
from ingest.db.sqlfiles import compose
from tests.conftest import REPO
from tests.fleet import bench_instance, incident, iso, post, push_lines, utcnow

QUERIES = REPO / "queries"
FILES = sorted(QUERIES.glob("*.sql"))
PARAMS = {"why_failed.sql": {"instance_id": "C.32733029"}}
# migration 017: the incident's OOM line as a template, its id; the incident against a healthy run (none: one row)
INCIDENT_PATTERN = "<ts> ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating <size> for NTT"
PARAMS |= {"pattern_failures.sql": {"pattern_id": hashlib.md5(INCIDENT_PATTERN.encode()).hexdigest()[:12]},
           "run_diff.sql": {"instance_id": "C.32733029"}}


async def load_demo(client) -> None:
    done = utcnow() - dt.timedelta(seconds=40)
    await incident(client, done, logs_complete=True)
    samples = []
    for i in range(12):  # the GPU in the last minute: busy, hot, memory nearly full
        ts = iso(done - dt.timedelta(seconds=60 - 5 * i))
        samples += [
            {"name": "DCGM_FI_DEV_GPU_UTIL", "ts": ts, "value": 98 - i, "labels": {"gpu": "0"}},
            {"name": "DCGM_FI_DEV_FB_USED", "ts": ts, "value": 23_900 + i, "labels": {"gpu": "0"}},
            {"name": "DCGM_FI_DEV_GPU_TEMP", "ts": ts, "value": 81, "labels": {"gpu": "0"}},
        ]
    await post(client, "/api/v1/metrics", {"instance_id": "C.32733029", "samples": samples})
    await bench_instance(client, "C.40", 777, done=done - dt.timedelta(hours=1), exit_code=0, rate=40.0, dph=0.8)
    await bench_instance(client, "C.31", 777, done=done, exit_code=0, rate=31.0, dph=0.8)
    await push_lines(client, "C.31", "benchout", ["proof 1 ok", "proof 2 ok"], at=done)
    await push_lines(client, "C.31", "benchout", ["proof 9 ok"], start=8, at=done)  # a gap: 2..7 missing
    await client.app[CORE].policy.run_cycle(False)


@pytest.fixture
async def demo_client(aiohttp_client, settings):
    client = await aiohttp_client(create_app(replace(settings, policy_interval_s=0)))
    await load_demo(client)
    return client


def test_every_query_file_says_what_it_answers_and_its_params():
    assert len(FILES) >= 8
    for path in FILES + sorted((QUERIES / "policies").glob("*.sql")):
        head = path.read_text().splitlines()[:8]
        assert head[0].startswith("-- ") and ":" in head[0], path
        assert any(line.startswith("-- params:") for line in head), path


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
async def test_query_file_returns_rows_on_demo_data(demo_client, path):
    sql = compose(path, QUERIES)
    r = await demo_client.post("/api/v1/query", data=orjson.dumps({"sql": sql, "params": PARAMS.get(path.name, {})}))
    body = await r.json()
    assert r.status == 200, body
    assert body["rows"], f"{path.name} returned no rows"


async def test_why_failed_shows_class_excerpt_and_gpu_state(demo_client):
    sql = compose(QUERIES / "why_failed.sql", QUERIES)
    r = await demo_client.post("/api/v1/query", data=orjson.dumps({"sql": sql, "params": {"instance_id": "C.32733029"}}))
    body = await r.json()
    row = dict(zip(body["columns"], body["rows"][0]))
    assert row["failure_class"] == "oom" and row["exit_code"] == 1
    assert "out of memory" in row["failure_excerpt"]
    gpu = orjson.loads(row["gpu_last_minute"])
    assert gpu["DCGM_FI_DEV_GPU_UTIL"]["samples"] == 12 and gpu["DCGM_FI_DEV_GPU_TEMP"]["max"] == 81


async def test_query_api_refuses_unused_and_missing_params(demo_client):
    r = await demo_client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT 1", "params": {"x": 1}}))
    assert r.status == 400 and "not used" in (await r.json())["error"]
    r = await demo_client.post("/api/v1/query", data=orjson.dumps({"sql": "SELECT $instance_id"}))
    assert r.status == 400 and "$instance_id" in (await r.json())["error"]


def fleetlog(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_fleetlog_query_against_server_and_file(server_process):
    server = server_process("--policy-interval", "0").start()
    import urllib.request

    doc = {"instance_id": "C.32733029", "source": "benchdaemon",
           "lines": [{"seq": 0, "line": "CUDA error: out of memory"}, {"seq": 1, "line": "x,y"}]}
    urllib.request.urlopen(urllib.request.Request(server.url + "/api/v1/logs", data=orjson.dumps(doc), method="POST")).close()
    table = fleetlog("query", "--server", server.url, "SELECT seq, line FROM logs ORDER BY seq")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines() == ["seq  line", "---  -------------------------", "0    CUDA error: out of memory",
                                         "1    x,y", "(2 rows)"]
    csv = fleetlog("query", "--server", server.url, "--format", "csv", "--file", "queries/log_volume.sql")
    assert csv.returncode == 0 and csv.stdout.splitlines()[0].startswith("instance_id,source,lines,bytes")
    bad = fleetlog("query", "--server", server.url, "SELECT * FROM read_text('/etc/passwd')")
    assert bad.returncode == 1 and "not allowed" in bad.stderr
    server.stop()
    offline = fleetlog("query", "--db", str(server.db), "--format", "json", "--param", "instance_id=C.32733029",
                       "SELECT count(*) AS n FROM logs WHERE instance_id = $instance_id")
    assert offline.returncode == 0, offline.stderr
    assert orjson.loads(offline.stdout) == [{"n": 2}]
