"""The dedupe index and the tail cache against simple models (Hypothesis)."""

from __future__ import annotations

import duckdb
from hypothesis import given, settings, strategies as st

from ingest.db.seqindex import SeqRanges, StreamIndex, runs_of
from ingest.db.tailcache import TailCache


@given(st.lists(st.lists(st.integers(0, 300), max_size=40), max_size=20))
def test_seq_ranges_behave_like_a_set(batches):
    ranges, model = SeqRanges(), set()
    for batch in batches:
        new = sorted(set(batch) - model)
        for lo, hi in runs_of(new):
            ranges.add_range(lo, hi)
        model.update(new)
        assert ranges.count == len(model)
        assert all((s in ranges) == (s in model) for s in range(0, 302))
        assert all(hi < lo2 - 1 for hi, lo2 in zip(ranges.his, ranges.los[1:]))  # disjoint, merged
        last = max(model) if model else None
        assert ranges.last == last
        missing = {s for lo, hi in ranges.gaps() for s in range(lo, hi + 1)}
        assert missing == ({s for s in range(last + 1) if s not in model} if model else set())
        for lo in range(0, 300, 37):
            assert ranges.overlaps(lo, lo + 10) == any(s in model for s in range(lo, lo + 11))


@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 200)), max_size=30), max_size=12),
       st.integers(1, 50))
def test_tail_cache_holds_the_newest_lines_in_order(commits, capacity):
    cache = TailCache(capacity, 10)
    stored: set[tuple[str, int]] = set()
    for i, commit in enumerate(commits):
        rows = sorted({(r, s, 0, f"{r}{s}") for r, s in commit if (r, s) not in stored})
        cache.on_commit(("C.1", "benchout"), rows, new_stream=(i == 0))
        stored.update((r, s) for r, s, _, _ in rows)
        expected = sorted(stored)[-capacity:]
        got = cache.tail(("C.1", "benchout"), capacity)
        if len(stored) >= capacity or i == 0 or got is not None:
            assert got is not None and [row[:2] for row in got] == expected


def test_tail_cache_load_merges_commits_made_during_the_load():
    cache = TailCache(5, 10)
    key = ("C.1", "benchdaemon")
    assert cache.begin_load(key)
    assert not cache.begin_load(key)  # a second reader does not load twice
    cache.on_commit(key, [("0", 10, 0, "x10"), ("0", 11, 0, "x11")], new_stream=False)
    assert cache.tail(key, 2) is None  # not answerable while loading
    cache.finish_load(key, [("0", s, 0, f"x{s}") for s in range(5, 10)], complete=False)
    assert [row[1] for row in cache.tail(key, 5)] == [7, 8, 9, 10, 11]
    assert cache.tail(key, 6) is None  # more than it holds of a longer stream


def test_tail_cache_evicts_least_recently_used_stream():
    cache = TailCache(5, 2)
    for name in ("a", "b"):
        cache.on_commit(("C.1", name), [("0", 0, 0, "x")], new_stream=True)
    assert cache.tail(("C.1", "a"), 1) is not None  # a is now the most recent
    cache.on_commit(("C.1", "c"), [("0", 0, 0, "x")], new_stream=True)
    assert cache.tail(("C.1", "b"), 1) is None
    assert cache.tail(("C.1", "a"), 1) is not None and cache.tail(("C.1", "c"), 1) is not None


@given(st.dictionaries(
    st.tuples(st.sampled_from(["C.1", "C.2"]), st.sampled_from(["benchout", "cuzk"]), st.sampled_from(["0", "1"])),
    st.sets(st.integers(min_value=0, max_value=60), min_size=1, max_size=40),
    max_size=8,
))
@settings(max_examples=60, deadline=None)
def test_index_load_from_the_table_matches_the_stored_seqs_with_and_without_holes(streams):
    """Start-up takes healthy streams from one aggregate and only holed ones through gaps and
    islands: either way the index must describe exactly the stored seqs."""
    con = duckdb.connect()
    con.execute("CREATE TABLE logs (instance_id VARCHAR, source VARCHAR, run_id VARCHAR, seq BIGINT, received_at TIMESTAMP DEFAULT now())")
    rows = [(*key, seq) for key, seqs in streams.items() for seq in seqs]
    if rows:
        con.executemany("INSERT INTO logs (instance_id, source, run_id, seq) VALUES (?, ?, ?, ?)", rows)
    index = StreamIndex()
    index.load(con)
    for (instance_id, source, run_id), seqs in streams.items():
        key = (instance_id, source, run_id)
        for seq in range(0, 62):
            assert index.is_stored(key, seq) == (seq in seqs)
        summary = next(s for s in index.summaries(instance_id) if (s.source, s.run_id) == (source, run_id))
        assert summary.lines == len(seqs) and summary.last_seq == max(seqs)
    con.close()


