"""The token filter: which blocks of log lines may hold a text (table ``log_blocks``, migration 014).

Invariants:
- Every log row the writer commits is counted in exactly one block, in the same transaction as the row
  (``BlockWriter.add`` runs inside ``store.write_batch``). A block is a run of consecutive rows in
  commit order, at most ``BLOCK_LINES`` long, with the ``[min_ts, max_ts]`` of its rows, the
  ``[min_received_at, max_received_at]`` of its rows (migration 020: the commit stamps, which follow
  commit order, so DuckDB's zone maps on ``received_at`` find the block's rows where its ts range, wide
  when streams interleave or clocks differ, cannot; a commit's rows are stamped its ``received_us`` plus
  their block's index among the blocks it touches, so a block's range holds no other block's rows while
  the clock moves forward) and ``bits``:
  a bitset of ``26**3`` bits holding at least every letter trigram of its lines. Extra bits are always
  allowed (they only make a search scan more); a missing one would lose a hit, so none may be missing.
  The ranges may be wider than the rows' (extra rows scanned), never narrower.
- Rows stored before migration 014 are in the catch-all block 0 (every bit set, their whole ts range);
  blocks written before 020 have no received_at range (NULL): a search scans their ts range.
- A letter trigram is three consecutive letters a-z after folding: ASCII letters lowered, the two
  characters DuckDB's ``lower`` (hence ``ILIKE``) turns into ASCII letters (U+212A KELVIN SIGN -> k,
  U+0130 -> i) folded the same way, and every other byte a separator. Whenever ``line ILIKE '%q%'``
  holds, each maximal letter run of the folded ``q`` is a substring of a letter run of the folded line,
  so every trigram of ``q`` is a trigram of the line: a block missing one cannot match.
- Digits are separators: numbers and hex ids do not prune (in a block of 2,048 lines every digit and
  hex trigram is present anyway); words do. A query with no trigram (``q``'s letter runs all shorter
  than 3) and a regular expression cannot use the filter: they scan the window, and say so.
- Lines written around the writer (straight into ``logs``) are in no block and a filtered search
  misses them: ``cover_unindexed`` adds a catch-all block for them. The lake mode keeps no blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

# Lines per block: an admitted block costs a scan of about this many lines. At 2 M lines, 2,048 (one of
# DuckDB's vectors) against 8,192: a rare phrase's 10 blocks 46 -> 25 ms, text found nowhere 1.5 -> 2.5 ms
# (4x the blocks' bits to test), +0.13 bytes on disk a line (bench/search_scale.py's file, in-process).
BLOCK_LINES = 2048
# The letter runs an open block remembers having cut into trigrams (``_Block.runs``): a cache, so bounded. Runs
# longer than RUN_CACHE_MAX_BYTES (base64, hashes: seen once) and runs beyond RUN_CACHE_MAX are cut every time.
# 2,048 lines of 4 KiB base64 held 687 k runs (59 MiB, copied each commit) before the bound.
RUN_CACHE_MAX = 8192
RUN_CACHE_MAX_BYTES = 32
NBITS = 26 ** 3
STAMP_TYPE = pa.timestamp("us")  # logs.received_at
_FOLD = bytes(c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 else 32 for c in range(256))
_TO_ASCII = ((b"\xe2\x84\xaa", b"k"), (b"\xc4\xb0", b"i"))  # U+212A, U+0130: DuckDB's lower() gives k, i


def fold(data: bytes) -> bytes:
    """UTF-8 text with every letter lowered to a-z and every other byte a space."""
    for seq, ascii_letter in _TO_ASCII:
        if seq in data:
            data = data.replace(seq, ascii_letter)
    return data.translate(_FOLD)


def letter_runs(data: bytes) -> set[bytes]:
    """The distinct letter runs of UTF-8 text, folded (lines concatenated are fine: a run across two
    lines gives extra trigrams, never a missing one). Split and made distinct by Arrow's kernels: a commit's
    800 lines hold ~17,000 runs but ~570 distinct ones, and only those become Python objects (``bytes.split``
    into a set: 1.17 -> 0.95 ms per 800 lines, alternating, in-process)."""
    folded = pa.array([fold(data)], pa.string())  # ASCII letters and spaces only
    runs = set(pc.unique(pc.ascii_split_whitespace(folded).flatten()).cast(pa.binary()).to_pylist())
    runs.discard(b"")  # Arrow's split keeps an empty run before leading spaces
    return runs


def trigrams_of(runs: set[bytes]) -> set[int]:
    """The trigrams of folded letter runs, as bit positions."""
    out: set[int] = set()
    for run in runs:
        for i in range(len(run) - 2):
            out.add((run[i] - 97) * 676 + (run[i + 1] - 97) * 26 + run[i + 2] - 97)
    return out


def trigrams(data: bytes) -> set[int]:
    """The letter trigrams of UTF-8 text, as bit positions."""
    return trigrams_of(letter_runs(data))


def bitstring(grams: set[int]) -> str:
    """The bit positions as DuckDB's BIT literal (position 0 first)."""
    chars = bytearray(b"0" * NBITS)
    for g in grams:
        chars[g] = 49
    return chars.decode()


