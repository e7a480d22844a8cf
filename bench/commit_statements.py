"""Where a group commit's CPU goes, statement by statement (issue 23: server CPU per ingested line).

Group commits as the writer makes them (``store.write_batch`` with the token filter on, one Arrow
batch per pushed body of BENCH_BODY_LINES lines of one stream, 600 streams; the instances upserted
as the writer does, new ones at once and last_seen once a second) are timed on a real
database file, each DuckDB call of the commit in the thread's CPU seconds (a proxy connection times
every ``execute``, ``register``, ``unregister`` and ``from_arrow`` by its statement's first words).
Two commit sizes: 8 bodies (what 8 connections can have in flight, ack after commit) and 64. The
reference, in the same run: the same rows appended in one 100k-row INSERT of an Arrow table (DuckDB
alone, no per-commit work), per line.

Printed per commit size: CPU per line of the whole commit and its ratio to the reference, then each
statement's share. What it measured on 2 cores (2026-12-03, BENCH_COMMITS=100): an 8-body commit of
800 lines cost ~20 ms of CPU (25 us a line, ~10x the reference), and a commit of 8 lines about the
same; the log_stream_lines upsert the largest statement (5.8 ms), then the logs insert (2.6 ms), the
instances upsert (2.4 ms, new instances coming in), the COMMIT (2.1 ms) and the token filter's block
update (1.4 ms). 64 bodies a commit: 9.7 us a line. 2026-12-04, after migration 024 (the stream figures
added once a second, not by each commit): an 8-body commit 10.3 ms, 12.9 us a line; 64 bodies 5.6 us.
Since 2026-12-04 (session 11) the lines are bench/storage_bytes.py's realistic ones (more words a line
than bench/common.py's templates, so the token filter's share is what the server sees); the block
writer cutting only unseen letter runs into trigrams, three alternating runs beside the commit before:
8 bodies 11.7, 14.7, 13.0 -> 11.1, 10.4, 13.4 us a line; 64 bodies 6.2, 6.6, 6.8 -> 5.4, 5.6, 5.6.

    python bench/commit_statements.py       # BENCH_COMMITS=150 BENCH_BODY_LINES=100
"""

from __future__ import annotations

import inspect
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from bench.storage_bytes import make_line  # noqa: E402  (the realistic lines bench/vs_victorialogs.py sends)
from ingest.contract.codec import MetricRows  # noqa: E402
from ingest.db import searchtokens as tokens, store  # noqa: E402
from ingest.db.writer import LAST_SEEN_STEP_US  # noqa: E402

COMMITS = int(os.environ.get("BENCH_COMMITS", "150"))
BODY_LINES = int(os.environ.get("BENCH_BODY_LINES", "100"))
STREAMS = [(f"C.{33000000 + i}", s) for i in range(200) for s in ("benchdaemon", "benchout", "setup")]


