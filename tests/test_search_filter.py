"""The search's token filter (ingest/db/searchtokens.py): it prunes only blocks that cannot match, and a rare
word's search reads only the blocks that hold it."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.db import search, searchplan as plans, store, searchtokens as tokens
from ingest.contract.codec import MetricRows

from tests.fleet import push_lines, utcnow

T0 = 1_800_000_000_000_000


def commit(con, blocks, rows: list[tuple[str, int, int, str]], received_us: int = T0) -> None:
    """One group commit through store.write_batch: rows of (instance, seq, ts_us, line), stamped ``received_us``."""
    logs = store.LogColumns.empty()
    streams: dict[str, list[tuple[int, int, str]]] = {}
    for instance, seq, ts_us, line in rows:  # one batch per stream and run of rows, as the writer's requests
        if streams and instance not in streams:
            for name, part in streams.items():
                logs.add(name, "s", "0", *map(list, zip(*part)), [False] * len(part))
            streams = {}
        streams.setdefault(instance, []).append((seq, ts_us, line))
    for name, part in streams.items():
        logs.add(name, "s", "0", *map(list, zip(*part)), [False] * len(part))
    store.write_batch(con, logs, [], MetricRows(), {}, received_us, blocks=blocks)
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
    hits, truncated, plan = run(db, "partition", limit=5)  # in every block: the newest answer, in one statement
    assert len(hits) == 5 and truncated and hits[0]["seq"] == 1999
    assert plan.ranges_scanned == -(-search.FIRST_LINES // 100) < 20  # the blocks of the first FIRST_LINES lines
    _, _, plan = run(db, "of")  # no trigram: the whole window, and the plan says so
    assert plan.filter == "no trigram in q"


class Profiled:
    """A connection whose every query on ``logs`` adds DuckDB's own count of the rows its scans read
    (the row groups its zone maps did not prune) to ``rows_scanned``."""

    def __init__(self, con, path) -> None:
        self.con, self.path, self.rows_scanned, self._sql = con, str(path), 0, ""
        con.execute("PRAGMA enable_profiling = 'json'")
        con.execute(f"PRAGMA profiling_output = '{self.path}'")
        con.execute("""PRAGMA custom_profiling_settings = '{"CUMULATIVE_ROWS_SCANNED": "true"}'""")

    def execute(self, sql, params=None):
        self._sql = sql
        self.con.execute(sql, params)
        return self

    def fetchall(self):
        rows = self.con.fetchall()
        if "FROM logs" in self._sql:
            with open(self.path) as f:
                self.rows_scanned += json.load(f)["cumulative_rows_scanned"]
        return rows

    def fetchone(self):
        return self.con.fetchone()

    def to_arrow_table(self):
        return self.con.to_arrow_table()

    def interrupt(self):
        self.con.interrupt()


def test_rare_phrase_search_scans_the_rows_of_its_blocks_not_their_time_span(tmp_path):
    # Streams interleave and one agent's clock is far behind: every block's ts range spans the whole
    # table, so the ts ranges of the admitted blocks prune nothing. The commit stamps (received_at) do.
    db = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter()
    commits, per_commit, rare_at = 100, 5000, 90
    for c in range(commits):
        rows = [("C.lag", c, T0, "INFO heartbeat from a lagging clock")]
        rows += [("C.%d" % (i // 100), c * per_commit + i, T0 + c * 1_000_000 + i, f"INFO partition {i} of proof {c} done")
                 for i in range(1, per_commit)]
        if c == rare_at:
            rows[2500] = ("C.7", 0, T0 + c * 1_000_000 + 2500, "ERROR CUDA error: out of memory")
        commit(db, blocks, rows, received_us=T0 + c * 1000)
    db.close()
    db = duckdb.connect(str(tmp_path / "f.duckdb"))  # store.open_database locks the configuration: no profiling
    total, = db.execute("SELECT count(*) FROM logs").fetchone()
    assert total == commits * per_commit
    profiled = Profiled(db, tmp_path / "profile.json")
    hits, _, plan = search.search(profiled, 30.0, search.SearchQuery(text="out of memory", regex=False, since_us=T0 - 10**9,
                                                                    until_us=T0 + 10**9), open_block=blocks.open_block)
    assert [h["line"] for h in hits] == ["ERROR CUDA error: out of memory"] and plan.blocks_admitted == 1
    # The admitted block's <= 8,192 rows lie in at most two of DuckDB's row groups (122,880 rows each).
    assert 0 < profiled.rows_scanned <= 2 * 122_880 < total, (profiled.rows_scanned, total)
    db.close()


def test_rows_before_the_migration_stay_searchable(tmp_path):
    path = tmp_path / "old.duckdb"
    con = store.open_database(path)
    con.execute("DELETE FROM log_blocks")
    con.execute("DELETE FROM schema_migrations WHERE version IN (14, 20)")
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
       limit=st.integers(1, 50), run_blocks=st.integers(1, 3), page=st.sampled_from([1, 2, 512]))
@pytest.mark.parametrize("windows", [False, True])
@pytest.mark.parametrize("step", [1000, 1])  # 1 us: a commit's blocks, stamped apart, overlap the next commits' stamps
def test_filtered_search_returns_exactly_the_hits_of_a_scan(db, monkeypatch, windows, step, lines, picks, extra, block_lines,
                                                             shuffle, limit, run_blocks, page):
    monkeypatch.setattr(tokens, "RUN_BLOCKS", run_blocks)  # closed runs (migration 025) of 1 to 3 blocks
    monkeypatch.setattr(plans, "RUN_LOAD_BLOCKS", page)  # the admitted runs read one at a time, or all at once
    if windows:  # every part of more than one block read in windows newest first: 1 ms, 2, 4 ...
        monkeypatch.setattr(plans, "SPLIT_BLOCKS", 1)
        monkeypatch.setattr(plans, "FIRST_WINDOW_US", 1000)
    db.execute("DELETE FROM logs")
    for table in ("log_blocks", "log_block_runs", "log_block_grams"):
        db.execute(f"DELETE FROM {table}")
    blocks = tokens.BlockWriter(block_lines=block_lines)
    rows = [("C.%d" % (i % 3), i, T0 + shuffle.randrange(0, 30) * 1000, line) for i, line in enumerate(lines)]  # ts out of order, ties
    stamps = [T0 + shuffle.choice((0, 0, 1, -1)) * step for _ in range(0, len(rows), 5)]  # shared, stepped back
    for n, start in enumerate(range(0, len(rows), 5)):
        commit(db, blocks, rows[start:start + 5], received_us=stamps[n] + step * n if n % 3 else stamps[n])
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, q=st.text(ALPHABET, min_size=1, max_size=6))
def test_a_plain_text_search_finds_exactly_the_lines_ilike_accepts(db, lines, q):
    """The documented meaning of ``q`` (docs/api.md): case-insensitive as DuckDB's ILIKE, with q's % _ \\ literal;
    whatever expression the search evaluates, filtered or not, its hits are ILIKE's lines."""
    db.execute("DELETE FROM logs")
    db.execute("DELETE FROM log_blocks")
    commit(db, tokens.BlockWriter(block_lines=3), [("C.1", i, T0 + i, line) for i, line in enumerate(lines)])
    pattern = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    expect = sorted(seq for (seq,) in db.execute("SELECT seq FROM logs WHERE line ILIKE ? ESCAPE '\\'", [pattern]).fetchall())
    for use_filter in (True, False):
        hits, _, _ = run(db, q, 1000, use_filter)
        assert sorted(h["seq"] for h in hits) == expect, (q, use_filter)


