"""GET /api/v1/search: log lines across the fleet, newest first, on the real app and a real DuckDB file."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import orjson
import pytest

from ingest.db import reads as reads_module
from ingest.db import search as search_module

from tests.fleet import OOM_DAEMON_LOG, incident, iso, push_lines, utcnow


@pytest.fixture
async def fleet(make_client):
    client = await make_client(read_token="r" * 20, admin_token="a" * 20, enroll_token="e" * 20)
    admin = {"Authorization": "Bearer " + "a" * 20}
    client.read = {"Authorization": "Bearer " + "r" * 20}

    class Admin:  # tests.fleet's helpers post through this: every push with the admin token
        async def post(self, path, data):
            return await client.post(path, data=data, headers=admin)

    now = utcnow()
    await incident(Admin(), now - dt.timedelta(minutes=5), logs_complete=True)
    await push_lines(Admin(), "C.2", "benchdaemon", ["ERROR cuda: Out Of Memory on device 1", "ok 50% done_x"],
                     at=now - dt.timedelta(minutes=1))
    await push_lines(Admin(), "C.old", "benchdaemon", ["CUDA error: out of memory, two days ago"],
                     at=now - dt.timedelta(days=2))
    return client


async def search(client, expect: int = 200, **params) -> dict:
    r = await client.get("/api/v1/search", params=params, headers=client.read)
    doc = await r.json()
    assert r.status == expect, doc
    return doc


async def test_search_finds_lines_across_instances_newest_first_case_insensitive(fleet):
    doc = await search(fleet, q="out of memory")
    assert [(h["instance_id"], h["source"]) for h in doc["hits"]] == [("C.2", "benchdaemon"), ("C.32733029", "benchdaemon")]
    assert doc["truncated"] is False
    hit = doc["hits"][1]
    assert hit["line"] == OOM_DAEMON_LOG[3] and hit["seq"] == 3 and hit["run_id"] == "0" and hit["ts"].endswith("Z")
    assert set(hit) == {"instance_id", "source", "run_id", "seq", "ts", "line"}


async def test_search_window_defaults_to_24_hours_and_takes_since_and_until(fleet):
    assert "C.old" not in {h["instance_id"] for h in (await search(fleet, q="out of memory"))["hits"]}
    old = await search(fleet, q="out of memory", since="3d")
    assert "C.old" in {h["instance_id"] for h in old["hits"]}
    until = iso(utcnow() - dt.timedelta(days=1))
    assert [h["instance_id"] for h in (await search(fleet, q="memory", since="7d", until=until))["hits"]] == ["C.old"]
    await search(fleet, 400, q="memory", since="yesterday-ish")
    await search(fleet, 400, q="memory", since="1h", until="2h")


async def test_search_substring_is_literal_and_regex_is_opt_in(fleet):
    assert [h["line"] for h in (await search(fleet, q="50%"))["hits"]] == ["ok 50% done_x"]
    assert (await search(fleet, q="o_t of"))["hits"] == []  # _ is not a wildcard
    doc = await search(fleet, q=r"out of memory \(cuda\w+\)", regex="1")
    assert [h["instance_id"] for h in doc["hits"]] == ["C.32733029"]
    bad = await search(fleet, 400, q="(unclosed", regex="1")
    assert bad["ok"] is False and "regular expression" in bad["error"]
    await search(fleet, 400, q="x", regex="yes")
    await search(fleet, 400, q="")


async def test_search_filters_by_source_and_instance_and_caps_limit(fleet):
    doc = await search(fleet, q="error", source="benchout")
    assert {h["source"] for h in doc["hits"]} == {"benchout"} and doc["hits"]
    doc = await search(fleet, q="e", instance="C.2")
    assert {h["instance_id"] for h in doc["hits"]} == {"C.2"}
    one = await search(fleet, q="cuzk", limit="1")
    assert len(one["hits"]) == 1 and one["truncated"] is True
    capped = await search(fleet, q="e", limit="100000")
    assert capped["truncated"] is False and len(capped["hits"]) > 1
    await search(fleet, 400, q="e", limit="0")


async def test_search_needs_a_token_and_the_read_token_suffices(fleet):
    r = await fleet.get("/api/v1/search", params={"q": "memory"})
    assert r.status == 401
    assert (await search(fleet, q="memory"))["hits"]


async def test_search_across_the_window_parts_keeps_newest_first_and_the_limit(fleet):
    now = utcnow()

    class Admin:
        async def post(self, path, data):
            return await fleet.post(path, data=data, headers={"Authorization": "Bearer " + "a" * 20})

    for hours, instance in ((0.5, "C.h0"), (3, "C.h3"), (12, "C.h12"), (20, "C.h20")):
        await push_lines(Admin(), instance, "benchout", ["Xid 79: GPU has fallen off the bus"],
                         at=now - dt.timedelta(hours=hours))
    doc = await search(fleet, q="fallen off the bus")
    assert [h["instance_id"] for h in doc["hits"]] == ["C.h0", "C.h3", "C.h12", "C.h20"] and not doc["truncated"]
    doc = await search(fleet, q="fallen off the bus", limit="2")
    assert [h["instance_id"] for h in doc["hits"]] == ["C.h0", "C.h3"] and doc["truncated"]
    doc = await search(fleet, q="fallen off the bus", limit="3")
    assert [h["instance_id"] for h in doc["hits"]] == ["C.h0", "C.h3", "C.h12"] and doc["truncated"]


async def assert_instances_answer_while_held(fleet, requests, entered: list[int], release: threading.Event) -> None:
    """``requests`` (searches) started at once, the first of them held (``entered`` counts those that
    reached the database, ``release`` lets them go): the instance list still answers, and every search
    is answered 200, or 429 naming search_max_concurrent with when to retry (beyond the search pool)."""
    held = [asyncio.ensure_future(r) for r in requests]
    try:
        deadline = time.monotonic() + 30
        while entered[0] < 2 and time.monotonic() < deadline:  # the first searches hold their threads
            await asyncio.sleep(0.01)
        assert entered[0] >= 2
        async with asyncio.timeout(10):  # generous: unblocked, it answers in milliseconds
            r = await fleet.get("/api/v1/instances", headers=fleet.read)
        assert r.status == 200 and (await r.json())
    finally:
        release.set()
        answers = await asyncio.gather(*held)
    statuses = [r.status for r in answers]
    assert set(statuses) <= {200, 429} and 200 in statuses, statuses
    for r in answers:
        if r.status == 429:
            assert "search_max_concurrent" in (await r.json())["error"] and r.headers["Retry-After"]


async def test_instances_answer_while_slow_searches_hold_their_threads(fleet, monkeypatch):
    """12 searches that do not finish (a search for absent text over a big window, made to block
    here) must not take the threads the page's reads run on: /api/v1/instances answers meanwhile."""
    release, entered, lock = threading.Event(), [0], threading.Lock()
    real = search_module.search

    def slow_search(con, timeout_s, query, **how):
        with lock:
            entered[0] += 1
        release.wait(60)
        return real(con, timeout_s, query, **how)

    monkeypatch.setattr(search_module, "search", slow_search)
    searches = [fleet.get("/api/v1/search", params={"q": "absent text"}, headers=fleet.read) for _ in range(12)]
    await assert_instances_answer_while_held(fleet, searches, entered, release)


