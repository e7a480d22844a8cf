"""The token filter's open block lives in the writer's memory: its row is written once, when it closes.

Writing the open block's row at every commit (an UPDATE of ~17,000 bits) was a statement of every group
commit; now a commit that closes no block writes nothing to log_blocks. What must hold anyway: a search finds
every line stored before it began, whether its block is closed (log_blocks), open (the writer's view, or,
for a caller without one, rebuilt from the rows stamped after the newest stored block), or left open by a
writer that died (rebuilt when the next one starts); and the commit stamps never step back, since the rows
after the newest stored block are found by them.
"""

from __future__ import annotations

import datetime as dt

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.contract.codec import MetricRows
from ingest.db import search, store, searchtokens as tokens
from ingest.errors import StoreError
from tests.test_search_filter import ALPHABET, T0, commit


class Statements:
    """A connection that records the statements run on ``log_blocks``."""

    def __init__(self, con) -> None:
        self.con, self.seen = con, []

    def execute(self, sql, params=None):
        if "log_blocks" in sql:
            self.seen.append(sql.split()[0])
        return self.con.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self.con, name)


def run(con, text: str, blocks=None, limit: int = 1000, use_filter: bool = True):
    """Search the whole window; ``blocks``: the writer whose open block the search asks (None: rebuilt from the rows)."""
    view = {} if blocks is None else {"open_block": blocks.open_block, "runs_written": blocks.runs_written}
    return search.search(con, 30.0, search.SearchQuery(text=text, regex=False, since_us=T0 - 10**9, until_us=T0 + 10**9,
                                                       limit=limit), use_filter, **view)


def test_a_commit_that_closes_no_block_writes_nothing_to_log_blocks(tmp_path):
    con = store.open_database(tmp_path / "f.duckdb")
    counted = Statements(con)
    blocks = tokens.BlockWriter(block_lines=100)
    commit(counted, blocks, [("C.1", i, T0 + i, f"INFO step {i}") for i in range(10)])
    counted.seen.clear()
    for c in range(1, 9):  # 90 lines in all: the block stays open
        commit(counted, blocks, [("C.1", i, T0 + i, f"INFO step {i}") for i in range(c * 10, c * 10 + 10)], received_us=T0 + c)
    assert counted.seen == []
    commit(counted, blocks, [("C.1", i, T0 + i, f"INFO step {i}") for i in range(90, 130)], received_us=T0 + 9)
    assert counted.seen == ["INSERT"]  # the block that closed, once
    assert con.execute("SELECT block, lines FROM log_blocks").fetchall() == [(1, 100)]
    con.close()


def test_the_open_block_is_found_with_the_view_and_without_it(tmp_path):
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=100)
    commit(con, blocks, [("C.1", 0, T0, "ERROR CUDA error: out of memory"), ("C.1", 1, T0 + 1, "INFO partition done")])
    assert con.execute("SELECT count(*) FROM log_blocks").fetchone() == (0,)
    for view in (blocks, None):
        hits, _, plan = run(con, "out of memory", view)
        assert [h["line"] for h in hits] == ["ERROR CUDA error: out of memory"]
        assert (plan.blocks, plan.blocks_admitted) == (1, 1)
        hits, _, plan = run(con, "nowhere at all", view)
        assert hits == [] and (plan.blocks, plan.blocks_admitted, plan.ranges_scanned) == (1, 0, 0)
    con.close()


def test_a_writer_that_died_leaves_its_open_block_to_the_next(tmp_path):
    """The rows of the block a killed writer held open are in no stored block: the next writer rebuilds the
    block from them (their trigrams) and goes on filling it."""
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=100)
    commit(con, blocks, [("C.1", i, T0 + i, f"INFO partition {i}") for i in range(100)])  # closed
    commit(con, blocks, [("C.1", 100, T0 + 100, "ERROR xid 79: fallen off the bus"), ("C.1", 101, T0 + 101, "INFO ok")],
           received_us=T0 + 1)  # open, then the writer is gone
    con.close()
    con = store.open_database(tmp_path / "f.duckdb")
    again = tokens.BlockWriter(block_lines=100)
    commit(con, again, [("C.2", 0, T0 + 200, "WARN throttled: thermal slowdown")], received_us=T0 + 2)
    for view in (again, None):
        for text, line in (("fallen off the bus", "ERROR xid 79: fallen off the bus"), ("thermal slowdown", "WARN throttled: thermal slowdown")):
            hits, _, plan = run(con, text, view)
            assert [h["line"] for h in hits] == [line] and plan.blocks_admitted == 1, (text, view)
    assert again.open_block().block == 2 and again.open_block().lines == 3
    assert tokens.trigrams(b"fallen off the bus thermal slowdown") <= again.open_block().grams
    con.close()