@given(st.dictionaries(st.sampled_from(["0", "1", "10", "2"]), st.sets(st.integers(0, 80), min_size=1, max_size=40), min_size=1,
                       max_size=3),
       st.integers(1, 60))
@settings(max_examples=200, deadline=None)
def test_tail_floor_bounds_exactly_the_newest_lines_of_the_stream(runs, n):
    """The tail cache's load reads ``run_id = floor run AND seq >= floor seq``: that must be exactly
    the newest ``n`` lines of the (instance, source) in (run_id, seq) order, whatever the holes and
    runs; when it cannot say (the newest lines span runs) it says None."""
    index = StreamIndex()
    for run_id, seqs in runs.items():
        index.commit(("C.1", "benchout", run_id), sorted(seqs))
    index.commit(("C.1", "other", "9"), [0, 1, 2])  # another source of the same instance
    stored = sorted((run_id, seq) for run_id, seqs in runs.items() for seq in seqs)
    newest = stored[-n:]
    floor = index.tail_floor("C.1", "benchout", n)
    if floor is None:
        assert len({run_id for run_id, _ in newest}) > 1
    else:
        assert [(r, s) for r, s in stored if r == floor[0] and s >= floor[1]] == newest
        assert floor[2] == (len(stored) <= n)  # another source of the instance does not count
    assert index.tail_floor("C.2", "benchout", n) is None


@given(st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(["C.1", "C.2", "C.3"]), st.sampled_from(["a", "b"]),
              st.sampled_from(["0", "1", "10"]), st.sets(st.integers(0, 30), min_size=1, max_size=5)),
    st.tuples(st.just("forget"), st.sampled_from(["C.1", "C.2", "C.3"])),
    st.tuples(st.just("adopt"), st.sets(st.sampled_from(["C.1", "C.2", "C.3"]))),
), max_size=30))
@settings(max_examples=150, deadline=None)
def test_index_per_instance_bookkeeping_matches_a_model_through_forget_and_adopt(steps):
    """The per-instance and per-source bookkeeping (stream counts, sources, latest run, line totals)
    stays exact through commits, retention's forget and lake mode's adopt."""
    index = StreamIndex()
    model: dict[tuple[str, str, str], set[int]] = {}
    other_model = {("C.2", "a", "5"): {0, 1}, ("C.3", "b", "0"): {3}}
    for step in steps:
        if step[0] == "commit":
            _, instance_id, source, run_id, seqs = step
            key = (instance_id, source, run_id)
            new = sorted(seqs - model.get(key, set()))
            if new:
                index.commit(key, new)
                model.setdefault(key, set()).update(new)
        elif step[0] == "forget":
            index.forget(step[1])
            model = {k: v for k, v in model.items() if k[0] != step[1]}
        else:
            other = StreamIndex()  # as lake mode does: a fresh index read from the lake, handed over
            for key, seqs in other_model.items():
                other.commit(key, sorted(seqs))
            index.adopt(other, step[1])
            model = {k: v for k, v in model.items() if k[0] not in step[1]}
            model.update({k: set(v) for k, v in other_model.items() if k[0] in step[1]})
    assert index.stream_count() == len(model)
    assert sorted(index.instances()) == sorted({k[0] for k in model})
    for instance_id in ("C.1", "C.2", "C.3"):
        mine = {k: v for k, v in model.items() if k[0] == instance_id}
        assert index.streams_of(instance_id) == len(mine)
        assert [(s.source, s.run_id, s.lines) for s in index.summaries(instance_id)] == \
            sorted((k[1], k[2], len(v)) for k, v in mine.items())
        for source in ("a", "b"):
            runs = {k[2]: v for k, v in mine.items() if k[1] == source}
            assert index.has_source(instance_id, source) == bool(runs)
            floor = index.tail_floor(instance_id, source, 1000)
            if runs:
                latest = max(runs)
                assert floor is not None and floor[0] == latest or len(runs) > 1
                stored = sorted((r, s) for r, v in runs.items() for s in v)
                n = len(runs[latest])
                floor = index.tail_floor(instance_id, source, n)
                assert floor is not None and floor[0] == latest
                assert floor[2] == (len(stored) <= n)
            else:
                assert floor is None
