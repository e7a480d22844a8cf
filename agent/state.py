"""What the agent must remember across a restart, kept in its state directory.

``<dir>/state.json`` holds the current run (its ``run_id``, the command it wraps), the next ``seq``
of every source of that run, the read position of every tailed file, the lines dropped per source
(by a full spool or a refusal: ``dropped``; by a file truncated before it was read to its end:
``lost_lines``, at least one per such truncation, and ``lost_bytes`` when known), and two spool positions: ``acked`` (everything before it was acknowledged) and ``written_at`` (the
spool's end when the file was written).

It also holds what the agent derives from the run's lines (``findings``: the rate, the failure
excerpt's evidence) and which of the run's events were spooled (``reported``). They move exactly as
the seqs and positions do: when a record is written (``apply``, the same function that replays it),
so after a restart they are those of the lines before the positions the tailers resume from, and a
restarted agent reports what an agent never killed would have (issue 21.1), and never a second time.

Nothing is committed ahead of its lines. A seq or a file position changes in memory only when the
lines it covers are appended to the spool, and the spool record carries the new positions in its
meta. state.json is a cache of that: on start, the records after ``written_at`` are replayed over
it, so a crash between appending and saving loses nothing. Before a spool segment is deleted
(acknowledged, or dropped because the spool is full) state.json is saved, so that what those
records recorded is not lost with them.

One agent at a time owns a state directory (an exclusive ``flock`` on ``<dir>/lock``, released by
the kernel when the process dies, even by SIGKILL).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from agent.result import Findings
from agent.spool import Ptr, Record, Spool

logger = logging.getLogger(__name__)

STATE_VERSION = 1


class StateDirBusy(Exception):
    """Another agent holds the state directory."""


def new_run_id(now: dt.datetime | None = None) -> str:
    """Sorts in time order (the server orders runs by run_id): ``20261129T112048Z-3f9a``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


@dataclass
class RunState:
    """The in-memory state; ``to_json``/``from_json`` are the state.json document."""

    instance_id: str
    run: dict[str, Any] | None = None  # run_id, mode, started_at, finished, command, sources, ...
    seqs: dict[str, int] = field(default_factory=dict)  # next seq per source of the current run
    files: dict[str, list[dict]] = field(default_factory=dict)  # path -> tailer snapshot
    dropped: dict[str, int] = field(default_factory=dict)  # lines dropped per source, current run
    lost_lines: dict[str, int] = field(default_factory=dict)  # lines that may have been lost before they were read, per source
    lost_bytes: dict[str, int] = field(default_factory=dict)  # bytes known to be lost so (a lower bound), per source
    dropped_events: int = 0
    findings: Findings | None = None  # derived from the current run's lines (run and wrap)
    reported: list[str] = field(default_factory=list)  # kinds of the current run's events already spooled
    acked: Ptr = Ptr(1, 0)
    written_at: Ptr = Ptr(1, 0)

    @property
    def run_id(self) -> str:
        assert self.run is not None, "no run started"
        return self.run["run_id"]

    def start_run(self, mode: str, **details: Any) -> str:
        """A new run: a new run_id, seqs from 0 again (file positions are kept)."""
        self.run = {"run_id": new_run_id(), "mode": mode, "finished": False, **details}
        self.seqs = {}
        self.dropped = {}
        self.lost_lines = {}
        self.lost_bytes = {}
        self.dropped_events = 0
        self.findings = None
        self.reported = []
        return self.run_id

    def count_lost(self, source: str, lines: int, nbytes: int) -> None:
        """Lines a tailer could not read (a copytruncate race); moves with the positions past them."""
        if lines:
            self.lost_lines[source] = self.lost_lines.get(source, 0) + lines
        if nbytes:
            self.lost_bytes[source] = self.lost_bytes.get(source, 0) + nbytes

    def dropped_total(self, sources: list[str]) -> dict[str, int]:
        """Lines of these sources that will never be stored, whatever the reason (``logs_complete``'s ``dropped``)."""
        out = {s: self.dropped.get(s, 0) + self.lost_lines.get(s, 0) for s in sources}
        return {s: n for s, n in out.items() if n}

    def last_seq(self, source: str) -> int:
        return self.seqs.get(source, 0) - 1

    def apply(self, record: Record, lines: list[str] | None = None) -> None:
        """What a record records, once it is written: called as it is written (``lines``: its
        lines, when the writer has them at hand) and again for each record replayed when recovering."""
        meta = record.meta
        current = self.run is not None and meta.get("run_id") == self.run.get("run_id")
        if record.kind == "event":
            if current and meta.get("kind") not in self.reported:
                self.reported.append(meta["kind"])
            return
        if record.kind != "logs":
            return
        if current:
            end = meta["first_seq"] + meta["n"]
            if end > self.seqs.get(meta["source"], 0):
                self.seqs[meta["source"]] = end
            if meta.get("lost"):
                self.count_lost(meta["source"], *meta["lost"])
            if self.findings is not None and meta["n"]:
                if lines is None:
                    lines = [line["line"] for line in orjson.loads(record.payload)["lines"]]
                self.findings.feed(meta["source"], _labelled(meta, lines))
        for path, positions in (meta.get("files") or {}).items():
            self.files[path] = positions

    def count_dropped(self, records: list[Record]) -> dict[str, int]:
        """Count the lines and events of dropped records; returns lines per source."""
        lines: dict[str, int] = {}
        for r in records:
            if r.kind == "logs" and self.run is not None and r.meta.get("run_id") == self.run.get("run_id"):
                lines[r.meta["source"]] = lines.get(r.meta["source"], 0) + r.meta["n"]
            elif r.kind == "event":
                self.dropped_events += 1
        for source, n in lines.items():
            self.dropped[source] = self.dropped.get(source, 0) + n
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "instance_id": self.instance_id,
            "run": self.run,
            "seqs": self.seqs,
            "files": self.files,
            "dropped": self.dropped,
            "lost_lines": self.lost_lines,
            "lost_bytes": self.lost_bytes,
            "dropped_events": self.dropped_events,
            "findings": self.findings.to_json() if self.findings is not None else None,
            "reported": self.reported,
            "acked": list(self.acked),
            "written_at": list(self.written_at),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "RunState":
        if doc.get("version") != STATE_VERSION:
            raise ValueError(f"state.json: unknown version {doc.get('version')!r}")
        return cls(
            instance_id=doc["instance_id"],
            run=doc.get("run"),
            seqs=dict(doc.get("seqs") or {}),
            files=dict(doc.get("files") or {}),
            dropped=dict(doc.get("dropped") or {}),
            lost_lines=dict(doc.get("lost_lines") or {}),
            lost_bytes=dict(doc.get("lost_bytes") or {}),
            dropped_events=int(doc.get("dropped_events") or 0),
            findings=Findings.from_json(doc["findings"]) if doc.get("findings") else None,
            reported=list(doc.get("reported") or []),
            acked=Ptr(*doc.get("acked", (1, 0))),
            written_at=Ptr(*doc.get("written_at", (1, 0))),
        )


