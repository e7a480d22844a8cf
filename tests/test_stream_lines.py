"""What is stored of each log stream (log_stream_lines, migration 019; kept as parts since 023, the lines
after a mark counted from logs since 024): kept by the writer, consistent with every commit that stores
lines, so that the views the policies read every cycle (log_streams and those built on it) cost what the
streams are plus the newest lines, not every line ever stored (issue 21: decisions late)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import duckdb
import orjson

from ingest.db import store, writes
from ingest.db.sqlfiles import load_rules
from tests.fleet import rows

REPO = Path(__file__).resolve().parent.parent
AGGREGATE = """
SELECT instance_id, source, run_id, count(*), min(seq), max(seq), count(*) FILTER (WHERE truncated), min(ts), max(ts),
       max(received_at)
FROM logs GROUP BY ALL ORDER BY ALL
"""
KEPT = """
SELECT instance_id, source, run_id, lines, first_seq, last_seq, truncated, first_ts, last_ts, last_received_at
FROM log_stream_lines ORDER BY ALL
"""


def _tables_scanned(plan: dict) -> set[str]:
    out = set()
    table = (plan.get("extra_info") or {}).get("Table") if isinstance(plan.get("extra_info"), dict) else None
    if table:
        out.add(table.rsplit(".", 1)[-1])
    for child in plan.get("children", []):
        out |= _tables_scanned(child)
    return out


ROW_GROUP = 122_880  # DuckDB's rows per row group: its zone maps skip whole ones


def _lines_after_the_mark(tmp_path: Path, stored: int, after: int) -> duckdb.DuckDBPyConnection:
    """A migrated file (a plain connection: profiling stays settable) of ``stored`` lines counted in the parts,
    then ``after`` lines committed after the mark."""
    con = duckdb.connect(str(tmp_path / "f.duckdb"))
    store.migrate(con)
    con.execute("""INSERT INTO logs SELECT 'C.' || (i % 3)::VARCHAR, 'benchout', '0', i, TIMESTAMP '2026-12-01' + to_seconds(i),
                   TIMESTAMP '2026-12-01' + to_microseconds(i), 'l', false FROM range($n) t(i)""", {"n": stored + after})
    con.execute("UPDATE log_stream_mark SET received_at = TIMESTAMP '2026-12-01' + to_microseconds($m)", {"m": stored - 1})
    writes.recount_stream_lines(con)
    return con


def _logs_rows_scanned(con: duckdb.DuckDBPyConnection, tmp_path: Path, sql: str, params=None) -> int:
    """Rows of ``logs`` that running ``sql`` read (DuckDB's profile: rows scanned, before filters)."""
    out = tmp_path / "profile.json"
    con.execute("SET custom_profiling_settings='{\"OPERATOR_ROWS_SCANNED\": \"true\", \"OPERATOR_TYPE\": \"true\", "
                "\"EXTRA_INFO\": \"true\"}'")
    con.execute("PRAGMA enable_profiling='json'")
    con.execute(f"PRAGMA profiling_output='{out}'")
    try:
        con.execute(sql, params or {}).fetchall()
    finally:
        con.execute("PRAGMA disable_profiling")

    def walk(node: dict) -> int:
        here = node.get("operator_rows_scanned", 0) if str(node.get("extra_info", {}).get("Table", "")).endswith(".logs") else 0
        return here + sum(walk(c) for c in node.get("children", []))
    return walk(orjson.loads(out.read_bytes()))


def test_the_views_the_rules_read_scan_only_the_lines_after_the_mark(tmp_path):
    """They cost what the streams are plus the newest lines (those the writer has not added to the parts
    yet: about a second's), not every line ever stored (issue 21: decisions late)."""
    con = _lines_after_the_mark(tmp_path, 4 * ROW_GROUP, 5000)
    try:
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        for view in ("log_streams", "instance_logs", "run_logs", "instance_phase", "log_stream_lines"):
            scanned = _logs_rows_scanned(con, tmp_path, f"SELECT * FROM {view}")
            assert 5000 <= scanned <= ROW_GROUP, f"{view} read {scanned} stored lines"
    finally:
        con.close()


def test_the_destroy_rule_scans_only_the_lines_after_the_mark(tmp_path):
    """Its class guard (a line of the run stored after its class was made) reads each stream's
    newest, not the logs table."""
    con = _lines_after_the_mark(tmp_path, 4 * ROW_GROUP, 5000)
    try:
        [rule] = [r for r in load_rules(REPO / "queries") if r.name == "destroy_below_min_rate"]
        params = {"destroy_grace_s": 45.0, "now": dt.datetime(2026, 12, 2)}
        scanned = _logs_rows_scanned(con, tmp_path, rule.sql, {p: params[p] for p in rule.params})
        assert scanned <= ROW_GROUP, scanned
    finally:
        con.close()


async def _push(client, instance_id, source, seqs, run_id=None, text="line"):
    doc = {"instance_id": instance_id, "source": source,
           "lines": [{"seq": s, "ts": 1764415248.0 + s, "line": f"{text} {s}"} for s in seqs]}
    if run_id:
        doc["run_id"] = run_id
    r = await client.post("/api/v1/logs", data=orjson.dumps(doc))
    assert r.status == 200, await r.text()
    return await r.json()


async def test_stream_lines_count_each_stored_line_once_whatever_is_resent(make_client):
    client = await make_client(max_line_bytes=64)
    await _push(client, "C.1", "benchout", range(0, 10))
    await _push(client, "C.1", "benchout", range(5, 15))  # 5 of them stored already
    await _push(client, "C.1", "benchout", [30, 20, 25])  # out of order, with gaps
    await asyncio.gather(*(_push(client, "C.1", "benchdaemon", range(0, 50)) for _ in range(5)))  # in one group
    await _push(client, "C.2", "benchout", range(0, 3), run_id="r1", text="x" * 100)  # truncated
    await _push(client, "C.2", "benchout", range(0, 2), run_id="r2")
    await _push(client, "C.2", "benchout", range(0, 3), run_id="r1", text="x" * 100)  # all duplicates
    await client.writer.flush()
    kept = rows(client, KEPT)
    assert kept == rows(client, AGGREGATE)
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in kept] == [
        ("C.1", "benchdaemon", "0", 50, 0), ("C.1", "benchout", "0", 18, 0),
        ("C.2", "benchout", "r1", 3, 3), ("C.2", "benchout", "r2", 2, 0)]


