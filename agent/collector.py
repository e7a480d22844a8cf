"""Lines of each source → spool records, by size or by age.

A record holds the lines of one source from one or more reads, the ``seq`` of each (taken from the
run's counter only when the record is written), the read positions of the files after its last
line, and the lines those reads know were lost (``lost``: a file truncated before it was read to
its end), which count only once the record is written, like the positions that moved past them. The lines of one read are never split across records, so the positions a record carries
always sit exactly after its last line; that is what makes a restart resume without a loss or a
double. A read may name its stream (``label``: a command's ``stdout`` and ``stderr`` share one
source); the record says which of its lines came from which (``labels``) when it is not the source.
Once written, a record moves the state through ``RunState.apply``, the function that also replays
it after a crash, so the live state and the recovered one cannot differ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import orjson

from agent.spool import Record
from agent.state import RunState

LINE_OVERHEAD_BYTES = 48  # {"seq":..,"ts":..,"line":""} around the text


@dataclass
class _Pending:
    lines: list[tuple[float, str]] = field(default_factory=list)
    nbytes: int = 0
    since: float = 0.0
    files: dict[str, list[dict]] = field(default_factory=dict)
    moved: bool = False  # file positions changed without lines
    lost: tuple[int, int] = (0, 0)  # lines, bytes the reads know were lost
    labels: list[list] = field(default_factory=list)  # [[label, count], ...]: the lines' streams, in order

    @property
    def empty(self) -> bool:
        return not self.lines and not self.moved


class Collector:
    def __init__(
        self,
        state: RunState,
        append: Callable[[list[Record]], None],
        *,
        batch_max_bytes: int,
        batch_max_delay_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.append = append
        self.batch_max_bytes = batch_max_bytes
        self.batch_max_delay_s = batch_max_delay_s
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        self.lines_in = 0

    def add(
        self, source: str, lines: list[str], ts: float, files: dict[str, list[dict]] | None = None, lost: tuple[int, int] = (0, 0),
        label: str | None = None,
    ) -> None:
        """Lines of one read (of stream ``label``, by default ``source``), the positions of the files
        after them, and what the read knows was lost."""
        if not lines and not files and not any(lost):
            return
        pending = self._pending.setdefault(source, _Pending())
        nbytes = sum(len(line) for line in lines) + LINE_OVERHEAD_BYTES * len(lines)
        if pending.lines and pending.nbytes + nbytes > self.batch_max_bytes:
            self._write([source])
            pending = self._pending.setdefault(source, _Pending())
        if pending.empty:
            pending.since = self.clock()
        pending.lines.extend((ts, line) for line in lines)
        if lines:
            label = label or source
            if pending.labels and pending.labels[-1][0] == label:
                pending.labels[-1][1] += len(lines)
            else:
                pending.labels.append([label, len(lines)])
        pending.nbytes += nbytes
        if files:
            pending.files.update(files)
            pending.moved = True
        if any(lost):
            pending.lost = (pending.lost[0] + lost[0], pending.lost[1] + lost[1])
            pending.moved = True
        self.lines_in += len(lines)
        if pending.nbytes >= self.batch_max_bytes:
            self._write([source])

    def flush(self, *, force: bool = False) -> None:
        """Write the sources whose lines are old enough (all of them when ``force``)."""
        now = self.clock()
        due = [s for s, p in self._pending.items() if not p.empty and (force or now - p.since >= self.batch_max_delay_s)]
        if due:
            self._write(due)

    @property
    def pending_lines(self) -> int:
        return sum(len(p.lines) for p in self._pending.values())

    def _write(self, sources: list[str]) -> None:
        state = self.state
        run_id = state.run_id
        records, taken = [], []
        for source in sources:
            pending = self._pending.pop(source)
            first = state.seqs.get(source, 0)
            n = len(pending.lines)
            payload = orjson.dumps(
                {
                    "instance_id": state.instance_id,
                    "source": source,
                    "run_id": run_id,
                    "lines": [{"seq": first + i, "ts": ts, "line": line} for i, (ts, line) in enumerate(pending.lines)],
                }
            )
            meta = {"source": source, "run_id": run_id, "first_seq": first, "n": n, "files": pending.files}
            if any(pending.lost):
                meta["lost"] = list(pending.lost)
            if any(label != source for label, _n in pending.labels):
                meta["labels"] = pending.labels
            records.append(Record("logs", meta, payload))
            taken.append([line for _ts, line in pending.lines])
        self.append(records)
        # Only now, with the records in the spool (or counted as dropped), does the state move.
        for record, lines in zip(records, taken):
            state.apply(record, lines)
