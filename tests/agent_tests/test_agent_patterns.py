"""Failure patterns end to end (issue 25): three benchmarks on three machines (three GPU models, two
drivers, two images) die of the same CUDA OOM with different sizes, request ids and pointers, through
the real `fleetlog-agent` against a real server; `fleetlog patterns` groups them as one pattern and
names who shares it, and `fleetlog why --diff` shows where one parts from a healthy run of its model."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from agentlib import REPO, Api

MODELS = [  # instance, machine, GPU model, driver, image, size, request id, pointer
    ("C.p1", 55891, "RTX PRO 4000", "575.57.08", "v1.4.0", "3.2 GiB", "6f1c2a3b-1234-4abc-9def-0123456789ab", "0x7f3a2c00"),
    ("C.p2", 55892, "RTX 4090", "570.124.06", "v1.4.0", "21.4 GiB", "0b9e77c1-5e6f-4d2a-8b3c-a1b2c3d4e5f6", "0x7f00aa10"),
    ("C.p3", 41003, "RTX A4000", "575.57.08", "v1.3.2", "512 MiB", "9d8c7b6a-0f1e-4d3c-b2a1-00ff00ff00ff", "0x55d1e000"),
]

BENCH = """#!/bin/sh
log="$1"
echo "INFO cuzk_daemon: listening on 127.0.0.1:$2, 1 GPU" >> "$log"
echo "INFO cuzk_daemon::pce: warm-up proof: PCE extraction started (partition-workers 16)" >> "$log"
echo "Starting benchmark: 12 proofs, concurrency 3, partition-workers 16"
"""
OOM = """echo "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating $3 for NTT (request $4, buffer $5)" >> "$log"
echo "cuzk-bench: rpc error: daemon closed the connection" >&2
echo "benchmark.sh exited with error" >&2
exit 1
"""
HEALTHY = """echo "INFO cuzk_daemon::pce: PCE extraction done in 212 s" >> "$log"
echo "proof 1/12 done in 90.0 s"
echo "Benchmark result: 40.0 proofs/hour"
"""


def fleetlog(server: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLOG_")} | {"COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args, "--server", server], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env, start_new_session=True)


def bench(agent, tmp_path, url: str, instance: str, machine: int, gpu: str, driver: str, image: str, body: str,
          *script_args: str) -> int:
    spool = tmp_path / instance
    registered = agent("event", url, instance, "registered", f"machine_id={machine}", f"gpu_model={gpu}", f"driver={driver}",
                       f'labels={{"image_version": "{image}"}}', "dph=0.35", spool=spool).run()
    assert registered.returncode == 0, registered.stderr
    script = tmp_path / f"{instance}.sh"
    script.write_text(BENCH + body)
    script.chmod(0o755)
    log = tmp_path / f"{instance}-daemon.log"
    done = agent("run", url, instance, "--no-register", "--tail", f"benchdaemon={log}", "--proofs", "12",
                 spool=spool, command=[script, log, 9820 + machine % 7, *script_args]).run(timeout_s=90)
    return done.returncode


def test_three_ooms_with_different_sizes_and_ids_are_one_pattern_across_three_machines(tmp_path, server_process, agent):
    server = server_process("--policy-interval", "0").start()
    api = Api(server.url)
    for instance, machine, gpu, driver, image, size, request, pointer in MODELS:
        assert bench(agent, tmp_path, server.url, instance, machine, gpu, driver, image, OOM, size, request, pointer) == 1
    assert bench(agent, tmp_path, server.url, "C.ok", 55893, "RTX PRO 4000", "575.57.08", "v1.4.0", HEALTHY) == 0
    api._call("/api/v1/policy/run", {})
    assert api.query("SELECT failure_class, count(*) FROM bench_runs WHERE exit_code = 1 GROUP BY 1") == [["oom", 3]]

    shown = fleetlog(server.url, "patterns")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "oom  3 failures, 3 instances, 3 machines" in text, text
    # the deciding line as the agent's excerpt gave it (its source in front)
    assert ("  [benchdaemon] ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating <size> "
            "for NTT (request <uuid>, buffer <hex>)\n") in text, text
    assert "  machines  41003 55891 55892\n" in text and "  GPUs      RTX 4090, RTX A4000, RTX PRO 4000\n" in text, text
    assert "  drivers   570.124.06 575.57.08\n" in text and "  images    v1.3.2 v1.4.0\n" in text, text
    assert "(1 pattern;" in text, text  # the healthy run has no deciding line; the three OOMs are one

    pattern_id = text.split()[0]
    listed = fleetlog(server.url, "patterns", pattern_id, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    failures = orjson.loads(listed.stdout)
    assert sorted((f["instance_id"], f["machine_id"], f["driver"], f["image_version"]) for f in failures) == [
        ("C.p1", 55891, "575.57.08", "v1.4.0"), ("C.p2", 55892, "570.124.06", "v1.4.0"), ("C.p3", 41003, "575.57.08", "v1.3.2")]
    assert {f["pattern_id"] for f in failures} == {pattern_id}
    assert sorted(f["failure_line"].split("allocating ")[1].split(" for")[0] for f in failures) == ["21.4 GiB", "3.2 GiB", "512 MiB"]

    why = fleetlog(server.url, "why", "C.p1", "--diff")
    assert why.returncode == 0, why.stderr
    text = why.stdout
    assert "compared with C.ok: the latest healthy run of RTX PRO 4000 (machine 55893" in text, text
    # the listening line differs in its port only (masked): alike for 2 lines, parted at the third
    assert "  benchdaemon: alike for 2 lines, parted at line 3" in text, text
    assert "    3 + failed   ERROR cuzk_daemon::pce: CUDA error: out of memory" in text, text
    assert "      - healthy  INFO cuzk_daemon::pce: PCE extraction done in 212 s" in text, text
    alone = fleetlog(server.url, "why", "C.p2", "--diff")  # no RTX 4090 passed
    assert "compared with: nothing (no run of RTX 4090 passed on another instance)" in alone.stdout, alone.stdout
