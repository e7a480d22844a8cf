"""The tail cache's load from the database, narrowed to where the stream's newest lines are.

``StreamIndex.tail_bounds`` says which seqs the newest lines have and when they were committed
(``received_at``). DuckDB keeps exact min/max of numbers per row group, and rows are stored in commit
order, so ``received_at BETWEEN since AND until`` skips every row group written outside that window:
a stream that wrote its newest lines in the last minute reads the last minute's row groups, not the
last hundred thousand rows of every instance. The seq floor alone skipped only the row groups whose
every seq is below the floor, which is few when streams advance at different rates.

The window is checked, not trusted: when the rows found with seqs up to the newest one known do not
number what the index holds, the load falls back to the floor query (``reads.load_tail``) and says so
in the log. ``refine_in_background`` narrows the windows of the streams loaded at start-up (they
only know their first and last commit) with one aggregate, off the request path.
"""

from __future__ import annotations

import logging
import threading

from ingest import reads
from ingest.reads import TAIL_LOAD_SQL, deadline_cursor
from ingest.streams import TailBounds
from ingest.tailcache import TailRow

logger = logging.getLogger(__name__)

WINDOW_SQL = TAIL_LOAD_SQL + " AND received_at BETWEEN make_timestamp(?) AND make_timestamp(?)"
REFINE_TIMEOUT_S = 120.0


def load_tail(con, timeout_s: float, instance_id: str, source: str, n: int,
              bounds: TailBounds | None) -> tuple[list[TailRow], bool]:
    """The newest ``n`` lines of (instance, source), oldest first, and whether they are all of them."""
    if bounds is None:
        return reads.load_tail(con, timeout_s, instance_id, source, n, None)
    floor = (bounds.run_id, bounds.first_seq, bounds.complete)
    if bounds.since_us is None or bounds.until_us is None:
        return reads.load_tail(con, timeout_s, instance_id, source, n, floor)
    with deadline_cursor(con, timeout_s) as cur:
        cur.execute(WINDOW_SQL, [instance_id, source, bounds.run_id, bounds.first_seq, bounds.since_us, bounds.until_us])
        found = cur.fetchall()
    known = sum(1 for seq, _ts, _line in found if seq <= bounds.last_seq)
    if known != bounds.lines:
        logger.warning("tail of %s/%s: %d of %d lines inside the commit window; reading without it",
                       instance_id, source, known, bounds.lines)
        return reads.load_tail(con, timeout_s, instance_id, source, n, floor)
    found.sort()
    tail = [(bounds.run_id, seq, ts, line) for seq, ts, line in found[-n:]] if n else []
    return tail, bounds.complete and len(found) <= n


def refine_in_background(reader) -> threading.Thread:
    """Narrow the start-up windows (``StreamIndex.refine``) on a thread of its own, through a tracked
    cursor of ``reader`` (interrupted when the reader closes). Until it finishes, loads use the wide
    windows, which are just as correct."""

    def run() -> None:
        try:
            with deadline_cursor(reader, REFINE_TIMEOUT_S) as cur:
                narrowed = reader.index.refine(cur, reader.tail.capacity)
            logger.info("tail windows narrowed for %d streams", narrowed)
        except Exception as e:  # the wide windows stay: slower first tails, never wrong ones
            logger.warning("tail windows not narrowed: %s", e)

    thread = threading.Thread(target=run, name="fleetlog-tail-refine", daemon=True)
    thread.start()
    return thread
