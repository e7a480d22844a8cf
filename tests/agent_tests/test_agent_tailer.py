"""The file tailer: every line written comes out once, whatever the file goes through."""

from __future__ import annotations

import os
import shutil
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.tailer import FileTailer

line_text = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=30)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@st.composite
def write_pattern(draw):
    """Lines ended by LF or CRLF (the last maybe by nothing), cut into chunks, polls in between."""
    lines = draw(st.lists(line_text, min_size=1, max_size=25))
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n"]), min_size=len(lines), max_size=len(lines)))
    unterminated = draw(st.booleans()) and lines[-1] != ""
    data = b"".join(line.encode() + end for line, end in zip(lines, ends))
    if unterminated:
        data = data[: -len(ends[-1])]
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=12))) | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
    polls = draw(st.lists(st.booleans(), min_size=len(chunks), max_size=len(chunks)))
    restart_at = draw(st.one_of(st.none(), st.integers(0, len(chunks))))
    return lines, chunks, polls, restart_at


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(write_pattern())
def test_tailer_yields_exactly_the_written_lines_whatever_the_write_pattern(tmp_path, pattern):
    lines, chunks, polls, restart_at = pattern
    path = tmp_path / "daemon.log"
    path.unlink(missing_ok=True)
    tailer = FileTailer(str(path))
    out = tailer.poll()  # the file does not exist yet
    with open(path, "ab", buffering=0) as f:
        for i, (chunk, poll) in enumerate(zip(chunks, polls)):
            if i == restart_at:  # the agent is killed and started again from its snapshot
                snapshot = tailer.snapshot()
                tailer.close()
                tailer = FileTailer(str(path))
                tailer.restore(snapshot)
            f.write(chunk)
            if poll:
                out += tailer.poll()
    out += tailer.finish()
    assert out == lines


def test_tailer_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    path = tmp_path / "cuzk-bench-daemon.log"
    tailer = FileTailer(str(path))
    assert tailer.poll() == [] and tailer.snapshot() == []
    path.write_bytes(b"cuzk-daemon: listening on 127.0.0.1:9820\n")
    assert tailer.poll() == ["cuzk-daemon: listening on 127.0.0.1:9820"]
    tailer.close()


def test_tailer_reads_a_renamed_file_to_its_end_then_the_new_one(tmp_path):
    clock = Clock()
    path = tmp_path / "daemon.log"
    tailer = FileTailer(str(path), rotate_wait_s=1.0, clock=clock)
    old = open(path, "ab", buffering=0)
    old.write(b"a1\na2\n")
    assert tailer.poll() == ["a1", "a2"]
    old.write(b"a3\npart")
    os.rename(path, tmp_path / "daemon.log.1")
    new = open(path, "ab", buffering=0)
    new.write(b"b1\n")
    old.write(b"ial\n")  # the writer has not reopened yet: the old file still grows
    assert sorted(tailer.poll()) == ["a3", "b1", "partial"]
    old.write(b"a4 after rotation\n")
    clock.now += 0.5
    assert tailer.poll() == ["a4 after rotation"]
    clock.now += 1.0  # quiet for rotate_wait_s: the old file is closed
    assert tailer.poll() == []
    assert len(tailer.snapshot()) == 1
    old.write(b"too late\n")
    new.write(b"b2\n")
    assert tailer.poll() == ["b2"]
    old.close()
    new.close()
    tailer.close()


def test_tailer_recovers_the_end_of_a_copytruncated_file_from_its_copy(tmp_path):
    path = tmp_path / "curio.log"
    tailer = FileTailer(str(path))
    with open(path, "ab", buffering=0) as f:
        f.write(b"line 1\nline 2\n")
        assert tailer.poll() == ["line 1", "line 2"]
        f.write(b"line 3\nline 4 no newline yet")
        shutil.copyfile(path, tmp_path / "curio.log.1")  # logrotate copytruncate
        os.truncate(path, 0)
        f.write(b"line 5\n")
        assert tailer.poll() == ["line 3", "line 4 no newline yet", "line 5"]
        f.write(b"line 6\n")
        assert tailer.poll() == ["line 6"]
    tailer.close()


