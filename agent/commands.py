"""The four things the agent does: ``run``, ``wrap``, ``tail`` and ``event``.

A run lives in the state directory until it is finished: when an agent is killed and started again
with the same ``--spool``, it first completes the unfinished run. A wrapped command that is still
running is adopted (its output is read on from the saved offsets; its exit status comes from the
reaper), and it is never started a second time: a restarted ``run`` or ``wrap`` reports the
adopted command and exits with its code. What it reports is what an agent never killed would have:
the rate and the failure excerpt are derived from the run's spooled lines and kept in its state
(``RunState.findings``), and an event already spooled for the run is not sent again. An unfinished ``tail`` run is resumed by the next ``tail``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable

import orjson

from agent import gpu, hostmem
from agent.config import AgentSettings, Invocation
from agent.echo import Echo
from agent.gpuexport import GpuTelemetry, default_endpoint, same_origin
from agent.recorder import Recorder
from agent.result import EXCERPT_MAX_CHARS, Findings
from agent.runner import Command, CommandResult
from agent.state import StateDir, StateDirBusy
from agent.timelimit import TimeLimit

logger = logging.getLogger(__name__)

EX_TEMPFAIL = 75  # the event is queued on disk but not yet delivered


def say(message: str) -> None:
    """A line for the person reading the container's output (not a log record)."""
    sys.stderr.write(f"fleetlog-agent: {message}\n")
    sys.stderr.flush()


