"""Failure patterns (issue 25): each failure's deciding line as a template (migration 017's
line_template), who shares it (pattern_spread, queries/patterns.sql), and where a failed run parts
from the latest healthy run of its GPU model (run_baselines, queries/run_diff.sql).

On the real app and a real DuckDB file; the masking is property-tested on a real DuckDB too. The
same through the real agent and the real server: tests/agent_tests/test_agent_patterns.py."""

from __future__ import annotations

import datetime as dt
import io
import string
import uuid

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import oncall
from ingest.db import sqlfiles as queryfiles, store
from tests.conftest import REPO
from tests.fleet import bench_instance, post, push_lines, rows, run_policies, utcnow
from tests.lake_pg import postgres  # noqa: F401 (a fixture)
from tests.test_lake import lake_client  # noqa: F401 (a fixture)

QUERIES = REPO / "queries"


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    """A database migrated by the store, as a server's (the macro is the migration's)."""
    path = tmp_path_factory.mktemp("patterns") / "t.duckdb"
    c = duckdb.connect(str(path))
    store.migrate(c)
    yield c
    c.close()


def named(client, name: str, **params) -> list[tuple]:
    """A canned query of queries/, composed as the server serves it, with its $named parameters."""
    from ingest.web.keys import DB

    cur = client.app[DB].cursor()
    try:
        return cur.execute(queryfiles.compose(QUERIES / f"{name}.sql", QUERIES), params).fetchall()
    finally:
        cur.close()


def template(con, line: str) -> str:
    return con.execute("SELECT line_template(?)", [line]).fetchone()[0]


# ---- the masking


@pytest.mark.parametrize("line, expected", [
    ("2026-11-29T11:30:58Z ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating 3.2 GiB for NTT",
     "<ts> ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating <size> for NTT"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.55 GiB",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <size>. GPU <num> has a total capacity of <size>"),
    ("NVRM: Xid (PCI:0000:41:00): 79, pid=4242, GPU has fallen off the bus.",
     "NVRM: Xid (PCI:<num>:<num>:<num>): <num>, pid=<num>, GPU has fallen off the bus."),
    ("rpc error: code = Unavailable desc = connection refused (127.0.0.1:9820)",
     "rpc error: code = Unavailable desc = connection refused (<ip>)"),
    ("job 6f1c2a3b-1234-4abc-9def-0123456789ab on C.32733029 ptr 0x7f3a2c00 sha deadbeefcafe1234",
     "job <uuid> on C.<num> ptr <hex> sha <hex>"),
    ("[benchmark] starting cuzk-daemon (log: /tmp/cuzk-bench-daemon.log)", "[benchmark] starting cuzk-daemon (log: <path>)"),
    ("loading SRS for 32GiB sectors from /var/tmp/filecoin-proof-parameters", "loading SRS for <size> sectors from <path>"),
    ("proof 3/12 done in 81.6 s on RTX A4000 sm_90 GPU0", "proof <num>/<num> done in <num> s on RTX A4000 sm_90 GPU0"),
])
def test_line_template_masks_what_varies_and_keeps_the_words(con, line, expected):
    assert template(con, line) == expected


WORD = st.text(string.ascii_lowercase, min_size=3, max_size=12).filter(lambda w: w not in ("byte", "bytes"))
NUMBER = st.one_of(st.integers(0, 10**12).map(str), st.floats(0, 1e6, allow_nan=False).map(lambda f: f"{f:.2f}"))
SIZE = st.tuples(NUMBER, st.sampled_from(["", " "]), st.sampled_from(["B", "KiB", "MiB", "GiB", "TiB", "MB", "GB", "bytes"])).map(
    lambda t: t[0] + (t[1] if t[2] != "B" else "") + t[2])
HEX = st.one_of(st.integers(0, 2**64).map(hex),
                st.integers(2**32, 2**128).map(lambda n: f"{n:x}").filter(lambda s: any(c.isdigit() for c in s) and not s.isdigit() and len(s) >= 8))  # all digits: a number
UUID = st.uuids().map(str)
PATH = st.lists(st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=10), min_size=1, max_size=5).map(
    lambda parts: "/" + "/".join(parts))
