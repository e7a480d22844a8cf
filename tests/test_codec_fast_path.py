"""The one-pass decoder of push bodies (msgspec) against the reference path (orjson + per-line checks):
for any body, the same chunks or the same error."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings, strategies as st

from ingest.contract import codec
from ingest.errors import RequestError

def mostly(good, bad):
    """Valid nine times in ten, so that most bodies reach the end of the one-pass path."""
    return st.integers(0, 9).flatmap(lambda k: good if k else bad)


ids = mostly(st.sampled_from(["C.1", "benchout", "0", "run-2"]), st.one_of(st.text(max_size=4), st.none(), st.integers(-2, 2)))
stamps = mostly(
    st.one_of(st.floats(min_value=0, max_value=2e9), st.none()),
    st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=3e11), st.integers(-5, 2**40),
              st.sampled_from(["2026-11-29T11:20:00Z", "2026-11-29T11:20:00", "soon", "0001-01-01T00:00:00+01:00"]),
              st.booleans(), st.just([1])),
)
seqs = mostly(st.integers(0, 30), st.one_of(st.integers(-3, -1), st.just(2**63 - 1), st.just(2**63), st.just(1.0), st.booleans(), st.none()))
texts = mostly(st.text(max_size=12), st.one_of(st.just("é" * 40), st.none(), st.integers(0, 3)))


@st.composite
def lines(draw):
    line = {}
    for name, values in (("seq", seqs), ("line", texts), ("ts", stamps)):
        if draw(st.integers(0, 30)):  # mostly present
            line[name] = draw(values)
    return line if draw(st.integers(0, 30)) else draw(st.one_of(st.none(), st.text(max_size=3), st.integers()))


@st.composite
def streams(draw):
    doc = {}
    for name in ("instance_id", "source", "run_id"):
        if draw(st.integers(0, 20)):
            doc[name] = draw(ids)
    if draw(st.integers(0, 20)):
        doc["lines"] = draw(st.lists(lines(), max_size=6))
    return doc


bodies = st.one_of(
    streams(),
    st.builds(lambda s: {"streams": s}, st.lists(streams(), max_size=3)),
    st.builds(lambda s, extra: {"streams": s, **extra}, st.lists(streams(), min_size=1, max_size=2), streams()),
)


def _outcome(fn):
    try:
        return fn()
    except RequestError as e:
        return (type(e).__name__, str(e))


@settings(max_examples=600, deadline=None)
@given(bodies, st.sampled_from([16, 64, 1000]), st.sampled_from([codec.Caps(), codec.Caps(lines=5, streams=2)]))
def test_one_pass_decoder_gives_the_reference_chunks_or_error(doc, max_line_bytes, caps):
    body = json.dumps(doc).encode()  # the stdlib writes integers past 64 bits too, as a hostile client may
    fast = _outcome(lambda: codec.parse_logs_body(body, max_line_bytes, 1_700_000_000_000_000, caps))
    reference = _outcome(lambda: codec.parse_logs(codec.decode_json(body), max_line_bytes, 1_700_000_000_000_000, caps))
    assert fast == reference


def test_one_pass_decoder_takes_the_usual_body_and_refuses_what_the_reference_refuses():
    good = {"instance_id": "C.1", "source": "benchout", "lines": [{"seq": i, "ts": 1764415248.5 + i, "line": f"l{i}"} for i in range(5)]}
    [chunk] = codec.parse_logs_body(orjson.dumps(good), 1000, 0)
    assert chunk.seqs == [0, 1, 2, 3, 4] and chunk.ts_us[0] == 1764415248_500000 and chunk.ascending
    for body in (b"{", b"\xff", b"[]", b'{"streams": null}'):
        try:
            codec.parse_logs_body(body, 1000, 0)
        except RequestError as e:
            assert "body" in str(e) or "streams" in str(e)
        else:
            raise AssertionError(body)