class Counted:
    """A connection that counts the statements run on ``logs``."""

    def __init__(self, con) -> None:
        self.con, self.statements = con, 0

    def execute(self, sql, params=None):
        self.statements += "FROM logs" in sql
        self.con.execute(sql, params)
        return self

    def fetchall(self):
        return self.con.fetchall()

    def to_arrow_table(self):
        return self.con.to_arrow_table()

    def interrupt(self):
        self.con.interrupt()


@pytest.mark.parametrize("parts", [12, 20])
def test_a_rare_phrase_in_many_parts_is_read_in_a_few_statements_newest_first(db, monkeypatch, parts):
    # Hits each in a block of its own and a part of its own (an hour apart, no other block between): one
    # statement per part planned each time (~1 ms each, as much as the block's scan). Up to 16 admitted blocks
    # are read in one statement (a rare phrase's 10 blocks: 19.8 -> 16.7 ms CPU against 1, 2, 4 and 2 parts a
    # statement); more go 1, 2, 4, 8 parts a statement, so a word in many blocks still stops at its newest.
    # The hits and their order are the scan's. (The first statement's FIRST_LINES, 21 of these 50-line blocks,
    # is test_rare_word_search_reads_only_the_blocks_that_hold_it's: here every part counts as one.)
    monkeypatch.setattr(search, "FIRST_LINES", 0)
    blocks = tokens.BlockWriter(block_lines=50)
    for c in range(parts):
        rows = [("C.%d" % c, i, T0 + c * 3_600_000_000 + i, "INFO partition done" if i != 7 else f"ERROR out of memory {c}")
                for i in range(50)]
        commit(db, blocks, rows, received_us=T0 + c)
    counted = Counted(db)
    for limit in (1000, 5):
        counted.statements = 0
        hits, truncated, plan = search.search(counted, 30.0, search.SearchQuery(
            text="out of memory", regex=False, since_us=T0 - 10**9, until_us=T0 + 10**11, limit=limit),
            open_block=blocks.open_block)  # as the server's: the writer's open block, no statement
        assert [h["line"] for h in hits] == [f"ERROR out of memory {c}" for c in range(parts - 1, -1, -1)][:limit]
        assert truncated == (limit < parts) and plan.blocks_admitted == parts
        if parts <= search.ONE_STATEMENT_BLOCKS:
            assert (plan.ranges_scanned, counted.statements) == (parts, 1), (plan, counted.statements)
        elif limit == 1000:
            assert (plan.ranges_scanned, counted.statements) == (parts, 5), (plan, counted.statements)  # 1+2+4+8+5
        else:  # 1 + 2 + 4 parts hold the newest 5, and one more
            assert (plan.ranges_scanned, counted.statements) == (7, 3), (plan, counted.statements)