TOKENS = st.one_of(WORD.map(lambda w: (w, w)), NUMBER.map(lambda n: (n, "<num>")), SIZE.map(lambda s: (s, "<size>")),
                   HEX.map(lambda h: (h, "<hex>")), UUID.map(lambda u: (u, "<uuid>")), PATH.map(lambda p: (p, "<path>")))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(TOKENS, min_size=1, max_size=12))
def test_line_template_masks_numbers_hex_uuids_paths_and_sizes_and_keeps_every_word(con, tokens):
    line = " ".join(t for t, _ in tokens)
    assert template(con, line) == " ".join(m for _, m in tokens), line


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(TOKENS, min_size=1, max_size=8), st.lists(TOKENS, min_size=1, max_size=8))
def test_two_lines_that_differ_only_in_what_is_masked_share_a_template(con, a, b):
    shape = [m for _, m in a]
    twin = [(t2, m) if m == m2 and m != t2 else (t, m) for (t, m), (t2, m2) in zip(a, b + a)]
    assert [m for _, m in twin] == shape
    assert template(con, " ".join(t for t, _ in a)) == template(con, " ".join(t for t, _ in twin))


# ---- the views on the real app


OOMS = [  # the same failure, three sizes, three request ids, three pointers
    ("C.p1", 55891, "RTX PRO 4000", "575.57.08", "v1.4.0", "3.2 GiB", "0x7f3a2c00"),
    ("C.p2", 55892, "RTX 4090", "570.124.06", "v1.4.0", "21.4 GiB", "0x7f00aa10"),
    ("C.p3", 41003, "RTX A4000", "575.57.08", "v1.3.2", "512 MiB", "0x55d1e000"),
]


def oom_line(size: str, ptr: str) -> str:
    return (f"ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating {size} for NTT "
            f"(request {uuid.uuid5(uuid.NAMESPACE_OID, ptr)}, buffer {ptr})")


HEALTHY_DAEMON = [
    "INFO cuzk_daemon: listening on 127.0.0.1:9820, 1 GPU (RTX PRO 4000)",
    "INFO cuzk_daemon::pce: warm-up proof: PCE extraction started (partition-workers 16)",
    "INFO cuzk_daemon::pce: PCE extraction done in 212 s",
    "INFO cuzk_daemon::prover: PoRep C2 proof 1/12: 10 partitions done in 81.6 s",
]


async def oom_fleet(client, done: dt.datetime) -> None:
    for instance_id, machine, gpu, driver, image, size, ptr in OOMS:
        await bench_instance(client, instance_id, machine, done=done, exit_code=1, rate=0.0, gpu_model=gpu)
        await post(client, "/api/v1/events", {"instance_id": instance_id, "kind": "registered", "ts": "2026-01-01T00:00:00Z",
                                               "machine_id": machine, "gpu_model": gpu, "driver": driver,
                                               "labels": {"image_version": image}})
        await push_lines(client, instance_id, "benchdaemon", HEALTHY_DAEMON[:2] + [oom_line(size, ptr)],
                         at=done - dt.timedelta(minutes=5))
    # a healthy run of the first one's GPU model, an hour earlier, on another machine
    await bench_instance(client, "C.ok", 55893, done=done - dt.timedelta(hours=1), exit_code=0, rate=40.0, gpu_model="RTX PRO 4000")
    await push_lines(client, "C.ok", "benchdaemon", HEALTHY_DAEMON, at=done - dt.timedelta(hours=1, minutes=5))


async def test_three_oom_lines_with_different_sizes_and_ids_are_one_pattern_across_three_machines(client):
    await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
    await run_policies(client)
    classes = rows(client, "SELECT failure_class, count(*) FROM bench_runs WHERE exit_code = 1 GROUP BY 1")
    assert classes == [("oom", 3)]
    spread = rows(client, "SELECT pattern, failures, machines, machine_ids, gpu_models, drivers, images, failure_classes "
                          "FROM pattern_spread")
    assert spread == [(
        "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating <size> for NTT "
        "(request <uuid>, buffer <hex>)",
        3, 3, [41003, 55891, 55892], ["RTX 4090", "RTX A4000", "RTX PRO 4000"], ["570.124.06", "575.57.08"],
        ["v1.3.2", "v1.4.0"], ["oom"],
    )]
    [(pattern_id,)] = rows(client, "SELECT pattern_id FROM pattern_spread")
    listed = named(client, "pattern_failures", pattern_id=pattern_id)
    assert sorted(r[1] for r in listed) == ["C.p1", "C.p2", "C.p3"]


