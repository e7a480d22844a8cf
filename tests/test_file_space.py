"""The database file holds the lines, not the space DuckDB's checkpoints left behind (issue 23: bytes per line).

Each checkpoint rewrites the row group the writer is still filling and frees the blocks it held; the
next checkpoint reuses them only as far as it writes new data. With DuckDB's default threshold (a
checkpoint per 16 MiB of WAL, ~80,000 lines) a file written in group commits kept a quarter of its
blocks free (400,000 lines: 32 of 122); at 64 MiB, 2 of 91; at 40 (a quarter of the default
duckdb_memory_limit_mb, 160), 1 of 91."""

from __future__ import annotations

import random

import duckdb

from bench.storage_bytes import make_line
from ingest.config import Settings
from ingest.contract.codec import MetricRows
from ingest.db import searchtokens as tokens, store

STREAMS = [(f"C.330000{i:02d}", source) for i in range(100) for source in ("setup", "benchout", "benchdaemon")]


def _group_commits(con: duckdb.DuckDBPyConnection, lines: int) -> None:
    """``lines`` realistic lines in the writer's commits at 8 connections: 8 bodies of 100 lines of one stream."""
    rng = random.Random(23)
    blocks, parts, seqs = tokens.BlockWriter(), store.StreamParts(), {}
    for n in range(lines // 800):
        logs = store.LogColumns.empty()
        for instance, source in rng.sample(STREAMS, 8):
            s0 = seqs.get((instance, source), 0)
            seqs[(instance, source)] = s0 + 100
            logs.add(
                instance, source, "0", list(range(s0, s0 + 100)), [1_764_000_000_000_000 + (s0 + i) * 1000 for i in range(100)],
                [make_line(rng, 1_764_000_000 + s0 + i) for i in range(100)], [False] * 100)
        store.write_batch(con, logs, [], MetricRows(), {}, 1_800_000_000_000_000 + n * 10_000, blocks=blocks, stream_parts=parts)
        blocks.committed()
        parts.committed()


def test_a_file_written_in_group_commits_keeps_little_free_space(tmp_path):
    path = tmp_path / "f.duckdb"
    settings = Settings()
    con = store.open_database(path, settings.duckdb_memory_limit_mb, threads=1, checkpoint_mb=settings.duckdb_checkpoint_mb)
    _group_commits(con, 400_000)
    con.close()
    check = duckdb.connect(str(path), read_only=True)
    total, used, free = check.execute("SELECT total_blocks, used_blocks, free_blocks FROM pragma_database_size()").fetchone()
    check.close()
    assert used > 50, used  # the lines are there (~59 B a line in 256 KiB blocks)
    assert free <= 0.05 * total, f"{free} of {total} blocks free"


def _duckdb_reads(megabytes: int) -> str:
    """How DuckDB shows a checkpoint threshold of ``megabytes`` MB."""
    con = duckdb.connect()
    con.execute(f"SET checkpoint_threshold = '{megabytes}MB'")
    return con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]


def test_the_checkpoint_threshold_is_the_setting_within_a_quarter_of_the_memory_limit(tmp_path):
    """Megabytes, as duckdb_memory_limit_mb's; at most a quarter of the limit, not below DuckDB's own 16."""
    for n, (memory_limit_mb, checkpoint_mb, expect) in enumerate(((256, 24, 24), (256, 64, 64), (16, 64, 16),
                                                                  (100, 64, 25), (1024, 64, 64), (1024, 8, 8))):
        con = store.open_database(tmp_path / f"f{n}.duckdb", memory_limit_mb, checkpoint_mb=checkpoint_mb)
        try:
            got = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
        finally:
            con.close()
        assert got == _duckdb_reads(expect), (memory_limit_mb, checkpoint_mb, got)


def test_a_small_memory_limit_still_checkpoints(tmp_path):
    """A checkpoint needs memory of its own: 64 MiB of WAL under a 16 MiB memory_limit failed one and
    DuckDB invalidated the database (FATAL) after ~300,000 lines; the threshold stays within the limit."""
    path = tmp_path / "f.duckdb"
    con = store.open_database(path, memory_limit_mb=16, threads=1, checkpoint_mb=64)
    try:
        _group_commits(con, 400_000)
        assert con.execute("SELECT count(*) FROM logs").fetchone()[0] == 400_000
    finally:
        con.close()
    check = duckdb.connect(str(path), read_only=True)
    assert check.execute("SELECT count(*) FROM logs").fetchone()[0] == 400_000
    check.close()
