#!/bin/sh
# The fleet simulation's benchmark (tests/fleetsim.py): usage sim_benchmark.sh PROOFS.
# SIM_FATE: healthy | slow | oom | gpu_lost | network | hung; SIM_RATE: the rate a passing run prints;
# SIM_LINES: daemon-log lines per proof (volume); SIM_ROTATE: 1 renames the daemon log away once
# mid-run, 2 twice in a row (logrotate-style double). Every line is unique, so a line stored twice
# (or never) can be told by its text. SIM_HOLD_FILE: wait for this file before printing the rate
# (the harness kills the agent there).
proofs=${1:?proofs}
log=${FLEETLOG_BENCH_DAEMON_LOG:?}
results=${FLEETLOG_BENCH_RESULTS_LOG:?}
fate=${SIM_FATE:-healthy}
lines=${SIM_LINES:-5}
echo "Starting benchmark: $proofs proofs, concurrency 3, partition-workers 16 ($fate)"
echo "INFO cuzk_daemon: listening on 127.0.0.1:9820, 1 GPU (NVIDIA RTX PRO 4000 Blackwell, 24 GiB)" >> "$log"
echo "INFO cuzk_daemon::pce: warm-up proof: PCE extraction started (partition-workers 16)" >> "$log"
case "$fate" in
oom)
    sleep 1
    echo "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) allocating 3.2 GiB for NTT" >> "$log"
    echo "ERROR cuzk_daemon: prover thread panicked; shutting down" >> "$log"
    echo "warm-up proof: failed" >> "$results"
    echo "[benchmark] error: daemon exited while waiting for warm-up proof"
    echo "benchmark.sh exited with error" >&2
    exit 1 ;;
gpu_lost)
    sleep 1
    echo "NVRM: Xid (PCI:0000:41:00): 79, pid=4242, GPU has fallen off the bus." >> "$log"
    echo "ERROR cuzk_daemon::prover: CUDA error: unspecified launch failure" >> "$log"
    echo "proof 1/$proofs failed"
    echo "benchmark.sh exited with error" >&2
    exit 2 ;;
network)
    sleep 1
    echo "WARN cuzk_daemon: listener closed unexpectedly" >> "$log"
    echo "cuzk-bench: rpc error: code = Unavailable desc = connection refused (127.0.0.1:9820)" >&2
    echo "benchmark.sh exited with error" >&2
    exit 1 ;;
hung)
    echo "waiting for warm-up proof..."
    while :; do sleep 1; done ;;
esac
i=1
while [ "$i" -le "$proofs" ]; do
    j=1
    while [ "$j" -le "$lines" ]; do
        echo "INFO cuzk_daemon::prover: proof $i/$proofs partition $j done" >> "$log"
        j=$((j + 1))
    done
    if [ "$i" -eq 2 ] && [ "${SIM_ROTATE:-0}" -ge 1 ]; then
        mv "$log" "$log.1"
        echo "INFO cuzk_daemon: log reopened after rotation 1" >> "$log"
        if [ "${SIM_ROTATE:-0}" -ge 2 ]; then
            mv "$log.1" "$log.2"; mv "$log" "$log.1"
            echo "INFO cuzk_daemon: log reopened after rotation 2" >> "$log"
        fi
    fi
    echo "proof $i/$proofs done in 78.6 s"
    echo "proof $i/$proofs: 78.6 s" >> "$results"
    i=$((i + 1))
    sleep 0.3
done
if [ -n "${SIM_HOLD_FILE:-}" ]; then
    echo "Benchmark result: ${SIM_RATE:-45.7} proofs/hour"
    while [ ! -e "$SIM_HOLD_FILE" ]; do sleep 0.1; done
    echo "benchmark finished after the hold"
    exit 0
fi
echo "Benchmark result: ${SIM_RATE:-45.7} proofs/hour"
