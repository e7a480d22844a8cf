"""The processes of a session, read from /proc: `ps` truncates a command line to the terminal's width
(COLUMNS, or 80 when it is set that way), so a long checkout path hides the words a test looks for."""

from __future__ import annotations

import os
from pathlib import Path


def in_session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line joined by spaces) of every live process whose session is sid."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc.name)
            if os.getsid(pid) != sid:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
        found.append((pid, b" ".join(a for a in argv if a).decode(errors="replace")))
    return found


def agent_runs(sid: int) -> list[int]:
    """The pids of `fleetlog-agent run` in session sid."""
    return [pid for pid, args in in_session(sid) if "fleetlog-agent run" in args]