class Signals:
    """SIGTERM/SIGINT: the 1st is forwarded to the command (SIGKILL after the grace period), the 2nd
    kills it at once, and one more while flushing gives up the flush."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.count = 0
        self.abort_flush = asyncio.Event()
        self.command: Command | None = None
        self.grace_s = 0.0
        self.flushing = False
        self._on_change = on_change
        self._kill_timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._received, signum)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        self.command_ended()

    def command_ended(self) -> None:
        if self._kill_timer is not None:
            self._kill_timer.cancel()
            self._kill_timer = None

    def _received(self, signum: int) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        command = self.command
        if self.flushing:
            if self.count > 1:
                say(f"{name} again: giving up the flush")
                self.abort_flush.set()
            else:
                say(f"{name}: still flushing (another signal gives up)")
        elif command is not None and command.running:
            if self.count == 1:
                say(f"{name}: forwarded to the command; SIGKILL in {self.grace_s:g} s unless it exits")
                command.send_signal(signum)
                self._kill_timer = asyncio.get_running_loop().call_later(self.grace_s, command.kill)
            else:
                say(f"{name} again: killing the command now")
                command.kill()
        self._on_change()


async def _flush(rec: Recorder, signals: Signals, timeout_s: float) -> bool:
    """Deliver everything, within ``timeout_s``, unless a signal gives up; report what is left."""
    signals.flushing = True
    started = time.monotonic()
    drain = asyncio.create_task(rec.drain(timeout_s))
    abort = asyncio.create_task(signals.abort_flush.wait())
    try:
        await asyncio.wait({drain, abort}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (drain, abort):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    delivered = drain.done() and not drain.cancelled() and drain.result()
    if not delivered:
        left = rec.undelivered()
        lines = ", ".join(f"{n} of {s}" for s, n in sorted(left["lines"].items())) or "none"
        say(
            f"not delivered after {time.monotonic() - started:.1f} s: lines {lines}; events {', '.join(left['events']) or 'none'}"
            f" ({left['bytes']} bytes, last error: {rec.shipper.last_error or 'none'}). They stay in {rec.dir.spool_dir};"
            " the next fleetlog-agent with this --spool sends them."
        )
    return delivered


def _registered_fields(inv: Invocation) -> dict[str, Any]:
    s = inv.settings
    fields = {k: getattr(s, k) for k in ("machine_id", "host_id", "gpu_model", "gpu_count", "dph", "location")}
    if s.gpu_model is None or s.gpu_count is None:
        found = gpu.detect()
        fields["gpu_model"] = s.gpu_model or found.get("gpu_model")
        fields["gpu_count"] = s.gpu_count if s.gpu_count is not None else found.get("gpu_count")
        if found.get("driver"):
            fields["driver"] = found["driver"]
    return {k: v for k, v in fields.items() if v is not None}


def _start_run(rec: Recorder, inv: Invocation) -> dict:
    s = inv.settings
    run_id = rec.state.start_run(
        inv.command,
        started_at=time.time(),
        source=s.source,
        tails=[list(t) for t in s.tails],
        bench=inv.command == "run",
        rate_regex=s.rate_regex,
        done_event=s.done_event,
        grace_s=s.grace_s,
        max_duration_s=s.max_duration_s,
        oom_kills_at_start=hostmem.oom_kills(s.proc_root, s.cgroup_root) if inv.command == "run" else None,
        proc_root=s.proc_root,
        cgroup_root=s.cgroup_root,
    )
    if inv.command in ("run", "wrap"):
        rec.state.findings = Findings.for_run(rec.state.run)
    rec.save_state()
    logger.info("run %s started", run_id)
    return rec.state.run


def _close_abandoned(rec: Recorder) -> None:
    """An unfinished run this invocation will not continue: declare what it has."""
    run = rec.state.run
    sources = sorted(set(rec.state.seqs) | {t[0] for t in run.get("tails", [])} | ({run["source"]} if run.get("source") else set()))
    if sources:
        rec.logs_complete(sources)
    run["finished"] = True
    rec.save_state()


def _start_gpu(rec: Recorder, s: AgentSettings) -> GpuTelemetry | None:
    """GPU telemetry beside the logs (None when off). Its ``gpu_state`` events go through the spool."""
    if not s.gpu_interval_s:
        return None
    assert rec.client is not None
    endpoint = s.otlp_endpoint or default_endpoint(s.server)
    credentials = rec.client.credentials
    try:
        telemetry = GpuTelemetry.start(
            nvml_spec=s.nvml_module, instance_id=s.instance_id, interval_s=s.gpu_interval_s, timeout_s=s.otlp_timeout_s,
            endpoint=endpoint, machine_id=s.machine_id, token=credentials.current if same_origin(endpoint, s.server) else None,
            proc_root=s.proc_root, cgroup_root=s.cgroup_root,
        )
    except Exception:  # GPU telemetry is never a reason not to ship the logs
        logger.exception("GPU telemetry could not start; shipping the logs without it")
        return None
    rec.feed_events(telemetry.take_events)
    return telemetry


async def _stop_gpu(rec: Recorder, telemetry: GpuTelemetry | None) -> None:
    """The last sample and the final export, then its events into the spool (before bench_done)."""
    if telemetry is None:
        return
    try:
        await telemetry.close()
    except Exception:
        logger.exception("stopping GPU telemetry failed")
    rec.take_fed_events()


async def _complete(rec: Recorder, run: dict, command: Command, signals: Signals, telemetry: GpuTelemetry | None = None) -> int:
    """Ship the command's output and the tailed logs until it exits, then report it."""
    run_dir = os.path.dirname(command.status_path)
    source = run["source"]
    if rec.state.findings is None:  # a run started by an agent that kept none
        rec.state.findings = Findings.for_run(run)
    for tail_source, path in run.get("tails", []):
        rec.tail(tail_source, path)
    echoes = [Echo(sys.stdout.buffer, "stdout"), Echo(sys.stderr.buffer, "stderr")]
    rec.tail(source, command.stdout_path, label="stdout", echo=echoes[0])
    rec.tail(source, command.stderr_path, label="stderr", echo=echoes[1])
    signals.command = command
    signals.grace_s = run.get("grace_s", 10.0)

    def timed_out() -> None:
        run["timed_out"] = True
        rec.save_state()
        rec.wake()

    limit = TimeLimit(command, run.get("max_duration_s"), signals.grace_s, fired=bool(run.get("timed_out")), on_fire=timed_out)
    limit.start(time.time())
    try:
        await rec.pump(lambda: not command.running)
    finally:
        limit.cancel()
    signals.command_ended()
    result: CommandResult = command.poll()
    command.reap()
    rec.finish_reading()
    for echo in echoes:
        echo.close()
    await _stop_gpu(rec, telemetry)  # what the GPU did up to the end is stored before bench_done
    exit_code = limit.exit_code(result.exit_code)
    findings = rec.state.findings
    reported = rec.state.reported  # by the agent killed before it could mark the run finished
    if run.get("bench") and "bench_done" not in reported:
        if limit.line:  # first, where the failure classifier and a reader look
            excerpt = limit.line + "\n" + findings.evidence.excerpt(EXCERPT_MAX_CHARS - len(limit.line) - 1)
        else:
            excerpt = findings.evidence.excerpt()
        done: dict[str, Any] = {"duration_s": round(command.duration_s, 3), "failure_excerpt": excerpt}
        if limit.fired:
            done["timeout"] = True
            done["max_duration_s"] = limit.max_duration_s
        if exit_code is not None:
            done["exit_code"] = exit_code
        else:
            done["error"] = "the exit status was lost: the agent and the reaper were both killed"
        if result.signal:
            done["signal"] = result.signal
        if findings.rate is not None and findings.rate.rate is not None:
            done["rate_per_hour"] = findings.rate.rate
            done["rate_line"] = findings.rate.line
        if findings.proofs is not None and findings.proofs.count is not None:
            done["proofs_ok"] = findings.proofs.count
        oom_kills = _oom_kills_during(run)
        if oom_kills is not None:
            done["host_oom_kills"] = oom_kills
        dropped = {s: n for s, n in rec.state.dropped.items() if n}
        if dropped:
            done["dropped_lines"] = dropped
        rec.event("bench_done", of_run=True, **done)
    if "logs_complete" not in reported:
        rec.logs_complete([source] + [t[0] for t in run.get("tails", [])])
    if run.get("done_event") and run["done_event"] not in reported:
        # with the step's code either way: a failed step's event is its failure, sent with its lines by
        # this agent (a second process started after it was seconds later on a loaded host)
        phase: dict[str, Any] = {"exit_code": 1 if exit_code is None else exit_code, "duration_s": round(command.duration_s, 3),
                                 "run_id": run["run_id"]}  # its evidence: this run's streams (migration 021)
        if exit_code is None:
            phase["error"] = "the exit status was lost: the agent and the reaper were both killed"
        if limit.fired:
            phase["timeout"] = True
            phase["max_duration_s"] = limit.max_duration_s
        if result.signal:
            phase["signal"] = result.signal
        rec.event(run["done_event"], of_run=True, **phase)
    run["finished"] = True
    run["exit_code"] = exit_code
    for path in (command.stdout_path, command.stderr_path):
        rec.forget_file(path)
    rec.save_state()
    rec.stop_tailing()
    shutil.rmtree(run_dir, ignore_errors=True)
    what = f"signal {result.signal}" if result.signal else f"exit code {exit_code}"
    if limit.fired:
        what += f", timed out after {limit.max_duration_s:g} s"
    logger.info("command ended (%s)", what)
    return 1 if exit_code is None else exit_code