def test_a_block_written_over_many_commits_holds_the_trigrams_of_all_its_lines(db):
    """The writer cuts only the letter runs a block has not seen into trigrams; the block's bits are still
    every trigram of its lines, whichever commit brought them, and its row, written when it closes, says so.
    A rolled-back commit's lines are not counted (its trigrams may stay: extra bits are allowed)."""
    blocks = tokens.BlockWriter(block_lines=61)
    lines = [f"INFO step {i} Kelvin\u212a {'alpha beta' if i % 2 else 'gamma'} w\u00f6rd{i % 7} ZETA" for i in range(60)]
    for c in range(6):
        commit(db, blocks, [("C.%d" % (c % 2), i, T0 + i, lines[i]) for i in range(c * 10, c * 10 + 10)], received_us=T0 + c)
    logs = store.LogColumns.empty()
    logs.add("C.9", "s", "0", [0, 1], [T0, T0], ["rolled back xylophone", "and one more"], [False, False])
    db.execute("BEGIN")
    blocks.add(db, logs.table(), T0 + 99)
    db.execute("ROLLBACK")
    blocks.rolled_back()
    commit(db, blocks, [("C.1", 100, T0 + 100, "last quokka"), ("C.1", 101, T0 + 101, "first of the next")], received_us=T0 + 7)
    rows = db.execute("SELECT block, lines, bits::VARCHAR, epoch_us(min_received_at), epoch_us(max_received_at) "
                      "FROM log_blocks ORDER BY block").fetchall()
    assert [(b, n, lo, hi) for b, n, _bits, lo, hi in rows] == [(1, 61, T0, T0 + 7)]
    stored = {i for i, b in enumerate(rows[0][2]) if b == "1"}
    every_line = set().union(*(tokens.trigrams(line.encode()) for line in [*lines, "last quokka"]))
    assert every_line <= stored <= tokens.trigrams(("".join(lines) + "rolled back xylophone last quokka").encode())
    assert tokens.trigrams("kelvin".encode()) <= stored and tokens.trigrams(b"zeta") <= stored
    assert tokens.trigrams(b"next") - stored  # the line after the block closed is the next block's
    opened = blocks.open_block()
    assert (opened.block, opened.lines, opened.min_received_us, opened.max_received_us) == (2, 1, T0 + 8, T0 + 8)
    assert tokens.trigrams(b"first of the next") <= opened.grams


