"""The search's token filter (ingest/db/searchtokens.py): it prunes only blocks that cannot match, and a rare
word's search reads only the blocks that hold it."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.db import search, store, searchtokens as tokens
from ingest.contract.codec import MetricRows

from tests.fleet import push_lines, utcnow

T0 = 1_800_000_000_000_000


def commit(con, blocks, rows: list[tuple[str, int, int, str]]) -> None:
    """One group commit through store.write_batch: rows of (instance, seq, ts_us, line)."""
    logs = store.LogColumns.empty()
    for instance, seq, ts_us, line in rows:
        logs.append(store.log_chunk_batch(instance, "s", "0", [seq], [ts_us], [line], [False]))
    store.write_batch(con, logs, [], MetricRows(), {}, T0, blocks=blocks)
    blocks.committed()


@pytest.fixture
def db(tmp_path):
    con = store.open_database(tmp_path / "f.duckdb")
    yield con
    con.close()


def run(con, text: str, limit: int = 1000, use_filter: bool = True, since_us: int = T0 - 10**9, until_us: int = T0 + 10**9):
    return search.search(con, 30.0, search.SearchQuery(text=text, regex=False, since_us=since_us, until_us=until_us,
                                                       limit=limit), use_filter)


def test_rare_word_search_reads_only_the_blocks_that_hold_it(db):
    blocks = tokens.BlockWriter(block_lines=100)
    seq = 0
    for c in range(20):  # 20 blocks of 100 lines, one second apart; block 13 holds the rare phrase
        rows = []
        for i in range(100):
            line = f"INFO partition {i} of proof {c} done" if (c, i) != (13, 42) else "ERROR CUDA error: out of memory"
            rows.append(("C.1", seq, T0 + c * 1_000_000 + i, line))
            seq += 1
        commit(db, blocks, rows)
    hits, truncated, plan = run(db, "Out Of Memory")
    assert [h["line"] for h in hits] == ["ERROR CUDA error: out of memory"] and not truncated
    assert (plan.filter, plan.blocks, plan.blocks_admitted, plan.ranges_scanned) == ("trigrams", 20, 1, 1)
    hits, _, plan = run(db, "text found nowhere")
    assert hits == [] and (plan.blocks_admitted, plan.ranges_scanned) == (0, 0)
    hits, truncated, plan = run(db, "partition", limit=5)  # in every block: the newest one answers
    assert len(hits) == 5 and truncated and hits[0]["seq"] == 1999 and plan.ranges_scanned == 1
    _, _, plan = run(db, "of")  # no trigram: the whole window, and the plan says so
    assert plan.filter == "no trigram in q"


def test_rows_before_the_migration_stay_searchable(tmp_path):
    path = tmp_path / "old.duckdb"
    con = store.open_database(path)
    con.execute("DELETE FROM log_blocks")
    con.execute("DELETE FROM schema_migrations WHERE version = 14")
    con.execute("DROP TABLE log_blocks")
    con.execute("INSERT INTO logs VALUES ('C.1', 's', '0', 0, make_timestamp(?), make_timestamp(?), 'old oom line', false)", [T0, T0])
    store.migrate(con)  # 014 puts them in a catch-all block
    hits, _, plan = run(con, "oom line")
    assert [h["line"] for h in hits] == ["old oom line"] and plan.blocks_admitted == 1
    con.close()


# Letters that fold (K, KELVIN SIGN, I, DOTTED CAPITAL I, dotless i, long s), separators, wildcards.
ALPHABET = st.sampled_from(list("abkKIiouOMmy \u212a\u0130\u0131\u017f\u00e9_%\\.:0-"))
LINES = st.lists(st.text(ALPHABET, min_size=0, max_size=24), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, picks=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 24), st.integers(1, 12), st.booleans()),
                                   min_size=1, max_size=6),
       extra=st.text(ALPHABET, min_size=1, max_size=8), block_lines=st.integers(1, 7), shuffle=st.randoms(use_true_random=False),
       limit=st.integers(1, 50))
def test_filtered_search_returns_exactly_the_hits_of_a_scan(db, lines, picks, extra, block_lines, shuffle, limit):
    db.execute("DELETE FROM logs")
    db.execute("DELETE FROM log_blocks")
    blocks = tokens.BlockWriter(block_lines=block_lines)
    rows = [("C.%d" % (i % 3), i, T0 + shuffle.randrange(0, 30) * 1000, line) for i, line in enumerate(lines)]  # ts out of order, ties
    for start in range(0, len(rows), 5):
        commit(db, blocks, rows[start:start + 5])
    queries = [extra]
    for n, at, size, swap in picks:
        line = lines[n % len(lines)]
        q = line[at % (len(line) or 1):][:size] or extra
        queries.append(q.swapcase() if swap else q)
    for q in queries:
        for window in ((T0 - 10**9, T0 + 10**9), (T0 + 5000, T0 + 20000)):
            filtered = run(db, q, limit, True, *window)
            plain = run(db, q, limit, False, *window)
            assert filtered[:2] == plain[:2], (q, filtered[2])


async def test_search_answer_says_how_the_filter_was_used(make_client):
    client = await make_client(read_token="r" * 20, admin_token="a" * 20)
    admin = {"Authorization": "Bearer " + "a" * 20}

    class Admin:
        async def post(self, path, data):
            return await client.post(path, data=data, headers=admin)

    await push_lines(Admin(), "C.1", "benchdaemon", ["ERROR cuda: out of memory", "ok"], at=utcnow() - dt.timedelta(minutes=1))
    read = {"Authorization": "Bearer " + "r" * 20}
    for params, expect in (({"q": "out of memory"}, ("trigrams", 1)), ({"q": "no such words"}, ("trigrams", 0)),
                           ({"q": "ok"}, ("no trigram in q", 1)), ({"q": "memo.y", "regex": "1"}, ("regex", 1))):
        doc = await (await client.get("/api/v1/search", params=params, headers=read)).json()
        assert (doc["scanned"]["filter"], len(doc["hits"])) == expect, (params, doc)
        if expect[0] == "trigrams":
            assert doc["scanned"]["blocks"] == 1
