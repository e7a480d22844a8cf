"""Exactly once across crashes: tailer → collector → spool → acknowledgement, killed anywhere.

A simulated agent (the real components, minus HTTP) reads a log that is being written, spools and
"ships" it to a fake server that keeps the first line it gets per seq and counts repeats; it is
killed at arbitrary moments, sometimes in the middle of writing a spool record, and started again
from its state directory. At the end the server must hold each written line once, at seqs 0..n-1.
"""

from __future__ import annotations

import os

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.collector import Collector
from agent.spool import Record, Spool
from agent.state import RunState, StateDir, recover
from agent.tailer import FileTailer


class Life:
    """One process lifetime of the simulated agent."""

    def __init__(self, directory: str, log: str, server: dict) -> None:
        self.dir = StateDir(directory)
        self.dir.lock()
        self.spool = Spool(self.dir.spool_dir, max_bytes=1 << 30, segment_max_bytes=2048, before_delete=self.save)
        self.state = recover(self.dir.load(), "C.1", self.spool)
        if self.state.run is None:
            self.state.start_run("tail")
        self.save()
        self.collector = Collector(self.state, self.spool.append, batch_max_bytes=300, batch_max_delay_s=0)
        self.tailer = FileTailer(log)
        self.last = self.state.files.get(self.tailer.path, [])
        self.tailer.restore(self.last)
        self.server = server

    def save(self) -> None:
        self.state.acked, self.state.written_at = self.spool.acked, self.spool.end
        self.dir.save(self.state.to_json())

    def poll(self, finish: bool = False) -> None:
        lines = self.tailer.finish() if finish else self.tailer.poll()
        snap = self.tailer.snapshot()
        files = {self.tailer.path: snap} if snap != self.last else None
        self.last = snap
        self.collector.add("cuzk", lines, 1.0, files)

    def ship(self, max_bytes: int) -> None:
        entries = self.spool.read(self.spool.acked, max_bytes)
        for e in entries:
            if e.record.kind == "logs" and e.record.meta["n"]:
                stream = orjson.loads(e.record.payload)
                for line in stream["lines"]:
                    key = (stream["run_id"], line["seq"])
                    if key in self.server["lines"]:
                        assert self.server["lines"][key] == line["line"], "a seq was reused for another line"
                        self.server["duplicates"] += 1
                    else:
                        self.server["lines"][key] = line["line"]
        if entries:
            self.spool.ack(entries[-1].end)
            if self.spool.releasable():
                self.save()
                self.spool.release()

    def crash(self, torn_bytes: int) -> None:
        """SIGKILL: nothing more is saved; maybe a spool write was cut short."""
        if torn_bytes:
            partial = Record("logs", {"source": "cuzk", "run_id": self.state.run_id, "first_seq": 10**6, "n": 1, "files": {}}, b'{"lines":[]}').encode()
            seg = max(int(n[:-4]) for n in os.listdir(self.dir.spool_dir))
            with open(os.path.join(self.dir.spool_dir, f"{seg:012d}.seg"), "ab") as f:
                f.write(partial[: torn_bytes % len(partial)])
        self.tailer.close()
        self.spool.close()
        self.dir.unlock()


steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 6), st.booleans()),
        st.tuples(st.just("poll")),
        st.tuples(st.just("flush")),
        st.tuples(st.just("save")),
        st.tuples(st.just("ship"), st.integers(1, 2000)),
        st.tuples(st.just("crash"), st.integers(0, 60)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps)
