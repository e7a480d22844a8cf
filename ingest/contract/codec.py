"""Request bodies → validated rows. Every check names the field it refused; nothing here writes.

The shapes are DESIGN.md's API contract. Timestamps are epoch seconds (int or float) or ISO-8601
strings (a missing zone means UTC); they are kept as integer microseconds since the epoch.
A log line is ordered and deduplicated by ``seq`` (0, 1, 2, ... per (instance, source, run_id)).

Stored range of a timestamp: what Python's datetime renders, 0001-01-01T00:00:00Z to
9999-12-31T23:59:59.999999Z after the zone shift (epoch numbers: 0 to that end); anything else is a
400 naming the field, so that every stored row can be read back.

Ids (instance_id, source, run_id, metric names; the same rule for headers and OTLP attributes, see
``check_id``): 1 to 128 printable characters (``str.isprintable``: no control, format such as the
bidi override U+202E, separator other than space, or unassigned characters), not blank, not
starting with ``-`` (a value substituted into an actuator command must never read as an option).
A log source name follows the id rule and holds neither a double quote nor a backslash (``check_source``): the same
rule for a push's ``source`` (JSON, plain text, OTLP) and for the keys of a ``logs_complete``'s
``sources`` and ``dropped``, so every stream a push can create can be declared complete, and a name is
never read as JSON-path or escape syntax by whoever queries it. Seqs and counts are integers from 0 to
2^63-1 (BIGINT; a declared last seq may be -1: no line).

An event is at most ``MAX_EVENT_DEPTH`` objects or arrays deep (400 naming the field), well inside
what the JSON encoder that stores it can write.

Work is capped before it is done: ``Caps`` bounds the lines, streams and events of one request
(413 naming the cap), counted before any line is looked at.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import orjson

from ingest.contract import promnames
from ingest.errors import BadRequest, PayloadTooLarge
from ingest.timestamps import datetime_to_us

EVENT_KINDS = frozenset(
    {"registered", "params_done", "bench_started", "bench_done", "logs_complete", "running", "killed",
     "gpu_state"}
)
MAX_ID_CHARS = 128
MIN_TS_US = datetime_to_us(dt.datetime(1, 1, 1))  # 0001-01-01T00:00:00Z
MAX_TS_US = 253402300799_999999  # 9999-12-31T23:59:59.999999Z
MAX_SEQ = 2**63 - 1
MAX_EVENT_DEPTH = 64  # objects and arrays, the event itself included; orjson writes at most 254
MAX_TS_S = 253402300799.999  # last epoch second accepted (1 ms short of the end: a float is ~32 µs coarse there)


@dataclass(frozen=True)
class Caps:
    """Most lines (or samples), streams and events one request may carry (413 beyond)."""

    lines: int = 50_000
    streams: int = 1_000
    events: int = 1_000

    def check(self, what: str, count: int, limit: int, setting: str) -> None:
        if count > limit:
            raise PayloadTooLarge(f"{what}: {count} in one request is over the cap of {limit} ({setting})")


NO_CAPS = Caps(lines=2**62, streams=2**62, events=2**62)


@dataclass
class LogChunk:
    """Lines of one stream from one request. ``seqs`` is None when the server assigns them."""

    instance_id: str
    source: str
    run_id: str
    seqs: list[int] | None
    ts_us: list[int]
    lines: list[str]
    truncated: list[bool]
    ascending: bool = False  # seqs strictly increasing (the writer's fast path)


@dataclass
class Event:
    instance_id: str
    kind: str
    ts_us: int
    body: dict[str, Any]


@dataclass
class MetricRows:
    instance_id: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    ts_us: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.name)


def decode_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"body: malformed JSON: {e}") from e


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected an object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def check_id(value: Any) -> str | None:
    """Why ``value`` is not an acceptable id, or None when it is (the one rule; see the docstring)."""
    if not isinstance(value, str):
        return f"expected a non-empty string, got {_kind(value)}"
    if not value.strip():
        return "expected a non-empty string, got an empty string"
    if len(value) > MAX_ID_CHARS:
        return f"must be at most {MAX_ID_CHARS} characters, got {len(value)}"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"must be printable: no control or format characters (found U+{ord(bad):04X})"
    if value[0] == "-":
        return "must not start with '-'"
    return None


def parse_id(value: Any, where: str) -> str:
    why = check_id(value)
    if why is not None:
        raise BadRequest(f"{where}: {why}")
    return value


def check_source(value: Any) -> str | None:
    """Why ``value`` is not an acceptable log source name, or None (the id rule, and no double quote or backslash)."""
    why = check_id(value)
    if why is None and ('"' in value or "\\" in value):
        return "must not contain '\"' or '\\'"
    return why


def parse_source(value: Any, where: str) -> str:
    why = check_source(value)
    if why is not None:
        raise BadRequest(f"{where}: {why}")
    return value


def parse_ts(value: Any, where: str, default_us: int) -> int:
    if value is None:
        return default_us
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 <= value <= MAX_TS_S:  # NaN, infinities and out of range all fail this
            raise BadRequest(f"{where}: epoch seconds out of range (0 to {MAX_TS_S:.3f}): {value!r}"[:200])
        return int(value * 1_000_000)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise BadRequest(f"{where}: unparseable timestamp {value[:64]!r} (epoch seconds or ISO-8601)") from None
        us = datetime_to_us(parsed)  # no zone: UTC
        if not MIN_TS_US <= us <= MAX_TS_US:
            raise BadRequest(f"{where}: {value[:64]!r} is outside the stored range 0001-01-01T00:00:00Z to "
                             "9999-12-31T23:59:59.999999Z")
        return us
    raise BadRequest(f"{where}: expected epoch seconds or an ISO-8601 string, got {_kind(value)}")


def _refuse_repeated_seqs(seqs: list[int], prefix: str) -> None:
    """A seq twice in one request is the sender's bug: refuse it, naming the second one."""
    if len(set(seqs)) == len(seqs):
        return
    seen: set[int] = set()
    for i, seq in enumerate(seqs):
        if seq in seen:
            raise BadRequest(f"{prefix}lines[{i}].seq: {seq} appears twice in this request")
        seen.add(seq)


