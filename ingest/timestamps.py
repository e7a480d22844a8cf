"""Time, as the server keeps it: integer microseconds since the epoch (UTC), and naive UTC datetimes
where DuckDB's TIMESTAMP columns are compared (the policy rules' ``now``, the hosts' view).

No I/O beyond the clock; no validation (``codec.parse_ts`` judges what a body sends).
"""

from __future__ import annotations

import datetime as dt
import time

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_NAIVE_EPOCH = dt.datetime(1970, 1, 1)
_US = dt.timedelta(microseconds=1)


def now_us() -> int:
    return time.time_ns() // 1000


def utcnow() -> dt.datetime:
    """Now as a naive UTC datetime (what DuckDB's TIMESTAMP holds)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def ts_to_iso(ts_us: int) -> str:
    """Exact to the microsecond over the whole stored range (no float on the way)."""
    return (_NAIVE_EPOCH + dt.timedelta(microseconds=ts_us)).isoformat(timespec="microseconds") + "Z"


def datetime_to_us(value: dt.datetime) -> int:
    """A naive datetime (read back from DuckDB, or an ISO-8601 string without a zone) is UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - EPOCH) // _US
