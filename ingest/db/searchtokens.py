"""The token filter, the writer's side: which blocks of log lines may hold a text (table ``log_blocks``, migration
014, and its runs, 025). The search's side is ingest/db/searchplan.py.

Invariants:
- Every log row the writer commits is counted in exactly one block: a stored one (``log_blocks``, its row
  written by the commit that fills it, in the same transaction) or the open block, which the writer keeps
  in memory (``BlockWriter.open_block``: searches read it before log_blocks) and which holds exactly the
  rows stamped after the newest stored block (commit stamps never step back: ``BlockWriter.stamp``), so a
  writer that dies leaves it to be rebuilt from those rows (``uncovered``). A block is a run of consecutive
  rows in commit order, at most ``BLOCK_LINES`` long, with the ``[min_ts, max_ts]`` of its rows, the
  ``[min_received_at, max_received_at]`` of its rows (migration 020: the commit stamps, which follow
  commit order, so DuckDB's zone maps on ``received_at`` find the block's rows where its ts range, wide
  when streams interleave or clocks differ, cannot; a commit's rows are stamped its ``received_us`` plus
  their block's index among the blocks it touches, so a block's range holds no other block's rows while
  the clock moves forward) and ``bits``:
  a bitset of ``26**3`` bits holding at least every letter trigram of its lines. Extra bits are always
  allowed (they only make a search scan more); a missing one would lose a hit, so none may be missing.
  The ranges may be wider than the rows' (extra rows scanned), never narrower.
- Runs (migration 025): blocks ``r * RUN_BLOCKS`` to ``(r + 1) * RUN_BLOCKS - 1`` are run ``r``. Once all its blocks
  are stored (a stored block's number is past it), a run is written transposed, in the commit that stores its last
  block (or the next writer's first, for a database from before 025 or RUN_BLOCKS changed): ``log_block_grams`` holds,
  for each trigram set in some block of the run, the bitset of its blocks that hold it, exactly as their bits say;
  ``log_block_runs`` its block range and ts range. Runs are written in order, 0 .. n - 1; a search uses them only
  when all are of RUN_BLOCKS blocks (``RUNS_SQL``), and tests the bits of the blocks after them.
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
- Lines written around the writer (straight into ``logs``) before the newest stored block are in no block
  and a filtered search misses them: ``cover_unindexed`` adds a catch-all block for them (those after it
  are taken for the open block's). The lake mode keeps no blocks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

# Lines per block: an admitted block costs a scan of about this many lines. At 2 M lines, 2,048 (one of
# DuckDB's vectors) against 8,192: a rare phrase's 10 blocks 46 -> 25 ms, text found nowhere 1.5 -> 2.5 ms
# (4x the blocks' bits to test), +0.13 bytes on disk a line (bench/search_scale.py's file, in-process).
BLOCK_LINES = 2048
# The letter runs an open block remembers having cut into trigrams (``Block.runs``): a cache, so bounded. Runs
# longer than RUN_CACHE_MAX_BYTES (base64, hashes: seen once) and runs beyond RUN_CACHE_MAX are cut every time.
# 2,048 lines of 4 KiB base64 held 687 k runs (59 MiB, copied each commit) before the bound.
RUN_CACHE_MAX = 8192
RUN_CACHE_MAX_BYTES = 32
NBITS = 26 ** 3
# Blocks per run (migration 025): a closed run's blocks are found by their trigrams' rows, one per run, not by each
# block's bits. 1,024 blocks are ~2 M lines; the open run's blocks (at most this many) are still tested one by one.
RUN_BLOCKS = 1024
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
class Block:
    block: int
    lines: int
    min_us: int
    max_us: int
    grams: set[int] = field(default_factory=set)
    runs: set[bytes] = field(default_factory=set)  # the letter runs whose trigrams are in grams already
    min_received_us: int | None = None
    max_received_us: int | None = None

    def extend(self, data: bytes | None, lo_us: int, hi_us: int, n: int, stamp: int) -> None:
        """Count ``n`` more lines (``data``: their bytes, ts from ``lo_us`` to ``hi_us``, stamped ``stamp``), in
        place: a reader holding the block sees it only grow. A block's lines repeat their words: only runs it has not
        seen are cut into trigrams (the block writer's CPU in a real server at 8 connections: 5.4 -> 4.2 ms a commit)."""
        if data:
            fresh = letter_runs(data) - self.runs
            self.grams |= trigrams_of(fresh)
            if len(self.runs) < RUN_CACHE_MAX:
                self.runs.update(r for r in fresh if len(r) <= RUN_CACHE_MAX_BYTES)
        self.min_us = lo_us if self.lines == 0 else min(self.min_us, lo_us)
        self.max_us = hi_us if self.lines == 0 else max(self.max_us, hi_us)
        self.min_received_us = stamp if self.min_received_us is None else min(self.min_received_us, stamp)
        self.max_received_us = stamp if self.max_received_us is None else max(self.max_received_us, stamp)
        self.lines += n

    def scalars(self) -> tuple:
        return self.lines, self.min_us, self.max_us, self.min_received_us, self.max_received_us

    def restore(self, scalars: tuple) -> None:
        """Back to ``scalars()`` as they were (a rolled-back commit): its trigrams stay, extra bits being allowed."""
        self.lines, self.min_us, self.max_us, self.min_received_us, self.max_received_us = scalars


def _insert(con: duckdb.DuckDBPyConnection, b: Block, bits: str | None = None) -> None:
    con.execute("INSERT INTO log_blocks (block, min_ts, max_ts, lines, bits, min_received_at, max_received_at) "
                "VALUES ($b, make_timestamp($lo), make_timestamp($hi), $n, $bits::BIT, make_timestamp($rlo), "
                "make_timestamp($rhi))",
                {"b": b.block, "n": b.lines, "lo": b.min_us, "hi": b.max_us, "bits": bits or bitstring(b.grams),
                 "rlo": b.min_received_us, "rhi": b.max_received_us})


# A closed run, transposed: for each trigram any of its blocks holds, the bitset of the blocks that hold it (bit i:
# block first + i). Only the trigrams set in some block are tried (their union first: ~600 of 17,576 in
# bench/search_scale.py's lines; 1,024 blocks ~45 ms, once per ~2 M lines). Idempotent: a run written again replaces itself.
TRANSPOSE_SQL = f"""
INSERT INTO log_block_grams
SELECT $run, p.g, bitstring_agg(b.block - $first, 0, $size - 1)
FROM (SELECT block, bits FROM log_blocks WHERE block BETWEEN $first AND $last) b,
     (SELECT g FROM range({NBITS}) t(g), (SELECT bit_or(bits) AS u FROM log_blocks WHERE block BETWEEN $first AND $last)
      WHERE get_bit(u, g::INT) = 1) p
WHERE get_bit(b.bits, p.g::INT) = 1
GROUP BY p.g"""


def _transpose(con: duckdb.DuckDBPyConnection, run: int) -> None:
    """Write run ``run`` (blocks ``run * RUN_BLOCKS`` on, every one of them stored) transposed."""
    first = run * RUN_BLOCKS
    bounds = {"run": run, "first": first, "last": first + RUN_BLOCKS - 1}
    con.execute("DELETE FROM log_block_grams WHERE run = $run", {"run": run})
    con.execute("DELETE FROM log_block_runs WHERE run = $run", {"run": run})
    con.execute(TRANSPOSE_SQL, {**bounds, "size": RUN_BLOCKS})
    con.execute("INSERT INTO log_block_runs SELECT $run, $first, $last, min(min_ts), max(max_ts) FROM log_blocks "
                "WHERE block BETWEEN $first AND $last", bounds)


def _close_runs(con: duckdb.DuckDBPyConnection, next_run: int, top: int) -> int:
    """Transpose the runs from ``next_run`` whose blocks are all stored (``top``: the newest stored block's number);
    returns the next run to write."""
    while (next_run + 1) * RUN_BLOCKS - 1 <= top:
        _transpose(con, next_run)
        next_run += 1
    return next_run


# The runs written, as a search uses them and the writer goes on from them: 0 .. n - 1, all written (the writer
# writes them in order) and all of RUN_BLOCKS blocks (``$size``); else none (their blocks' bits are tested instead),
# until the writer has written them again.
RUNS_SQL = """
SELECT CASE WHEN count(*) = coalesce(max(run) + 1, 0) AND count(*) FILTER (last_block - first_block + 1 <> $size) = 0
            THEN count(*) ELSE 0 END
FROM log_block_runs"""


UNCOVERED_MAX_LINES = 4 * BLOCK_LINES  # more rows after the newest block than this: a catch-all block, not their trigrams


def uncovered(con: duckdb.DuckDBPyConnection) -> Block | None:
    """The rows stamped after the newest stored block, as the block that holds them (numbered after the last):
    the open block of a writer that died, or of one whose view the caller does not have; every row when
    log_blocks is empty. None when there are none, or when the stored blocks have no received_at range (before
    migration 020, when every row was in a stored block). More than UNCOVERED_MAX_LINES rows (written around
    the writer) make a catch-all block (every bit) rather than be read."""
    ((top, newest, stored),) = con.execute(
        "SELECT coalesce(max(block), 0), epoch_us(max(max_received_at)), count(*) FROM log_blocks").fetchall()
    if newest is None and stored:
        return None
    after = "" if newest is None else f"WHERE received_at > make_timestamp({int(newest)})"
    ((n, lo, hi, rlo, rhi),) = con.execute(
        f"SELECT count(*), epoch_us(min(ts)), epoch_us(max(ts)), epoch_us(min(received_at)), epoch_us(max(received_at)) "
        f"FROM logs {after}").fetchall()
    if not n:
        return None
    block = Block(top + 1, n, lo, hi, min_received_us=rlo, max_received_us=rhi)
    if n > UNCOVERED_MAX_LINES:
        block.grams = set(range(NBITS))
        return block
    text = "\n".join(line for (line,) in con.execute(f"SELECT line FROM logs {after}").fetchall()).encode()
    runs = letter_runs(text)
    block.runs = set(itertools.islice((r for r in runs if len(r) <= RUN_CACHE_MAX_BYTES), RUN_CACHE_MAX))  # as add's
    block.grams = trigrams_of(runs)
    return block


class BlockWriter:
    """The writer's side (on the writer thread only): the open block, extended in place by each commit, kept in
    memory; its row is written once, by the commit that closes it (``add``). Readers ask ``open_block`` beside
    log_blocks. Commit stamps never step back (``stamp``): the rows after the newest stored block are the open
    block's, which is how ``load`` finds them again after the writer died.

    ``add`` writes the blocks a commit closes inside its transaction and keeps the rest pending; ``committed``
    makes them the state, ``rolled_back`` puts the open block back as it was."""

    def __init__(self, block_lines: int = BLOCK_LINES) -> None:
        self.block_lines = block_lines
        self._open: Block | None = None
        self._next_id: int | None = None  # None: not loaded yet
        self._floor = 0  # the next stamp is at least this: one past the newest stored
        self._pending: tuple[Block | None, int, int, int, int, int] | None = None
        self._undo: tuple | None = None  # the open block's scalars before the commit in flight
        self._marker_due = False
        self._top = -1  # the newest stored block's number
        self._next_run = 0  # the first run not written transposed (migration 025): the runs before it all are
        self._reset_runs = False  # runs of another size than RUN_BLOCKS are stored: all are written again
        self.spread = 0  # the last commit's stamps ran from its received_us to received_us + spread

    def open_block(self) -> Block | None:
        """The block being filled, or None: read it before log_blocks (a block closed meanwhile is then in the
        table) and only read it; it grows in place, so what a reader sees holds at least what was committed."""
        return self._open

    def runs_written(self) -> int | None:
        """How many runs are written (runs 0 .. n - 1, of RUN_BLOCKS blocks, committed): what ``RUNS_SQL``
        reads, from memory; None before ``load``. Read before log_blocks: a run written meanwhile is only tested by its
        blocks' bits."""
        if self._next_id is None:
            return None
        return 0 if self._reset_runs else self._next_run

    def stamp(self, received_us: int, con: duckdb.DuckDBPyConnection | None = None) -> int:
        """A commit's stamp: ``received_us``, or one past the newest stamp stored when the clock stepped back
        (``con``: where to read it, the first time)."""
        if self._next_id is None and con is not None:
            self.load(con)
        return max(received_us, self._floor)

    def load(self, con: duckdb.DuckDBPyConnection) -> None:
        """Where the last writer stopped: the block it left open (its rows rebuilt: ``uncovered``), the next id,
        the newest stamp. A database whose blocks have no received_at range (before migration 020) gets a block
        of no lines at its newest stamp, so the rows after it are found the same way."""
        ((top, stored, ranged, newest),) = con.execute(
            "SELECT coalesce(max(block), 0), count(*), count(max_received_at), (SELECT epoch_us(max(received_at)) FROM logs) "
            "FROM log_blocks").fetchall()
        self._open = uncovered(con)
        self._next_id = top + 1 + (self._open is not None)
        self._top = top if stored else -1
        self._floor = (newest + 1) if newest is not None else 0
        self._marker_due = bool(self._open is None and newest is not None and stored and not ranged)
        # the runs a search uses (RUNS_SQL: 0 .. n - 1, else none): the next commit writes (again) those from n on; all
        # are deleted first when some have another size (RUN_BLOCKS changed), whose numbers mean other blocks
        ((self._next_run, odd),) = con.execute(
            f"SELECT ({RUNS_SQL}), count(*) FILTER (last_block - first_block + 1 <> $size) FROM log_block_runs",
            {"size": RUN_BLOCKS}).fetchall()
        self._reset_runs = bool(odd)

    def add(self, con: duckdb.DuckDBPyConnection, rows: pa.Table, received_us: int) -> pa.Array:
        """The blocks of a commit's rows (``store.LogColumns.table()``: one chunk a column), and the rows'
        ``received_at`` in order: the commit's stamp (``stamp(received_us)``) plus the index of the row's block
        among the blocks it touches (0 for the open block it continues). A block's slice of a commit is stamped
        apart from the commit's other blocks, so the block's received_at range holds its own rows and no other's.
        The commit's stamps end at ``stamp + spread`` (``spread`` once it is committed).

        The rows are read block by block (one slice of the line bytes, one min/max of ts each). Only the blocks
        the commit fills are written: the open block is extended in place, and a rollback puts it back."""
        if self._next_id is None:
            self.load(con)
        if self._reset_runs:
            con.execute("DELETE FROM log_block_grams")
            con.execute("DELETE FROM log_block_runs")
        top, next_run = self._top, self._next_run

        def store(b: Block, bits: str | None = None) -> None:  # a closed block's row, and the runs it closes
            nonlocal top, next_run
            _insert(con, b, bits)
            top = max(top, b.block)
            next_run = _close_runs(con, next_run, top)

        next_run = _close_runs(con, next_run, top)  # left by a writer that died, or from before migration 025
        if self._marker_due:
            store(Block(self._next_id, 0, self._floor - 1, self._floor - 1, min_received_us=self._floor - 1,
                         max_received_us=self._floor - 1), "0" * NBITS)
        received_us = self.stamp(received_us)
        block = self._open
        self._undo = block.scalars() if block is not None else None
        if block is not None and block.lines >= self.block_lines:  # rebuilt full by ``load``: stored now
            store(block)
        next_id = self._next_id + self._marker_due
        touched: list[Block] = []
        rows_of: list[int] = []  # rows stamped received_us + i, for each touched block i
        lines, ts = rows.column("line").combine_chunks(), rows.column("ts").combine_chunks()
        _, offsets, data = lines.buffers()
        at = memoryview(offsets).cast("i") if data is not None else None
        start, total = 0, rows.num_rows
        while start < total:
            if block is None or block.lines >= self.block_lines:
                block = Block(next_id, 0, 0, 0)
                next_id += 1
            touched.append(block)
            n = min(self.block_lines - block.lines, total - start)
            # the bytes of rows [start, start + n), through the int32 offsets
            text = data.slice(at[lines.offset + start], at[lines.offset + start + n] - at[lines.offset + start]).to_pybytes() \
                if at is not None else None
            bounds = pc.min_max(ts.slice(start, n))
            block.extend(text, bounds["min"].value, bounds["max"].value, n, received_us + len(touched) - 1)
            rows_of.append(n)
            if block.lines >= self.block_lines:
                store(block)  # closed: its row, once
            start += n
        spread = max(len(touched) - 1, 0)
        self._pending = (block, next_id, spread, received_us + spread + 1 if touched else received_us, top, next_run)
        return pa.concat_arrays([pa.repeat(pa.scalar(received_us + i, STAMP_TYPE), n) for i, n in enumerate(rows_of)]
                                or [pa.array([], STAMP_TYPE)])

    def committed(self) -> None:
        self.spread = 0
        if self._pending is not None:
            self._open, self._next_id, self.spread, self._floor, self._top, self._next_run = self._pending
            if self._open is not None and self._open.lines >= self.block_lines:
                self._open = None  # stored: the next commit begins a new block
            self._pending = None
            self._marker_due = False
            self._reset_runs = False
        self._undo = None

    def rolled_back(self) -> None:
        """The commit that failed extended the open block in place: its counts and ranges go back (its trigrams
        stay: extra bits only make a search read more); the blocks it began are forgotten."""
        if self._open is not None and self._undo is not None:
            self._open.restore(self._undo)
        self._pending = None
        self._undo = None


def cover_unindexed(con: duckdb.DuckDBPyConnection) -> None:
    """A catch-all block (every bit set) over the ts range of every stored line: for rows written
    straight into ``logs`` (benchmarks, tools), which a filtered search would otherwise miss."""
    con.execute(
        "INSERT INTO log_blocks (block, min_ts, max_ts, lines, bits, min_received_at, max_received_at) "
        "SELECT (SELECT coalesce(max(block), 0) + 1 FROM log_blocks), min(ts), max(ts), count(*), "
        f"repeat('1', {NBITS})::BIT, min(received_at), max(received_at) FROM logs HAVING count(*) > 0"
    )
