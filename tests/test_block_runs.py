"""The token filter's closed runs, transposed (migration 025): a search reads a run's rows of its trigrams, not
each block's bits.

At 100 M lines a search tested the bits of each of the window's 48,829 blocks: text found nowhere cost 6.4x its
10 M figure, a common word 5.2x (bench/search_scale.py). A run of RUN_BLOCKS blocks is written, in the commit
that stores its last block, as one bitset of its blocks per trigram. What must hold: every run whose blocks are
all stored is written exactly as its blocks' bits say, by the writer that stored them or by the next one (a
writer that died, a database from before 025, RUN_BLOCKS changed); a search finds the same hits as a scan
whatever is written; and it does use the runs.
"""

from __future__ import annotations

from ingest.db import store, searchtokens as tokens
from tests.test_open_block import run
from tests.test_search_filter import T0, commit

WORDS = ["partition", "cuda", "thermal", "fallen", "proof", "xid", "memory", "slowdown"]


def fill(con, blocks, n: int, start: int = 0, per_commit: int = 7) -> None:
    """``n`` lines from seq ``start``, two words each (which two: by seq), in commits of ``per_commit``."""
    rows = [("C.%d" % (i % 3), i, T0 + i * 1000, f"INFO {WORDS[i % 8]} {WORDS[(i // 8) % 8]} {i}") for i in range(start, start + n)]
    for at in range(0, n, per_commit):
        commit(con, blocks, rows[at:at + per_commit], received_us=T0 + start + at)


def transposed_from_bits(con) -> dict[tuple[int, int], str]:
    """What log_block_grams must hold, from log_blocks' bits: (run, trigram) -> the run's blocks holding it."""
    want: dict[tuple[int, int], list[str]] = {}
    runs = {r for (r,) in con.execute("SELECT run FROM log_block_runs").fetchall()}
    for block, bits in con.execute("SELECT block, bits::VARCHAR FROM log_blocks").fetchall():
        r = block // tokens.RUN_BLOCKS
        if r not in runs:
            continue
        for g in (i for i, c in enumerate(bits) if c == "1"):
            want.setdefault((r, g), ["0"] * tokens.RUN_BLOCKS)[block % tokens.RUN_BLOCKS] = "1"
    return {key: "".join(v) for key, v in want.items()}


def stored(con) -> dict[tuple[int, int], str]:
    rows = con.execute("SELECT run, gram, blocks::VARCHAR FROM log_block_grams").fetchall()
    assert len(rows) == len({(r, g) for r, g, _ in rows}), "a (run, trigram) written twice"
    return {(r, g): bits for r, g, bits in rows}


def test_a_run_is_written_transposed_by_the_commit_that_stores_its_last_block(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 4)
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=5)
    fill(con, blocks, 14)  # blocks 1, 2 stored, 3 open: run 0 (blocks 0-3) not closed
    assert con.execute("SELECT count(*) FROM log_block_runs").fetchone() == (0,)
    fill(con, blocks, 38, start=14)  # 52 lines: blocks 1-10 stored, runs 0 (0-3) and 1 (4-7) closed, 11 open
    assert con.execute("SELECT run, first_block, last_block FROM log_block_runs ORDER BY run").fetchall() == [(0, 0, 3), (1, 4, 7)]
    want = transposed_from_bits(con)
    assert {r for r, _ in want} == {0, 1} and stored(con) == want
    assert tokens.trigrams(b"partition") <= {g for r, g in want if r == 1}
    con.close()


def test_a_search_admits_a_closed_runs_blocks_by_its_rows_not_their_bits(tmp_path, monkeypatch):
    """Zero the bits of the closed runs' blocks: the search still finds every hit (it reads the runs); the blocks
    after the runs are still tested by their bits (set them all: all three admitted, no hit lost)."""
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 4)
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=5)
    fill(con, blocks, 92)  # blocks 1-18 stored: runs 0-3 (blocks 0-15) closed, 16-18 stored after them, 19 open
    assert con.execute("SELECT count(*) FROM log_block_runs").fetchone() == (4,)
    texts = ("thermal", "cuda memory", "fallen slowdown 7", "nowhere")
    before = {text: run(con, text, blocks) for text in texts}
    after_runs = {text: con.execute("SELECT count(*) FROM log_blocks WHERE block >= 16 AND " + " AND ".join(
        f"get_bit(bits, {g}) = 1" for g in tokens.trigrams(text.encode()))).fetchone()[0] for text in texts}
    con.execute(f"UPDATE log_blocks SET bits = repeat('0', {tokens.NBITS})::BIT WHERE block < 16")
    con.execute(f"UPDATE log_blocks SET bits = repeat('1', {tokens.NBITS})::BIT WHERE block >= 16")
    for text, (hits, more, plan) in before.items():
        assert (hits, more) == run(con, text, blocks, use_filter=False)[:2], text
        again, _, plan_again = run(con, text, blocks)
        assert again == hits, text
        assert plan_again.blocks == plan.blocks == 19
        assert plan_again.blocks_admitted == plan.blocks_admitted - after_runs[text] + 3, text
    assert before["nowhere"][2].blocks_admitted == 0 and before["thermal"][2].blocks_admitted > 3
    con.close()