def _labelled(meta: dict[str, Any], lines: list[str]) -> list[tuple[str, list[str]]]:
    """A logs record's lines by stream: ``meta["labels"]`` is [[label, count], ...] in order when
    its lines come from more than one stream (a command's stdout and stderr), else all are ``source``'s."""
    runs = meta.get("labels")
    if not runs:
        return [(meta["source"], lines)]
    out, at = [], 0
    for label, n in runs:
        out.append((label, lines[at : at + n]))
        at += n
    return out


class StateDir:
    """The directory: its lock, state.json, and where the spool and captured output live."""

    def __init__(self, path: str, *, fsync: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.fsync = fsync
        self._lock_fd: int | None = None

    @property
    def spool_dir(self) -> str:
        return os.path.join(self.path, "spool")

    @property
    def inbox_dir(self) -> str:
        """Events left by ``fleetlog-agent event`` while another agent held the lock."""
        return os.path.join(self.path, "inbox")

    def run_dir(self, run_id: str) -> str:
        """A wrapped command's captured stdout and stderr, and its exit status."""
        return os.path.join(self.path, "runs", run_id)

    def lock(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StateDirBusy(f"{self.path} is used by another fleetlog-agent (pid {holder}); give each concurrent agent its own --spool") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def load(self) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.path, "state.json"), "rb") as f:
                return orjson.loads(f.read())
        except FileNotFoundError:
            return None

    def save(self, doc: dict[str, Any]) -> None:
        """Atomically: a reader (or a restart) sees the old document or the new one, never a mix."""
        final = os.path.join(self.path, "state.json")
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(doc))
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)


def recover(doc: dict[str, Any] | None, instance_id: str, spool: Spool) -> RunState:
    """The state after a start or a crash: state.json, then the spool records written after it.

    Opens ``spool`` (which cuts a torn last record). Whatever was spooled is reflected in the
    result, and nothing that was not spooled is.
    """
    state = RunState.from_json(doc) if doc is not None else RunState(instance_id)
    if state.instance_id != instance_id:
        logger.warning("state directory belonged to instance %s; now %s", state.instance_id, instance_id)
        state.instance_id = instance_id
    spool.open(state.acked)
    for entry in spool.entries(state.written_at):
        state.apply(entry.record)
    state.acked = spool.acked
    return state
