"""``fleetlog demo``: a simulated fleet pushed into a running server through the real agent.

Eleven instances, each driven the way ``docker/entrypoint.sh`` drives a real one: ``fleetlog-agent
event registered``, ``wrap`` of a parameter fetch (source setup, then params_done), ``run`` of a
benchmark with its daemon log tailed as benchdaemon, then ``event running`` for the healthy ones.
The parameter fetch and the benchmark are small generated shell scripts that print what the real
ones print, faster. GPU samples (DCGM names) for each benchmark's window are pushed through the
metrics API, shaped by what went wrong. Then the policies run once, so decisions, bad hosts and
failure classes are there to look at. Machine 41010 is rented twice, one rental after the other:
40.2 proofs/hour, then 20.1 (a degraded machine: best 40.2, recent 30.2; `fleetlog hosts` says so).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingest.client import Client, ClientError


@dataclasses.dataclass(frozen=True)
class Profile:
    instance_id: str
    machine_id: int
    gpu_model: str
    dph: float
    location: str
    outcome: str  # healthy, slow, oom, gpu_lost, network, degraded (healthy, at half the rate it had)
    rate: float = 0.0
    oom_gib: float = 3.2  # what the OOM failed to allocate (the same failure line, another size: one pattern)
    driver: str = "575.57.08"


FLEET = [
    Profile("C.91000001", 41001, "RTX 4090", 0.42, "Norway", "healthy", 44.1),
    Profile("C.91000002", 41002, "RTX 3090", 0.21, "Czechia", "healthy", 31.5),
    Profile("C.91000003", 41003, "RTX A4000", 0.18, "Texas, US", "slow", 12.4),
    Profile("C.91000004", 55891, "RTX PRO 4000", 0.35, "Norway", "oom"),
    Profile("C.91000005", 41005, "RTX 4090", 0.40, "Quebec, CA", "gpu_lost"),
    Profile("C.91000006", 41006, "RTX 3090", 0.19, "Poland", "network"),
    # the OOM's pattern on two more machines (other sizes, GPU models, a driver), and a healthy run of
    # its GPU model to compare it with (`fleetlog patterns`, `fleetlog why C.91000004 --diff`)
    Profile("C.91000007", 55892, "RTX PRO 4000", 0.36, "Norway", "healthy", 33.0),
    Profile("C.91000008", 41008, "RTX A4000", 0.17, "Texas, US", "oom", oom_gib=1.6, driver="570.124.06"),
    Profile("C.91000009", 41009, "RTX 4090", 0.41, "Germany", "oom", oom_gib=12.8),
    Profile("C.91000010", 41010, "RTX 4090", 0.38, "Sweden", "healthy", 40.2),  # the same machine, rented again:
    Profile("C.91000011", 41010, "RTX 4090", 0.38, "Sweden", "degraded", 20.1),  # half as fast (degraded)
]

PARAMS = """#!/bin/sh
echo "[entrypoint] fetching proving parameters (v28, 32GiB sectors)"
for f in 1 2 3; do
  echo "fetching v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher.params part $f/3"
  sleep 0.2
done
echo "fetched 3 of 3 parameter files (56.2 GiB)"
"""

BENCH_HEAD = """#!/bin/sh
log={daemon_log}
proofs=${{1:-12}}
echo "Starting benchmark: $proofs proofs, concurrency 3, partition-workers 16"
echo "INFO cuzk_daemon: listening on 127.0.0.1:9820, 1 GPU ({gpu_model})" >> "$log"
echo "INFO cuzk_daemon::srs: loading SRS for 32GiB sectors" >> "$log"
echo "INFO cuzk_daemon::pce: warm-up proof: PCE extraction started (partition-workers 16)" >> "$log"
sleep 0.5
"""

BENCH_BODY = {
    "healthy": """echo "INFO cuzk_daemon::pce: PCE extraction done in 212 s" >> "$log"
i=1
while [ "$i" -le "$proofs" ]; do
  echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs: 10 partitions done in {proof_s} s" >> "$log"
  echo "proof $i/$proofs done in {proof_s} s"
  i=$((i + 1)); sleep 0.1
done
echo "Benchmark result: {rate} proofs/hour"
""",
    "oom": """echo "INFO cuzk_daemon::pce: allocating 21.4 GiB on device 0" >> "$log"
echo "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating {oom_gib} GiB for NTT" >> "$log"
echo "ERROR cuzk_daemon: prover thread panicked; shutting down" >> "$log"
echo "waiting for warm-up proof..."
echo "cuzk-bench: rpc error: daemon closed the connection" >&2
echo "benchmark.sh exited with error" >&2
exit 1
""",
    "gpu_lost": """echo "INFO cuzk_daemon::prover: PoRep C2 proof 1/$proofs started" >> "$log"
echo "NVRM: Xid (PCI:0000:41:00): 79, pid=4242, GPU has fallen off the bus." >> "$log"
echo "ERROR cuzk_daemon::prover: CUDA error: unspecified launch failure" >> "$log"
echo "proof 1/$proofs failed"
echo "benchmark.sh exited with error" >&2
exit 2
""",
    "network": """echo "WARN cuzk_daemon: listener closed unexpectedly" >> "$log"