def test_runs_not_written_are_written_by_the_next_writers_first_commit(tmp_path, monkeypatch):
    """A database from before migration 025 (its runs deleted here), or one whose runs are of another size
    (RUN_BLOCKS changed): the next writer's first commit writes them as its blocks' bits say; until then the
    search tests the bits, and finds the same hits."""
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 4)
    con = store.open_database(tmp_path / "f.duckdb")
    fill(con, tokens.BlockWriter(block_lines=5), 92)
    want = stored(con)
    con.execute("DELETE FROM log_block_grams WHERE run >= 1")
    con.execute("DELETE FROM log_block_runs WHERE run >= 1")
    con.execute("DELETE FROM log_block_runs WHERE run = 0")  # a run's rows without its runs row: written again, once
    hits = run(con, "cuda memory")[:2]
    assert hits == run(con, "cuda memory", use_filter=False)[:2] and hits[0]
    again = tokens.BlockWriter(block_lines=5)
    fill(con, again, 2, start=92)
    assert stored(con) == want and con.execute("SELECT count(*) FROM log_block_runs").fetchone() == (4,)
    assert run(con, "cuda memory", again)[:2] == hits
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 3)
    assert run(con, "cuda memory")[:2] == hits  # runs of 4 blocks: not used by a search for runs of 3
    third = tokens.BlockWriter(block_lines=5)
    fill(con, third, 1, start=94)
    assert con.execute("SELECT count(*), min(last_block - first_block) FROM log_block_runs").fetchone() == (6, 2)
    assert stored(con) == transposed_from_bits(con)
    assert run(con, "cuda memory", third)[:2] == hits
    con.close()


def test_a_rolled_back_commit_takes_the_run_it_closed_with_it(tmp_path, monkeypatch):
    from ingest.contract.codec import MetricRows
    from ingest.errors import StoreError
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 2)
    con = store.open_database(tmp_path / "f.duckdb")
    blocks = tokens.BlockWriter(block_lines=5)
    fill(con, blocks, 3)
    logs = store.LogColumns.empty()
    logs.add("C.9", "s", "0", list(range(4)), [T0 + 50] * 4, ["rolled back xylophone"] * 4, [False] * 4)
    try:  # closes block 1, the last of run 0: both rolled back
        store.write_batch(con, logs, [], MetricRows(), {}, T0 + 10, actions=[lambda c: 1 / 0], blocks=blocks)
    except StoreError:
        blocks.rolled_back()
    assert con.execute("SELECT count(*) FROM log_block_runs").fetchone() == (0,)
    fill(con, blocks, 20, start=3)
    assert con.execute("SELECT run FROM log_block_runs ORDER BY run").fetchall() == [(0,), (1,)]
    assert stored(con) == transposed_from_bits(con)
    assert not run(con, "xylophone", blocks)[0]
    con.close()


def test_the_writers_count_of_runs_is_what_the_search_would_read(tmp_path, monkeypatch):
    """``BlockWriter.runs_written`` (the server's searches ask it instead of a statement) equals RUNS_SQL at every step:
    runs written, a commit rolled back, a database from before 025, runs of another size."""
    from ingest.contract.codec import MetricRows
    from ingest.errors import StoreError
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 2)
    con = store.open_database(tmp_path / "f.duckdb")

    def read() -> int:
        return con.execute(tokens.RUNS_SQL, {"size": tokens.RUN_BLOCKS}).fetchone()[0]

    blocks = tokens.BlockWriter(block_lines=5)
    assert blocks.runs_written() is None  # not loaded: the search reads it
    fill(con, blocks, 3)
    assert blocks.runs_written() == read() == 0
    logs = store.LogColumns.empty()
    logs.add("C.9", "s", "0", list(range(4)), [T0 + 50] * 4, ["rolled back"] * 4, [False] * 4)
    try:
        store.write_batch(con, logs, [], MetricRows(), {}, T0 + 10, actions=[lambda c: 1 / 0], blocks=blocks)
    except StoreError:
        blocks.rolled_back()
    assert blocks.runs_written() == read() == 0
    fill(con, blocks, 40, start=3)  # blocks 1-8 stored: runs 0-3
    assert blocks.runs_written() == read() == 4
    assert run(con, "cuda", blocks)[:2] == run(con, "cuda", use_filter=False)[:2]
    monkeypatch.setattr(tokens, "RUN_BLOCKS", 3)
    again = tokens.BlockWriter(block_lines=5)
    again.load(con)
    assert again.runs_written() == read() == 0  # runs of 2 blocks: none used until written again
    fill(con, again, 1, start=43)
    assert again.runs_written() == read() == 3  # blocks 0-8
    con.close()
