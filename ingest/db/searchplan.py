"""The search's side of the token filter (ingest/db/searchtokens.py, the writer's side): which parts of a window
may hold a text, newest first.

A search asks ``admitted_ranges`` for the parts of its window whose blocks hold every letter trigram of its text:
the closed runs' blocks by their runs' rows (migration 025), the blocks after them by their bits, and the writer's
open block from its memory. The parts are disjoint in ts (a row is scanned once), each with the ``received_at``
ranges of its blocks (their rows lie there: migration 020), and made as the search reads them, from the newest;
``newest_first`` cuts a part of many blocks into ts windows. The plan says how the filter was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import duckdb

from ingest.db import searchtokens as tokens


@dataclass
class Plan:
    """How a search used the filter: rendered as the answer's ``scanned``."""

    filter: str  # "trigrams", or why not: "no trigram in q", "regex", "off"
    blocks: int = 0  # blocks overlapping the window
    blocks_admitted: int = 0  # of those, the ones that may hold a hit (all of them without the filter)
    ranges_scanned: int = 0  # time ranges scanned (admitted blocks merged), newest first until the limit

    def as_dict(self) -> dict:
        return {"filter": self.filter, "blocks": self.blocks, "blocks_admitted": self.blocks_admitted,
                "ranges_scanned": self.ranges_scanned}


MAX_STAMP_RANGES = 32  # received_at ranges one scan ORs together (a UNION ALL branch each); closer ones are merged


@dataclass(frozen=True)
class Range:
    """A part ``[lower, upper)`` of the window, and where its admitted rows lie in commit order: the
    ``received_at`` ranges ``[lo, hi]`` of its blocks (disjoint), or None when a block has none (scan
    the part)."""

    lower: int
    upper: int
    stamps: tuple[tuple[int, int], ...] | None = None
    blocks: tuple[tuple[int, int, int, int | None, int | None], ...] = ()  # its blocks: (min_ts, max_ts, block, rlo, rhi)
    lines: int | None = None  # its blocks' lines (None: not counted)


def _stamp_ranges(blocks: list[tuple[int, int | None, int | None]]) -> tuple[tuple[int, int], ...] | None:
    """The received_at ranges of ``blocks`` (block, lo, hi) merged: overlapping ones (a commit shared
    by two blocks, a clock stepped back: a row must be read once) and consecutive blocks (nothing lies
    between them) join, and beyond MAX_STAMP_RANGES the closest ones do. None if any block has none."""
    if any(lo is None for _, lo, _ in blocks):
        return None
    merged: list[list[int]] = []  # [lo, hi, last block]
    for block, lo, hi in sorted(blocks, key=lambda b: (b[1], b[0])):
        if merged and (lo <= merged[-1][1] or block == merged[-1][2] + 1):
            merged[-1][1], merged[-1][2] = max(merged[-1][1], hi), block
        else:
            merged.append([lo, hi, block])
    while len(merged) > MAX_STAMP_RANGES:
        gaps = sorted(range(len(merged) - 1), key=lambda i: merged[i + 1][0] - merged[i][1])
        cut = set(gaps[: len(merged) - MAX_STAMP_RANGES])
        joined: list[list[int]] = []
        for i, r in enumerate(merged):
            if i - 1 in cut:
                joined[-1][1], joined[-1][2] = max(joined[-1][1], r[1]), r[2]
            else:
                joined.append(list(r))
        merged = joined
    return tuple((lo, hi) for lo, hi, _ in merged)


# The closed runs before $runs that hold every trigram, with the AND of their rows: bit i set, block run * size + i
# may match (a run lacking a trigram has fewer rows, and none of its blocks may match).
RUNS_ADMITTED = """m AS MATERIALIZED (SELECT run, bit_and(blocks) AS mask FROM log_block_grams WHERE run < $runs AND gram IN ({grams})
    GROUP BY run HAVING count(*) = $n)"""