def test_every_line_is_stored_once_whenever_the_agent_is_killed(tmp_path, plan):
    case = tmp_path / os.urandom(4).hex()
    case.mkdir()
    log = str(case / "cuzk.log")
    server = {"lines": {}, "duplicates": 0}
    written: list[str] = []
    partial = ""
    life = Life(str(case / "state"), log, server)
    with open(log, "a") as f:
        for step in plan:
            if step[0] == "write":
                for _ in range(step[1]):
                    text = f"cuzk line {len(written)} " + "x" * (len(written) % 7)
                    if step[2] and not partial:  # half now, the rest with the next write
                        partial = text
                        f.write(text[:5])
                        f.flush()
                        break
                    if partial:
                        f.write(partial[5:] + "\n")
                        written.append(partial)
                        partial = ""
                        continue
                    f.write(text + "\n")
                    written.append(text)
                f.flush()
            elif step[0] == "poll":
                life.poll()
            elif step[0] == "flush":
                life.collector.flush(force=True)
            elif step[0] == "save":
                life.save()
            elif step[0] == "ship":
                life.ship(step[1])
            else:
                life.crash(step[1])
                life = Life(str(case / "state"), log, server)
        if partial:
            f.write(partial[5:] + "\n")
            written.append(partial)
    life.poll(finish=True)
    life.collector.flush(force=True)
    for _ in range(1000):
        if life.spool.empty:
            break
        life.ship(1 << 20)
    assert life.spool.empty, "records the shipper cannot read are stuck in the spool"
    life.crash(0)
    stored = [line for (_run, _seq), line in sorted(server["lines"].items())]
    assert stored == written
    assert [seq for (_run, seq) in sorted(server["lines"])] == list(range(len(written)))
    assert len({run for run, _seq in server["lines"]}) <= 1  # a restart resumed the run


def test_a_position_is_not_saved_before_its_lines_are_spooled(tmp_path):
    """loki#1540: the read position must not move ahead of the lines it covers."""
    log = tmp_path / "cuzk.log"
    log.write_text("one\ntwo\n")
    life = Life(str(tmp_path / "state"), str(log), {"lines": {}, "duplicates": 0})
    life.poll()  # read, but not yet in the spool
    assert life.state.files == {} and life.state.seqs == {}
    life.save()
    life.crash(0)
    life = Life(str(tmp_path / "state"), str(log), life.server)
    life.poll()
    life.collector.flush(force=True)
    assert life.state.seqs == {"cuzk": 2}
    assert life.state.files[str(log)][0]["offset"] == len("one\ntwo\n")


def test_recover_replays_records_spooled_after_the_last_save(tmp_path):
    directory = StateDir(str(tmp_path / "state"))
    spool = Spool(directory.spool_dir, max_bytes=1 << 20)
    state = recover(None, "C.1", spool)
    state.start_run("run")
    directory.save(state.to_json())  # saved here; everything below is only in the spool
    collector = Collector(state, spool.append, batch_max_bytes=1 << 20, batch_max_delay_s=0)
    collector.add("benchdaemon", ["a", "b", "c"], 1.0, {"/tmp/d.log": [{"dev": 1, "ino": 2, "offset": 6, "head_len": 6, "head_crc": 7}]})
    collector.flush(force=True)
    spool.close()
    reopened = Spool(directory.spool_dir, max_bytes=1 << 20)
    again = recover(directory.load(), "C.1", reopened)
    reopened.close()
    assert again.seqs == {"benchdaemon": 3}
    assert again.files["/tmp/d.log"][0]["offset"] == 6
    assert again.run_id == state.run_id


def test_a_lost_count_spooled_after_the_last_save_survives_a_crash(tmp_path):
    directory = StateDir(str(tmp_path / "state"))
    spool = Spool(directory.spool_dir, max_bytes=1 << 20)
    state = recover(None, "C.1", spool)
    state.start_run("tail")
    directory.save(state.to_json())
    collector = Collector(state, spool.append, batch_max_bytes=1 << 20, batch_max_delay_s=0)
    moved = {"/tmp/curio.log": [{"dev": 1, "ino": 2, "offset": 0, "head_len": 0, "head_crc": 0}]}
    collector.add("curio", ["after the truncation"], 1.0, moved, lost=(1, 40))
    collector.flush(force=True)
    assert (state.lost_lines, state.lost_bytes) == ({"curio": 1}, {"curio": 40})
    spool.close()  # killed before state.json was saved again
    reopened = Spool(directory.spool_dir, max_bytes=1 << 20)
    again = recover(directory.load(), "C.1", reopened)
    reopened.close()
    assert (again.lost_lines, again.lost_bytes) == ({"curio": 1}, {"curio": 40})
    assert again.dropped_total(["curio", "cuzk"]) == {"curio": 1}
    assert _roundtrip(again).lost_lines == {"curio": 1}


def _roundtrip(state: RunState) -> RunState:
    return RunState.from_json(orjson.loads(orjson.dumps(state.to_json())))