def test_a_block_of_unrepeated_words_keeps_a_bounded_cache_and_every_trigram(db):
    """Base64-like lines bring runs seen once: the block remembers at most RUN_CACHE_MAX of them, none longer
    than RUN_CACHE_MAX_BYTES (they were 687 k runs, 59 MiB, copied each commit), and its bits still hold every
    trigram of its lines."""
    import base64
    import random
    rng = random.Random(7)
    lines = [base64.b64encode(rng.randbytes(600)).decode() for _ in range(300)]
    blocks = tokens.BlockWriter(block_lines=10_000)
    for c in range(0, 300, 50):
        commit(db, blocks, [("C.1", i, T0 + i, lines[i]) for i in range(c, c + 50)], received_us=T0 + c)
    runs = blocks.open_block().runs  # the block is open: its bits are the writer's until it closes
    assert len(tokens.letter_runs("".join(lines).encode())) > 10_000  # far more distinct runs than the cache keeps
    assert len(runs) <= min(tokens.RUN_CACHE_MAX + 2_000, 10_000) and all(len(r) <= tokens.RUN_CACHE_MAX_BYTES for r in runs)
    assert set().union(*(tokens.trigrams(line.encode()) for line in lines)) <= blocks.open_block().grams


def test_a_part_without_received_ranges_keeps_its_ts_bounds_in_the_scan():
    """ts's zone maps are the only pruning of a part without received_at ranges (old blocks, regex, no trigram,
    the lake): its bounds stay the scan's filter; a part with ranges checks them on the rows it reads."""
    sql, _ = search._statement(search.MATCH_SQL, [plans.Range(1, 2)])
    assert "ts >= make_timestamp($since0)" in sql and "epoch_us(ts)" not in sql
    sql, _ = search._statement(search.MATCH_SQL, [plans.Range(1, 2, ((5, 6),))])
    assert "epoch_us(ts) >= $since0" in sql and "received_at BETWEEN" in sql and "ts >= make_timestamp" not in sql


WORDS = ["alpha", "beta", "gamma", "Alphabet", "kelvin", "\u212aelvin", "mu"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join), min_size=1, max_size=60),
       block_lines=st.integers(1, 5), shuffle=st.randoms(use_true_random=False), limit=st.integers(1, 30),
       q=st.sampled_from(["alpha", "beta", "gamma", "kelvin", "ALPHAB", "lpha bet", "nowhere"]))
def test_a_common_word_read_in_windows_newest_first_finds_exactly_the_hits_of_a_scan(db, monkeypatch, lines, block_lines,
                                                                                      shuffle, limit, q):
    """Parts of many blocks read in ts windows newest first (plans.newest_first), here every part of more than
    one block and windows from 1 ms: the hits, their order and whether more matched are the scan's, with ts
    spread over 0.6 s out of order, ties, shared and stepped-back commit stamps."""
    monkeypatch.setattr(plans, "SPLIT_BLOCKS", 1)
    monkeypatch.setattr(plans, "FIRST_WINDOW_US", 1000)
    db.execute("DELETE FROM logs")
    for table in ("log_blocks", "log_block_runs", "log_block_grams"):
        db.execute(f"DELETE FROM {table}")
    blocks = tokens.BlockWriter(block_lines=block_lines)
    rows = [("C.%d" % (i % 3), i, T0 + shuffle.randrange(0, 600) * 1000, line) for i, line in enumerate(lines)]
    for n, start in enumerate(range(0, len(rows), 5)):
        commit(db, blocks, rows[start:start + 5], received_us=T0 + 1000 * (n - (n % 4 == 3)))
    for window in ((T0 - 10**9, T0 + 10**9), (T0 + 50_000, T0 + 400_000)):
        filtered = run(db, q, limit, True, *window)
        plain = run(db, q, limit, False, *window)
        assert filtered[:2] == plain[:2], (q, filtered[2])