WINDOW_SQL = "max_ts >= make_timestamp($since) AND min_ts < make_timestamp($until)"
# What a search reads of the filter at once, by ``kind``: 0, the admitted blocks it has at once (block, lo, hi, rlo,
# rhi): those from $end (their bits hold every trigram: ``block >= $end`` keeps the scan from the older blocks' bits)
# and those of the admitted runs across the window's edge (their masks, each block's ts), or of every admitted run when
# those inside the window admit at most $few blocks; else 1, the admitted runs inside the window (run, first block,
# newest max_ts, admitted blocks, mask), whose blocks are read as the search reaches them; 2, the window's blocks,
# their newest max_ts, and the newest stored block (an open block of that number or below was stored meanwhile).
ADMITTED_SQL = """
WITH {m},
r AS (SELECT m.run, m.mask, x.first_block, x.max_ts,
             x.min_ts >= make_timestamp($since) AND x.max_ts < make_timestamp($until) AS inside
      FROM m JOIN log_block_runs x ON x.run = m.run
      WHERE x.max_ts >= make_timestamp($since) AND x.min_ts < make_timestamp($until)),
few AS (SELECT coalesce(sum(bit_count(mask)), 0) <= $few AS few FROM r WHERE inside),
edge AS (SELECT run, mask FROM r, few WHERE NOT inside OR few)
SELECT 0 AS kind, b.block, epoch_us(b.min_ts) AS a, epoch_us(b.max_ts) AS b, epoch_us(b.min_received_at) AS c,
       epoch_us(b.max_received_at) AS d, b.lines, NULL::VARCHAR AS mask
FROM log_blocks b JOIN edge ON b.block // {size} = edge.run
WHERE b.{window} AND get_bit(edge.mask, (b.block % {size})::INT) = 1
UNION ALL
SELECT 0, block, epoch_us(min_ts), epoch_us(max_ts), epoch_us(min_received_at), epoch_us(max_received_at), lines, NULL
FROM log_blocks WHERE block >= $end AND {window} AND {test}
UNION ALL
SELECT 1, run, first_block, epoch_us(max_ts), bit_count(mask), NULL, NULL, mask::VARCHAR FROM r, few WHERE inside AND NOT few
UNION ALL
SELECT 2, NULL, count(*), epoch_us(max(max_ts)), (SELECT max(block) FROM log_blocks), NULL, NULL, NULL FROM log_blocks WHERE {window}"""
# The blocks of a run (a UNION ALL branch each): its admitted ones are kept by its mask, in Python (an IN list of a
# run's 1,024 blocks cost 3-6 ms to plan, the mask tested in SQL 2 ms, the range alone 1 ms).
RUN_BLOCKS_SQL = """
SELECT block, epoch_us(min_ts), epoch_us(max_ts), epoch_us(min_received_at), epoch_us(max_received_at), lines
FROM log_blocks WHERE block BETWEEN {first} AND {last}"""
RUN_LOAD_BLOCKS = 512  # admitted blocks of the runs inside the window: at most this many, and they are read at once


def admitted_ranges(cur: duckdb.DuckDBPyConnection, grams: set[int], since_us: int, until_us: int,
                    plan: Plan, open_block: tokens.Block | None = None, runs: int | None = None) -> Iterator[Range]:
    """The parts of the window that blocks holding every trigram cover, newest first, merged so that
    none overlaps another (a row is scanned once), each with the received_at ranges of its blocks.
    ``open_block``: the writer's (``BlockWriter.open_block``, taken before this reads log_blocks), or the rows
    after the newest stored block (``uncovered``); a block of that number in log_blocks was closed meanwhile.

    The closed runs' blocks (migration 025: ``runs`` of them, ``BlockWriter.runs_written``, else ``tokens.RUNS_SQL``) are
    admitted by ANDing their runs' rows of the text's trigrams; only the blocks after them have their bits tested (at 100 M lines the bits of 48,829 blocks were
    ~107 MB a search). The runs are read first: a run written meanwhile only has its blocks tested by their bits.

    The plan's counts are set at once; the parts are made as the search asks for them, from the newest, and an
    admitted run inside the window has its blocks read only when the search reaches its newest ts (``_newest``):
    a common word stops at its newest part, and at 100 M lines reading all its 48,829 admitted blocks cost more
    than the rest of its search."""
    if runs is None:
        ((runs,),) = cur.execute(tokens.RUNS_SQL, {"size": tokens.RUN_BLOCKS}).fetchall()
    ordered = sorted(grams)
    sql = ADMITTED_SQL.format(m=RUNS_ADMITTED.format(grams=", ".join(map(str, ordered))), size=tokens.RUN_BLOCKS,
                              window=WINDOW_SQL, test=" AND ".join(f"get_bit(bits, {g}) = 1" for g in ordered))
    rows = cur.execute(sql, {"since": since_us, "until": until_us, "runs": runs, "end": runs * tokens.RUN_BLOCKS,
                             "n": len(grams), "few": RUN_LOAD_BLOCKS}).fetchall()
    blocks = [r[1:7] for r in rows if r[0] == 0]
    inside = [(newest, first, count, mask) for kind, _, first, newest, count, _, _, mask in rows if kind == 1]
    ((_, _, window_blocks, _, top, _, _, _),) = [r for r in rows if r[0] == 2]
    if open_block is not None:
        block, lo, hi, rlo, rhi, n = open_block.block, *open_block.scalars()[1:], open_block.lines
        if n and hi >= since_us and lo < until_us and (top is None or block > top):  # else stored meanwhile: in log_blocks
            window_blocks += 1
            if grams <= open_block.grams:
                blocks.append((block, lo, hi, rlo, rhi, n))
    plan.blocks = window_blocks
    plan.blocks_admitted = len(blocks) + sum(count for _, _, count, _ in inside)
    return _parts(_newest(cur, blocks, inside), since_us, until_us)


