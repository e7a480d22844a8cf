"""An instance that opens many log streams: the writer's work per push does not grow with the streams
already stored, and the streams one instance may hold are capped (413 naming the cap, nothing stored).

Issue 20 item 9: 1,000 new sources per push from one instance took each push from 1.0 to 8.8 s as its
streams reached ~16k (``_publish`` asked ``has_source``, which scanned all of the instance's streams
for each source), and stalled every other instance's pushes behind the one writer.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import orjson

from tests.conftest import read_db

INGEST = Path(__file__).resolve().parent.parent / "ingest"
WRITER_THREAD = "fleetlog-writer"  # ingest/db/writer.py Writer.start
BOOKKEEPING = {str(INGEST / "db" / name) for name in ("seqindex.py", "tailcache.py", "writer.py")}


def streams_body(instance_id: str, sources, run_id: str = "0") -> bytes:
    return orjson.dumps({"streams": [
        {"instance_id": instance_id, "source": source, "run_id": run_id, "lines": [{"seq": 0, "ts": 1795951000, "line": "x"}]}
        for source in sources]})


async def push(client, instance_id: str, sources, run_id: str = "0"):
    r = await client.post("/api/v1/logs", data=streams_body(instance_id, sources, run_id))
    return r.status, await r.json()


class LineCounter:
    """Counts the Python lines executed in the writer's stream bookkeeping (the index, the tail cache,
    the writer) on the writer's thread (started while installed): a measure of work that no load on the
    machine changes, unlike a time. Only that thread's, and only the push's: the test runs no policy cycle
    (a cycle's commit fell inside the measure on a CI host: 247 -> 344 lines)."""

    def __init__(self) -> None:
        self.on = False
        self.lines = 0

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename in BOOKKEEPING and threading.current_thread().name == WRITER_THREAD:
            return self._local
        return None

    def _local(self, frame, event, arg):
        if self.on and event == "line":
            self.lines += 1
        return self._local

    async def measure(self, client, instance_id: str, source: str) -> int:
        self.lines, self.on = 0, True
        try:
            status, answer = await push(client, instance_id, [source])
        finally:
            self.on = False
        assert status == 200, answer
        return self.lines


async def test_push_work_does_not_grow_with_the_streams_stored_for_many_streams(make_client):
    counter = LineCounter()
    threading.settrace(counter)  # the writer thread starts with the app, below
    try:
        client = await make_client(max_streams_per_instance=5_000, tail_cache_max_streams=100, policy_interval_s=0)
    finally:
        threading.settrace(None)
    assert (await push(client, "C.many", [f"s{k}" for k in range(10)]))[0] == 200
    few = await counter.measure(client, "C.many", "new-at-10")
    for start in range(10, 3_010, 1_000):
        status, answer = await push(client, "C.many", [f"s{k}" for k in range(start, start + 1_000)])
        assert status == 200, answer
    many = await counter.measure(client, "C.many", "new-at-3011")
    assert few > 0
    # one new source costs the same lines whether the instance holds 11 streams or 3,012
    assert many <= few * 1.2, (few, many)
    assert sys.gettrace() is None


async def test_streams_beyond_the_cap_are_refused_413_naming_it_and_nothing_is_stored(make_client, settings):
    client = await make_client(max_streams_per_instance=40)
    assert (await push(client, "C.1", [f"s{k}" for k in range(30)]))[0] == 200
    status, answer = await push(client, "C.1", [f"t{k}" for k in range(11)])  # 41 streams
    assert status == 413, answer
    assert "max_streams_per_instance" in answer["error"] and "40" in answer["error"], answer
    assert answer == {"ok": False, "error": answer["error"], "status": 413}
    # what fits still goes in: up to the cap (a new run is a new stream), existing streams, other instances
    assert (await push(client, "C.1", ["s0"], run_id="1"))[0] == 200
    assert (await push(client, "C.1", [f"s{k}" for k in range(30)] + [f"t{k}" for k in range(9)]))[0] == 200
    assert (await push(client, "C.1", ["s1"], run_id="1"))[0] == 413
    status, answer = await push(client, "C.1", ["s1"])
    assert status == 200 and answer["duplicates"] == 1
    assert (await push(client, "C.2", [f"s{k}" for k in range(40)]))[0] == 200
    r = await client.get("/api/v1/instances/C.1")
    assert r.status == 200
    await client.close()
    rows = read_db(settings.db, "SELECT instance_id, count(*), count(DISTINCT (source, run_id)) FROM logs GROUP BY ALL ORDER BY 1")
    assert rows == [("C.1", 40, 40), ("C.2", 40, 40)]


async def test_cap_refuses_the_whole_push_even_its_events_and_existing_streams(make_client, settings):
    client = await make_client(max_streams_per_instance=3)
    assert (await push(client, "C.1", ["a", "b"]))[0] == 200
    body = {"streams": [
        {"instance_id": "C.1", "source": "a", "lines": [{"seq": 1, "line": "kept?"}]},
        {"instance_id": "C.1", "source": "c", "lines": [{"seq": 0, "line": "x"}]},
        {"instance_id": "C.1", "source": "d", "lines": [{"seq": 0, "line": "x"}]},
    ]}
    r = await client.post("/api/v1/logs", data=orjson.dumps(body))
    assert r.status == 413, await r.text()
    await client.close()
    assert read_db(settings.db, "SELECT source, seq FROM logs ORDER BY 1, 2") == [("a", 0), ("b", 0)]


async def test_concurrent_pushes_that_each_fit_but_not_together_are_one_refused(make_client, settings):
    client = await make_client(max_streams_per_instance=10, batch_max_delay_s=0.2)  # likely one group commit
    answers = await asyncio.gather(*(push(client, "C.1", [f"{p}{k}" for k in range(6)]) for p in "ab"))
    assert sorted(status for status, _ in answers) == [200, 413], answers
    await client.close()
    assert read_db(settings.db, "SELECT count(*) FROM logs") == [(6,)]


async def test_cap_counts_the_streams_stored_before_a_restart(make_client, settings):
    client = await make_client(max_streams_per_instance=5)
    assert (await push(client, "C.1", [f"s{k}" for k in range(5)]))[0] == 200
    await client.close()
    client = await make_client(max_streams_per_instance=5)
    status, answer = await push(client, "C.1", ["s5"])
    assert status == 413 and "max_streams_per_instance" in answer["error"], answer
    assert (await push(client, "C.1", ["s4"]))[0] == 200


async def test_plain_text_push_of_a_source_beyond_the_cap_is_refused_413(make_client, settings):
    """The old manager's endpoint names any source in a header: one new stream per request, the same cap."""
    client = await make_client(max_streams_per_instance=2)
    for source in ("a", "b", "c"):
        r = await client.post("/api/log-push", data=b"one\ntwo\n", headers={"X-Instance-Id": "C.1", "X-Log-Source": source})
        assert r.status == (413 if source == "c" else 200), await r.text()
    r = await client.post("/api/log-push", data=b"three\n", headers={"X-Instance-Id": "C.1", "X-Log-Source": "a"})
    assert r.status == 200
    await client.close()
    assert read_db(settings.db, "SELECT source, count(*) FROM logs GROUP BY 1 ORDER BY 1") == [("a", 3), ("b", 2)]