async def test_instances_answer_while_slow_filtered_log_reads_hold_their_threads(fleet, monkeypatch):
    """An instance's log read with ``q=`` is a search within it (a substring over all its lines): 12
    that do not finish, with the read token, must not take the page's read threads, as searches do
    not (the same ILIKE-like scan, put at /api/v1/instances 5.7 s median, 0.3 s alone, on a 1 M-line
    instance)."""
    release, entered, lock = threading.Event(), [0], threading.Lock()
    real = reads_module.read_logs

    def slow_read_logs(con, timeout_s, instance_id, **kwargs):
        if kwargs.get("q"):
            with lock:
                entered[0] += 1
            release.wait(60)
        return real(con, timeout_s, instance_id, **kwargs)

    monkeypatch.setattr(reads_module, "read_logs", slow_read_logs)
    reads = [fleet.get("/api/v1/instances/C.2/logs", params={"q": "absent text", **where}, headers=fleet.read)
             for where in [{}, {"source": "benchdaemon"}] * 6]
    await assert_instances_answer_while_held(fleet, reads, entered, release)


async def test_follow_with_q_reads_only_new_lines_on_each_poll(fleet, monkeypatch):
    """``follow=1&q=`` whose first answer matched nothing polled from seq -1 with the substring every
    0.5 s: each follower scanned its whole stream twice a second, on the page's read threads. Its polls
    read only the lines stored since the last poll, and still send only the lines that match."""
    lines = [f"progress {i}" for i in range(2_000)]

    class Admin:
        async def post(self, path, data):
            return await fleet.post(path, data=data, headers={"Authorization": "Bearer " + "a" * 20})

    await push_lines(Admin(), "C.f", "bench", lines, at=utcnow() - dt.timedelta(minutes=1))
    polls: list[dict] = []
    real = reads_module.read_logs

    def recorded(con, timeout_s, instance_id, **kwargs):
        polls.append(kwargs)
        return real(con, timeout_s, instance_id, **kwargs)

    monkeypatch.setattr(reads_module, "read_logs", recorded)
    r = await fleet.get("/api/v1/instances/C.f/logs", params={"source": "bench", "q": "Xid", "follow": "1"},
                        headers=fleet.read)
    assert r.status == 200
    try:
        deadline = time.monotonic() + 30
        while len(polls) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(polls) >= 4
        later = polls[1:]  # the first is the answer asked for
        assert all(p["after_seq"] is not None and p["after_seq"] >= 1_999 for p in later), later
        await push_lines(Admin(), "C.f", "bench", ["ok", "NVRM: Xid 79 fallen off the bus", "ok again"],
                         at=utcnow(), start=2_000)
        async with asyncio.timeout(30):
            got = orjson.loads(await r.content.readline())
        assert got["seq"] == 2_001 and "Xid 79" in got["line"]
    finally:
        r.close()


@pytest.mark.parametrize("since", ["99999999w", "9" * 400 + "w"])
async def test_a_duration_back_past_year_one_searches_everything_instead_of_a_500(fleet, since):
    """``since=99999999w`` (read token) reached below BIGINT and DuckDB's make_timestamp(HUGEINT) had
    no overload: 500; 400 nines overflowed the float. Further back than 0001-01-01 is all of it."""
    doc = await search(fleet, q="out of memory", since=since)
    assert {h["instance_id"] for h in doc["hits"]} >= {"C.2", "C.old"}
