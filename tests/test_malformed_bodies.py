"""Hundreds of malformed bodies: every one is a 4xx with the JSON error shape, and nothing is written."""

from __future__ import annotations

import gzip

import orjson
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from ingest.web.keys import DB

GOOD_LINE = {"seq": 0, "ts": 1764415248.0, "line": "ok"}

# A fixed corpus of the mistakes a client makes, each naming what must appear in the error.
CORPUS = [
    (b"", "body"), (b"{", "body"), (b"null", "body"), (b"[]", "body"), (b"42", "body"), (b'"x"', "body"),
    (b"\xff\xfe garbage", "body"),
    (orjson.dumps({"source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": "", "source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": "   ", "source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": 7, "source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": "a\nb", "source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": "x" * 300, "source": "s", "lines": [GOOD_LINE]}), "instance_id"),
    (orjson.dumps({"instance_id": "i", "lines": [GOOD_LINE]}), "source"),
    (orjson.dumps({"instance_id": "i", "source": "s", "run_id": "", "lines": [GOOD_LINE]}), "run_id"),
    (orjson.dumps({"instance_id": "i", "source": "s"}), "lines"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": {"seq": 0}}), "lines"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": ["text"]}), "lines[0]"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"ts": 1, "line": "x"}]}), "lines[0].seq"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 1.5, "line": "x"}]}), "lines[0].seq"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": True, "line": "x"}]}), "lines[0].seq"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 2**63, "line": "x"}]}), "lines[0].seq"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [GOOD_LINE, GOOD_LINE]}), "lines[1].seq"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "line": None}]}), "lines[0].line"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "line": ["x"]}]}), "lines[0].line"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "ts": "soon", "line": "x"}]}), "lines[0].ts"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "ts": -5, "line": "x"}]}), "lines[0].ts"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "ts": 1e300, "line": "x"}]}), "lines[0].ts"),
    (orjson.dumps({"instance_id": "i", "source": "s", "lines": [{"seq": 0, "ts": [1], "line": "x"}]}), "lines[0].ts"),
    (orjson.dumps({"streams": []}), "streams"),
    (orjson.dumps({"streams": "x"}), "streams"),
    (orjson.dumps({"streams": [None]}), "streams[0]"),
]


def _count(client) -> int:
    cursor = client.app[DB].cursor()
    try:
        return sum(cursor.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("logs", "events", "metrics", "instances"))
    finally:
        cursor.close()


async def _assert_refused(client, path: str, body: bytes, headers=None, fragment: str | None = None) -> None:
    r = await client.post(path, data=body, headers=headers or {"Content-Type": "application/json"})
    assert 400 <= r.status < 500, (body[:200], r.status)
    doc = await r.json()
    assert doc["ok"] is False and doc["status"] == r.status and isinstance(doc["error"], str) and doc["error"]
    if fragment is not None:
        assert fragment in doc["error"], (fragment, doc["error"])


async def test_corpus_of_malformed_log_bodies_is_refused_and_writes_nothing(client):
    for body, fragment in CORPUS:
        await _assert_refused(client, "/api/v1/logs", body, fragment=fragment)
        await _assert_refused(client, "/api/v1/logs", gzip.compress(body), {"Content-Encoding": "gzip"}, fragment)
    assert _count(client) == 0


EVENT_CORPUS = [
    {"kind": "registered"},
    {"instance_id": "i", "kind": "nope"},
    {"instance_id": "i"},
    {"instance_id": "i", "kind": "registered", "machine_id": "55891"},
    {"instance_id": "i", "kind": "registered", "machine_id": 1.5},
    {"instance_id": "i", "kind": "registered", "labels": ["x"]},
    {"instance_id": "i", "kind": "bench_done", "exit_code": "1"},
    {"instance_id": "i", "kind": "bench_done", "rate_per_hour": "fast"},
    {"instance_id": "i", "kind": "bench_done", "failure_excerpt": 3},
    {"instance_id": "i", "kind": "logs_complete"},
    {"instance_id": "i", "kind": "logs_complete", "sources": {"benchout": "9"}},
    {"instance_id": "i", "kind": "running", "ts": "tuesday"},
    [],
    [{"instance_id": "i", "kind": "running"}, {"instance_id": "i", "kind": "bogus"}],
]
METRIC_CORPUS = [
    {"samples": [{"name": "x", "value": 1}]},
    {"instance_id": "i"},
    {"instance_id": "i", "samples": []},
    {"instance_id": "i", "samples": [{"value": 1}]},
    {"instance_id": "i", "samples": [{"name": "x"}]},
    {"instance_id": "i", "samples": [{"name": "x", "value": None}]},
    {"instance_id": "i", "samples": [{"name": "x", "value": 1, "labels": "gpu=0"}]},
    {"instance_id": "i", "samples": [{"name": "x", "value": 1, "labels": {"gpu": [0]}}]},
    {"instance_id": "i", "samples": [{"name": "x", "value": 1, "ts": "later"}]},
]


async def test_corpus_of_malformed_events_and_metrics_is_refused_and_writes_nothing(client):
    for doc in EVENT_CORPUS:
        await _assert_refused(client, "/api/v1/events", orjson.dumps(doc))
    for doc in METRIC_CORPUS:
        await _assert_refused(client, "/api/v1/metrics", orjson.dumps(doc))
    assert _count(client) == 0


@st.composite
def broken_log_bodies(draw):
    """A valid body with one field replaced by something of the wrong shape."""
    doc = {"instance_id": "C.1", "source": "benchout", "lines": [dict(GOOD_LINE, seq=i) for i in range(3)]}
    target = draw(st.sampled_from(["instance_id", "source", "lines", "line.seq", "line.line", "line.ts", "line"]))
    if target == "line.ts":  # numbers and ISO strings are fine timestamps: keep only wrong shapes
        value = draw(st.sampled_from([[1], {"t": 1}, True, "not a time", -1, 1e20]))
    elif target == "line.seq":  # everything but an integer >= 0
        value = draw(st.one_of(st.integers(min_value=-(2**63), max_value=-1), st.floats(), st.text(), st.booleans(), st.none(), st.lists(st.integers(-(2**63), 2**63 - 1))))
    elif target in ("instance_id", "source"):
        value = draw(st.one_of(st.just(""), st.just(" "), st.integers(-(2**63), 2**63 - 1), st.none(), st.lists(st.text())))
    elif target == "line.line":
        value = draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.none(), st.lists(st.text()), st.booleans()))
    elif target == "lines":
        value = draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(), st.none(), st.dictionaries(st.text(), st.integers(-(2**63), 2**63 - 1))))
    else:  # a whole line that is not an object
        value = draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(), st.none(), st.lists(st.integers(-(2**63), 2**63 - 1))))
    index = draw(st.integers(0, 2))
    if target.startswith("line."):
        doc["lines"][index][target.split(".")[1]] = value
    elif target == "line":
        doc["lines"][index] = value
    else:
        doc[target] = value
    return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=broken_log_bodies())
async def test_generated_broken_bodies_are_refused_and_write_nothing(client, body):
    await _assert_refused(client, "/api/v1/logs", body)
    assert _count(client) == 0