async def test_stream_lines_go_with_the_retention_delete(make_client):
    client = await make_client()
    await _push(client, "C.1", "benchout", range(0, 4))
    await _push(client, "C.2", "benchout", range(0, 2))
    await client.writer.execute(lambda con: writes.delete_logs(con, "C.1"), kind="policy")
    assert rows(client, KEPT) == rows(client, AGGREGATE)
    assert [r[0] for r in rows(client, KEPT)] == ["C.2"]
    await _push(client, "C.1", "benchout", range(0, 1))  # a stream that comes back counts afresh
    assert rows(client, KEPT) == rows(client, AGGREGATE)


def test_migration_counts_the_lines_stored_before_it(tmp_path):
    con = duckdb.connect(str(tmp_path / "f.duckdb"))  # not open_database: it applies every migration
    try:
        store.migrate(con, [m for m in store.migrations() if m[0] < 19])
        con.execute("""INSERT INTO logs SELECT 'C.' || (i % 3)::VARCHAR, 'benchout', '0', i, TIMESTAMP '2026-12-01' + to_seconds(i),
                       TIMESTAMP '2026-12-01', 'l', i % 7 = 0 FROM range(100) t(i)""")
        store.migrate(con)
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        assert len(con.execute(KEPT).fetchall()) == 3
    finally:
        con.close()


def _commit(con, parts, stream_rows: list[tuple[str, str, list[int]]], received_us: int, actions=()) -> None:
    """One group commit of ``stream_rows`` (instance, source, seqs) through store.write_batch."""
    from ingest.contract.codec import MetricRows
    logs = store.LogColumns.empty()
    for instance_id, source, seqs in stream_rows:
        logs.add(instance_id, source, "0", seqs, [1_764_415_248_000_000 + s for s in seqs], [f"line {s}" for s in seqs],
                 [s % 5 == 0 for s in seqs])
    store.write_batch(con, logs, [], MetricRows(), {}, received_us, list(actions), stream_parts=parts)
    parts.committed()


