#!/bin/sh
# Stands in for benchmark.sh in the entrypoint test: usage standin_benchmark.sh PROOFS.
# Writes the daemon log and the results log where the entrypoint tails them (it exports both paths);
# STANDIN_BENCH=oom fails like the incident.
proofs=${1:?proofs}
log=${FLEETLOG_BENCH_DAEMON_LOG:?}
results=${FLEETLOG_BENCH_RESULTS_LOG:?}
echo "cuzk-daemon: listening on 127.0.0.1:9820" >> "$log"
if [ "${STANDIN_BENCH:-ok}" = oom ]; then
    echo "ERROR cuzk_daemon::pce: CUDA error: out of memory (cudaErrorMemoryAllocation) during PCE extraction" >> "$log"
    echo "warm-up proof: failed" >> "$results"
    echo "waiting for warm-up proof..."
    echo "benchmark.sh exited with error" >&2
    exit 1
fi
i=1
while [ "$i" -le "$proofs" ]; do
    echo "INFO cuzk_daemon::prover: PoRep C2 proof $i/$proofs finished" >> "$log"
    echo "proof $i/$proofs done in 141.0 s"
    echo "proof $i/$proofs: 141.0 s" >> "$results"
    i=$((i + 1))
done
echo "Benchmark result: 41.7 proofs/hour"
