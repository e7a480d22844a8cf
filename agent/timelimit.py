"""``--max-duration``: a wrapped command that runs too long is ended, and the run says so.

Past ``started_at + max_duration_s`` (wall clock, from the state directory: the limit holds for an
agent that adopts the command after a restart), the command's process group gets SIGTERM, and
SIGKILL ``grace_s`` later if it is still running. Before the signal, a line saying so is appended
to the command's captured stderr: it is shipped in order with the command's last words (where the
server's failure classifier reads ``timed out``), echoed, and heads ``bench_done``'s failure
excerpt; ``bench_done`` carries ``"timeout": true``. A command that exits 0 on the SIGTERM still
timed out: its exit code is reported as 124 (what coreutils' ``timeout`` uses).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Callable

from agent.runner import Command

logger = logging.getLogger(__name__)

TIMED_OUT_EXIT_CODE = 124


def timed_out_line(command: Command, max_duration_s: float) -> str:
    name = os.path.basename(command.argv[0]) if command.argv else "the command"
    return f"fleetlog-agent: {name} timed out after {max_duration_s:g} s (--max-duration)"


class TimeLimit:
    def __init__(self, command: Command, max_duration_s: float | None, grace_s: float, *, fired: bool = False, on_fire: Callable[[], None] = lambda: None) -> None:
        self.command = command
        self.max_duration_s = max_duration_s
        self.grace_s = grace_s
        self.fired = fired  # True when an earlier agent already ended the command for it
        self.on_fire = on_fire
        self._timers: list[asyncio.TimerHandle] = []

    def start(self, now: float) -> None:
        """Arm the limit (``now``: wall-clock time, as ``command.started_at``)."""
        if self.max_duration_s is None:
            return
        if self.fired:  # an earlier agent sent the SIGTERM and died before its SIGKILL was due
            if self.command.running:
                self._timers.append(asyncio.get_running_loop().call_later(self.grace_s, self._kill))
            return
        delay = max(0.0, self.command.started_at + self.max_duration_s - now)
        self._timers.append(asyncio.get_running_loop().call_later(delay, self._fire))

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []

    @property
    def line(self) -> str | None:
        return timed_out_line(self.command, self.max_duration_s) if self.fired and self.max_duration_s is not None else None

    def exit_code(self, code: int | None) -> int | None:
        """What to report: a timed-out command never reports success."""
        return TIMED_OUT_EXIT_CODE if self.fired and code == 0 else code

    def _fire(self) -> None:
        if not self.command.running:
            return
        self.fired = True
        assert self.max_duration_s is not None
        note = f"{timed_out_line(self.command, self.max_duration_s)}: SIGTERM to its process group, SIGKILL in {self.grace_s:g} s unless it exits"
        logger.warning("%s", note)
        self._append_to_stderr(note)
        self.on_fire()  # recorded before the signal: an agent restarted now still knows
        self.command.signal_group(signal.SIGTERM)
        self._timers.append(asyncio.get_running_loop().call_later(self.grace_s, self._kill))

    def _kill(self) -> None:
        if self.command.running:
            self.command.kill()

    def _append_to_stderr(self, note: str) -> None:
        try:
            fd = os.open(self.command.stderr_path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except OSError as e:
            logger.warning("cannot note the timeout in %s: %s", self.command.stderr_path, e)
            return
        try:
            size = os.fstat(fd).st_size
            fresh_line = size == 0 or os.pread(fd, 1, size - 1) == b"\n"  # else the command's partial line ends here
            os.write(fd, (b"" if fresh_line else b"\n") + note.encode() + b"\n")
        finally:
            os.close(fd)