def test_stream_parts_are_folded_when_due_and_the_figures_never_change(tmp_path):
    """Each commit appends a part per stream; once the parts are more than twice what the last fold left
    plus the slack, that commit folds them to one per stream: log_stream_lines reads the same throughout,
    and a read never folds more than about twice the streams. A rolled-back commit leaves the count to
    be taken again."""
    con = store.open_database(tmp_path / "f.duckdb")
    parts = store.StreamParts(slack=10, interval_s=0)  # the mark moves at every commit
    streams = [(f"C.{i}", source) for i in range(3) for source in ("benchout", "benchdaemon")]
    try:
        high = 0
        for n in range(40):
            _commit(con, parts, [(i, s, list(range(n * 3, n * 3 + 3))) for i, s in streams[n % 2::2]], 1_800_000_000_000_000 + n)
            (stored,) = con.execute("SELECT count(*) FROM log_stream_parts").fetchone()
            assert stored == parts.rows and stored <= 2 * len(streams) + 10 + 3, (n, stored)
            assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall(), n
            high = max(high, stored)
        assert high > len(streams) and parts.floor == len(streams), (high, parts.floor)  # folds happened
        try:  # a commit that fails after its parts went in: rolled back, and the count is taken afresh
            def fail(_con):
                raise RuntimeError("the action failed")
            _commit(con, parts, [("C.9", "benchout", [0, 1])], 1_900_000_000_000_000, actions=[fail])
        except Exception:
            parts.rolled_back()
        assert parts.rows is None
        _commit(con, parts, [("C.9", "benchout", [0, 1])], 1_900_000_000_000_001)
        (stored,) = con.execute("SELECT count(*) FROM log_stream_parts").fetchone()
        assert stored == parts.rows and con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
    finally:
        con.close()


def test_a_commit_writes_no_part_until_the_mark_is_due(tmp_path):
    """The commit's figures are log_stream_lines' at once (log_stream_tail counts the lines after the mark);
    the parts change only when the mark moves: at the first commit of a writer (what lies after the mark is
    not known), then once ``lines`` lines (or ``interval_s``) have gone in since."""
    con = store.open_database(tmp_path / "f.duckdb")
    parts = store.StreamParts(slack=1000, interval_s=3600, lines=50)
    streams = [(f"C.{i}", "benchout") for i in range(3)]
    try:
        history = []
        for n in range(20):  # 6 lines a commit
            _commit(con, parts, [(i, s, [2 * n, 2 * n + 1]) for i, s in streams], 1_800_000_000_000_000 + n)
            assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall(), n
            history.append(con.execute("SELECT count(*), epoch_us(max(last_received_at)) FROM log_stream_parts").fetchone())
        moves = [n for n in range(20) if n == 0 or history[n] != history[n - 1]]
        assert moves == [0, 9, 18], moves  # 9 commits of 6 lines reach 50
        (mark,) = con.execute("SELECT epoch_us(received_at) FROM log_stream_mark").fetchone()
        assert mark == 1_800_000_000_000_018 == parts.mark_us
    finally:
        con.close()


def test_a_commit_stamped_before_the_mark_is_counted_once(tmp_path):
    """The clock stepped back: a commit stamped at or before the mark is no part of the tail, so its
    figures go into the parts at once, and the next move of the mark does not count them again."""
    con = store.open_database(tmp_path / "f.duckdb")
    parts = store.StreamParts(slack=1000, interval_s=3600, lines=4)
    try:
        _commit(con, parts, [("C.1", "benchout", [0, 1, 2, 3])], 1_800_000_000_000_100)  # moves the mark to ..100
        assert parts.mark_us == 1_800_000_000_000_100
        _commit(con, parts, [("C.1", "benchout", [4]), ("C.2", "benchout", [0])], 1_800_000_000_000_050)  # stepped back
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        _commit(con, parts, [("C.1", "benchout", [5, 6, 7, 8])], 1_800_000_000_000_060)  # still behind, and due
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        _commit(con, parts, [("C.2", "benchout", [1, 2, 3, 4])], 1_800_000_000_000_200)  # ahead again, due
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        assert parts.mark_us == 1_800_000_000_000_200
        parts = store.StreamParts(slack=0, interval_s=3600, lines=4)  # a restarted writer: reads all, moves the mark
        _commit(con, parts, [("C.3", "benchout", [0])], 1_800_000_000_000_300)
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        assert (parts.rows, parts.mark_us) == con.execute(
            "SELECT (SELECT count(*) FROM log_stream_parts), (SELECT epoch_us(received_at) FROM log_stream_mark)").fetchone()
        assert parts.mark_us == 1_800_000_000_000_300
    finally:
        con.close()