def test_a_block_cut_from_large_commits_reads_only_its_own_rows(db):
    """A search reads an admitted block's rows by its received_at range. Commits larger than a block (64
    connections: ~6,400 rows a commit, blocks of 2,048) used to stamp all their rows alike, so each of their
    blocks read the whole commit (3x its rows); each block's slice of a commit is stamped apart, so a block's
    range holds its own rows and no other's."""
    blocks = tokens.BlockWriter(block_lines=100)
    seq = 0
    for c in range(12):  # 350 rows a commit: 3-5 blocks each, the first continuing the last commit's open block
        rows = [("C.%d" % (i % 7), seq + i, T0 + i, f"INFO partition {i} of proof {c}") for i in range(350)]
        seq += 350
        commit(db, blocks, rows, received_us=T0 + c * 1000)
    spans = db.execute("SELECT block, lines, epoch_us(min_received_at), epoch_us(max_received_at) FROM log_blocks "
                       "ORDER BY block").fetchall()
    opened = blocks.open_block()  # its row is written when it closes (here the 42nd block closed with the last commit)
    assert opened is None and len(spans) == 42
    assert sum(lines for _, lines, _, _ in spans) == 12 * 350
    for block, lines, lo, hi in spans:
        (inside,) = db.execute("SELECT count(*) FROM logs WHERE epoch_us(received_at) BETWEEN ? AND ?", [lo, hi]).fetchone()
        assert inside == lines, (block, lines, inside)
    # the stamps of a commit stay within it: the next commit's are later, and a tail's window still holds them
    (newest,) = db.execute("SELECT epoch_us(max(received_at)) FROM logs").fetchone()
    assert T0 + 11 * 1000 <= newest < T0 + 11 * 1000 + 10


def test_a_rare_phrase_read_in_two_halves_at_once_keeps_the_deadline(db, monkeypatch):
    """At most 16 admitted blocks are read as two statements at once (search._in_two: the older half on a cursor
    of its own). The side statement is under the search's deadline too: one that runs long is interrupted, the
    search says it timed out, and nothing of it is left running."""
    from ingest.errors import QueryTimeout

    blocks = tokens.BlockWriter(block_lines=50)
    for c in range(6):
        rows = [("C.%d" % c, i, T0 + c * 3_600_000_000 + i, "INFO partition done" if i != 7 else f"ERROR out of memory {c}")
                for i in range(50)]
        commit(db, blocks, rows, received_us=T0 + c)
    sides: list[int] = []
    read = search._read

    def slow_side(cur, filters, params, parts, limit):
        if parts[0].upper <= T0 + 3 * 3_600_000_000:  # the older half, on the side cursor
            sides.append(len(parts))
            cur.execute("SELECT count(*) FROM range(10000000000) a WHERE a.range % 7 = 3").fetchall()
        return read(cur, filters, params, parts, limit)

    hits, _, plan = run(db, "out of memory", since_us=T0 - 10**9, until_us=T0 + 10**11)
    assert [h["line"] for h in hits] == [f"ERROR out of memory {c}" for c in range(5, -1, -1)] and plan.ranges_scanned == 6
    monkeypatch.setattr(search, "_read", slow_side)
    with pytest.raises(QueryTimeout):
        search.search(db, 0.5, search.SearchQuery(text="out of memory", regex=False, since_us=T0 - 10**9,
                                                 until_us=T0 + 10**11))
    assert sides == [3]
    assert db.execute("SELECT count(*) FROM logs").fetchone() == (300,)