@dataclass
class _Block:
    block: int
    lines: int
    min_us: int
    max_us: int
    grams: set[int] = field(default_factory=set)
    runs: set[bytes] = field(default_factory=set)  # the letter runs whose trigrams are in grams already
    min_received_us: int | None = None
    max_received_us: int | None = None
    stored: bool = False  # its row exists: the commit updates it rather than inserting it


class BlockWriter:
    """The writer's side: the open block, extended by each commit (on the writer thread only).

    ``add`` writes the blocks a commit touches inside its transaction and keeps them pending;
    ``committed`` makes them the state, ``rolled_back`` forgets them (the retry recomputes them)."""

    def __init__(self, block_lines: int = BLOCK_LINES) -> None:
        self.block_lines = block_lines
        self._open: _Block | None = None
        self._next_id: int | None = None
        self._pending: tuple[_Block | None, int, int] | None = None
        self.spread = 0  # the last commit's stamps ran from its received_us to received_us + spread

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        (top,) = con.execute("SELECT coalesce(max(block), 0) FROM log_blocks").fetchone()
        self._next_id = top + 1  # after a restart a new block begins: the last one may stay short

    def add(self, con: duckdb.DuckDBPyConnection, rows: pa.Table, received_us: int) -> pa.Array:
        """The blocks of a commit's rows (``store.LogColumns.table()``: one chunk a column), and the rows'
        ``received_at`` in order: ``received_us`` plus the index of the row's block among the blocks the commit
        touches (0 for the open block it continues). A block's slice of a commit is stamped apart from the
        commit's other blocks, so the block's received_at range holds its own rows and no other's: a commit of
        64 connections (~6,400 rows) no longer makes each of its blocks read all of it. The commit's stamps end
        at ``received_us + spread`` (``spread`` once it is committed).

        The rows are read block by block (one slice of the line bytes, one min/max of ts each), not body by
        body. The open block is extended in place: a rollback forgets it (``rolled_back``) and the next commit
        begins a new block, as after a restart, instead of each commit copying the block's trigrams and runs."""
        if self._next_id is None:
            self._load(con)
        block = self._open
        next_id = self._next_id
        touched: list[_Block] = []
        rows_of: list[int] = []  # rows stamped received_us + i, for each touched block i
        lines, ts = rows.column("line").combine_chunks(), rows.column("ts").combine_chunks()
        _, offsets, data = lines.buffers()
        at = memoryview(offsets).cast("i") if data is not None else None
        start, total = 0, rows.num_rows
        while start < total:
            if block is None or block.lines >= self.block_lines:
                block = _Block(next_id, 0, 0, 0)
                next_id += 1
            touched.append(block)
            rows_of.append(0)
            stamp = received_us + len(touched) - 1
            n = min(self.block_lines - block.lines, total - start)
            if at is not None:  # the bytes of rows [start, start + n), through the int32 offsets
                lo, hi = at[lines.offset + start], at[lines.offset + start + n]
                # a block's lines repeat their words: only runs it has not seen are cut into trigrams
                # (the block writer's CPU in a real server at 8 connections: 5.4 -> 4.2 ms a commit)
                fresh = letter_runs(data.slice(lo, hi - lo).to_pybytes()) - block.runs
                block.grams |= trigrams_of(fresh)
                if len(block.runs) < RUN_CACHE_MAX:
                    block.runs.update(r for r in fresh if len(r) <= RUN_CACHE_MAX_BYTES)
            bounds = pc.min_max(ts.slice(start, n))
            lo_us, hi_us = bounds["min"].value, bounds["max"].value
            block.min_us = lo_us if block.lines == 0 else min(block.min_us, lo_us)
            block.max_us = hi_us if block.lines == 0 else max(block.max_us, hi_us)
            block.lines += n
            if block.min_received_us is None:
                block.min_received_us = block.max_received_us = stamp
            block.min_received_us = min(block.min_received_us, stamp)
            block.max_received_us = max(block.max_received_us, stamp)
            rows_of[-1] += n
            start += n
        for b in touched:
            params = {"b": b.block, "n": b.lines, "lo": b.min_us, "hi": b.max_us, "bits": bitstring(b.grams),
                      "rlo": b.min_received_us, "rhi": b.max_received_us}
            if b.stored:
                con.execute("UPDATE log_blocks SET lines = $n, min_ts = make_timestamp($lo), max_ts = make_timestamp($hi), "
                            "bits = $bits::BIT, min_received_at = make_timestamp($rlo), max_received_at = make_timestamp($rhi) "
                            "WHERE block = $b", params)
            else:
                con.execute("INSERT INTO log_blocks (block, min_ts, max_ts, lines, bits, min_received_at, max_received_at) "
                            "VALUES ($b, make_timestamp($lo), make_timestamp($hi), $n, $bits::BIT, make_timestamp($rlo), "
                            "make_timestamp($rhi))", params)
        self._pending = (block, next_id, max(len(touched) - 1, 0))
        return pa.concat_arrays([pa.repeat(pa.scalar(received_us + i, STAMP_TYPE), n) for i, n in enumerate(rows_of)]
                                or [pa.array([], STAMP_TYPE)])

    def committed(self) -> None:
        self.spread = 0
        if self._pending is not None:
            self._open, self._next_id, self.spread = self._pending
            if self._open is not None:
                self._open.stored = True
            self._pending = None

    def rolled_back(self) -> None:
        """The open block was changed in place by the commit that failed: forgotten, with the ids (read again)."""
        self._pending = None
        self._open = None
        self._next_id = None