def test_a_commit_stamped_before_the_mark_is_counted_once(tmp_path):
    """Each block's slice of a commit is stamped apart (received_us, +1, +2 ...: searchtokens.BlockWriter). A
    commit whose clock stepped back behind the mark is stamped after the newest stored row instead (the stamps
    never step back: BlockWriter.stamp), so none of its rows lies at or before the mark, and each line is
    counted once."""
    from ingest.contract.codec import MetricRows
    from ingest.db import searchtokens as tokens
    con = store.open_database(tmp_path / "f.duckdb")
    parts, blocks = store.StreamParts(slack=1000, interval_s=3600, lines=4), tokens.BlockWriter(block_lines=2)

    def commit(stream_rows, received_us):
        logs = store.LogColumns.empty()
        for instance_id, seqs in stream_rows:
            logs.add(instance_id, "benchout", "0", seqs, [1_764_415_248_000_000 + s for s in seqs], [f"line {s}" for s in seqs],
                     [s % 5 == 0 for s in seqs])
        store.write_batch(con, logs, [], MetricRows(), {}, received_us, blocks=blocks, stream_parts=parts)
        parts.committed()
        blocks.committed()
    try:
        commit([("C.1", [0, 1, 2, 3])], 1_800_000_000_000_100)  # two blocks: stamps ..100, ..101; moves the mark
        assert parts.mark_us == 1_800_000_000_000_101
        commit([("C.1", [4, 5, 6]), ("C.2", [0, 1, 2])], 1_800_000_000_000_100)  # the clock behind: ..102 to ..104
        stamps = con.execute("SELECT epoch_us(received_at), count(*) FROM logs GROUP BY 1 ORDER BY 1").fetchall()
        assert stamps == [(1_800_000_000_000_100 + i, 2) for i in range(5)], stamps
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        commit([("C.2", [3, 4, 5, 6])], 1_800_000_000_000_200)  # ahead again, due: the mark moves past them
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        assert parts.mark_us == 1_800_000_000_000_201
    finally:
        con.close()


def test_a_lost_mark_is_set_again_and_the_figures_counted_afresh(tmp_path):
    """Without its row (a hand edit, a partial restore) log_stream_tail counts nothing: the writer's next
    commit (and a recount) puts the mark back and counts the parts afresh, instead of failing every commit."""
    con = store.open_database(tmp_path / "f.duckdb")
    try:
        parts = store.StreamParts(interval_s=3600, lines=1000)
        _commit(con, parts, [("C.1", "benchout", [0, 1, 2])], 1_800_000_000_000_000)
        _commit(con, parts, [("C.1", "benchout", [3]), ("C.2", "benchout", [0])], 1_800_000_000_000_001)
        con.execute("DELETE FROM log_stream_mark")
        writes.recount_stream_lines(con, ["C.1"])
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        con.execute("DELETE FROM log_stream_mark")
        parts = store.StreamParts(interval_s=3600, lines=1000)  # a restarted writer
        _commit(con, parts, [("C.2", "benchout", [1])], 1_800_000_000_000_002)
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
        assert con.execute("SELECT count(*) FROM log_stream_mark").fetchone() == (1,)
    finally:
        con.close()


def test_a_file_migrated_by_a_newer_fleetlog_is_refused(tmp_path):
    """An older writer on a newer file would keep its figures as it knew how (023's per-commit parts under
    024's tail: every line counted twice): it refuses to open it instead."""
    store.open_database(tmp_path / "f.duckdb").close()
    con = duckdb.connect(str(tmp_path / "f.duckdb"))
    con.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'from the future')")
    con.close()
    try:
        store.open_database(tmp_path / "f.duckdb").close()
    except store.StoreError as e:
        assert "migration 999" in str(e), e
    else:
        raise AssertionError("a file of a newer fleetlog was opened")