def test_a_block_rebuilt_from_unrepeated_words_keeps_a_bounded_cache(tmp_path, monkeypatch):
    """The block a dead writer left is rebuilt with every trigram of its lines, and a run cache no larger than
    the one ``add`` keeps (RUN_CACHE_MAX runs): base64-like lines bring runs seen once."""
    import base64
    import random
    monkeypatch.setattr(tokens, "RUN_CACHE_MAX", 500)
    rng = random.Random(7)
    lines = [base64.b64encode(rng.randbytes(600)).decode() for _ in range(60)]
    con = store.open_database(tmp_path / "f.duckdb")
    commit(con, tokens.BlockWriter(block_lines=1000), [("C.1", i, T0 + i, line) for i, line in enumerate(lines)])
    again = tokens.BlockWriter(block_lines=1000)
    again.load(con)
    rebuilt = again.open_block()
    assert rebuilt.lines == 60 and set().union(*(tokens.trigrams(line.encode()) for line in lines)) <= rebuilt.grams
    assert len(tokens.letter_runs("".join(lines).encode())) > 2_000
    assert len(rebuilt.runs) <= tokens.RUN_CACHE_MAX
    con.close()


def test_a_writer_that_died_over_blocks_from_before_their_received_ranges(tmp_path):
    """Blocks written before migration 020 have no received_at range: the first commit of a writer on such a
    database writes a block of no lines at the newest stamp, so the block it leaves open is found as after
    any other."""
    con = store.open_database(tmp_path / "f.duckdb")
    con.execute("DELETE FROM schema_migrations WHERE version IN (14, 20)")
    con.execute("DROP TABLE log_blocks")
    con.execute("INSERT INTO logs VALUES ('C.1', 's', '0', 0, make_timestamp(?), make_timestamp(?), 'old oom line', false)", [T0, T0])
    store.migrate(con)  # 014: the old rows in a catch-all block; 020: no received_at range for it
    assert con.execute("SELECT count(*), count(max_received_at) FROM log_blocks").fetchone() == (1, 0)
    blocks = tokens.BlockWriter(block_lines=100)
    commit(con, blocks, [("C.1", 1, T0 + 1, "ERROR xid 79: fallen off the bus")], received_us=T0 + 10)
    con.close()
    con = store.open_database(tmp_path / "f.duckdb")
    again = tokens.BlockWriter(block_lines=100)
    commit(con, again, [("C.1", 2, T0 + 2, "WARN thermal slowdown")], received_us=T0 + 20)
    for view in (again, None):
        for text, line in (("oom line", "old oom line"), ("fallen off", "ERROR xid 79: fallen off the bus"),
                           ("thermal", "WARN thermal slowdown")):
            assert [h["line"] for h in run(con, text, view)[0]] == [line], (text, view)
    con.close()


def test_a_rolled_back_commit_leaves_the_open_block_as_it_was(tmp_path):
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=10)
    commit(con, blocks, [("C.1", i, T0 + i, f"INFO kept {i}") for i in range(6)])
    logs = store.LogColumns.empty()
    logs.add("C.9", "s", "0", list(range(8)), [T0 + 50] * 8, ["rolled back xylophone"] * 8, [False] * 8)
    try:  # 8 more lines would close the block: its row is written, and rolled back with the rows
        store.write_batch(con, logs, [], MetricRows(), {}, T0 + 1, actions=[lambda c: 1 / 0], blocks=blocks)
    except StoreError:
        blocks.rolled_back()
    view = blocks.open_block()
    assert (view.block, view.lines, view.min_us, view.max_us) == (1, 6, T0, T0 + 5)
    assert con.execute("SELECT count(*) FROM log_blocks").fetchone() == (0,)
    commit(con, blocks, [("C.1", i, T0 + i, f"INFO kept {i}") for i in range(6, 12)], received_us=T0 + 2)
    assert con.execute("SELECT block, lines FROM log_blocks").fetchall() == [(1, 10)]
    assert blocks.open_block().lines == 2
    assert [h["seq"] for h in run(con, "kept", blocks)[0]] == list(range(11, -1, -1))
    con.close()