echo "cuzk-bench: rpc error: code = Unavailable desc = connection refused (127.0.0.1:9820)" >&2
echo "benchmark.sh exited with error" >&2
exit 1
""",
}
BENCH_BODY["slow"] = BENCH_BODY["degraded"] = BENCH_BODY["healthy"]


def agent_executable() -> str:
    beside = Path(sys.executable).parent / "fleetlog-agent"
    found = str(beside) if beside.exists() else shutil.which("fleetlog-agent")
    if not found:
        raise SystemExit("fleetlog demo: fleetlog-agent is not installed")
    return found


def _write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _agent(args: list[str], env: dict[str, str], log: Path) -> int:
    with log.open("ab") as out:
        return subprocess.run([agent_executable(), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=300).returncode


def gpu_samples(profile: Profile, started: float, ended: float) -> list[dict]:
    """What the GPU did during the benchmark, one sample a second, shaped by the outcome."""
    labels = {"gpu": "0", "UUID": f"GPU-{profile.machine_id:08x}-demo", "modelName": f"NVIDIA {profile.gpu_model}",
              "pci_bus_id": "00000000:41:00.0"}
    total_mib = 24_576
    samples = []
    n = max(2, int(ended - started) + 1)
    for i in range(n):
        t = started + (ended - started) * i / (n - 1)
        frac = i / (n - 1)
        util, used, temp, power = 96.0, 19_800.0 + 900 * frac, 74 + 6 * frac, 280.0
        if profile.outcome == "slow":
            util, temp, power = 41.0 + 5 * (i % 2), 63.0, 140.0
        elif profile.outcome == "degraded":  # running hot, clocks down
            util, temp, power = 99.0, 88.0 + 2 * frac, 190.0
        elif profile.outcome == "oom":
            util, used, temp, power = 35 + 50 * frac, 14_000 + (total_mib - 14_000) * frac, 66 + 12 * frac, 120 + 150 * frac
        elif profile.outcome == "gpu_lost":
            util, power = (0.0, 0.0) if frac > 0.7 else (97.0, 290.0)
        elif profile.outcome == "network":
            util, used, power = 2.0, 1_200.0, 45.0
        ts = round(t, 3)
        samples += [
            {"name": "DCGM_FI_DEV_GPU_UTIL", "ts": ts, "value": util, "labels": labels},
            {"name": "DCGM_FI_DEV_FB_USED", "ts": ts, "value": round(used), "labels": labels},
            {"name": "DCGM_FI_DEV_FB_FREE", "ts": ts, "value": round(total_mib - used), "labels": labels},
            {"name": "DCGM_FI_DEV_GPU_TEMP", "ts": ts, "value": round(temp, 1), "labels": labels},
            {"name": "DCGM_FI_DEV_POWER_USAGE", "ts": ts, "value": round(power, 1), "labels": labels},
        ]
    return samples


def run_instance(profile: Profile, client: Client, workdir: Path) -> str:
    home = workdir / profile.instance_id
    home.mkdir(parents=True)
    daemon_log = home / "cuzk-bench-daemon.log"
    params = _write_script(home / "fetch-params.sh", PARAMS)
    proof_s = round(3600 / profile.rate, 1) if profile.rate else 0
    bench = _write_script(
        home / "benchmark.sh",
        BENCH_HEAD.format(daemon_log=daemon_log, gpu_model=profile.gpu_model)
        + BENCH_BODY[profile.outcome].format(proof_s=proof_s, rate=profile.rate, oom_gib=profile.oom_gib),
    )
    env = {
        **os.environ,
        "FLEETLOG_SERVER": client.server,
        "FLEETLOG_INSTANCE_ID": profile.instance_id,
        "FLEETLOG_AGENT_SPOOL": str(home / "spool"),
        "FLEETLOG_AGENT_POLL_INTERVAL_S": "0.05",
        "FLEETLOG_AGENT_FLUSH_TIMEOUT_S": "60",
    }
    if client.token:
        env["FLEETLOG_TOKEN"] = client.token
    log = home / "agent.log"
    identity = [f"machine_id={profile.machine_id}", f"host_id={profile.machine_id * 10 + 7}",
                f"gpu_model={profile.gpu_model}", "gpu_count=1", f"dph={profile.dph}", f"location={profile.location}",
                f"driver={profile.driver}", 'labels={"image_version": "demo-1.0"}']
    _agent(["event", "registered", *identity], env, log)
    if _agent(["wrap", "--done-event", "params_done", "--", str(params)], env, log) != 0:
        return f"{profile.instance_id}: parameter fetch failed (see {log})"
    started = time.time()
    code = _agent(["run", "--no-register", "--tail", f"benchdaemon={daemon_log}", "--proofs", "12",
                   "--concurrency", "3", "--partition-workers", "16", "--", str(bench), "12"], env, log)
    ended = time.time()
    client.post("/api/v1/metrics", {"instance_id": profile.instance_id, "samples": gpu_samples(profile, started, ended)})
    if code == 0 and profile.outcome == "healthy":
        _agent(["event", "running"], env, log)
    return f"{profile.instance_id}  machine {profile.machine_id:<6} {profile.gpu_model:<13} {profile.outcome:<9} exit {code}"


def run(client: Client, keep: bool = False) -> int:
    server = client.server
    try:
        client.ready()
    except ClientError as e:
        print(f"fleetlog demo: no server at {server} ({e.message}); start one with `make run`", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="fleetlog-demo-"))
    started = time.monotonic()
    try:
        machines: dict[int, list[Profile]] = {}  # the rentals of one machine run one after the other
        for profile in FLEET:
            machines.setdefault(profile.machine_id, []).append(profile)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(machines)) as pool:
            for lines in pool.map(lambda rentals: [run_instance(p, client, workdir) for p in rentals], machines.values()):
                for line in lines:
                    print(line, flush=True)
        try:
            report = client.post("/api/v1/policy/run")
            print(f"policies: {len(report['new_decisions'])} new decisions, {report['classified']} failures classified")
        except ClientError as e:
            print(f"policies not run ({e.status}: the admin token runs them); they run on the server's timer", file=sys.stderr)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"demo fleet pushed in {time.monotonic() - started:.0f} s: open {server}/ (fleet), "
          f"{server}/#/instance/C.91000004 (the OOM), {server}/#/machines (41010: degraded)")
    return 0