def test_tailer_notices_a_truncation_that_the_writer_outgrew_before_the_poll(tmp_path):
    path = tmp_path / "curio.log"
    tailer = FileTailer(str(path))
    path.write_bytes(b"old 1\nold 2\n")
    assert tailer.poll() == ["old 1", "old 2"]
    shutil.copyfile(path, tmp_path / "curio.log.1")
    path.write_bytes(b"new 1 is a longer line than before\n")  # truncate, then more than was read
    assert tailer.poll() == ["new 1 is a longer line than before"]
    tailer.close()


def test_tailer_resumes_a_file_rotated_while_the_agent_was_down(tmp_path):
    path = tmp_path / "cuzk.log"
    tailer = FileTailer(str(path))
    with open(path, "ab", buffering=0) as f:
        f.write(b"r1\n")
        assert tailer.poll() == ["r1"]
        snapshot = tailer.snapshot()
        tailer.close()
        f.write(b"r2 written while the agent was down\n")
    os.rename(path, tmp_path / "cuzk.log-20261129")
    path.write_bytes(b"n1\n")
    tailer = FileTailer(str(path))
    tailer.restore(snapshot)
    assert sorted(tailer.finish()) == ["n1", "r2 written while the agent was down"]
    assert tailer.lost_files == 0


def test_tailer_reads_a_replaced_file_with_a_reused_inode_from_its_start(tmp_path):
    path = tmp_path / "daemon.log"
    path.write_bytes(b"first run\n")
    tailer = FileTailer(str(path))
    assert tailer.poll() == ["first run"]
    snapshot = tailer.snapshot()
    tailer.close()
    with open(path, "wb") as f:  # same inode, new content of the same length
        f.write(b"other run\nmore\n")
    tailer = FileTailer(str(path))
    tailer.restore(snapshot)
    assert tailer.finish() == ["other run", "more"]


class Polls:
    """How many polls the tailer has finished; a writer can wait for one that began after now."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def done(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_for_a_whole_poll(self) -> None:
        with self.cond:
            target = self.count + 2  # the one under way may have begun before now
            assert self.cond.wait_for(lambda: self.count >= target, 10)


def _writer(path, n, rotate_every, mode, polls: Polls):
    """A daemon that logs n lines and rotates its own log every rotate_every lines.

    Rotations are far apart in real life (minutes, against polls every 0.1 s): after one, the
    writer goes on writing but does not rotate again before the tailer has polled once.
    """
    f = open(path, "ab", buffering=0)
    for i in range(n):
        f.write(f"line {i:05d} of the daemon log\n".encode())
        if i % rotate_every == rotate_every - 1:
            polls.wait_for_a_whole_poll()
            if mode == "rename":
                os.replace(path, f"{path}.1")
                f.close()
                f = open(path, "ab", buffering=0)
            else:
                shutil.copyfile(path, f"{path}.1")
                os.truncate(path, 0)
            polls.wait_for_a_whole_poll()
    f.close()


def _tail_while_writing(tmp_path, mode):
    path = str(tmp_path / "daemon.log")
    tailer = FileTailer(path, rotate_wait_s=0.2)
    n = 3000
    polls = Polls()
    writer = threading.Thread(target=_writer, args=(path, n, 150, mode, polls))
    out = []
    writer.start()
    while writer.is_alive():
        out += tailer.poll()
        polls.done()
    writer.join()
    out += tailer.finish()
    return out, [f"line {i:05d} of the daemon log" for i in range(n)]


def test_tailer_loses_nothing_when_the_log_is_renamed_away_while_written(tmp_path):
    out, expected = _tail_while_writing(tmp_path, "rename")
    assert sorted(out) == expected


def test_tailer_loses_nothing_when_the_log_is_copytruncated_while_written(tmp_path):
    out, expected = _tail_while_writing(tmp_path, "copytruncate")
    assert sorted(out) == expected


def test_tailer_resumed_after_finish_does_not_make_a_line_of_the_late_newline(tmp_path):
    path = tmp_path / "cuzk.log"
    path.write_bytes(b"a\nb without newline")
    tailer = FileTailer(str(path))
    assert tailer.finish() == ["a", "b without newline"]  # stopped: the partial line is shipped
    snapshot = tailer.snapshot()
    tailer = FileTailer(str(path))
    tailer.restore(snapshot)
    assert tailer.poll() == []
    with open(path, "ab") as f:
        f.write(b"\r\nc\n")
    assert tailer.poll() == ["c"]
    tailer.close()
