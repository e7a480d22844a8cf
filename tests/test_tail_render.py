"""The read API's fast line rendering gives exactly what ``ts_to_iso`` gives, over the whole stored range."""

from __future__ import annotations

from hypothesis import given, strategies as st

from ingest.contract.codec import MAX_TS_US, MIN_TS_US
from ingest.web.logs import render_lines
from ingest.timestamps import ts_to_iso

stamps = st.integers(min_value=MIN_TS_US, max_value=MAX_TS_US)


@given(stamps, st.lists(st.integers(min_value=-3_000_000, max_value=3_000_000), max_size=50), st.lists(stamps, max_size=5))
def test_render_lines_ts_matches_ts_to_iso_whatever_the_stamps(base, steps, far):
    # stamps a few seconds apart share or straddle a second (the memo must not leak one second into
    # the next); a few far ones anywhere in the range
    stamps_us = [min(MAX_TS_US, max(MIN_TS_US, base + step)) for step in steps] + far
    rows = [("src", "run", i, ts, f"line {i}") for i, ts in enumerate(stamps_us)]
    rendered = render_lines(rows)
    assert [line["ts"] for line in rendered] == [ts_to_iso(ts) for ts in stamps_us]
    assert [(line["source"], line["run_id"], line["seq"], line["line"]) for line in rendered] == [
        (s, r, seq, text) for s, r, seq, _ts, text in rows
    ]


def test_render_lines_edges_of_the_stored_range_and_the_epoch():
    edges = [MIN_TS_US, MIN_TS_US + 1, -1_000_001, -1_000_000, -999_999, -1, 0, 1, 999_999, 1_000_000, MAX_TS_US - 1, MAX_TS_US]
    rendered = render_lines([("s", "r", i, ts, "x") for i, ts in enumerate(edges)])
    assert [line["ts"] for line in rendered] == [ts_to_iso(ts) for ts in edges]
    assert rendered[0]["ts"] == "0001-01-01T00:00:00.000000Z" and rendered[-1]["ts"] == "9999-12-31T23:59:59.999999Z"