def _oom_kills_during(run: dict) -> int | None:
    """How many processes the container's cgroup OOM-killed since the run started (None: unknown).
    The count at the start is in the run's state, so an adopted run counts from the same start."""
    start = run.get("oom_kills_at_start")
    if start is None:
        return None
    now = hostmem.oom_kills(run.get("proc_root", hostmem.DEFAULT_PROC_ROOT), run.get("cgroup_root", hostmem.DEFAULT_CGROUP_ROOT))
    return None if now is None else max(0, now - start)


async def _adopt(rec: Recorder, signals: Signals, telemetry: GpuTelemetry | None = None) -> int:
    run = rec.state.run
    command = Command.adopt(run["command"])
    state = "still running" if command.running else "already ended"
    say(f"resuming run {run['run_id']}: its command (reaper pid {command.reaper_pid}) {state}; not starting another")
    return await _complete(rec, run, command, signals, telemetry)


async def run_command(inv: Invocation) -> int:
    """``run`` and ``wrap``."""
    s = inv.settings
    rec = Recorder(s)
    registration = _registered_fields(inv) if inv.command == "run" else {}
    await rec.open(registration)
    signals = Signals(rec.wake)
    signals.install()
    telemetry = None
    gpu_telemetry = inv.command == "run"
    try:
        prev = rec.state.run
        if prev and not prev.get("finished") and prev.get("command"):
            telemetry = _start_gpu(rec, s) if gpu_telemetry else None
            code = await _adopt(rec, signals, telemetry)
        else:
            if prev and not prev.get("finished"):
                _close_abandoned(rec)
            run = _start_run(rec, inv)
            if inv.command == "run":
                if s.register:
                    rec.event("registered", **registration)
                rec.event("bench_started", **{k: getattr(s, k) for k in ("proofs", "concurrency", "partition_workers") if getattr(s, k) is not None}, run_id=run["run_id"], command=list(inv.argv))
            run_dir = rec.dir.run_dir(run["run_id"])
            command = Command(list(inv.argv), os.path.join(run_dir, "status"), os.path.join(run_dir, "stdout"), os.path.join(run_dir, "stderr"))
            run["command"] = command.info()  # saved before it starts: a restart never starts it twice
            rec.save_state()
            telemetry = _start_gpu(rec, s) if gpu_telemetry else None  # its gpu_state events come after bench_started
            command.start()
            run["command"] = command.info()
            rec.save_state()
            code = await _complete(rec, run, command, signals, telemetry)
        await _flush(rec, signals, s.flush_timeout_s)
        return code
    finally:
        await _stop_gpu(rec, telemetry)
        signals.uninstall()
        await rec.close()


