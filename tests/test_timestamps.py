"""Time helpers live in one place (ingest/timestamps.py): nobody defines a clock or an epoch conversion of
its own, and nobody imports the policy engine just to read the clock."""

from __future__ import annotations

import datetime as dt
import re

from ingest.timestamps import datetime_to_us, now_us, ts_to_iso, utcnow
from tests.conftest import REPO

HELPERS = ("utcnow", "now_us", "ts_to_iso", "datetime_to_us")


def test_time_helpers_are_defined_once_and_imported_from_timestamps():
    found = []
    for path in sorted([*(REPO / "ingest").rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]):
        text = path.read_text()
        for name in HELPERS:
            if re.search(rf"^\s*def {name}\(", text, re.M) and path.name != "timestamps.py":
                found.append(f"{path.relative_to(REPO)} defines {name}")
            if re.search(rf"from ingest\.(?!timestamps\b)[\w.]+ import [^\n]*\b{name}\b", text):
                found.append(f"{path.relative_to(REPO)} imports {name} from elsewhere")
    assert found == []


def test_time_helpers_agree_with_each_other():
    before = now_us()
    now = utcnow()
    assert now.tzinfo is None and before - 1_000_000 <= datetime_to_us(now) <= now_us() + 1_000_000
    assert ts_to_iso(datetime_to_us(dt.datetime(2024, 5, 1, 12, 0, 0, 7))) == "2024-05-01T12:00:00.000007Z"