def _newest(cur, blocks: list[tuple], runs: list[tuple]) -> Iterator[tuple]:
    """``blocks`` (block, lo, hi, rlo, rhi, lines) and the admitted blocks of ``runs`` (newest max_ts, first block, admitted
    blocks, mask), newest hi first. A run's blocks are read once a block of it might be the next: when its newest
    max_ts is at least the newest hi in hand; with it, the runs after it when all of theirs are few (RUN_LOAD_BLOCKS).
    What is in hand is a list sorted newest first, sorted again with each run read (a few times a search: a heap
    cost ~2.5 us a block, 2.8 ms for a common word's first part of 1,133 blocks)."""
    ready = sorted(blocks, key=_newest_key, reverse=True)
    at = 0
    pending = sorted(runs, key=lambda r: r[0], reverse=True)
    left = sum(r[2] for r in pending)
    while at < len(ready) or pending:
        if pending and (at == len(ready) or pending[0][0] >= ready[at][2]):
            take = len(pending) if left <= RUN_LOAD_BLOCKS else 1
            ids = {first + i for _, first, _, mask in pending[:take] for i, bit in enumerate(mask) if bit == "1"}
            sql = "\nUNION ALL\n".join(RUN_BLOCKS_SQL.format(first=first, last=first + len(mask) - 1)
                                       for _, first, _, mask in pending[:take])
            left -= sum(r[2] for r in pending[:take])
            del pending[:take]
            ready = sorted(ready[at:] + [b for b in cur.execute(sql).fetchall() if b[0] in ids], key=_newest_key, reverse=True)
            at = 0
            continue
        yield ready[at]
        at += 1


def _newest_key(block: tuple) -> tuple[int, int]:
    return block[2], block[0]


def _parts(rows: Iterator[tuple], since_us: int, until_us: int) -> Iterator[Range]:
    """Blocks (block, lo, hi, rlo, rhi, lines) sorted by their newest ts, descending, merged into disjoint parts newest first (the mirror of merging
    intervals sorted by their start: a block joins the part when its span reaches the part's lower bound)."""
    lower = upper = 0
    blocks: list[tuple] = []  # (lo, hi, block, rlo, rhi) of the part being made
    lines = 0
    for block, lo, hi, rlo, rhi, n in rows:
        a, z = max(lo, since_us), min(hi + 1, until_us)
        if blocks and z >= lower:
            lower = min(lower, a)
        else:
            if blocks:
                yield Range(lower, upper, _stamp_ranges([b[2:] for b in blocks]), tuple(blocks), lines)
            lower, upper, blocks, lines = a, z, [], 0
        blocks.append((a, z, block, rlo, rhi))
        lines += n
    if blocks:
        yield Range(lower, upper, _stamp_ranges([b[2:] for b in blocks]), tuple(blocks), lines)


SPLIT_BLOCKS = 8  # a part of more admitted blocks is read in windows newest first (``newest_first``)
FIRST_WINDOW_US = 60_000_000


def newest_first(part: Range) -> list[Range]:
    """A part of many blocks cut into ts windows newest first, each reading only the blocks it overlaps:
    1 minute, then 2, 4, ... A common word's blocks overlap into one part the width of the whole window
    (streams interleave, clocks differ), so its one statement read every block, oldest row group first,
    to keep the newest ``limit``; its newest minute holds them. The windows are disjoint in ts, as parts
    are, so a row is read once and the search still stops at the first window that fills the limit."""
    if len(part.blocks) <= SPLIT_BLOCKS:
        return [part]
    out, upper, width = [], part.upper, FIRST_WINDOW_US
    while upper > part.lower:
        lower = max(part.lower, upper - width)
        inside = [(block, rlo, rhi) for lo, hi, block, rlo, rhi in part.blocks if hi > lower and lo < upper]
        if inside:
            out.append(Range(lower, upper, _stamp_ranges(inside)))
        upper, width = lower, width * 2
    return out
