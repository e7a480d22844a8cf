"""What the agent derives from a run's output (rate, proofs completed, failure excerpt) survives its restart exactly
as the lines do (issue 21.1).

The real Recorder reads a recorded benchmark output as it is written (the daemon's log, the
command's stdout and stderr); it is "SIGKILLed" after chosen lines: the state directory is put back
as it was at that moment (what a killed process leaves on disk), and a new Recorder starts from it,
as a restarted agent does. Its findings at the end must equal those of an agent never killed.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import orjson

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.config import AgentSettings
from agent.recorder import Recorder
from agent.result import Findings
from agent.spool import Record

# A failed PCE extraction on an RTX PRO 4000 (docs: /work/shared/INCIDENT.md), with a warm-up
# estimate that is not the rate, a rate line before the end, an over-long line and an unterminated one.
OUTPUT: list[tuple[str, str]] = [
    ("stdout", "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"),
    ("benchdaemon", "INFO cuzk_daemon: listening on 127.0.0.1:9820"),
    ("benchdaemon", "INFO cuzk_daemon::pce: extracting PCE (warm-up proof)"),
    ("stdout", "warm-up: 12.0 proofs/hour (estimate)"),
    ("stderr", "warning: GPU temperature 81C"),
    ("benchdaemon", "INFO cuzk_daemon::prover: PoRep C2 proof 1/12 started"),
    ("stdout", "proof 1/12 done in 141.2 s"),
    ("benchdaemon", "INFO cuzk_daemon::prover: PoRep C2 proof 1/12 finished"),
    ("stdout", "proof 2/12 done in 139.8 s"),
    ("stdout", "Benchmark result: 45.7 proofs/hour"),
    ("benchdaemon", "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) during PCE extraction"),
    ("stderr", "benchmark.sh: " + "x" * 600 + " failed"),
    ("stdout", "proof 3/12 failed"),
    ("benchdaemon", "INFO cuzk_daemon: shutting down"),
    ("stderr", "benchmark.sh exited with error"),
    ("stdout", "Benchmark result: 0 proofs/hour (partial)"),
] + [("benchdaemon", f"INFO cuzk_daemon::grpc: request {i} cancelled") for i in range(18)] + [
    ("stdout", "Benchmark result: 38.25 proofs/hour"),
    ("stderr", "benchmark.sh: cleaning up (no newline)"),  # the last line, unterminated
]


class Bench:
    """The benchmark's files; they outlive the agent (the kernel keeps what was written)."""

    def __init__(self, root: Path) -> None:
        self.paths = {name: root / name for name in ("benchdaemon", "stdout", "stderr")}
        for path in self.paths.values():
            path.touch()

    def write(self, i: int) -> None:
        stream, line = OUTPUT[i]
        with open(self.paths[stream], "a") as f:
            f.write(line if i == len(OUTPUT) - 1 else line + "\n")


class Agent:
    """One agent process's Recorder, set up as ``run`` sets it up."""

    def __init__(self, root: Path, bench: Bench, batch_max_delay_s: float) -> None:
        self.state_dir = root / "state"
        self.bench = bench
        self.settings = AgentSettings(
            server="http://127.0.0.1:9", instance_id="C.32733029", spool=str(self.state_dir), gpu_interval_s=0,
            batch_max_delay_s=batch_max_delay_s, retry_initial_delay_s=60, retry_max_delay_s=60,
            tails=(("benchdaemon", str(bench.paths["benchdaemon"])),),
        )
        self.rec: Recorder | None = None

    async def start(self) -> Recorder:
        rec = self.rec = Recorder(self.settings)
        await rec.open()
        if rec.state.run is None:  # the first start: _start_run's part
            rec.state.start_run("run", source="benchout", tails=[["benchdaemon", str(self.bench.paths["benchdaemon"])]], bench=True,
                                rate_regex=self.settings.rate_regex)
            rec.state.findings = Findings.for_run(rec.state.run)
            rec.save_state()
        rec.tail("benchdaemon", str(self.bench.paths["benchdaemon"]))  # _complete's part
        rec.tail("benchout", str(self.bench.paths["stdout"]), label="stdout")
        rec.tail("benchout", str(self.bench.paths["stderr"]), label="stderr")
        return rec

    async def kill(self, torn_bytes: int = 0) -> None:
        """SIGKILL: the next agent sees the state directory as it is now, not what a clean exit saves;
        ``torn_bytes``: it died writing a record (of a rate line no one read), cut after that many bytes."""
        snapshot = self.state_dir.with_name("at-kill")
        shutil.copytree(self.state_dir, snapshot)
        assert self.rec is not None
        if torn_bytes:
            run_id = self.rec.state.run_id
            payload = orjson.dumps({"source": "benchout", "run_id": run_id, "lines": [{"seq": 10**6, "ts": 1.0, "line": "999 proofs/hour"}]})
            torn = Record("logs", {"source": "benchout", "run_id": run_id, "first_seq": 10**6, "n": 1, "files": {}, "labels": [["stdout", 1]]}, payload).encode()
            last = max(snapshot.joinpath("spool").glob("*.seg"))
            with open(last, "ab") as f:
                f.write(torn[: torn_bytes % len(torn)])
        await self.rec.close()
        shutil.rmtree(self.state_dir)
        snapshot.rename(self.state_dir)

    async def stop(self) -> dict:
        assert self.rec is not None
        self.rec.finish_reading()
        findings = self.rec.state.findings
        assert findings is not None and findings.rate is not None
        assert findings.proofs is not None
        result = {"rate_per_hour": findings.rate.rate, "rate_line": findings.rate.line, "failure_excerpt": findings.evidence.excerpt(),
                  "proofs_ok": findings.proofs.count, "proofs_total": findings.proofs.total}
        await self.rec.close()
        return result


