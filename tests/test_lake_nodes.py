"""Three ``fleetlog serve --lake`` processes on one PostgreSQL and one lake directory: pushes spread
over every node, one node SIGKILLed mid-ingest, its slots taken over, and every acknowledged line
stored exactly once."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

from ingest.db.lake import storage as lake
from ingest.db.lake.slots import SLOTS
from tests.conftest import REPO, free_port
from tests.lake_pg import postgres  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.lake, pytest.mark.slow]

LEASE_S = 3.0


class Node:
    def __init__(self, name: str, dsn: str, data: Path, tmp: Path, *extra: str) -> None:
        self.name, self.port, self.grpc_port = name, free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        self.log = tmp / f"{name}.log"
        self.args = [sys.executable, "-m", "ingest.cli", "serve", "--port", str(self.port), "--otlp-grpc-port", str(self.grpc_port),
                     "--db", str(tmp / f"{name}.duckdb"), "--lake", dsn, "--lake-data", str(data), "--node-id", name,
                     "--advertise-url", self.url, "--lake-lease-s", str(LEASE_S), "--policy-interval-s", "0",
                     "--log-level", "WARNING", *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def wait_for(condition, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def owners(pg_dsn: str) -> dict[str, int]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT owner, count(*) FROM fleetlog_slots WHERE expires_at > now() GROUP BY owner").fetchall()
    return dict(rows)


def push(urls: list[str], doc: dict, deadline: float) -> dict:
    """Like the agent: retry on connection errors and 503, on the next node, until acknowledged."""
    body = json.dumps(doc).encode()
    for url in itertools.cycle(urls):
        assert time.monotonic() < deadline, f"push never acknowledged: {doc['instance_id']}"
        request = urllib.request.Request(url + "/api/v1/logs", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            assert e.code in (502, 503, 504), (e.code, e.read()[:300])
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("unreachable")


@pytest.fixture
def cluster(postgres, tmp_path):  # noqa: F811
    dsn = postgres.createdb("n" + uuid.uuid4().hex[:12])
    nodes = [Node(f"n{i}", dsn, tmp_path / "lake", tmp_path) for i in range(3)]
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            wait_for(node.ready, f"{node.name} ready")
        yield dsn, nodes
    finally:
        for node in nodes:
            node.kill(signal.SIGTERM)


def test_lake_three_nodes_sigkill_mid_ingest_stores_every_acked_line_once(cluster, tmp_path):
    dsn, nodes = cluster
    pg_dsn = dsn.removeprefix("postgres:")
    wait_for(lambda: len(owners(pg_dsn)) == 3 and sum(owners(pg_dsn).values()) == SLOTS, "slots spread over 3 nodes")

    acked: dict[str, int] = {}  # instance -> lines acknowledged (seqs 0..n-1, pushed in order)
    counts = {"accepted": 0, "duplicates": 0}
    stop = threading.Event()
    errors: list[BaseException] = []
    lock = threading.Lock()
    urls = [n.url for n in nodes]

    def pusher(k: int) -> None:
        try:
            instances = [f"C.{k}.{j}" for j in range(8)]
            start = time.monotonic() + 600
            for round_ in itertools.count():
                if stop.is_set():
                    return
                for j, instance in enumerate(instances):
                    lines = [{"seq": s, "ts": 1764415248.0 + s, "line": f"{instance} line {s}"}
                             for s in range(round_ * 40, round_ * 40 + 40)]
                    order = urls[(k + j + round_) % 3:] + urls[:(k + j + round_) % 3]  # spread over the nodes
                    reply = push(order, {"instance_id": instance, "source": "benchout", "lines": lines}, start)
                    with lock:
                        acked[instance] = round_ * 40 + 40
                        counts["accepted"] += reply["accepted"]
                        counts["duplicates"] += reply["duplicates"]
        except BaseException as e:  # surfaced by the test body
            errors.append(e)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: sum(acked.values()) >= 3000 or errors, "first acknowledged lines")
    victim = max(nodes, key=lambda n: owners(pg_dsn).get(n.name, 0))
    victim.kill()  # SIGKILL mid-ingest: its leases stop being renewed
    survivors = [n.name for n in nodes if n is not victim]
    wait_for(lambda: set(owners(pg_dsn)) <= set(survivors) and sum(owners(pg_dsn).values()) == SLOTS,
             "the survivors to take over every slot")
    before = sum(acked.values())
    wait_for(lambda: sum(acked.values()) >= before + 3000 or errors, "ingest to go on after the takeover")
    stop.set()
    for t in threads:
        t.join(120)
    assert not errors, errors

    check = lake.open_lake(dsn, str(tmp_path / "lake"), temp_dir=str(tmp_path / "check.tmp"))
    try:
        assert lake.audit(check) == []
        stored = dict(check.execute("SELECT instance_id, count(*) FROM logs GROUP BY 1").fetchall())
        ranges = check.execute("SELECT instance_id, min(seq), max(seq), count(DISTINCT seq) FROM logs GROUP BY 1").fetchall()
    finally:
        check.close()
    for instance, n in acked.items():
        assert stored.get(instance, 0) >= n, (instance, stored.get(instance), n)
    for instance, lo, hi, distinct in ranges:
        assert lo == 0 and distinct == hi + 1, (instance, lo, hi, distinct)  # no hole, no double
    assert counts["accepted"] <= sum(stored.values())


def _post(url: str, path: str, doc) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _post_until_taken(url: str, path: str, body, timeout_s: float = 120):
    """POST as an agent does: a 503 (a slot settling, a fence margin, an owner busy) asks for a retry."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, reply = _post(url, path, body)
        if status != 503 or time.monotonic() > deadline:
            return status, reply
        time.sleep(0.2)