def truncate_line(line: str, max_bytes: int) -> tuple[str, bool]:
    """Cut a line to ``max_bytes`` of UTF-8 (never inside a character)."""
    if len(line) * 4 <= max_bytes:
        return line, False
    raw = line.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return line, False
    return raw[:max_bytes].decode("utf-8", "ignore"), True


def parse_logs(doc: Any, max_line_bytes: int, received_us: int, caps: Caps = Caps()) -> list[LogChunk]:
    """``{"instance_id", "source", "run_id"?, "lines": [...]}`` or ``{"streams": [that, ...]}``.

    The caps are checked (streams, then lines counted over every stream) before any line is parsed.
    """
    doc = _object(doc, "body")
    if "streams" in doc:
        streams = doc["streams"]
        if not isinstance(streams, list) or not streams:
            raise BadRequest("streams: expected a non-empty array")
        caps.check("streams", len(streams), caps.streams, "max_streams_per_request")
        total = sum(len(s["lines"]) for s in streams if type(s) is dict and type(s.get("lines")) is list)
        caps.check("lines", total, caps.lines, "max_lines_per_request")
        return [_parse_stream(s, f"streams[{i}]", max_line_bytes, received_us) for i, s in enumerate(streams)]
    if type(doc.get("lines")) is list:
        caps.check("lines", len(doc["lines"]), caps.lines, "max_lines_per_request")
    return [_parse_stream(doc, "", max_line_bytes, received_us)]


