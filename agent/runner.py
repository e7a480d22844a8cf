"""Run the wrapped command (through ``reaper.py``) with its output going to capture files.

The command writes its stdout and stderr straight into two files of the state directory; the
agent tails them like any log (and echoes what it reads to its own stdout and stderr). So the
command never blocks on, or dies with, the agent: a killed agent costs no line, and a restarted
agent *adopts* the command (``Command.adopt``) by the reaper's pid and start time, reads on from
its saved offsets, and learns the exit status from the status file the reaper writes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: the status was lost (the reaper was killed too)
    signal: str | None = None
    ended_at: float | None = None


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (ticks since boot): tells a pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int, start_time: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start_time is not None and process_start_time(pid) not in (start_time, None):
        return False
    try:  # a zombie (our own child, not yet reaped) is not running
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return True


class Command:
    def __init__(self, argv: list[str], status_path: str, stdout_path: str, stderr_path: str) -> None:
        self.argv = argv
        self.status_path = status_path
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.started_at = time.time()
        self.reaper_pid: int | None = None
        self.reaper_start: str | None = None
        self._proc: subprocess.Popen | None = None
        self._result: CommandResult | None = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.stdout_path), exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out = os.open(self.stdout_path, flags, 0o644)
        err = os.open(self.stderr_path, flags, 0o644)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-s", REAPER, self.status_path, "--", *self.argv],
                stdin=subprocess.DEVNULL if os.isatty(0) else None,  # its own process group may not read the terminal
                stdout=out,
                stderr=err,
                process_group=0,  # a terminal's Ctrl-C reaches the agent only; it forwards it once
            )
        finally:
            os.close(out)
            os.close(err)
        self.started_at = time.time()
        self.reaper_pid = self._proc.pid
        self.reaper_start = process_start_time(self._proc.pid)

    def info(self) -> dict:
        """What state.json keeps to adopt this command after a restart."""
        return {
            "argv": self.argv,
            "status_path": self.status_path,
            "stdout_path": self.stdout_path,
            "stderr_path": self.stderr_path,
            "started_at": self.started_at,
            "reaper_pid": self.reaper_pid,
            "reaper_start": self.reaper_start,
        }

    @classmethod
    def adopt(cls, info: dict) -> "Command":
        cmd = cls(info["argv"], info["status_path"], info["stdout_path"], info["stderr_path"])
        cmd.started_at = info["started_at"]
        cmd.reaper_pid = info.get("reaper_pid")
        cmd.reaper_start = info.get("reaper_start")
        if cmd.reaper_pid is None:  # the agent died while starting it: the reaper says who it is
            try:
                with open(cmd.status_path + ".reaper") as f:
                    cmd.reaper_pid = int(f.read().strip())
            except (OSError, ValueError):
                pass
        return cmd

    def _read_status(self) -> CommandResult | None:
        try:
            with open(self.status_path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        return CommandResult(doc.get("exit_code"), doc.get("signal"), doc.get("ended_at"))

    def poll(self) -> CommandResult | None:
        """The result once the command has ended, else None. Never blocks."""
        if self._result is not None:
            return self._result
        if self._proc is not None:
            rc = self._proc.poll()
            if rc is None:
                return None
            lost = CommandResult(rc, None, time.time()) if rc >= 0 else CommandResult(128 - rc, signal.Signals(-rc).name, time.time())
            self._result = self._read_status() or lost
            return self._result
        status = self._read_status()  # adopted: not our child
        if status is not None:
            self._result = status
        elif self.reaper_pid is None or not _alive(self.reaper_pid, self.reaper_start):
            self._result = self._read_status() or CommandResult(None, None, time.time())
        return self._result

    @property
    def running(self) -> bool:
        return self.poll() is None

    def send_signal(self, signum: int) -> None:
        """To the reaper, which forwards it to the command's process group."""
        if self.reaper_pid is not None and self.running:
            try:
                os.kill(self.reaper_pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the command's whole process group (the grace period is over)."""
        self.signal_group(signal.SIGKILL)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the command's whole process group (the reaper lives on to write the status)."""
        try:
            with open(self.status_path + ".pid") as f:
                pid = int(f.read().strip())
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass
        except (OSError, ValueError):  # the command never started: the reaper is all there is
            self.send_signal(signum)

    def reap(self) -> None:
        """Collect our child's exit (no zombie, no ResourceWarning)."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.wait()

    @property
    def duration_s(self) -> float:
        ended = self._result.ended_at if self._result and self._result.ended_at else time.time()
        return max(0.0, ended - self.started_at)