async def benchmark(root: Path, kills: list[int | None], saves: list[bool], polls: list[bool], batch_max_delay_s: float) -> dict:
    """Write OUTPUT line by line; after line i, maybe poll, maybe save state, maybe kill (``kills[i]``:
    the torn bytes of a record it was writing) and restart."""
    root.mkdir()
    bench = Bench(root)
    agent = Agent(root, bench, batch_max_delay_s)
    rec = await agent.start()
    for i in range(len(OUTPUT)):
        bench.write(i)
        if polls[i]:
            rec.poll()
        if saves[i]:
            rec.save_state()
        if kills[i] is not None:
            await agent.kill(kills[i])
            rec = await agent.start()
    return await agent.stop()


N = len(OUTPUT)
flags = st.lists(st.booleans(), min_size=N, max_size=N)
kill_plans = st.lists(st.none() | st.integers(0, 400), min_size=N, max_size=N)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kills=kill_plans, saves=flags, polls=flags, batch_max_delay_s=st.sampled_from([0.0, 3600.0]))
@example(kills=[0] * N, saves=[False] * N, polls=[True] * N, batch_max_delay_s=0.0)  # killed after every line
@example(kills=[0] * N, saves=[True] * N, polls=[True] * N, batch_max_delay_s=3600.0)
@example(kills=[77] * N, saves=[False] * N, polls=[True] * N, batch_max_delay_s=0.0)
def test_findings_after_kills_at_any_lines_equal_those_of_an_agent_never_killed(tmp_path_factory, kills, saves, polls, batch_max_delay_s):
    root = tmp_path_factory.mktemp("findings")
    never_killed = asyncio.run(benchmark(root / "never-killed", [None] * N, saves, polls, batch_max_delay_s))
    assert never_killed["rate_per_hour"] == 38.25 and "CUDA error: out of memory" in never_killed["failure_excerpt"]
    assert (never_killed["proofs_ok"], never_killed["proofs_total"]) == (2, 12)  # 1 and 2 done (each said twice), 3 failed
    assert asyncio.run(benchmark(root / "killed", kills, saves, polls, batch_max_delay_s)) == never_killed


def test_an_event_spooled_before_the_kill_is_known_to_the_restarted_agent(tmp_path):
    """Killed after bench_done went into the spool, before the run was marked finished: the next
    agent must not send a second bench_done (the server would store a second run)."""

    async def scenario() -> list[str]:
        bench = Bench(tmp_path)
        agent = Agent(tmp_path, bench, 0.0)
        rec = await agent.start()
        rec.event("gpu_state", state="nvml_unavailable", reason="test")  # not the run's report
        rec.save_state()
        rec.event("bench_done", of_run=True, exit_code=0, rate_per_hour=45.7)
        rec.logs_complete(["benchout", "benchdaemon"])
        await agent.kill()
        rec = await agent.start()
        try:
            return list(rec.state.reported)
        finally:
            await rec.close()

    assert asyncio.run(scenario()) == ["bench_done", "logs_complete"]
