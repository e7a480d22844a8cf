"""One agent process's pipeline: state directory → tailers → collector → spool → shipper.

The recorder owns the order of things that makes delivery exactly-once:

1. ``open``: take the state directory's lock, load state.json, open the spool (cutting a torn
   record), replay the records written after state.json was saved, start shipping what is left.
2. ``poll``: read every tailed file, hand the lines and the files' new positions to the collector,
   which writes them to the spool as records by size or age; the state moves with the records.
3. ``event``: a lifecycle event is a spool record too, so it is sent only after every line written
   before it has been stored (``bench_done`` never overtakes the daemon's last words). A run's own
   report names the run in its meta, so a restarted agent knows it was already spooled.
4. ``drain``: wait until the spool is empty, up to a deadline; ``close``: save state, release all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from agent.collector import Collector
from agent.config import AgentSettings
from agent.credentials import Credentials
from agent.shipper import Backoff, Client, Outcome, Shipper
from agent.spool import Entry, Record, Spool
from agent.state import RunState, StateDir, recover
from agent.tailer import FileTailer

logger = logging.getLogger(__name__)

STATE_SAVE_INTERVAL_S = 1.0
INBOX_CHECK_INTERVAL_S = 0.5


@dataclass
class _Tail:
    source: str
    tailer: FileTailer
    label: str  # the stream's name in the failure excerpt
    last: list[dict] = field(default_factory=list)


class Recorder:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.dir = StateDir(settings.spool, fsync=settings.spool_fsync)
        self.state = RunState(settings.instance_id)
        self.spool: Spool | None = None
        self.collector: Collector | None = None
        self.client: Client | None = None
        self.shipper: Shipper | None = None
        self._ship_task: asyncio.Task | None = None
        self._tails: list[_Tail] = []
        self._wakeup = asyncio.Event()
        self._last_save = 0.0
        self._saved_at: tuple = ()
        self._last_inbox = 0.0
        self._drops_to_report = False
        self.dropped_by_reason: dict[tuple[str, str], int] = {}
        self._event_feeds: list[Callable[[], list[dict[str, Any]]]] = []

    # ---- lifetime ---------------------------------------------------------------------------

    async def open(self, registration: dict[str, Any] | None = None) -> None:
        """``registration``: what a ``registered`` event says of this instance (used to enroll)."""
        s = self.settings
        self.dir.lock()
        try:
            self.spool = Spool(
                self.dir.spool_dir,
                max_bytes=s.spool_max_bytes,
                full_policy=s.spool_full_policy,
                fsync=s.spool_fsync,
                on_drop=self._on_drop,
                before_delete=self.save_state,
            )
            self.state = recover(self.dir.load(), s.instance_id, self.spool)
            self.save_state()
        except BaseException:
            self.dir.unlock()
            raise
        self.collector = Collector(self.state, self._append, batch_max_bytes=s.batch_max_bytes, batch_max_delay_s=s.batch_max_delay_s)
        credentials = Credentials(s.instance_id, token=s.token, enroll_token=s.enroll_token, token_file=s.token_file, registration=registration)
        self.client = Client(s.server, credentials=credentials, request_timeout_s=s.request_timeout_s)
        self.shipper = Shipper(
            self.spool,
            self.client,
            batch_max_bytes=s.batch_max_bytes,
            backoff=Backoff(s.retry_initial_delay_s, s.retry_max_delay_s),
            hold_delay_s=s.retry_max_delay_s,
            on_acked=self._on_acked,
            on_rejected=self._on_rejected,
        )
        self._ship_task = asyncio.create_task(self.shipper.run(), name="fleetlog-shipper")
        self.check_inbox()

    async def close(self) -> None:
        if self.shipper is not None and self._ship_task is not None:
            self.shipper.stop()
            self._ship_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ship_task
        if self.client is not None:
            await self.client.close()
        for t in self._tails:
            t.tailer.close()
        if self.spool is not None:
            self.save_state()
            self.spool.close()
        self.dir.unlock()

    def save_state(self) -> None:
        assert self.spool is not None
        self.state.acked = self.spool.acked
        self.state.written_at = self.spool.end
        self.dir.save(self.state.to_json())
        self._last_save = time.monotonic()
        self._saved_at = (self.spool.acked, self.spool.end)

    def _save_if_changed(self) -> None:
        """The periodic save: only when records were written or acknowledged since the last one."""
        assert self.spool is not None
        if (self.spool.acked, self.spool.end) != self._saved_at:
            self.save_state()
        else:
            self._last_save = time.monotonic()

    # ---- reading ----------------------------------------------------------------------------

    def tail(self, source: str, path: str, *, label: str | None = None, echo: Callable[[bytes], None] | None = None) -> FileTailer:
        """``label``: the stream's name in the run's findings (the failure excerpt), by default ``source``."""
        s = self.settings
        tailer = FileTailer(path, max_line_bytes=s.max_line_bytes, rotate_wait_s=s.rotate_wait_s, on_bytes=echo)
        positions = self.state.files.get(tailer.path) or []
        if positions:
            tailer.restore(positions)
        self._tails.append(_Tail(source, tailer, label or source, list(positions)))
        return tailer

    def _take(self, t: _Tail, lines: list[str], ts: float) -> None:
        snap = t.tailer.snapshot()
        files = {t.tailer.path: snap} if snap != t.last else None
        t.last = snap
        lost = t.tailer.take_losses()
        if any(lost):
            logger.warning(
                "source %s: %s was truncated before it was read to its end; %d line(s) counted as dropped%s (logs_complete will say so)",
                t.source, t.tailer.path, lost[0], f", at least {lost[1]} bytes" if lost[1] else "",
            )
        if lines or files or any(lost):
            assert self.collector is not None
            self.collector.add(t.source, lines, ts, files, lost, label=t.label)  # the findings move with the record

    def poll(self) -> bool:
        """Read, spool what is due, save state now and then. True when a file has more to read."""
        assert self.collector is not None
        now = round(time.time(), 6)
        more = False
        for t in self._tails:
            try:
                self._take(t, t.tailer.poll(), now)
            except OSError as e:  # an unreadable file must not stop the others
                logger.warning("reading %s failed: %s", t.tailer.path, e)
                continue
            more = more or t.tailer.more
        self.collector.flush()
        self.take_fed_events()
        mono = time.monotonic()
        if mono - self._last_inbox >= INBOX_CHECK_INTERVAL_S:
            self.check_inbox()
        if mono - self._last_save >= STATE_SAVE_INTERVAL_S:
            self._save_if_changed()
        return more

    async def pump(self, done: Callable[[], bool]) -> None:
        """Poll until ``done()``; ``wake()`` cuts a wait short."""
        while not done():
            if self.poll():
                await asyncio.sleep(0)
                continue
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.settings.poll_interval_s)

    def wake(self) -> None:
        self._wakeup.set()

    def finish_reading(self) -> None:
        """Read every file to its end (partial last lines included) and spool everything."""
        assert self.collector is not None
        now = round(time.time(), 6)
        for t in self._tails:
            self._take(t, t.tailer.finish(), now)
        self.collector.flush(force=True)
        self.take_fed_events()
        self.check_inbox()
        self.save_state()

    def stop_tailing(self) -> None:
        """Close every tailer (their final positions are in the state already)."""
        for t in self._tails:
            t.tailer.close()
        self._tails = []

    def forget_file(self, path: str) -> None:
        """A file this state directory will never read again (a finished run's captured output)."""
        self.state.files.pop(os.path.abspath(path), None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    # ---- writing ----------------------------------------------------------------------------

    def _append(self, records: list[Record]) -> None:
        assert self.spool is not None and self.shipper is not None
        self.spool.append(records)
        if self._drops_to_report:
            self._drops_to_report = False
            self.spool.append([self._drops_record()])
        self.shipper.wake()

    def event(self, kind: str, *, ts: float | None = None, of_run: bool = False, **fields: Any) -> dict[str, Any]:
        """``of_run``: the current run's own report (``bench_done``, ``logs_complete``, its done event),
        remembered in the state (``reported``) so that a restarted agent does not send it again."""
        body = {"instance_id": self.state.instance_id, "kind": kind, "ts": round(ts if ts is not None else time.time(), 6), **fields}
        meta = {"kind": kind, **({"run_id": self.state.run_id} if of_run else {})}
        record = Record("event", meta, orjson.dumps(body))
        self._append([record])
        self.state.apply(record)
        return body

    def logs_complete(self, sources: list[str]) -> dict[str, Any]:
        """``dropped``: lines of these sources that will never be stored (a full spool, a refusal, a
        file truncated before it was read): present only when some were, and then the server
        does not hold the logs complete."""
        dropped = self.state.dropped_total(sources)
        if dropped:
            logger.warning("run %s: logs_complete declares lines that will never be stored: %s", self.state.run_id, ", ".join(f"{n} of {s}" for s, n in sorted(dropped.items())))
        return self.event(
            "logs_complete",
            of_run=True,
            run_id=self.state.run_id,
            sources={s: self.state.last_seq(s) for s in sources},
            dropped_lines={s: n for s, n in self.state.dropped.items() if n},
            **({"dropped": dropped} if dropped else {}),
            **({"dropped_events": self.state.dropped_events} if self.state.dropped_events else {}),
        )

    def feed_events(self, take: Callable[[], list[dict[str, Any]]]) -> None:
        """Events made on another thread (the GPU sampler's ``gpu_state``): ``take()`` returns the
        bodies not taken yet ({"kind", "ts", ...}); they are spooled at every poll, in order."""
        self._event_feeds.append(take)

    def take_fed_events(self) -> None:
        for take in self._event_feeds:
            for body in take():
                fields = dict(body)
                kind, ts = fields.pop("kind"), fields.pop("ts", None)
                self.event(kind, ts=ts, **fields)

    def check_inbox(self) -> None:
        """Events that ``fleetlog-agent event`` left while this process held the state directory."""
        self._last_inbox = time.monotonic()
        try:
            names = sorted(n for n in os.listdir(self.dir.inbox_dir) if n.endswith(".json"))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.dir.inbox_dir, name)
            try:
                with open(path, "rb") as f:
                    body = orjson.loads(f.read())
            except (OSError, orjson.JSONDecodeError) as e:
                logger.warning("inbox %s unreadable: %s", path, e)
                continue
            self._append([Record("event", {"kind": body.get("kind")}, orjson.dumps(body))])
            os.unlink(path)  # a crash before this sends it twice: events are deduplicated on (instance, kind, ts)

    # ---- delivery ---------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        assert self.shipper is not None
        delivered = await self.shipper.drain(time.monotonic() + timeout_s)
        self.save_state()
        return delivered

    def undelivered(self) -> dict[str, Any]:
        """What is still in the spool: lines per source, events, bytes."""
        assert self.spool is not None
        lines: dict[str, int] = {}
        events: list[str] = []
        for entry in self.spool.entries(self.spool.acked):
            r = entry.record
            if r.kind == "logs":
                lines[r.meta["source"]] = lines.get(r.meta["source"], 0) + r.meta["n"]
            elif r.kind == "event":
                events.append(str(r.meta.get("kind")))
        return {"lines": {s: n for s, n in lines.items() if n}, "events": events, "bytes": self.spool.unacked_bytes}

    def _on_acked(self) -> None:
        assert self.spool is not None
        if self.spool.releasable():
            self.save_state()  # what the acknowledged records recorded is saved before they go
            self.spool.release()

    def _count(self, records: list[Record], reason: str) -> None:
        lines = self.state.count_dropped(records)
        for source, n in lines.items():
            key = (source, reason)
            self.dropped_by_reason[key] = self.dropped_by_reason.get(key, 0) + n
        if lines:
            logger.warning("dropped %s lines (%s)", ", ".join(f"{n} of {s}" for s, n in lines.items()), reason)
            self._drops_to_report = True

    def _on_drop(self, records: list[Record], reason: str) -> None:
        self._count(records, reason)

    def _on_rejected(self, entry: Entry, outcome: Outcome) -> None:
        self._count([entry.record], f"rejected_{outcome.status}")
        if self._drops_to_report and self.spool is not None:
            self._drops_to_report = False
            self.spool.append([self._drops_record()])

    def _drops_record(self) -> Record:
        now = round(time.time(), 6)
        samples = [
            {"name": "fleetlog_agent_dropped_lines_total", "ts": now, "value": n, "labels": {"source": source, "reason": reason}}
            for (source, reason), n in sorted(self.dropped_by_reason.items())
        ]
        return Record("metrics", {}, orjson.dumps({"instance_id": self.state.instance_id, "samples": samples}))
