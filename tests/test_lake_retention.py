"""Retention and maintenance of a lake shared by several nodes: the retention rule carried out while
another node ingests (a DuckLake DELETE on ``logs`` conflicts with every concurrent insert, so the
lake carries it out in a delete window, ingest/db/lake/storage.py), and the maintenance job on one node at a
time."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import psycopg
import pytest

from ingest.web.keys import CORE
from ingest.db.lake.slots import SLOTS, slot_of
from tests.lake_pg import LakeNode, postgres  # noqa: F401 (a fixture)
from tests.fleet import rows

pytestmark = [pytest.mark.lake, pytest.mark.slow]


def post(url: str, doc) -> int:
    """POST ``doc``; retries 503 (a slot settling) as an agent does; returns the status of the answer."""
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                return e.code
        time.sleep(0.05)


def tail(url: str, instance_id: str) -> list[int]:
    with urllib.request.urlopen(f"{url}/api/v1/instances/{instance_id}/logs?source=s&tail=5", timeout=60) as r:
        return [line["seq"] for line in json.loads(r.read())["lines"]]


def owners(pg_dsn: str) -> dict[int, str]:
    with psycopg.connect(pg_dsn) as conn:
        return dict(conn.execute("SELECT slot, owner FROM fleetlog_slots WHERE expires_at > now()").fetchall())


async def wait_until(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


class Load:
    """Threads pushing batches of lines for ``instances`` to ``url`` until stopped; ``acked`` holds,
    per instance, how many lines (seq 0..n-1) were acknowledged."""

    def __init__(self, url: str, instances: list[str], batch: int = 50, threads: int = 2) -> None:
        self.url, self.batch = url, batch
        self.acked = {i: 0 for i in instances}
        self.errors: list[str] = []
        self.stop = threading.Event()
        parts = [instances[k::threads] for k in range(threads)]
        self.threads = [threading.Thread(target=self._run, args=(part,)) for part in parts if part]
        for t in self.threads:
            t.start()

    def _run(self, mine: list[str]) -> None:
        while not self.stop.is_set():
            for instance in mine:
                start = self.acked[instance]
                doc = {"instance_id": instance, "source": "s", "lines": [
                    {"seq": s, "ts": 1795951000.0 + s, "line": f"{instance} line {s}"} for s in range(start, start + self.batch)]}
                status = post(self.url + "/api/v1/logs", doc)
                if status != 200:
                    self.errors.append(f"{instance}: {status}")
                    return
                self.acked[instance] = start + self.batch

    def lines(self) -> int:
        return sum(self.acked.values())

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


async def node_a(make_client, postgres, tmp_path, **settings):  # noqa: F811
    """Node ``a`` of a new lake, in this process, once it holds every slot; returns (a, dsn, data path)."""
    dsn = postgres.createdb("r" + uuid.uuid4().hex[:12])
    data = tmp_path / "lake"
    a = await make_client(lake=dsn, lake_data=str(data), lake_lease_s=3.0, policy_interval_s=0, node_id="a", **settings)
    slots = a.app[CORE].slots
    await wait_until(lambda: len(slots.held()) == SLOTS, "node a to hold every slot")
    return a, dsn, data


async def test_lake_retention_commits_while_another_node_ingests(make_client, postgres, tmp_path):  # noqa: F811
    # maintenance every second on both nodes: a merge conflicts with a DELETE too
    a, dsn, data = await node_a(make_client, postgres, tmp_path, retention_s=0, lake_maintenance_interval_s=1.0)
    old = ["OLD.1", "OLD.2"]
    for instance in old:  # several commits each: several files (or inlined rows) to delete from
        for start in range(0, 300, 100):
            r = await a.post("/api/v1/logs", json={"instance_id": instance, "source": "s", "lines": [
                {"seq": s, "ts": 1795951000.0 + s, "line": f"old {s}"} for s in range(start, start + 100)]})
            assert r.status == 200, await r.text()
        r = await a.post("/api/v1/metrics", json={"instance_id": instance, "samples": [
            {"name": "gpu_util", "ts": 1795951000, "value": 97.0, "labels": {"gpu": "0"}}]})
        assert r.status == 200, await r.text()
        r = await a.post("/api/v1/events", json={"instance_id": instance, "kind": "killed", "ts": 1795951500})
        assert r.status == 200, await r.text()
    pg_dsn = dsn.removeprefix("postgres:")
    b = LakeNode("b", dsn, data, tmp_path, 3.0, "--lake-maintenance-interval-s", "1")
    load = None
    try:
        await wait_until(lambda: b.alive() and set(owners(pg_dsn).values()) == {"a", "b"} and len(owners(pg_dsn)) == SLOTS,
                         "the slots to spread over a and b")
        held_by_b = {slot for slot, owner in owners(pg_dsn).items() if owner == "b"}
        live = [name for name in (f"LIVE.{k}" for k in range(200)) if slot_of(name) in held_by_b][:6]
        load = Load(b.url, live)  # node b commits to the lake all along
        assert len(tail(b.url, "OLD.1")) == 5  # node b's tail cache holds OLD.1's newest lines now
        await wait_until(lambda: load.lines() >= 1000 or load.errors, "node b to commit")
        policy = a.app[CORE].policy
        failures = []
        for _attempt in range(6):  # cycle 1 marks them stale, cycle 2 proposes and carries out the deletes
            try:
                await policy.run_cycle(True)
            except Exception as e:  # noqa: BLE001 (what a failed attempt said is the evidence)
                failures.append(str(e).splitlines()[0])
            states = set(rows(a, "SELECT subject, state FROM decisions WHERE action = 'delete_logs'"))
            if states == {(i, "executed") for i in old}:
                break
        lines_during = load.lines()
        await wait_until(lambda: load.lines() >= lines_during + 500 or load.errors, "ingest to go on after retention")
        await wait_until(lambda: tail(b.url, "OLD.1") == [], "node b to forget the deleted lines it had cached")
    finally:
        if load is not None:
            await asyncio.to_thread(load.finish)
        b.stop()
    assert not load.errors, load.errors
    assert states == {(i, "executed") for i in old}, (states, failures)
    assert rows(a, "SELECT count(*) FROM logs WHERE instance_id LIKE 'OLD.%'") == [(0,)]
    assert rows(a, "SELECT count(*) FROM metrics WHERE instance_id LIKE 'OLD.%'") == [(0,)]
    stored = dict((i, (n, distinct, top)) for i, n, distinct, top in rows(
        a, "SELECT instance_id, count(*), count(DISTINCT seq), max(seq) FROM logs GROUP BY 1"))
    assert stored == {i: (n, n, n - 1) for i, n in load.acked.items() if n}, (stored, load.acked)
    assert rows(a, "SELECT count(*) FROM events WHERE instance_id LIKE 'OLD.%'") == [(2,)]  # events stay
    assert [p for p in passes(pg_dsn) if p[5] is not None] == []  # no merge lost to a delete either


def passes(pg_dsn: str) -> list[tuple]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute("SELECT node_id, started_at, finished_at, files_before, files_after, error "
                            "FROM fleetlog_maintenance ORDER BY started_at").fetchall()


def lake_counts(client) -> tuple[int, int]:
    """(data files of logs and metrics, snapshots) in the lake now."""
    files = sum(rows(client, f"SELECT count(*) FROM ducklake_list_files('lake', '{t}')")[0][0] for t in ("logs", "metrics"))
    return files, rows(client, "SELECT count(*) FROM ducklake_snapshots('lake')")[0][0]


async def test_lake_maintenance_runs_on_a_timer_under_ingest_and_keeps_every_line(make_client, postgres, tmp_path):  # noqa: F811
    a, dsn, data = await node_a(make_client, postgres, tmp_path, lake_maintenance_interval_s=1.0, lake_snapshot_keep_s=0)
    pg_dsn = dsn.removeprefix("postgres:")
    b = LakeNode("b", dsn, data, tmp_path, 3.0, "--lake-maintenance-interval-s", "1", "--lake-snapshot-keep-s", "0")
    load = None
    try:
        await wait_until(lambda: b.alive() and set(owners(pg_dsn).values()) == {"a", "b"} and len(owners(pg_dsn)) == SLOTS,
                         "the slots to spread over a and b")
        by_owner = owners(pg_dsn)
        live = [f"M.{k}" for k in range(40)]
        mine = {"a": [i for i in live if by_owner[slot_of(i)] == "a"][:3], "b": [i for i in live if by_owner[slot_of(i)] == "b"][:3]}
        loads = [Load(str(a.make_url("")).rstrip("/"), mine["a"], batch=20, threads=1), Load(b.url, mine["b"], batch=20, threads=1)]
        load = loads[1]
        ran = len(passes(pg_dsn))
        await wait_until(lambda: sum(1 for p in passes(pg_dsn)[ran:] if p[2] is not None) >= 4 or any(x.errors for x in loads),
                         "four maintenance passes under ingest")
        for x in loads:  # off the event loop: node a answers the pushes in flight on it
            await asyncio.to_thread(x.finish)
        # a pass begun after the last push was answered (on a loaded host six passes could all run under ingest,
        # the last of them before the final commits: 26 files left, CI 2026-12-04)
        stopped = len(passes(pg_dsn))
        await wait_until(lambda: len(passes(pg_dsn)) >= max(stopped + 1, ran + 6) and passes(pg_dsn)[-1][2] is not None,
                         "a pass after ingest stopped")
    finally:
        for x in (loads if load is not None else []):
            await asyncio.to_thread(x.finish)
        b.stop()
    assert not any(x.errors for x in loads), [x.errors for x in loads]
    done = passes(pg_dsn)
    assert all(p[5] is None for p in done), done  # no pass failed (appends never conflict with it)
    assert any(p[4] < p[3] for p in done), done  # files merged
    for earlier, later in zip(done, done[1:]):  # one node at a time: no pass began before the previous ended
        assert earlier[2] <= later[1], (earlier, later)
    files, snapshots = lake_counts(a)
    acked = {**loads[0].acked, **loads[1].acked}
    commits = sum(n // 20 for n in acked.values())
    assert files <= 4 and snapshots < commits, (files, snapshots, commits)  # merged, and old snapshots expired
    stored = {i: (n, distinct) for i, n, distinct in rows(a, "SELECT instance_id, count(*), count(DISTINCT seq) FROM logs GROUP BY 1")}
    assert stored == {i: (n, n) for i, n in acked.items()}, (stored, acked)
    for instance, n in acked.items():  # tails still read the newest lines of each stream
        r = await a.get(f"/api/v1/instances/{instance}/logs?source=s&tail=3")
        assert [line["seq"] for line in (await r.json())["lines"]] == [n - 3, n - 2, n - 1]
    r = await a.post("/api/v1/query", json={"sql": "SELECT count(*) FROM logs"})
    assert (await r.json())["rows"] == [[sum(acked.values())]]


def test_lake_maintenance_passes_of_two_nodes_never_overlap(postgres, tmp_path):  # noqa: F811
    from ingest.db.lake import storage as lake
    from ingest.db.lake.jobs import Maintenance
    from ingest.db.lake.slots import Slots

    dsn = postgres.createdb("m" + uuid.uuid4().hex[:12])
    pg_dsn = dsn.removeprefix("postgres:")
    con = lake.open_lake(dsn, str(tmp_path / "lake"))
    slots = Slots(pg_dsn, "x", "http://x", 3.0)
    slots.start()  # creates fleetlog_maintenance
    nodes = [Maintenance(con.cursor, pg_dsn, name, 0.01, 0) for name in ("n1", "n2")]
    stop = threading.Event()

    def node(m: Maintenance) -> None:
        while not stop.wait(0.01):  # a timer's check, every few milliseconds
            m.run_once()

    def writer() -> None:  # appends meanwhile, so each pass has files to merge
        cur = con.cursor()
        k = 0
        while not stop.wait(0.02):  # paced: every commit is a file, and each pass merges them all
            cur.execute("INSERT INTO lake.main.logs SELECT 'W', 's', '', i + ?, now()::TIMESTAMP, now()::TIMESTAMP, 'x', false "
                        "FROM range(10) t(i)", [k * 10])
            k += 1
        cur.close()

    threads = [threading.Thread(target=node, args=(m,)) for m in nodes] + [threading.Thread(target=writer)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while not (all(m.passes >= 1 for m in nodes) and sum(m.passes for m in nodes) >= 4):  # both took turns
            assert time.monotonic() < deadline, [m.passes for m in nodes]
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for m in nodes:
            m.stop()
        slots.stop()
        con.close()
    done = passes(pg_dsn)
    assert {p[0] for p in done} == {"n1", "n2"} and all(p[5] is None for p in done), done
    for earlier, later in zip(done, done[1:]):
        assert earlier[2] <= later[1], (earlier, later)


async def test_lake_retention_waits_for_a_maintenance_pass_in_progress(make_client, postgres, tmp_path):  # noqa: F811
    from ingest.db.lake.jobs import MAINTENANCE_LOCK_KEY

    a, dsn, _data = await node_a(make_client, postgres, tmp_path, retention_s=0, lake_maintenance_interval_s=0)
    r = await a.post("/api/v1/logs", json={"instance_id": "OLD.1", "source": "s", "lines": [
        {"seq": s, "ts": 1795951000.0 + s, "line": f"old {s}"} for s in range(10)]})
    assert r.status == 200, await r.text()
    assert (await a.post("/api/v1/events", json={"instance_id": "OLD.1", "kind": "killed", "ts": 1795951500})).status == 200
    policy = a.app[CORE].policy
    await policy.run_cycle(True)  # marks it stale
    waiting = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = %s")
    with psycopg.connect(dsn.removeprefix("postgres:"), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [MAINTENANCE_LOCK_KEY])  # a pass in progress (a merge)
        cycle = asyncio.create_task(policy.run_cycle(True))
        await wait_until(lambda: conn.execute(waiting, [MAINTENANCE_LOCK_KEY]).fetchone()[0] == 1, "retention to wait for the pass")
        assert rows(a, "SELECT count(*) FROM logs") == [(10,)]  # nothing deleted under the merge
        r = await a.post("/api/v1/logs", json={"instance_id": "LIVE.1", "source": "s", "lines": [
            {"seq": 0, "ts": 1795951000.0, "line": "ingest goes on"}]})
        assert r.status == 200, await r.text()  # the writer is not the one waiting
        conn.execute("SELECT pg_advisory_unlock(%s)", [MAINTENANCE_LOCK_KEY])
        report = await asyncio.wait_for(cycle, 60)
    assert len(report.executed) == 1, report
    assert rows(a, "SELECT instance_id, count(*) FROM logs GROUP BY 1") == [("LIVE.1", 1)]