def test_stream_parts_stay_bounded_across_restarts(tmp_path):
    """Each process (or a rolled-back commit) counts the parts afresh: the count must be held against the
    streams, not taken as what the last fold left, or a server restarted before each fold was due
    would never fold again (the parts, and every read of log_stream_lines, growing for good)."""
    con = store.open_database(tmp_path / "f.duckdb")
    streams = [(f"C.{i}", "benchout") for i in range(5)]
    try:
        seq = 0
        for life in range(12):
            parts = store.StreamParts(slack=10, interval_s=0)  # a restarted writer
            for _ in range(3):
                _commit(con, parts, [(i, s, [seq, seq + 1]) for i, s in streams], 1_800_000_000_000_000 + seq)
                seq += 2
            (stored,) = con.execute("SELECT count(*) FROM log_stream_parts").fetchone()
            assert stored <= 2 * len(streams) + 10 + len(streams), (life, stored)
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
    finally:
        con.close()


def test_a_fold_that_fails_says_why(tmp_path, monkeypatch):
    """A statement of the fold that fails (out of memory, a full disk) is the error the commit reports, so
    that the writer can tell a storage failure from a bad request."""
    con = store.open_database(tmp_path / "f.duckdb")
    parts = store.StreamParts(slack=0, interval_s=0)
    try:
        _commit(con, parts, [("C.1", "benchout", [0])], 1_800_000_000_000_000)
        real = store.fold_stream_parts

        class Failing:  # the fold's insert fails as DuckDB's statements fail: the transaction aborted
            def __init__(self, c):
                self.c = c

            def execute(self, sql, *args):
                if sql.startswith("INSERT INTO log_stream_parts"):
                    return self.c.execute("SELECT error('the fold ran out of memory')")
                return self.c.execute(sql, *args)

        def failing(c):
            return real(Failing(c))

        monkeypatch.setattr(store, "fold_stream_parts", failing)
        try:
            _commit(con, parts, [("C.1", "benchout", [1]), ("C.2", "benchout", [0])], 1_800_000_000_000_001)
        except store.StoreError as e:
            assert "the fold ran out of memory" in str(e), e
        else:
            raise AssertionError("the failing fold did not fail the commit")
        parts.rolled_back()
        monkeypatch.setattr(store, "fold_stream_parts", real)
        _commit(con, parts, [("C.1", "benchout", [1]), ("C.2", "benchout", [0])], 1_800_000_000_000_002)
        assert con.execute(KEPT).fetchall() == con.execute(AGGREGATE).fetchall()
    finally:
        con.close()


def test_migration_023_keeps_the_figures_019_kept(tmp_path):
    con = duckdb.connect(str(tmp_path / "f.duckdb"))
    try:
        store.migrate(con, [m for m in store.migrations() if m[0] < 23])
        con.execute("""INSERT INTO logs SELECT 'C.' || (i % 3)::VARCHAR, 'benchout', '0', i, TIMESTAMP '2026-12-01' + to_seconds(i),
                       TIMESTAMP '2026-12-01', 'l', i % 7 = 0 FROM range(100) t(i)""")
        con.execute(f"INSERT INTO log_stream_lines SELECT {store.STREAM_FIGURES_SQL}, max(received_at) FROM logs GROUP BY ALL")
        before = con.execute(KEPT).fetchall()
        store.migrate(con)
        assert con.execute(KEPT).fetchall() == before == con.execute(AGGREGATE).fetchall() and len(before) == 3
    finally:
        con.close()


# -- what logs_complete events declared (log_stream_declared, migration 022) --------------------------
DECLARED = "SELECT instance_id, run_id, source, declared_last_seq, dropped FROM log_stream_declared ORDER BY ALL"
FROM_EVENTS = f"SELECT * FROM ({store.STREAM_DECLARATIONS_SQL.format(events='events')}) ORDER BY ALL"


def test_log_streams_reads_no_event_body(tmp_path):
    """The streams' declarations are kept by the writer: no read of every logs_complete body (json_each)."""
    con = store.open_database(tmp_path / "f.duckdb")
    try:
        plan = orjson.loads(con.execute("EXPLAIN (FORMAT json) SELECT * FROM log_streams").fetchall()[0][1])
        scanned = set().union(*(_tables_scanned(p) for p in plan))
        assert "events" not in scanned and "log_stream_declared" in scanned, sorted(scanned)
    finally:
        con.close()