def _parse_stream(doc: Any, where: str, max_line_bytes: int, received_us: int) -> LogChunk:
    doc = _object(doc, where or "body")
    prefix = f"{where}." if where else ""
    instance_id = parse_id(doc.get("instance_id"), prefix + "instance_id")
    source = parse_source(doc.get("source"), prefix + "source")
    run_id = parse_id(doc.get("run_id", "0"), prefix + "run_id")
    lines = doc.get("lines")
    if not isinstance(lines, list):
        raise BadRequest(f"{prefix}lines: expected an array, got {_kind(lines)}")
    # The hot loop of ingest: error messages (and their f-strings) are built only on failure.
    seqs: list[int] = []
    ts_us: list[int] = []
    texts: list[str] = []
    cut_at: list[int] = []
    char_limit = max_line_bytes // 4  # a line this short cannot exceed the byte limit
    ascending = True
    prev = -1
    for i, item in enumerate(lines):
        if type(item) is not dict:
            raise BadRequest(f"{prefix}lines[{i}]: expected an object, got {_kind(item)}")
        seq = item.get("seq")
        if type(seq) is not int or seq < 0 or seq > MAX_SEQ:
            raise BadRequest(f"{prefix}lines[{i}].seq: expected an integer from 0 to 2^63-1, got {seq!r}"[:200])
        text = item.get("line")
        if type(text) is not str:
            raise BadRequest(f"{prefix}lines[{i}].line: expected a string, got {_kind(text)}")
        if len(text) > char_limit:
            text, cut = truncate_line(text, max_line_bytes)
            if cut:
                cut_at.append(i)
        ts = item.get("ts")
        if type(ts) is float and 0.0 <= ts <= MAX_TS_S:
            ts_us.append(int(ts * 1_000_000))
        else:
            ts_us.append(parse_ts(ts, f"{prefix}lines[{i}].ts", received_us))
        if seq <= prev:
            ascending = False
        prev = seq
        seqs.append(seq)
        texts.append(text)
    if not ascending:
        _refuse_repeated_seqs(seqs, prefix)
    truncated = [False] * len(seqs)
    for i in cut_at:
        truncated[i] = True
    return LogChunk(instance_id, source, run_id, seqs, ts_us, texts, truncated, ascending)


@functools.cache
def _push_decoder(max_line_chars: int) -> msgspec.json.Decoder:
    """A decoder of push bodies whose lines are all shorter than ``max_line_chars`` characters (a
    line that long may be over ``max_line_bytes``: such a body takes the reference path, which
    truncates). The structs are created per limit, once."""

    unset = msgspec.UnsetType
    line = msgspec.defstruct("Line", [
        ("seq", Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]),
        ("line", Annotated[str, msgspec.Meta(max_length=max_line_chars)]),
        ("ts", int | float | str | None, None),
    ], gc=False)
    stream = msgspec.defstruct("Stream", [
        ("instance_id", str), ("source", str), ("lines", list[line]), ("run_id", str, "0"),
    ], gc=False)
    push = msgspec.defstruct("Push", [
        ("instance_id", str | unset, msgspec.UNSET), ("source", str | unset, msgspec.UNSET),
        ("lines", list[line] | unset, msgspec.UNSET), ("run_id", str, "0"), ("streams", list[stream] | unset, msgspec.UNSET),
    ], gc=False)
    return msgspec.json.Decoder(push)