async def tail_command(inv: Invocation) -> int:
    s = inv.settings
    rec = Recorder(s)
    await rec.open()
    stop = asyncio.Event()
    signals = Signals(lambda: (stop.set(), rec.wake()))
    signals.install()
    telemetry = _start_gpu(rec, s)
    try:
        prev = rec.state.run
        if prev and not prev.get("finished") and prev.get("command"):
            await _adopt(rec, signals)
            signals.count = 0
            prev = rec.state.run
        if prev and not prev.get("finished") and prev.get("mode") == "tail":
            prev["tails"] = [list(t) for t in s.tails]
            say(f"resuming tail run {prev['run_id']}")
        else:
            if prev and not prev.get("finished"):
                _close_abandoned(rec)
            _start_run(rec, inv)
        for source, path in s.tails:
            rec.tail(source, path)
        await rec.pump(stop.is_set)
        rec.finish_reading()
        rec.logs_complete([t[0] for t in s.tails])
        rec.state.run["finished"] = True
        rec.save_state()
        await _stop_gpu(rec, telemetry)  # the last sample; logs_complete is on its way meanwhile
        await _flush(rec, signals, s.flush_timeout_s)
        return 0
    finally:
        await _stop_gpu(rec, telemetry)
        signals.uninstall()
        await rec.close()


async def event_command(inv: Invocation) -> int:
    s = inv.settings
    fields = dict(inv.event_fields)
    ts = fields.pop("ts", None)
    body = {"instance_id": s.instance_id, "kind": inv.event_kind, "ts": round(float(ts) if ts is not None else time.time(), 6), **fields}
    rec = Recorder(s)
    try:
        await rec.open()
    except StateDirBusy:
        return await _event_via_inbox(StateDir(s.spool), body, s.flush_timeout_s)
    signals = Signals(lambda: None)
    signals.install()
    try:
        rec.event(inv.event_kind, ts=body["ts"], **fields)
        delivered = await _flush(rec, signals, s.flush_timeout_s)
        return 0 if delivered else EX_TEMPFAIL
    finally:
        signals.uninstall()
        await rec.close()


async def _event_via_inbox(state_dir: StateDir, body: dict, timeout_s: float) -> int:
    """Another agent holds the state directory: leave the event in its inbox, wait until it takes it."""
    os.makedirs(state_dir.inbox_dir, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{body['kind']}.json"
    path = os.path.join(state_dir.inbox_dir, name)
    with open(path + ".tmp", "wb") as f:
        f.write(orjson.dumps(body))
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + timeout_s
    while os.path.exists(path):
        if time.monotonic() >= deadline:
            say(f"the agent holding {state_dir.path} has not taken the event yet; it stays in {path}")
            return EX_TEMPFAIL
        await asyncio.sleep(0.05)
    return 0  # now in that agent's spool, which sends it in order