async def _complete(client, instance_id, ts, sources, run_id=None, dropped=None):
    body = {"instance_id": instance_id, "kind": "logs_complete", "ts": ts, "sources": sources}
    if run_id:
        body["run_id"] = run_id
    if dropped:
        body["dropped"] = dropped
    r = await client.post("/api/v1/events", data=orjson.dumps(body))
    assert r.status == 200, await r.text()


async def test_declarations_kept_are_what_the_stored_events_declare(make_client):
    client = await make_client()
    await _push(client, "C.1", "benchout", range(0, 3), run_id="r1")
    await _complete(client, "C.1", 10.0, {"benchout": 1}, run_id="r1")  # an early, lower declaration
    await _complete(client, "C.1", 11.0, {"benchout": 2, "benchdaemon": -1}, run_id="r1")
    await _complete(client, "C.1", 11.0, {"benchout": 2, "benchdaemon": -1}, run_id="r1")  # resent: a duplicate
    await asyncio.gather(*(_complete(client, "C.2", 20.0 + i, {"setup": i}, dropped={"setup": i % 2}) for i in range(6)))
    await _complete(client, "C.3", 30.0, {"entrypoint": 4}, dropped={"other": 2})  # dropped of a source not declared
    await client.writer.flush()
    assert rows(client, DECLARED) == rows(client, FROM_EVENTS)
    assert rows(client, DECLARED) == [
        ("C.1", "r1", "benchdaemon", -1, None), ("C.1", "r1", "benchout", 2, None), ("C.2", "0", "setup", 5, 1),
        ("C.3", "0", "entrypoint", 4, None), ("C.3", "0", "other", None, 2)]
    streams = {(r[0], r[1], r[2]): r[3:] for r in rows(client, "SELECT instance_id, run_id, source, complete, why_incomplete FROM log_streams")}
    assert streams[("C.1", "r1", "benchout")] == (True, None)
    assert streams[("C.2", "0", "setup")] == (False, "lines dropped by the agent")
    assert streams[("C.3", "0", "other")] == (False, "no logs_complete")


async def test_an_admins_delete_of_a_logs_complete_counts_the_declarations_again(make_client):
    client = await make_client()
    await _push(client, "C.1", "benchout", range(0, 3))
    await _complete(client, "C.1", 10.0, {"benchout": 2})
    await _complete(client, "C.1", 11.0, {"benchout": 9})  # a wrong one, removed by an admin below
    await _complete(client, "C.2", 12.0, {"benchout": 0})
    await client.writer.flush()
    await client.writer.execute(lambda con: store.delete_event(con, "C.1", "logs_complete", 11_000_000), kind="delete_event")
    assert rows(client, DECLARED) == rows(client, FROM_EVENTS) == [("C.1", "0", "benchout", 2, None), ("C.2", "0", "benchout", 0, None)]
    assert rows(client, "SELECT complete FROM log_streams WHERE instance_id = 'C.1'") == [(True,)]


def test_migration_keeps_the_declarations_of_events_stored_before_it(tmp_path):
    con = duckdb.connect(str(tmp_path / "f.duckdb"))  # not open_database: it applies every migration
    try:
        store.migrate(con, [m for m in store.migrations() if m[0] < 22])
        bodies = ['{"sources": {"benchout": 3}, "run_id": "r1"}', '{"sources": {"benchout": 5}, "run_id": "r1"}',
                  '{"sources": {"benchout": "not a number"}, "dropped": {"benchout": "x"}}',  # stored by an older server
                  '{"sources": [1, 2]}', '{"sources": {"setup": 9223372036854775808}}']
        for i, body in enumerate(bodies):
            con.execute("INSERT INTO events VALUES ('C.' || ?::VARCHAR, 'logs_complete', TIMESTAMP '2026-12-01' + to_seconds(?), "
                        "TIMESTAMP '2026-12-01', ?)", [i // 2, i, body])
        before = con.execute(f"SELECT * FROM log_streams ORDER BY ALL").fetchall()
        store.migrate(con)
        assert con.execute(DECLARED).fetchall() == con.execute(FROM_EVENTS).fetchall() == [
            ("C.0", "r1", "benchout", 5, None), ("C.1", "0", "benchout", None, 1), ("C.2", "0", "setup", None, None)]
        assert con.execute("SELECT * FROM log_streams ORDER BY ALL").fetchall() == before  # the same streams, the same figures
    finally:
        con.close()
