"""The small process between the agent and the wrapped command; stdlib only, run as a script.

``python reaper.py STATUS_PATH -- COMMAND ARGS...`` starts COMMAND in its own process group (its
stdout and stderr are the capture files the agent opened for it), forwards SIGTERM, SIGINT, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 to that group, writes its own pid to ``STATUS_PATH.reaper``, COMMAND's to ``STATUS_PATH.pid`` and, when
COMMAND ends, its exit status to ``STATUS_PATH`` as JSON (``exit_code``: the code, or 128+signal;
``signal``: the signal's name or null), then exits with the same code.

Why it exists: the command must not depend on the agent. If the agent is killed (OOM killer,
``kill -9``), the benchmark goes on writing to its capture files, and the restarted agent reads on
from where the last one stopped and still learns the exit status from STATUS_PATH.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_status(path: str, exit_code: int, signum: int | None, pid: int | None) -> None:
    name = signal.Signals(signum).name if signum else None
    write_atomically(path, json.dumps({"exit_code": exit_code, "signal": name, "pid": pid, "ended_at": time.time()}))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: reaper.py STATUS_PATH -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    status_path, command = argv[0], argv[2:]
    write_atomically(status_path + ".reaper", str(os.getpid()))  # an agent that died before saving our pid finds us here
    child: subprocess.Popen | None = None
    early: list[int] = []  # signals that came before the command existed

    def forward(signum: int, _frame) -> None:
        if child is None:
            early.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:  # exec resets these to their default in the command
        signal.signal(signum, forward)
    try:
        child = subprocess.Popen(command, process_group=0)
    except (FileNotFoundError, PermissionError, OSError) as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        print(f"fleetlog-agent: cannot run {command[0]!r}: {e}", file=sys.stderr, flush=True)
        write_status(status_path, code, None, None)
        return code
    write_atomically(status_path + ".pid", str(child.pid))
    for signum in early:
        forward(signum, None)
    rc = child.wait()
    exit_code, signum = (128 - rc, -rc) if rc < 0 else (rc, None)
    write_status(status_path, exit_code, signum, child.pid)
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