def parse_logs_body(body: bytes, max_line_bytes: int, received_us: int, caps: Caps = Caps()) -> list[LogChunk]:
    """``parse_logs(decode_json(body))``, in one pass for a well-formed body.

    msgspec decodes and type-checks the body into typed structs in C (no dict per line); what is left
    (ids, timestamps, caps, duplicates) is checked over whole columns. A body msgspec
    refuses, for whatever reason, goes through ``parse_logs``, so every error names what it did before.
    """
    try:
        push = _push_decoder(max_line_bytes // 4).decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return parse_logs(decode_json(body), max_line_bytes, received_us, caps)
    if push.streams is not msgspec.UNSET:
        streams = push.streams
        if not streams:
            raise BadRequest("streams: expected a non-empty array")
        caps.check("streams", len(streams), caps.streams, "max_streams_per_request")
        caps.check("lines", sum(len(s.lines) for s in streams), caps.lines, "max_lines_per_request")
        return [_columns(s.instance_id, s.source, s.run_id, s.lines, f"streams[{i}].", max_line_bytes, received_us)
                for i, s in enumerate(streams)]
    if push.lines is msgspec.UNSET or push.instance_id is msgspec.UNSET or push.source is msgspec.UNSET:
        return parse_logs(decode_json(body), max_line_bytes, received_us, caps)
    caps.check("lines", len(push.lines), caps.lines, "max_lines_per_request")
    return [_columns(push.instance_id, push.source, push.run_id, push.lines, "", max_line_bytes, received_us)]


def _columns(instance_id: str, source: str, run_id: str, items: list, prefix: str, max_line_bytes: int,
             received_us: int) -> LogChunk:
    """One stream's typed lines as columns, with ``_parse_stream``'s checks in its order."""
    parse_id(instance_id, prefix + "instance_id")
    parse_source(source, prefix + "source")
    parse_id(run_id, prefix + "run_id")
    seqs = [item.seq for item in items]
    texts = [item.line for item in items]
    stamps = [item.ts for item in items]
    if stamps and set(map(type, stamps)) == {float} and 0.0 <= min(stamps) and max(stamps) <= MAX_TS_S:
        ts_us = [int(t * 1_000_000) for t in stamps]
    else:
        ts_us = [int(t * 1_000_000) if type(t) is float and 0.0 <= t <= MAX_TS_S
                 else parse_ts(t, f"{prefix}lines[{i}].ts", received_us) for i, t in enumerate(stamps)]
    truncated = [False] * len(texts)  # no line reached max_line_bytes // 4 characters (the decoder checked)
    ascending = all(map(operator.lt, seqs, seqs[1:]))
    if not ascending:
        _refuse_repeated_seqs(seqs, prefix)
    return LogChunk(instance_id, source, run_id, seqs, ts_us, texts, truncated, ascending)


def parse_plain_lines(body: bytes, instance_id: Any, source: Any, max_line_bytes: int, received_us: int,
                      caps: Caps = Caps()) -> LogChunk:
    """The old manager's ``/api/log-push``: text, one line per line; the server assigns seq.

    The lines are counted (newlines, a C-speed scan) against the cap before any is decoded."""
    instance_id = parse_id(instance_id, "X-Instance-Id")
    source = parse_source(source, "X-Log-Source")
    count = body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)
    caps.check("lines", count, caps.lines, "max_lines_per_request")
    text = body.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    texts, truncated = [], []
    for line in lines:
        line, cut = truncate_line(line.removesuffix("\r"), max_line_bytes)
        texts.append(line)
        truncated.append(cut)
    return LogChunk(instance_id, source, "0", None, [received_us] * len(texts), texts, truncated, True)


def parse_events(doc: Any, received_us: int, caps: Caps = Caps()) -> list[Event]:
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise BadRequest("body: expected an event or a non-empty array of events")
    caps.check("events", len(items), caps.events, "max_events_per_request")
    out = []
    for i, item in enumerate(items):
        where = f"[{i}]" if isinstance(doc, list) else ""
        item = _object(item, where or "body")
        prefix = f"{where}." if where else ""
        instance_id = parse_id(item.get("instance_id"), prefix + "instance_id")
        kind = item.get("kind")
        if kind not in EVENT_KINDS:
            raise BadRequest(f"{prefix}kind: expected one of {', '.join(sorted(EVENT_KINDS))}, got {kind!r}"[:300])
        ts_us = parse_ts(item.get("ts"), prefix + "ts", received_us)
        _check_depth(item, prefix)
        _check_event_fields(item, kind, prefix)
        out.append(Event(instance_id, kind, ts_us, item))
    return out


_NUMBER_FIELDS = {
    "registered": {"machine_id": int, "host_id": int, "gpu_count": int, "dph": float},
    "params_done": {"exit_code": int},
    "bench_started": {"proofs": int, "concurrency": int, "partition_workers": int},
    "bench_done": {"exit_code": int, "rate_per_hour": float, "duration_s": float, "proofs_ok": int, "host_oom_kills": int},
}
_COLUMN_LIMITS = {"machine_id": 2**63, "host_id": 2**63}  # BIGINT; the other integers are INTEGER
# counts, prices, rates and durations: below zero they turn money negative and the rules' comparisons over
_NOT_NEGATIVE = {"gpu_count", "dph", "proofs", "concurrency", "partition_workers", "rate_per_hour", "duration_s",
                 "proofs_ok", "host_oom_kills"}
_STRING_FIELDS = {"registered": ("gpu_model", "location"), "bench_done": ("failure_excerpt",)}