class TimedConnection:
    """A DuckDB connection whose calls are timed (CPU of this thread) by what they do."""

    def __init__(self, con) -> None:
        self.con = con
        self.cpu: dict[str, float] = defaultdict(float)

    def _timed(self, what: str, fn, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.cpu[what] += time.thread_time() - t0

    def execute(self, sql: str, *args, **kwargs):
        words = " ".join(sql.split()[:3])
        return self._timed(words if len(words) < 40 else words[:40], self.con.execute, sql, *args, **kwargs)

    def register(self, *args):
        return self._timed("register", self.con.register, *args)

    def unregister(self, *args):
        return self._timed("unregister", self.con.unregister, *args)

    def from_arrow(self, table):
        rel = self.con.from_arrow(table)
        proxy = self

        class Relation:  # the logs insert: insert_into("logs") (or, in older trees, project(...).insert_into)
            def insert_into(self, name):
                return proxy._timed(f"insert into {name} (arrow)", rel.insert_into, name)

            def project(self, sql):
                inner = rel.project(sql)

                class Projected:
                    def insert_into(self, name):
                        return proxy._timed(f"insert into {name} (arrow)", inner.insert_into, name)
                return Projected()
        return Relation()


def bodies(rng: random.Random, seqs: dict, count: int) -> store.LogColumns:
    logs = store.LogColumns.empty()
    for instance, source in rng.sample(STREAMS, count):
        s0 = seqs.get((instance, source), 0)
        seqs[(instance, source)] = s0 + BODY_LINES
        logs.add(
            instance, source, "0", list(range(s0, s0 + BODY_LINES)),
            [1_764_000_000_000_000 + (s0 + i) * 1000 for i in range(BODY_LINES)],
            [make_line(rng, 1_764_000_000 + s0 + i) for i in range(BODY_LINES)], [False] * BODY_LINES)
    return logs


def reference(directory: Path, rows: store.LogColumns) -> float:
    """CPU seconds per line of DuckDB appending ``rows`` in one INSERT of an Arrow table (one thread)."""
    con = store.open_database(directory / "reference.duckdb", threads=1)
    table = rows.table()
    table = table.add_column(store.LOG_RECEIVED_AT, "received_at", pa.repeat(pa.scalar(1, store.TS_TYPE), len(rows)))
    t0 = time.thread_time()
    con.execute("BEGIN")
    con.from_arrow(table).insert_into("logs")
    con.execute("COMMIT")
    cpu = time.thread_time() - t0
    con.close()
    return cpu / len(rows)


def commits(directory: Path, per_commit: int) -> tuple[float, dict[str, float], int]:
    """(CPU seconds per line, CPU seconds by statement, lines) of COMMITS group commits of ``per_commit`` bodies."""
    rng = random.Random(per_commit)
    con = TimedConnection(store.open_database(directory / f"commits-{per_commit}.duckdb", threads=1))
    blocks = tokens.BlockWriter()
    parts = store.StreamParts() if hasattr(store, "StreamParts") else True  # (an older tree: A/B runs)
    kind = "stream_parts" if "stream_parts" in inspect.signature(store.write_batch).parameters else "stream_lines"
    parts_kw = {kind: parts}
    seqs: dict = {}
    lines = 0
    total = 0.0
    known: set[str] = set()
    due: set[str] = set()
    touched = time.monotonic()
    for n in range(COMMITS):
        logs = bodies(rng, seqs, per_commit)
        seen = logs.instances()
        # as the writer (_instances_to_touch): new instances at once, last_seen of the others once a second
        if time.monotonic() - touched >= LAST_SEEN_STEP_US / 1e6:
            touch, touched, due = seen | due, time.monotonic(), set()
        else:
            touch = seen - known
            due |= seen & known
        known |= seen
        instances = dict.fromkeys(touch, 1_764_000_000_000_000)
        t0 = time.thread_time()
        store.write_batch(con, logs, [], MetricRows(), instances, 1_800_000_000_000_000 + n, blocks=blocks, **parts_kw)
        blocks.committed()
        if parts is not True:
            parts.committed()
        total += time.thread_time() - t0
        lines += len(logs)
    con.con.close()
    return total / lines, dict(con.cpu), lines


def main() -> None:
    print(f"group commits: {COMMITS} per size, bodies of {BODY_LINES} lines of one stream, {len(STREAMS)} streams, "
          f"DuckDB 1 thread; CPUs {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="fleetlog-commit-") as tmp:
        tmp = Path(tmp)
        rng = random.Random(0)
        ref = reference(tmp, bodies(rng, {}, 600) if BODY_LINES * 600 <= 200_000 else bodies(rng, {}, 200_000 // BODY_LINES))
        print(f"reference: one Arrow INSERT of {min(600, 200_000 // BODY_LINES) * BODY_LINES:,} lines, {ref * 1e6:.2f} us/line")
        for per_commit in (8, 64):
            per_line, by_statement, lines = commits(tmp, per_commit)
            whole = sum(by_statement.values())
            print(f"commits of {per_commit} bodies ({per_commit * BODY_LINES} lines): {per_line * 1e6:.2f} us/line, "
                  f"{per_line * per_commit * BODY_LINES * 1e3:.2f} ms a commit; ratio to the reference {per_line / ref:.1f}x")
            for what, cpu in sorted(by_statement.items(), key=lambda kv: -kv[1]):
                print(f"    {cpu / COMMITS * 1e3:7.3f} ms a commit  {cpu / whole:5.1%}  {what}")
            print(f"    {(per_line * lines - whole) / COMMITS * 1e3:7.3f} ms a commit  outside DuckDB calls (Arrow, Python, trigrams)")


if __name__ == "__main__":
    main()