def test_commit_stamps_never_step_back_even_across_a_restart(tmp_path):
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=4)
    commit(con, blocks, [("C.1", i, T0 + i, "a line") for i in range(6)], received_us=T0 + 1000)  # 2 blocks: +0, +1
    assert blocks.stamp(T0) == T0 + 1002  # the clock stepped back: the next stamp follows the last one
    commit(con, blocks, [("C.1", 6, T0 + 6, "a line")], received_us=T0)
    con.close()
    con = store.open_database(tmp_path / "f.duckdb")
    stamps = [us for (us,) in con.execute("SELECT epoch_us(received_at) FROM logs ORDER BY seq").fetchall()]
    assert stamps == [T0 + 1000] * 4 + [T0 + 1001] * 2 + [T0 + 1002]
    again = tokens.BlockWriter(block_lines=4)
    again.load(con)
    assert again.stamp(T0 + 5) == T0 + 1003
    con.close()


LINES = st.lists(st.text(ALPHABET, min_size=0, max_size=20), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, block_lines=st.integers(1, 9), fail=st.sets(st.integers(0, 9), max_size=3),
       restart=st.integers(0, 9), stamps=st.lists(st.integers(-3, 3), min_size=10, max_size=10),
       q=st.text(ALPHABET, min_size=3, max_size=6), limit=st.integers(1, 30), run_blocks=st.integers(1, 3))
def test_every_stored_line_is_found_whatever_its_block(tmp_path_factory, monkeypatch, lines, block_lines, fail, restart, stamps, q,
                                                       limit, run_blocks):
    """Commits of 4 lines, some rolled back, one writer replaced mid-way (as after a SIGKILL), the clock stepping
    back and forth, runs of 1 to 3 blocks (migration 025): the filtered search, with the writer's view and without
    it, returns exactly the scan's hits."""
    monkeypatch.setattr(tokens, "RUN_BLOCKS", run_blocks)
    con = store.open_database(tmp_path_factory.mktemp("db") / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=block_lines)
    rows = [("C.%d" % (i % 3), i, T0 + i * 1000, line) for i, line in enumerate(lines)]
    for n, start in enumerate(range(0, len(rows), 4)):
        if n == restart:
            blocks = tokens.BlockWriter(block_lines=block_lines)
        if n in fail:
            logs = store.LogColumns.empty()
            logs.add("C.9", "s", "0", [n], [T0], [q], [False])
            try:
                store.write_batch(con, logs, [], MetricRows(), {}, T0 + stamps[n], actions=[lambda c: 1 / 0], blocks=blocks)
            except StoreError:
                blocks.rolled_back()
        commit(con, blocks, rows[start:start + 4], received_us=T0 + 1000 * n + stamps[n] * 1500)
    plain = run(con, q, None, limit, use_filter=False)
    for view in (blocks, None):
        assert run(con, q, view, limit)[:2] == plain[:2], (q, view)
    con.close()


async def test_a_server_killed_mid_block_finds_the_blocks_lines_after_its_restart(server_process):
    """SIGKILL while the open block holds acknowledged lines: after the restart a search finds them, and the
    lines pushed after it."""
    server = server_process().start()
    at = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)).timestamp()

    async def push(session, seq0: int, lines: list[str]) -> None:
        doc = {"instance_id": "C.32733029", "source": "benchdaemon",
               "lines": [{"seq": seq0 + i, "ts": at + (seq0 + i) / 1000, "line": line} for i, line in enumerate(lines)]}
        async with session.post(server.url + "/api/v1/logs", data=orjson.dumps(doc)) as r:
            assert r.status == 200, await r.text()

    async def search_for(session, q: str) -> list[str]:
        async with session.get(server.url + "/api/v1/search", params={"q": q}) as r:
            assert r.status == 200, await r.text()
            return [h["line"] for h in (await r.json())["hits"]]

    async with aiohttp.ClientSession() as session:
        await push(session, 0, [f"INFO partition {i} done" for i in range(50)])
        await push(session, 50, ["ERROR cuzk: CUDA error: out of memory (cudaErrorMemoryAllocation)"])
        assert await search_for(session, "out of memory") == ["ERROR cuzk: CUDA error: out of memory (cudaErrorMemoryAllocation)"]
    server.kill()
    server.start()
    async with aiohttp.ClientSession() as session:
        assert await search_for(session, "out of memory") == ["ERROR cuzk: CUDA error: out of memory (cudaErrorMemoryAllocation)"]
        await push(session, 51, ["WARN nvml: thermal slowdown"])
        assert await search_for(session, "thermal slowdown") == ["WARN nvml: thermal slowdown"]
        assert len(await search_for(session, "partition")) == 50
