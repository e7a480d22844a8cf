"""Fixtures: the real agent as a subprocess (the real server is ``server_process``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentlib import FAST, REPO
from tests.conftest import kill_group


def fast_flags(cmd: str) -> list[str]:
    if cmd == "event":  # reads no files
        i = FAST.index("--poll-interval-s")
        return FAST[:i] + FAST[i + 2 :]
    return FAST


@pytest.fixture
def agent(tmp_path):
    """``agent(cmd, url, instance_id, *flags, command=[...])``: the argv of a real agent process,
    with a state directory under tmp_path and fast timings; ``.run()`` waits, ``.start()`` doesn't."""
    procs: list[subprocess.Popen] = []

    class Agent:
        def __init__(self, cmd, url, instance_id, *flags, command=(), spool=None):
            self.spool = spool or tmp_path / "agent-state"
            self.argv = [sys.executable, "-m", "agent.cli", cmd, "--server", url, "--instance-id", instance_id, "--spool", str(self.spool), *fast_flags(cmd), *flags]
            if command:
                self.argv += ["--", *map(str, command)]

        def start(self) -> subprocess.Popen:
            """Its stdout and stderr go to files (a pipe nobody reads would fill up)."""
            n = len(procs)
            self.out, self.err = tmp_path / f"agent-{n}.out", tmp_path / f"agent-{n}.err"
            with open(self.out, "wb") as out, open(self.err, "wb") as err:
                proc = subprocess.Popen(self.argv, cwd=REPO, stdout=out, stderr=err, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                        start_new_session=True)  # its own process group, killed with it
            procs.append(proc)
            return proc

        def run(self, timeout_s: float = 60) -> subprocess.CompletedProcess:
            proc = self.start()
            proc.wait(timeout=timeout_s)
            return subprocess.CompletedProcess(self.argv, proc.returncode, self.out.read_text(errors="replace"), self.err.read_text(errors="replace"))

    yield Agent
    for proc in procs:
        kill_group(proc)  # the agent and whatever it started in its group