def cover_unindexed(con: duckdb.DuckDBPyConnection) -> None:
    """A catch-all block (every bit set) over the ts range of every stored line: for rows written
    straight into ``logs`` (benchmarks, tools), which a filtered search would otherwise miss."""
    con.execute(
        "INSERT INTO log_blocks (block, min_ts, max_ts, lines, bits, min_received_at, max_received_at) "
        "SELECT (SELECT coalesce(max(block), 0) + 1 FROM log_blocks), min(ts), max(ts), count(*), "
        f"repeat('1', {NBITS})::BIT, min(received_at), max(received_at) FROM logs HAVING count(*) > 0"
    )


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


def admitted_ranges(cur: duckdb.DuckDBPyConnection, grams: set[int], since_us: int, until_us: int,
                    plan: Plan) -> list[Range]:
    """The parts of the window that blocks holding every trigram cover, newest first, merged so that
    none overlaps another (a row is scanned once), each with the received_at ranges of its blocks."""
    test = " AND ".join(f"get_bit(bits, {g}) = 1" for g in sorted(grams))
    rows = cur.execute(
        f"SELECT block, epoch_us(min_ts), epoch_us(max_ts), epoch_us(min_received_at), epoch_us(max_received_at), {test} "
        "FROM log_blocks WHERE max_ts >= make_timestamp($since) AND min_ts < make_timestamp($until)",
        {"since": since_us, "until": until_us},
    ).fetchall()
    plan.blocks = len(rows)
    spans = sorted((max(lo, since_us), min(hi + 1, until_us), (block, rlo, rhi))
                   for block, lo, hi, rlo, rhi, may in rows if may)
    plan.blocks_admitted = len(spans)
    merged: list[list] = []  # [lower, upper, blocks]
    for lo, hi, block in spans:  # oldest first
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
            merged[-1][2].append((lo, hi, block))
        else:
            merged.append([lo, hi, [(lo, hi, block)]])
    return [Range(lo, hi, _stamp_ranges([b for _, _, b in blocks]), tuple((a, z, *b) for a, z, b in blocks))
            for lo, hi, blocks in reversed(merged)]


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
