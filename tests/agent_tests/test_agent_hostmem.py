"""Host memory beside NVML: /proc/meminfo and the container's cgroup, read from a fake tree (the seam,
as prometheus client_python's tests/proc), and a run during which the cgroup OOM-killed is ``oom_host``."""

from __future__ import annotations

from pathlib import Path

from agentlib import SCRIPTS, Api

from agent import hostmem

MEMINFO = """MemTotal:       131891704 kB
MemFree:         1213440 kB
MemAvailable:    2048000 kB
Buffers:           12345 kB
"""


def fake_root(tmp_path: Path, *, oom_kill: int = 0, version: int = 2) -> tuple[Path, Path]:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    (proc / "meminfo").write_text(MEMINFO)
    if version == 2:
        cgroup.mkdir()
        (cgroup / "memory.current").write_text("66571993088\n")
        (cgroup / "memory.max").write_text("68719476736\n")
        (cgroup / "memory.events").write_text(f"low 0\nhigh 0\nmax 4\noom {oom_kill}\noom_kill {oom_kill}\noom_group_kill 0\n")
    else:
        (cgroup / "memory").mkdir(parents=True)
        (cgroup / "memory" / "memory.usage_in_bytes").write_text("1048576\n")
        (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        (cgroup / "memory" / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    return proc, cgroup


def test_read_gives_meminfo_and_cgroup_v2_in_bytes(tmp_path):
    proc, cgroup = fake_root(tmp_path, oom_kill=2)
    got = hostmem.read(str(proc), str(cgroup))
    assert got == hostmem.HostMemory(available_bytes=2048000 * 1024, total_bytes=131891704 * 1024,
                                     cgroup_current_bytes=66571993088, cgroup_max_bytes=68719476736, oom_kills=2)


def test_read_falls_back_to_cgroup_v1_and_an_unlimited_max_is_none(tmp_path):
    proc, cgroup = fake_root(tmp_path, oom_kill=1, version=1)
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    got = hostmem.read(str(proc), str(cgroup))
    assert (got.cgroup_current_bytes, got.cgroup_max_bytes, got.oom_kills) == (1048576, None, 1)


def test_read_of_a_missing_tree_is_all_none(tmp_path):
    assert hostmem.read(str(tmp_path / "no-proc"), str(tmp_path / "no-cgroup")) == hostmem.HostMemory()


def test_run_during_which_the_cgroup_oom_killed_is_class_oom_host(tmp_path, server_process, agent):
    proc, cgroup = fake_root(tmp_path, oom_kill=1)  # one kill before the run: not this run's
    server = server_process().start()
    api = Api(server.url)
    log = tmp_path / "daemon.log"
    no_nvml = tmp_path / "no_nvml.py"  # NVML unavailable: host memory is exported all the same
    no_nvml.write_text("raise ImportError('no NVML here')\n")
    done = agent("run", server.url, "C.77", "--tail", f"benchdaemon={log}", "--gpu-interval-s", "0.1", "--nvml-module", str(no_nvml),
                 "--proc-root", str(proc), "--cgroup-root", str(cgroup),
                 command=[SCRIPTS / "bench_host_oom.sh", log, cgroup]).run()
    assert done.returncode == 1, done.stderr
    (bench_done,) = api.events("C.77", "bench_done")
    assert bench_done["host_oom_kills"] == 2  # 1 -> 3 during the run
    api._call("/api/v1/policy/run", {})
    [[failure_class, failure_line]] = api.query("SELECT failure_class, failure_line FROM bench_runs WHERE instance_id = 'C.77'")
    assert failure_class == "oom_host", failure_line
    assert "oom_kill" in failure_line
    metrics = dict(api.query("SELECT name, arg_max(value, ts) FROM metrics WHERE instance_id = 'C.77' GROUP BY name"))
    assert metrics["fleetlog_host_memory_available_bytes"] == 2048000 * 1024
    assert metrics["fleetlog_cgroup_memory_max_bytes"] == 68719476736
    assert metrics["fleetlog_cgroup_memory_current_bytes"] == 66571993088
    assert metrics["fleetlog_cgroup_oom_kills_total"] == 3