def _check_event_fields(item: dict, kind: str, prefix: str) -> None:
    for name, kind_of in _NUMBER_FIELDS.get(kind, {}).items():
        value = item.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind_of is int and type(value) is not int):
            raise BadRequest(f"{prefix}{name}: expected {'an integer' if kind_of is int else 'a number'}, got {value!r}"[:200])
        limit = _COLUMN_LIMITS.get(name, 2**31) if kind_of is int else 1e300  # what the column stores
        if not (0 if name in _NOT_NEGATIVE else -limit) <= value < limit:
            raise BadRequest(f"{prefix}{name}: out of range, got {value!r}"[:200])
    for name in _STRING_FIELDS.get(kind, ()):
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{prefix}{name}: expected a string, got {_kind(value)}")
    if kind == "registered" and item.get("labels") is not None and not isinstance(item["labels"], dict):
        raise BadRequest(f"{prefix}labels: expected an object, got {_kind(item['labels'])}")
    if kind == "logs_complete":
        sources = item.get("sources")
        if not isinstance(sources, dict) or not sources:
            raise BadRequest(f"{prefix}sources: expected an object of source name -> last seq")
        _check_counts(sources, f"{prefix}sources", minimum=-1)
        dropped = item.get("dropped")
        if dropped is not None:
            if not isinstance(dropped, dict):
                raise BadRequest(f"{prefix}dropped: expected an object of source name -> lines dropped, got {_kind(dropped)}")
            _check_counts(dropped, f"{prefix}dropped", minimum=0)
        if "run_id" in item:
            parse_id(item["run_id"], prefix + "run_id")


def _check_counts(counts: dict, where: str, *, minimum: int) -> None:
    """Source name -> seq or count: each name a source name, each number from ``minimum`` to 2^63-1
    (null allowed: it declares nothing)."""
    for name, n in counts.items():
        why = check_source(name)
        if why is not None:
            raise BadRequest(f"{where}: source name {name[:64]!r}: {why}")
        if n is not None and (type(n) is not int or not minimum <= n <= MAX_SEQ):
            raise BadRequest(f"{where}.{name}: expected an integer from {minimum} to 2^63-1, got {n!r}"[:200])


def _check_depth(item: dict, prefix: str) -> None:
    """Each field of an event nests at most MAX_EVENT_DEPTH - 1 objects or arrays (the event is one)."""
    for name, value in item.items():
        if nests_deeper(value, MAX_EVENT_DEPTH - 1):
            raise BadRequest(f"{prefix}{name}: nested deeper than {MAX_EVENT_DEPTH} levels (objects and arrays)")


def nests_deeper(value: Any, levels: int) -> bool:
    """Whether ``value`` holds more than ``levels`` objects or arrays inside one another; walked
    without recursion, stopping at the first too deep."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if type(value) is dict:
            children = value.values()
        elif type(value) is list:
            children = value
        else:
            continue
        if depth > levels:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_metrics(doc: Any, received_us: int, caps: Caps = Caps()) -> MetricRows:
    """``{"instance_id", "samples": [{"name", "ts", "value", "labels"}]}`` (samples count as lines)."""
    doc = _object(doc, "body")
    instance_id = parse_id(doc.get("instance_id"), "instance_id")
    samples = doc.get("samples")
    if not isinstance(samples, list) or not samples:
        raise BadRequest(f"samples: expected a non-empty array, got {_kind(samples)}")
    caps.check("samples", len(samples), caps.lines, "max_lines_per_request")
    rows = MetricRows()
    for i, sample in enumerate(samples):
        at = f"samples[{i}]"
        sample = _object(sample, at)
        name = parse_id(sample.get("name"), at + ".name")
        value = sample.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise BadRequest(f"{at}.value: expected a number, got {value!r}"[:200])
        labels = sample.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, (str, int, float)) for v in labels.values()):
            raise BadRequest(f"{at}.labels: expected an object of strings")
        labels = {str(k): str(v) for k, v in labels.items()}
        if promnames.feeds_gauges(name):  # exposed on /metrics under its own name and labels
            if (why := promnames.check_metric_name(name)) is not None:
                raise BadRequest(f"{at}.name: {why}")
            if (why := promnames.check_labels(labels)) is not None:
                raise BadRequest(f"{at}.labels: {why}")
        rows.instance_id.append(instance_id)
        rows.name.append(name)
        rows.ts_us.append(parse_ts(sample.get("ts"), at + ".ts", received_us))
        rows.value.append(float(value))
        rows.labels.append(orjson.dumps(labels).decode())
    return rows