async def test_the_patterns_query_puts_the_pattern_on_most_machines_first(client):
    await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
    await bench_instance(client, "C.net", 777, done=utcnow(), exit_code=1, rate=0.0)
    await push_lines(client, "C.net", "benchout", ["rpc error: connection refused (127.0.0.1:9820)"], at=utcnow())
    await run_policies(client)
    found = named(client, "patterns")
    assert [(r[2], r[4]) for r in found] == [(3, 3), (1, 1)]
    assert found[1][1] == "rpc error: connection refused (<ip>)"


async def test_run_diff_gives_the_first_lines_where_a_failed_run_parts_from_a_healthy_one_of_its_model(client):
    await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
    await run_policies(client)
    found = named(client, "run_diff", instance_id="C.p1")
    columns = ["instance_id", "gpu_model", "machine_id", "healthy_instance_id", "healthy_machine_id", "healthy_done_at",
               "source", "parted_at", "failed_lines", "healthy_lines", "line_no", "failed_line", "healthy_line"]
    found = [dict(zip(columns, r)) for r in found]
    assert {r["healthy_instance_id"] for r in found} == {"C.ok"}
    # lines 1 and 2 alike (the listening line's address and the partition count are masked); they part at 3
    assert [(r["source"], r["line_no"]) for r in found] == [("benchdaemon", 3), ("benchdaemon", 4)]
    first = found[0]
    assert first["parted_at"] == 3 and first["failed_lines"] == 3 and first["healthy_lines"] == 4
    assert "out of memory" in first["failed_line"] and first["healthy_line"] == HEALTHY_DAEMON[2]
    assert found[1]["failed_line"] is None and found[1]["healthy_line"] == HEALTHY_DAEMON[3]


async def test_run_diff_without_a_healthy_run_of_the_model_says_so_in_one_row(client):
    await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
    await run_policies(client)
    [row] = named(client, "run_diff", instance_id="C.p2")  # no RTX 4090 passed
    assert row[0] == "C.p2" and row[3] is None and row[6] is None
    assert named(client, "run_diff", instance_id="C.ok") == []  # not a failed run: nothing to compare


async def test_why_diff_and_patterns_print_through_the_http_api(client):
    """The CLI's commands (synchronous, in a thread) against the app's HTTP API on loopback; the same
    through `fleetlog` and a real server: tests/agent_tests/test_agent_patterns.py."""
    import asyncio

    from ingest.client import Client

    await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
    await run_policies(client)
    api = Client(str(client.make_url("/")).rstrip("/"), None)
    out = io.StringIO()
    assert await asyncio.to_thread(oncall.patterns, api, {"pattern": None, "format": "table"}, out) == 0
    text = out.getvalue()
    assert "allocating <size> for NTT" in text and "41003 55891 55892" in text, text
    out = io.StringIO()
    assert await asyncio.to_thread(oncall.why, api, {"instance": "C.p1", "format": "table", "diff": True}, out) == 0
    text = out.getvalue()
    assert "compared with C.ok" in text and "benchdaemon: alike for 2 lines, parted at line 3" in text, text
    assert "- healthy  INFO cuzk_daemon::pce: PCE extraction done in 212 s" in text, text


@pytest.mark.lake
async def test_lake_groups_patterns_and_diffs_as_the_single_file_does(make_client, lake_client):
    """The macro and the views are re-created in the lake's in-memory DuckDB (ingest/db/lake/storage.py), the same SQL."""

    async def answers(client):
        await oom_fleet(client, utcnow() - dt.timedelta(seconds=30))
        await run_policies(client)
        spread = [(r[0], r[1], r[2], r[4], r[6], r[7], r[8], r[9]) for r in named(client, "patterns")]
        diff = [(r[3], r[6], r[7], r[10], r[11], r[12]) for r in named(client, "run_diff", instance_id="C.p1")]
        return spread, diff

    single = await answers(await make_client(policy_interval_s=0))
    assert single[0][0][3] == 3 and single[1], single
    assert await answers(lake_client) == single
