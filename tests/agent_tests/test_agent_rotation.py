"""Rotations faster than the polls: a file renamed twice (or copied and truncated twice) between two
polls of the tailer, at a high line rate. Every line comes out exactly once, or the loss is counted:
never a silent loss."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter

import pytest

from agent.tailer import FileTailer

N_LINES = 20_000


def line(i: int) -> str:
    return f"line {i:05d} of the daemon log, written at a high rate"


class Rotator:
    """What logrotate (or the daemon itself) does to ``path``, in one of three ways."""

    def __init__(self, path: str, mode: str) -> None:
        self.path = path
        self.mode = mode  # rename (NAME.1, NAME.2, ... shifted), dateext (NAME-0001, ...), copytruncate
        self.count = 0

    def _shift(self) -> None:
        for k in range(self.count, 0, -1):  # NAME.k -> NAME.k+1, the newest is NAME.1
            os.replace(f"{self.path}.{k}", f"{self.path}.{k + 1}")

    def rotate(self, f):
        """Returns the file the writer goes on with."""
        if self.mode == "rename":
            self._shift()
            os.replace(self.path, f"{self.path}.1")
        elif self.mode == "dateext":
            os.replace(self.path, f"{self.path}-{self.count + 1:04d}")
        else:
            self._shift()
            shutil.copyfile(self.path, f"{self.path}.1")
            os.truncate(self.path, 0)
        self.count += 1
        if self.mode == "copytruncate":
            return f
        f.close()
        return open(self.path, "ab", buffering=0)


def _write(path: str, mode: str, gap_s: float, burst: int, every: int) -> None:
    """Writes N_LINES lines in bursts; every ``every`` lines, two rotations ``gap_s`` apart with
    lines in between: the second generation is created and rotated away between two polls."""
    rotator = Rotator(path, mode)
    f = open(path, "ab", buffering=0)
    i = 0
    while i < N_LINES:
        n = min(burst, N_LINES - i)
        f.write("".join(line(j) + "\n" for j in range(i, i + n)).encode())
        i += n
        if i % every < burst and i < N_LINES:
            f = rotator.rotate(f)
            for _ in range(3):  # the short-lived generation gets a few writes
                if i < N_LINES:
                    f.write((line(i) + "\n").encode())
                    i += 1
            time.sleep(gap_s)
            f = rotator.rotate(f)
        time.sleep(0.001)
    f.close()


def _tail_while_rotating(tmp_path, mode: str, gap_s: float, poll_interval_s: float, burst: int = 40, every: int = 600):
    path = str(tmp_path / "daemon.log")
    open(path, "wb").close()
    tailer = FileTailer(path, rotate_wait_s=0.3)
    failed: list[BaseException] = []

    def write() -> None:
        try:
            _write(path, mode, gap_s, burst, every)
        except BaseException as e:  # seen by the test, not lost in the thread
            failed.append(e)

    writer = threading.Thread(target=write)
    out: list[str] = []
    writer.start()
    try:
        while writer.is_alive():
            out += tailer.poll()
            time.sleep(poll_interval_s)
    finally:
        writer.join()
    assert not failed, failed
    deadline = time.monotonic() + 5  # the renamed-away files are read until quiet for rotate_wait_s
    while time.monotonic() < deadline and len(tailer.snapshot()) > 1:
        out += tailer.poll()
        time.sleep(0.02)
    out += tailer.finish()
    return out, tailer


TIMINGS = [(0.0, 0.1), (0.02, 0.1), (0.02, 0.02), (0.05, 0.3)]


@pytest.mark.parametrize("mode", ["rename", "dateext"])
@pytest.mark.parametrize(("gap_s", "poll_interval_s"), TIMINGS)
def test_tailer_reads_every_line_once_when_renamed_twice_between_polls(tmp_path, mode, gap_s, poll_interval_s):
    out, tailer = _tail_while_rotating(tmp_path, mode, gap_s, poll_interval_s)
    doubles = [x for x, n in Counter(out).items() if n > 1]
    assert not doubles, doubles[:5]
    missing = sorted(set(map(line, range(N_LINES))) - set(out))
    assert not missing, f"{len(missing)} lines lost, e.g. {missing[:3]}"
    assert tailer.lost == (0, 0)


@pytest.mark.parametrize(("gap_s", "poll_interval_s"), TIMINGS)
def test_tailer_copytruncated_twice_between_polls_loses_nothing_silently(tmp_path, gap_s, poll_interval_s):
    out, tailer = _tail_while_rotating(tmp_path, "copytruncate", gap_s, poll_interval_s)
    doubles = [x for x, n in Counter(out).items() if n > 1]
    assert not doubles, doubles[:5]
    missing = set(map(line, range(N_LINES))) - set(out)
    assert not missing or tailer.lost[0] > 0, f"{len(missing)} lines lost and not counted"