def test_lake_a_body_spanning_owners_is_split_forwarded_and_summed(cluster, tmp_path):
    dsn, nodes = cluster
    pg_dsn = dsn.removeprefix("postgres:")
    wait_for(lambda: len(owners(pg_dsn)) == 3 and sum(owners(pg_dsn).values()) == SLOTS, "slots spread over 3 nodes")
    from ingest.db.lake.slots import slot_of

    with psycopg.connect(pg_dsn) as conn:
        owner_of = dict(conn.execute("SELECT slot, owner FROM fleetlog_slots").fetchall())
    ids = [f"C.mix.{k}" for k in range(24)]
    assert len({owner_of[slot_of(i)] for i in ids}) == 3  # the body spans all three nodes
    streams = [{"instance_id": i, "source": "benchout", "lines": [{"seq": s, "ts": 1795951000 + s, "line": "x"} for s in range(5)]}
               for i in ids]
    status, body = _post_until_taken(nodes[0].url, "/api/v1/logs", {"streams": streams})
    # a 503 retried may have committed the parts of owners that answered: they come back as duplicates
    assert status == 200 and body["accepted"] + body["duplicates"] == 120 and body["accepted"] > 0, body
    status, body = _post_until_taken(nodes[1].url, "/api/v1/logs", {"streams": streams})  # again, through another node
    assert (status, body) == (200, {"ok": True, "accepted": 0, "duplicates": 120})
    events = [{"instance_id": i, "kind": "registered", "ts": 1795951000, "machine_id": 7} for i in ids]
    status, body = _post_until_taken(nodes[2].url, "/api/v1/events", events)
    assert status == 200 and body["ok"] is True, body
    check = lake.open_lake(dsn, str(tmp_path / "lake"), temp_dir=str(tmp_path / "check.tmp"))
    try:
        assert check.execute("SELECT count(*), count(DISTINCT instance_id) FROM logs").fetchall() == [(120, 24)]
        assert check.execute("SELECT count(*) FROM events WHERE kind = 'registered'").fetchall() == [(24,)]
        assert lake.audit(check) == []
    finally:
        check.close()
