"""The reads' deadlines (ingest/db/deadlines.py): a read past its deadline is interrupted, one that ended is
never interrupted after (its cursor may run the next read), and what was cancelled does not pile up."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from ingest.db.deadlines import Deadlines
from ingest.errors import QueryTimeout
from ingest.db import reads

SLOW_SQL = "SELECT count(*) FROM range(10000000000) a WHERE a.range % 7 = 3"


def test_a_read_past_its_deadline_is_interrupted():
    con = duckdb.connect()
    started = time.monotonic()
    with pytest.raises(QueryTimeout):
        with reads.deadline_cursor(con, 0.3) as cur:
            cur.execute(SLOW_SQL).fetchall()
    assert time.monotonic() - started < 30
    assert con.execute("SELECT 42").fetchall() == [(42,)]  # the cursor's next read runs whole


def test_a_cancelled_deadline_never_fires_and_the_earliest_goes_first():
    deadlines = Deadlines()
    fired: list[str] = []
    done = threading.Event()
    late = deadlines.watch(lambda: fired.append("late"), 0.6)
    cancelled = deadlines.watch(lambda: fired.append("cancelled"), 0.2)
    deadlines.watch(lambda: (fired.append("early"), done.set()), 0.1)  # earlier than every deadline held
    deadlines.cancel(cancelled)
    assert done.wait(30)
    deadline = time.monotonic() + 30
    while "late" not in fired and time.monotonic() < deadline:
        time.sleep(0.02)
    deadlines.cancel(late)  # too late: it fired already; cancelling does nothing
    assert fired == ["early", "late"]


def test_reads_that_end_in_time_leave_nothing_behind():
    deadlines = Deadlines()
    calls = []
    for _ in range(20_000):
        deadlines.cancel(deadlines.watch(lambda: calls.append(1), 60))
    assert deadlines.pending() <= 1024 + 2 and calls == []
